"""Whether the cluster takes a job (pure): the admin's policy, and whether any node can run its workers."""

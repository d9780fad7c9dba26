"""Whether the cluster takes a job (pure): the admin's policy, whether any node can run its workers, where
its notifications may go, and whether every Ray pod may mount its checkpoints' claim."""

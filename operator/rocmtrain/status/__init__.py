"""The status mapping (pure): what the operator observes, turned into a job's status, events and metrics.

- `phase`: the phase and the conditions of one job from its RayJob, Ray pods, Kueue
  Workload and what holds it back (`compute_status`, `Observation`);
- `hold`: why the operator holds a job's RayJob back (`Hold`), and when it looks again;
- `condition_merge`: a condition as a typed value, and its merge into the status' list;
- `events`: the events that explain each status transition;
- `pods`: what the Ray pods say (ready workers, why a pod cannot run);
- `workload`: what Kueue's Workload says (admitted where, why it waits or was evicted);
- `queue_estimate`: when a queued job will start (its place, and when its GPUs are free);
- `progress_patch`: a progress report turned into a merge patch of the status;
- `rdma`: the network RCCL chose, against what the job asked for;
- `accounting`: GPU-seconds and cost;
- `gauges`: the per-job metric values (`rocmtrain.metrics.prometheus` serves them);
- `objects`: views and patches of the objects the operator keeps (jobs, RayJobs).

Plain data in, plain data out: no kopf, no Kubernetes client, no HTTP.
"""

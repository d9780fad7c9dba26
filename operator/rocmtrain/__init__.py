"""The operator side: the contract (`api`), the pure core, the kopf shell and the I/O edges.

- `api`: the contract shared with the training image (`rocmtrain_train`), which imports
  nothing else of this package; this package never imports the training image;
- pure core: `render` (RocmTrainingJob to RayJob), `status` (observations to status,
  holds, events), `preflight` (can any node run the workers), `objects` (views and
  patches of the objects the operator keeps), `pod_health` and `kueue_workload` (what the
  Ray pods and Kueue's Workloads say), `policy`, `accounting`, `job_gauges`, `views`;
- shell: `controller` (kopf handlers, settings, reconciler, the informer behind the RayJob,
  Ray pod and Workload watches), `metrics`;
- I/O: `kube` (the API server), `progress` (the HTTPS endpoint training drivers report to);
- tools: `cli` (`rocmtrain`), `docs` (the README field reference).
"""

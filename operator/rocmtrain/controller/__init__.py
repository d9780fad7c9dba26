"""The operator process, the only part of `rocmtrain` that imports kopf.

- `handlers`: the kopf handlers (job events, the indexes of jobs and nodes, the
  `/healthz` probe, startup and cleanup), wiring only;
- `runtime`: `OperatorRuntime`, what the handlers share, built once at startup;
- `settings`: the configuration from `ROCMTRAIN_*` variables, and kopf's settings;
- `reconciler`: per-job orchestration (RayJob create or update, status writes,
  retries) around `rocmtrain.kube.client`;
- `informer`: the supervised list-then-watch under `rayjob_watch` (RayJobs),
  `pod_watch` (Ray pods), `event_watch` (the events on pods about their volumes) and
  `workload_watch` (Kueue Workloads); `supervision`:
  their restart back-off and health policy;
- `__main__`: `python -m rocmtrain.controller`.

The decisions they sequence are pure modules outside this package:
`rocmtrain.api.validate`, `rocmtrain.render`, `rocmtrain.admission.node_fit`
and `rocmtrain.status.phase`; the progress endpoint the runtime
serves is `rocmtrain.progress`.
"""

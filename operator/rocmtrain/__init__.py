"""The operator side: the contract (`api`), the pure core, and the shell of servers, commands and kopf.

Packages, as layers from the bottom up (a module imports only its own package and those below it;
`tests/unit/test_boundary.py` holds them to it, see docs/design/architecture.md):

- `api`: the contract shared with the training image (`rocmtrain_train`), which imports nothing
  else of this package but `plan`; this package never imports the training image;
- pure core: `plan` (the planner: memory plan, model shapes, fit, GPU memory; importable by the
  training image), `render` (RocmTrainingJob to RayJob), `status` (observations to status,
  conditions, events, accounting and metric values), `admission` (the admin's policy, and whether
  any node can run the workers), `views` (what `rocmtrain status`, `pool`, `plot` and `plan`
  print); the strict mypy section of pyproject.toml lists the pure modules (see
  docs/design/boundaries.md);
- I/O: `kube` (the API-server client), `serving` (what both HTTPS servers share: refusals,
  TokenReviews, rate limits, the TLS site), `metrics` (the Prometheus registry, `/metrics` access
  and its server), `progress` (the HTTPS endpoint training drivers report to);
- on top: `chart` (the Helm chart generator), `cli` (the `rocmtrain` command: its cluster commands,
  plot, model files and the docs generator), `controller` (the kopf shell: handlers, settings,
  reconciler, the watches).
"""

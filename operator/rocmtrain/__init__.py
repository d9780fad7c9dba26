"""The operator side: the contract (`api`), the pure core, the kopf shell and the I/O edges.

- `api`: the contract shared with the training image (`rocmtrain_train`), which imports
  nothing else of this package; this package never imports the training image;
- pure core: `render` (RocmTrainingJob to RayJob), `status` (observations to status,
  conditions, events, accounting and metric values), `node_fit` (can any node run the
  workers), `policy`, `views` (what `rocmtrain status` and `pool` print); the strict
  mypy section of pyproject.toml lists the pure modules, and `tests/unit/test_boundary.py`
  holds them to it (see docs/design/boundaries.md);
- shell: `controller` (kopf handlers, settings, reconciler, the watches);
- I/O: `kube` (the API server), `progress` (the HTTPS endpoint training drivers report to),
  `prometheus` (the metrics endpoint);
- tools: `cli` (`rocmtrain`), `cluster_cli` (its cluster commands), `docs` (the generated reference).
"""

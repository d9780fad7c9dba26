"""The operator process, the only part of `rocmtrain` that imports kopf.

`handlers` (kopf handlers, wiring only), `settings` (configuration from the
environment), `reconciler` (per-job orchestration around `rocmtrain.kube`),
`rayjob_watch` (the RayJob informer). The decisions they sequence are pure
modules outside this package: `rocmtrain.api.validate`, `rocmtrain.render`,
`rocmtrain.node_fit` and `rocmtrain.status`.
"""

"""The contract: everything the operator, the renderer and the training image share, and nothing else.

It imports only the standard library, pydantic and PyYAML (never kopf, kubernetes,
torch or ray, nor any other part of `rocmtrain`); the training image (`rocmtrain_train`)
imports it and the planner (`rocmtrain.plan`) only; `tests/unit/test_boundary.py`
enforces both.

- `contract`: every shared name and number (API group, labels, RayJob API, AMD GPU
  resource and node labels, object-store schemes, environment variables, reserved
  volumes, the progress channel's path, audience and rate);
- `models`: the RocmTrainingJob spec and status (pydantic), the single source of the CRD;
- `condition_reasons`: the status' condition types and every reason the operator writes;
- `kuberay` and `workload_conditions`: KubeRay's words for a RayJob's state, Kueue's for a Workload's;
- `validate`: the one validation of every entry point, for a cluster or a local run;
- `manifests`: reading job files (YAML as kubectl reads it) into validated jobs;
- `names`: the names KubeRay derives from a job; `patterns` and `types`: the string
  patterns and constrained types; `quantity`: resource quantities; `timestamps`: RFC 3339;
- `crd`: the CustomResourceDefinition generated from the models.
"""

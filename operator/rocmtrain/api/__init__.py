"""The contract: everything the operator, the renderer and the training image share, and nothing else.

It imports only the standard library, pydantic and PyYAML (never kopf, kubernetes,
torch or ray, nor any other part of `rocmtrain`), and it is the only part of
`rocmtrain` the training image (`rocmtrain_train`) imports; `tests/unit/test_boundary.py`
enforces both.

- `contract`: every shared name and number (API group, labels, RayJob API, AMD GPU
  resource and node labels, object-store schemes, environment variables, reserved
  volumes, the progress channel's path, audience and rate);
- `models`: the RocmTrainingJob spec and status (pydantic), the single source of the CRD;
- `conditions`: the status' condition types and every reason the operator writes;
- `kuberay` and `kueue`: KubeRay's words for a RayJob's state, Kueue's for a Workload's;
- `validate`: the one validation of every entry point, for a cluster or a local run;
- `manifests`: reading job files (YAML as kubectl reads it) into validated jobs;
- `names`: the names KubeRay derives from a job; `patterns` and `types`: the string
  patterns and constrained types; `quantity`: resource quantities; `timestamps`: RFC 3339;
- `crd`: the CustomResourceDefinition generated from the models;
- the memory plan (`rocmtrain plan`, the driver's pre-flight): `model_shapes` (a model's tensors from its
  config.json), `memory_plan` (the bytes per GPU by part), `memory_fit` (whether a job fits, and what would
  make it), `gpu_memory` (the memory of one GPU: a node label, or the table of AMD Instinct models).
"""

"""TEST-ONLY: the local test world of rocm-train-operator (see tests/testworld/README.md).

A real control plane, kube-scheduler, KubeRay and Kueue, kwok's fake GPU nodes and a process runtime
that runs Ray pods as processes here: what the tests, `make cluster-up` and `make demo` run.
"""

"""Fault injection for the control-plane tests, on loopback only.

- `proxy`: a TLS proxy between a client and kube-apiserver that answers chosen requests
  with 429/500/503, hangs them, delays them, or drops their connections;
- `apiserver`: restart kube-apiserver of the local test cluster while etcd stays up;
- `operator_process`: the operator as its own process (`python -m rocmtrain.controller`),
  to kill with SIGKILL, restart, scrape and measure;
- `flood`: a client process that floods the progress endpoint with junk tokens (the flood test's, and
  `bench/flood_bench.py`'s).

They use the harness's `KubeCluster` as it is (`rocmtrain_testworld/kubecluster.py`).
"""

"""The operator's Prometheus metrics: the registry and its collectors, who may read them, and the server."""

"""The network RCCL chose, against what the job asked for (pure): the one check that the RDMANotUsed
event (`rocmtrain.status.progress_patch`) and `rocmtrain status` share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def unused_rdma(transport: str | None, spec: Mapping[str, Any]) -> str | None:
    """The RDMA resource a multi-worker job's `spec.resources.network` requests while RCCL reports TCP
    sockets between its pods (a silent fallback, many times slower); None where that is not the case."""
    resources = spec.get("resources") or {}
    rdma = (resources.get("network") or {}).get("rdmaResource")
    if transport != "Socket" or not rdma or (resources.get("workers") or 1) < 2:
        return None
    return str(rdma)

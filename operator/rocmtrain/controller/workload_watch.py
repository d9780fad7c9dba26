"""Kueue's Workloads of RayJobs, followed by an `Informer`, grouped by RayJob.

Kueue names no label of ours on its Workloads, so every Workload of the watched
namespaces is listed and those not made for a RayJob are dropped at once. Kueue is
optional: while its CRD is not installed (404) or the operator may not read
Workloads (403), the watch waits and lists again, and job status falls back to
what the RayJob shows (`suspend`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client

from rocmtrain.api.contract import WORKLOAD_GROUP, WORKLOAD_PLURAL, WORKLOAD_VERSION
from rocmtrain.controller.informer import Handler, Informer, Key, View, custom_objects
from rocmtrain.controller.supervision import DEFAULT_RESTART, RestartPolicy
from rocmtrain.status.workload import rayjob_owner, workload_view


def _of_rayjob(workload: Mapping[str, Any]) -> View | None:
    return workload_view(workload) if rayjob_owner(workload) is not None else None


def rayjob_key(view: View) -> Key:
    """(namespace, RayJob name) of a Workload view."""
    return view["metadata"]["namespace"], view["metadata"]["owner"]["name"]


class WorkloadWatch(Informer):
    """Kueue's Workloads of RayJobs, by (namespace, RayJob name)."""

    def __init__(
        self,
        api: client.ApiClient,
        handle: Handler,
        *,
        namespaces: Iterable[str] = (),
        retry_seconds: float = 30.0,
        restart: RestartPolicy = DEFAULT_RESTART,
    ) -> None:
        super().__init__(
            custom_objects(api, WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL),
            _of_rayjob,
            handle,
            what="Kueue Workloads",
            group=rayjob_key,
            namespaces=namespaces,
            missing_retry_seconds=retry_seconds,
            restart=restart,
        )

    def of_rayjob(self, rayjob: Mapping[str, Any]) -> View | None:
        """The live Workload of this very RayJob (its uid), the newest if Kueue is replacing one; else None."""
        meta = rayjob.get("metadata") or {}
        mine = [
            view
            for view in self.members((meta.get("namespace", ""), meta.get("name", "")))
            if view["metadata"]["owner"]["uid"] == meta.get("uid") and not view["metadata"]["deleting"]
        ]
        return max(mine, key=lambda view: view["metadata"]["creationTimestamp"] or "", default=None)

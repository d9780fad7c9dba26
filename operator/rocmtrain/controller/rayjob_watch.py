"""The RayJobs the operator made (selected by its label), followed by an `Informer`.

kopf treats a 404 on a watch as fatal, and a CRD deleted at run time produces one
(the API server's discovery lags the deletion), so the RayJobs are watched here
instead: a 404 means "KubeRay is not installed"; the watch waits and lists again.

The watch keeps a small view of every RayJob (`rayjob_view`) for the stall loop
and the other watches, and hands each change to `handle`, one RayJob at a time,
again after a backoff when its handling (the job's status write) fails.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubernetes_asyncio import client

from rocmtrain.controller.informer import Handler, Informer, View, custom_objects
from rocmtrain.controller.supervision import DEFAULT_RESTART, RestartPolicy
from rocmtrain.kube.client import RAYJOBS
from rocmtrain.status.objects import rayjob_view


class RayJobWatch(Informer):
    """The operator's RayJobs, in memory and as a stream of changes."""

    def __init__(
        self,
        api: client.ApiClient,
        handle: Handler,
        *,
        label_selector: str,
        namespaces: Iterable[str] = (),
        missing_retry_seconds: float = 30.0,
        restart: RestartPolicy = DEFAULT_RESTART,
    ) -> None:
        super().__init__(
            custom_objects(api, RAYJOBS.group, RAYJOBS.version, RAYJOBS.plural, label_selector=label_selector),
            rayjob_view,
            handle,
            what="RayJobs",
            namespaces=namespaces,
            missing_retry_seconds=missing_retry_seconds,
            restart=restart,
        )

    def get(self, namespace: str, name: str) -> View | None:
        """The current view of one RayJob, or None."""
        return self.views.get((namespace, name))

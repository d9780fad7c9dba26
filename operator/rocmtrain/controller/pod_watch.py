"""The Ray pods (head and workers) of the operator's jobs, followed by an `Informer`, grouped by job.

Selected by label on the API server (`RAY_PODS_SELECTOR`: the labels of the rendered
templates, which KubeRay keeps, plus KubeRay's cluster label), kept as
`rocmtrain.status.pods.pod_view`s, and handed over one job at a time: a burst of pod changes of
one job (eight workers turning Ready) makes one status update. A job's pods come with the events on them
about their volumes (`rocmtrain.controller.event_watch`), which pod fields never tell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubernetes_asyncio import client

from rocmtrain.api.contract import RAY_PODS_SELECTOR
from rocmtrain.controller.event_watch import PodEventWatch
from rocmtrain.controller.informer import Handler, Informer, View, pods
from rocmtrain.controller.supervision import DEFAULT_RESTART, RestartPolicy
from rocmtrain.status.pods import job_key, pod_view, with_volume_events


class PodWatch(Informer):
    """The Ray pods of every job, by (namespace, job name)."""

    def __init__(
        self,
        api: client.ApiClient,
        handle: Handler,
        *,
        namespaces: Iterable[str] = (),
        retry_seconds: float = 30.0,
        restart: RestartPolicy = DEFAULT_RESTART,
        volume_events: Sequence[PodEventWatch] = (),
    ) -> None:
        self._volume_events = volume_events
        super().__init__(
            pods(api, label_selector=RAY_PODS_SELECTOR),
            pod_view,
            handle,
            what="Ray pods",
            group=job_key,
            namespaces=namespaces,
            missing_retry_seconds=retry_seconds,
            restart=restart,
        )

    def of_job(self, namespace: str, job: str) -> list[View]:
        """The Ray pods of one job, of any of its Ray clusters, each with its volume events."""
        return [with_volume_events(pod, self._events_of(pod)) for pod in self.members((namespace, job))]

    def _events_of(self, pod: View) -> list[View]:
        meta = pod["metadata"]
        return [event for watch in self._volume_events for event in watch.of_pod(meta["namespace"], meta["name"])]

    def job_of_pod(self, namespace: str, pod: str) -> tuple[str, str] | None:
        """(namespace, job name) of a Ray pod the watch knows, else None."""
        view = self.views.get((namespace, pod))
        return job_key(view) if view is not None else None

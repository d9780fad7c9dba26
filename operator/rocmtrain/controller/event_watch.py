"""The events on pods whose volumes cannot be attached or mounted, followed by `Informer`s, grouped by pod.

A pod whose ConfigMap, Secret or claim is missing only waits in `ContainerCreating`: the kubelet (and the
attach/detach controller) says why in a Warning event on the pod, nowhere else. One watch per reason of
`rocmtrain.status.pods.VOLUME_EVENT_REASONS`, each selected on the API server by a field selector
(`involvedObject.kind=Pod,reason=FailedMount`), so that no other event reaches the operator; each is kept as a
`rocmtrain.status.pods.volume_event_view` (the message bounded) until the API server lets it expire (one
hour by default). `PodWatch` joins them to the Ray pods they name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubernetes_asyncio import client

from rocmtrain.controller.informer import Handler, Informer, Lister, View
from rocmtrain.controller.supervision import DEFAULT_RESTART, RestartPolicy
from rocmtrain.status.pods import event_pod_key, volume_event_view


def _pod_events(api: client.ApiClient, reason: str) -> Lister:
    """The list (and watch) call of the events with `reason` on pods."""
    core = client.CoreV1Api(api)
    selector = f"involvedObject.kind=Pod,reason={reason}"

    async def call(namespace: str | None, **options: Any) -> Any:
        if namespace is None:
            return await core.list_event_for_all_namespaces(field_selector=selector, **options)
        return await core.list_namespaced_event(namespace, field_selector=selector, **options)

    return call


class PodEventWatch(Informer):
    """The events of one reason on pods, by (namespace, pod name)."""

    def __init__(
        self,
        api: client.ApiClient,
        handle: Handler,
        reason: str,
        *,
        namespaces: Iterable[str] = (),
        retry_seconds: float = 30.0,
        restart: RestartPolicy = DEFAULT_RESTART,
    ) -> None:
        super().__init__(
            _pod_events(api, reason),
            volume_event_view,
            handle,
            what=f"{reason} events",
            group=event_pod_key,
            namespaces=namespaces,
            missing_retry_seconds=retry_seconds,
            restart=restart,
        )

    def of_pod(self, namespace: str, pod: str) -> list[View]:
        """The events on one pod (of any pod of that name: `with_volume_events` picks its own by uid)."""
        return self.members((namespace, pod))

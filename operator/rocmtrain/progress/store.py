"""Read RocmTrainingJobs, merge-patch their status subresource and post events on them
(the endpoint's only writes).

Throttling, server errors and broken connections are retried briefly (`rocmtrain.kube.client.retrying`)
before they become a 503 for the reporting job.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.contract import GROUP, PLURAL, VERSION
from rocmtrain.api.errors import Conflict
from rocmtrain.kube.client import Kube, retrying
from rocmtrain.serving.errors import Gone, checked


class KubeJobStore:
    """RocmTrainingJob reads and status patches through the API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self._custom = client.CustomObjectsApi(api)
        self.post_event = Kube(api).post_event  # best effort: a failure is logged, not raised

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job object, or None when it does not exist."""
        try:
            return await checked(
                "job lookup",
                retrying(self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name),
            )
        except ApiException:
            return None

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Apply a JSON merge patch to the status subresource; raise Conflict or Gone."""
        try:
            await checked(
                "status patch",
                retrying(
                    self._custom.patch_namespaced_custom_object_status,
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                    patch,
                    _content_type="application/merge-patch+json",
                ),
            )
        except ApiException as exc:
            raise (Conflict if exc.status == 409 else Gone) from None

"""The operator's one door to the API server: create, read, patch and post events; nothing decided here.

Built on kubernetes_asyncio (kopf imports it anyway). Every write is either a
create that tells "already exists" apart, or a JSON merge patch of named fields,
so a write is never half-applied and never touches fields the operator does not own.

Every client comes from `new_api_client`, which gives each request it sends a
deadline (`TimedApiClient`): kubernetes_asyncio sends requests without one, so a
hung API server would hold the caller (and its reconcile slot) for ever. The
progress endpoint and the watches (RayJobs, Ray pods, Kueue Workloads) get clients
of their own, so that neither a flood of reports nor the long watch requests (one per
watch and namespace) can take the reconciler's connections.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.contract import (
    CLUSTER_QUEUE_PLURAL,
    GROUP,
    LOCAL_QUEUE_PLURAL,
    NETWORK_POLICY_GROUP,
    NETWORK_POLICY_PLURAL,
    NETWORK_POLICY_VERSION,
    OPERATOR_NAME,
    PLURAL,
    RAYJOB_GROUP,
    RAYJOB_PLURAL,
    RAYJOB_VERSION,
    VERSION,
    WORKLOAD_GROUP,
    WORKLOAD_VERSION,
)
from rocmtrain.api.errors import ApiError, Conflict
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.status.messages import EVENT_MESSAGE_LIMIT, bounded

FIELD_MANAGER = OPERATOR_NAME
_MERGE_PATCH = "application/merge-patch+json"
# Transient failures worth a quick retry: throttling, server errors, timeouts.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_RETRY_DELAYS = (0.1, 0.5, 1.0)
# How long one request may take, connecting and waiting for a pooled connection included.
REQUEST_TIMEOUT_SECONDS = 15.0
CONNECT_TIMEOUT_SECONDS = 5.0
# Answers that refuse a create for good, whatever the retries: admission (a webhook, a
# policy, a quota: 403) or validation (400, 422). 403 "... is terminating" is ApiMissing.
_REFUSED_STATUSES = frozenset({400, 403, 422})
# What a call to the API server raises besides a bug: its answers, broken connections, timeouts (an OSError).
API_ERRORS: tuple[type[Exception], ...] = (ApiException, aiohttp.ClientError, OSError)

logger = logging.getLogger(__name__)


class ApiMissing(ApiError):
    """The API server does not serve the resource type (its CRD is not installed)."""


class Refused(ApiError):
    """The API server refused a create: its HTTP status and its own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def api_message(exc: ApiException) -> str:
    """The `message` of the API server's Status answer, else its reason."""
    try:
        message = json.loads(exc.body or "").get("message")
    except (ValueError, AttributeError, TypeError):
        message = None
    return str(message or exc.reason or f"HTTP {exc.status}")


def error_message(exc: BaseException) -> str:
    """One of `API_ERRORS` in one line: its type, and the API server's message or the error's own."""
    detail = api_message(exc) if isinstance(exc, ApiException) else str(exc)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class TimedApiClient(client.ApiClient):
    """An ApiClient whose requests time out: `timeout` unless a call passes its own `_request_timeout`."""

    def __init__(self, configuration: client.Configuration, timeout: aiohttp.ClientTimeout) -> None:
        super().__init__(configuration)
        self.timeout = timeout

    def request(
        self,
        method: str,
        url: str,
        query_params: Any = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        """As `ApiClient.request`, with the client's deadline when the call sets none."""
        return super().request(
            method,
            url,
            query_params=query_params,
            headers=headers,
            post_params=post_params,
            body=body,
            _preload_content=_preload_content,
            _request_timeout=_request_timeout or self.timeout,
        )


async def new_api_client(
    pool_size: int, timeout: float = REQUEST_TIMEOUT_SECONDS, kubeconfig: str | None = None
) -> TimedApiClient:
    """A client from `kubeconfig`, $KUBECONFIG or ~/.kube/config, else the in-cluster service account.

    It keeps at most `pool_size` connections, and each request gets `timeout` seconds in all.
    """
    configuration = client.Configuration()
    named = kubeconfig or os.environ.get("KUBECONFIG")
    kubeconfig = named or str(Path("~/.kube/config").expanduser())
    if named or Path(kubeconfig).is_file():
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    deadline = aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, CONNECT_TIMEOUT_SECONDS))
    return TimedApiClient(configuration, deadline)


@dataclass(frozen=True)
class Ref:
    """A namespaced custom resource type."""

    group: str
    version: str
    plural: str


JOBS = Ref(GROUP, VERSION, PLURAL)
RAYJOBS = Ref(RAYJOB_GROUP, RAYJOB_VERSION, RAYJOB_PLURAL)
NETWORK_POLICIES = Ref(NETWORK_POLICY_GROUP, NETWORK_POLICY_VERSION, NETWORK_POLICY_PLURAL)
LOCAL_QUEUES = Ref(WORKLOAD_GROUP, WORKLOAD_VERSION, LOCAL_QUEUE_PLURAL)
CLUSTER_QUEUES = Ref(WORKLOAD_GROUP, WORKLOAD_VERSION, CLUSTER_QUEUE_PLURAL)  # cluster-scoped: `*_readable`


async def retrying(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Await `call`, retrying briefly on throttling, server errors and broken connections.

    A request that timed out is not tried again here: it has waited its whole deadline,
    and the caller's own retry comes later.
    """
    for delay in _RETRY_DELAYS:
        try:
            return await call(*args, **kwargs)
        except ApiException as exc:
            if exc.status not in _RETRY_STATUSES:
                raise
        except TimeoutError:
            raise
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(delay)
    return await call(*args, **kwargs)


async def readable(call: Any, *args: Any) -> Any:
    """`retrying(call, *args)`, or None when the object does not exist, its type is not served or the operator
    may not read it (403, 404)."""
    try:
        return await retrying(call, *args)
    except ApiException as exc:
        if exc.status in (403, 404):
            return None
        raise


class Kube:
    """Async access to RocmTrainingJobs, RayJobs and Events through one pooled connection."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._objects = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    @classmethod
    async def connect(
        cls, pool_size: int = 32, timeout: float = REQUEST_TIMEOUT_SECONDS, kubeconfig: str | None = None
    ) -> Kube:
        """A pooled client with request deadlines (`new_api_client`)."""
        return cls(await new_api_client(pool_size, timeout, kubeconfig))

    @property
    def api(self) -> client.ApiClient:
        """The pooled client, for APIs this class does not wrap (the progress CA ConfigMaps)."""
        return self._api

    async def close(self) -> None:
        """Close the connection pool."""
        await self._api.close()

    async def create(self, ref: Ref, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create `body`; None when an object of that name already exists.

        Raise ApiMissing when the type is not served, Refused when admission or
        validation refuses the object.
        """
        namespace = body["metadata"]["namespace"]
        try:
            return await retrying(
                self._objects.create_namespaced_custom_object,
                ref.group,
                ref.version,
                namespace,
                ref.plural,
                body,
                field_manager=FIELD_MANAGER,
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            # 404: the type is not served; 403 "... while custom resource definition is terminating": going away.
            if exc.status == 404 or (exc.status == 403 and "terminating" in str(exc.body)):
                raise ApiMissing(f"{ref.plural}.{ref.group}/{ref.version} is not served") from exc
            if exc.status in _REFUSED_STATUSES:
                raise Refused(exc.status, api_message(exc)) from exc
            raise

    async def get(self, ref: Ref, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await retrying(
                self._objects.get_namespaced_custom_object, ref.group, ref.version, namespace, ref.plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def get_readable(self, ref: Ref, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object (cluster-scoped without `namespace`), or None when it does not exist, its type is not
        served or the operator may not read it (Kueue's queues: optional, and read only where RBAC allows)."""
        if namespace is None:
            return await readable(self._objects.get_cluster_custom_object, ref.group, ref.version, ref.plural, name)
        return await readable(
            self._objects.get_namespaced_custom_object, ref.group, ref.version, namespace, ref.plural, name
        )

    async def list_readable(self, ref: Ref) -> list[dict[str, Any]] | None:
        """Every object of a cluster-scoped type, or None when its type is not served or the operator may not
        list it (Kueue's ClusterQueues: few, read in one page)."""
        found = await readable(self._objects.list_cluster_custom_object, ref.group, ref.version, ref.plural)
        return None if found is None else list(found.get("items") or [])

    async def delete(self, ref: Ref, namespace: str, name: str, *, uid: str) -> bool:
        """Delete the object with `uid` (its dependents in the background); False when it is gone or replaced."""
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await retrying(
                self._objects.delete_namespaced_custom_object,
                ref.group,
                ref.version,
                namespace,
                ref.plural,
                name,
                body=body,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or the uid precondition failed: a new object of that name
                return False
            raise
        return True

    async def patch(
        self, ref: Ref, namespace: str, name: str, patch: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any] | None:
        """Merge-patch the object; None when it is gone. With `resource_version`, only that version of it: `Conflict`
        when it has changed since."""
        if resource_version is not None:
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version}}
        try:
            return await self._patch(self._objects.patch_namespaced_custom_object, ref, namespace, name, patch)
        except ApiException as exc:
            if exc.status == 409 and resource_version is not None:
                raise Conflict(f"{ref.plural} {namespace}/{name} changed since version {resource_version}") from exc
            raise

    async def patch_status(
        self, ref: Ref, namespace: str, name: str, status: dict[str, Any], *, uid: str
    ) -> dict[str, Any] | None:
        """Merge-patch `status` of the object with `uid`; None when it is gone (or replaced)."""
        body = {"metadata": {"uid": uid}, "status": status}
        try:
            return await self._patch(self._objects.patch_namespaced_custom_object_status, ref, namespace, name, body)
        except ApiException as exc:
            if exc.status == 409:  # the uid precondition failed: a new object of the same name
                return None
            raise

    async def _patch(
        self, call: Any, ref: Ref, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        try:
            return await retrying(
                call,
                ref.group,
                ref.version,
                namespace,
                ref.plural,
                name,
                body,
                field_manager=FIELD_MANAGER,
                _content_type=_MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data, decoded; None when it does not exist or the operator may not read it."""
        if (secret := await readable(self._core.read_namespaced_secret, name, namespace)) is None:
            return None
        return {key: base64.b64decode(value).decode(errors="replace") for key, value in (secret.data or {}).items()}

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A PersistentVolumeClaim as the API server writes it; None when it does not exist or the operator may not
        read it (RBAC withheld)."""
        claim = await readable(self._core.read_namespaced_persistent_volume_claim, name, namespace)
        return None if claim is None else dict(self._api.sanitize_for_serialization(claim))

    async def post_event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about `obj` (a job); best effort: a failure is logged, not raised."""
        meta = obj["metadata"]
        now = rfc3339(dt.datetime.now(dt.UTC))
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type,
            "reason": reason,
            "message": bounded(message, EVENT_MESSAGE_LIMIT),
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await retrying(self._core.create_namespaced_event, meta["namespace"], body)
        except (ApiException, TimeoutError, aiohttp.ClientError) as exc:
            logger.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc)

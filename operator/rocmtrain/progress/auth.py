"""Who may push progress for a job: TokenReview authentication, pod-based authorisation.

A report carries a projected service-account token with the audience
`rocmtrain.dev/progress`, bound to the Ray head pod that sends it. The
API server's TokenReview says whether the token is valid (signature, expiry,
audience, and that the bound pod still exists with the same uid) and names the
pod. The pod must then belong to the very job it reports for: same namespace,
same uid as the token says, `ray.io/cluster` equal to the job's Ray cluster, and
no `rocmtrain.dev/job-name` label naming another job.

Results are cached for a few seconds (as the API server caches its own token
authentication), keyed by a hash of the token, so a burst of reports costs one
TokenReview and one pod read; tokens themselves are never stored or logged.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.contract import (
    JOB_NAME_LABEL,
    PROGRESS_AUDIENCE,
    RAY_CLUSTER_LABEL,
    RAYJOB_GROUP,
    RAYJOB_PLURAL,
    RAYJOB_VERSION,
)
from rocmtrain.progress.errors import Forbidden, Unauthenticated, checked

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
CACHE_TTL_SECONDS = 10.0
CACHE_ENTRIES = 1024

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Identity:
    """The pod a valid token was issued for."""

    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str


def _single(extra: Mapping[str, Any], key: str) -> str | None:
    values = extra.get(key) or []
    return values[0] if len(values) == 1 and isinstance(values[0], str) and values[0] else None


def identity_from_review(status: Mapping[str, Any], audience: str) -> Identity:
    """Read a TokenReview `status`; raise Unauthenticated or Forbidden when it does not name a pod."""
    if not status.get("authenticated") or audience not in (status.get("audiences") or []):
        raise Unauthenticated("token not accepted")
    user = status.get("user") or {}
    username = user.get("username") or ""
    namespace, _, service_account = username.removeprefix(SA_PREFIX).partition(":")
    if not username.startswith(SA_PREFIX) or not namespace or not service_account:
        raise Forbidden("not a service-account token")
    extra = user.get("extra") or {}
    pod_name, pod_uid = _single(extra, POD_NAME_EXTRA), _single(extra, POD_UID_EXTRA)
    if pod_name is None or pod_uid is None:
        raise Forbidden("token is not bound to a pod")
    return Identity(namespace=namespace, service_account=service_account, pod_name=pod_name, pod_uid=pod_uid)


def pod_belongs_to_job(labels: Mapping[str, str], job_name: str, ray_cluster_name: str | None) -> bool:
    """Whether a pod with `labels` is part of the job's Ray cluster.

    With the cluster name known, `ray.io/cluster` must equal it; before KubeRay
    has named the cluster, the pod must carry `rocmtrain.dev/job-name: <job>`.
    A job-name label naming another job always refuses.
    """
    job_label = labels.get(JOB_NAME_LABEL)
    if job_label is not None and job_label != job_name:
        return False
    if ray_cluster_name:
        return labels.get(RAY_CLUSTER_LABEL) == ray_cluster_name
    return job_label == job_name


class TtlCache(Generic[K, V]):
    """A small LRU map whose entries expire after `ttl` seconds."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float]) -> None:
        self._ttl, self._size, self._clock = ttl, size, clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The live value for `key`, or None."""
        item = self._items.get(key)
        if item is None or item[0] <= self._clock():
            self._items.pop(key, None)
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: K, value: V) -> None:
        """Store `value` for `ttl` seconds, evicting the least recently used entry when full."""
        self._items[key] = (self._clock() + self._ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


class TokenReviewAuthenticator:
    """Authenticate bearer tokens with the API server's TokenReview."""

    def __init__(
        self,
        api: client.ApiClient,
        audience: str = PROGRESS_AUDIENCE,
        *,
        ttl: float = CACHE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._authn = client.AuthenticationV1Api(api)
        self._serialize = api.sanitize_for_serialization
        self._audience = audience
        self._cache: TtlCache[bytes, Identity] = TtlCache(ttl, CACHE_ENTRIES, clock)

    async def __call__(self, token: str) -> Identity:
        """The pod identity of `token`; raise Unauthenticated, Forbidden or Unavailable."""
        key = hashlib.sha256(token.encode()).digest()
        if (cached := self._cache.get(key)) is not None:
            return cached
        body: Any = {  # the client takes plain dicts as well as its model classes
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self._audience]},
        }
        review = await checked("TokenReview", self._authn.create_token_review(body))
        identity = identity_from_review(self._serialize(review).get("status") or {}, self._audience)
        self._cache.put(key, identity)
        return identity


class PodAuthoriser:
    """Allow a token's pod to report only for the job whose Ray cluster it belongs to."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        ttl: float = CACHE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._cache: TtlCache[tuple[str, str, str], bool] = TtlCache(ttl, CACHE_ENTRIES, clock)

    async def __call__(self, identity: Identity, job: Mapping[str, Any]) -> None:
        """Return when `identity` may write `job`'s progress; raise Forbidden or Unavailable otherwise."""
        meta, status = job.get("metadata") or {}, job.get("status") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if identity.namespace != namespace:
            raise Forbidden("token is for another namespace")
        cluster = status.get("rayClusterName") or await self._ray_cluster_name(
            namespace, status.get("rayJobName") or name
        )
        key = (identity.pod_uid, str(meta.get("uid", "")), cluster or "")
        if self._cache.get(key):
            return
        try:
            pod = await checked("pod lookup", self._core.read_namespaced_pod(identity.pod_name, namespace))
        except ApiException:
            raise Forbidden("token's pod no longer exists") from None
        if pod.metadata.uid != identity.pod_uid:
            raise Forbidden("token's pod was replaced")
        if not pod_belongs_to_job(pod.metadata.labels or {}, name, cluster):
            raise Forbidden("token's pod is not part of this job's Ray cluster")
        self._cache.put(key, True)

    async def _ray_cluster_name(self, namespace: str, rayjob: str) -> str | None:
        """The cluster KubeRay created for the RayJob, before the operator has copied it to the job."""
        try:
            obj = await checked(
                "RayJob lookup",
                self._custom.get_namespaced_custom_object(
                    RAYJOB_GROUP, RAYJOB_VERSION, namespace, RAYJOB_PLURAL, rayjob
                ),
            )
        except ApiException:
            return None
        return (obj.get("status") or {}).get("rayClusterName") or None

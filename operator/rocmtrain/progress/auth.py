"""Who may push progress for a job: cheap checks first, TokenReview, then the pod's place in the job.

A report carries a projected service-account token with the audience
`rocmtrain.dev/progress`, bound to the Ray head pod that sends it. Before the API
server is asked anything, a token must look like one (`token_claims`: a JWT of
bounded size whose unverified claims name our audience and have not expired) and
fit the budget of TokenReviews (`TokenReviewAuthenticator`: a token bucket, and a few
reviews at once, shared by the tokens of pods that have not reported lately, so that
forgeries only compete with forgeries). The API server's TokenReview then says whether
it is valid (signature, expiry, audience, and that the bound pod still exists with the same
uid) and names the pod. Answers are cached by a hash of the token, accepted ones
and refused ones apart (a flood of refused tokens never evicts an accepted one),
so a driver's reports cost one review per cache period; tokens themselves are
never stored or logged.

The pod must then be the head of the very job's Ray cluster (`ray_pod_of_job`):
a chain of controller references from the pod to a RayCluster, from it to the
job's RayJob (by name), and from that to the job (by uid), with KubeRay's head
label. A job running its own code (spec.code) also takes reports from its Ray
workers, where Ray Train's rank 0 reports from (KubeRay's worker label, the same
chain). Labels alone prove nothing: anyone who can create pods in the namespace
can set them, on worker, submitter or unrelated pods alike.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.contract import (
    KIND,
    PROGRESS_AUDIENCE,
    RAY_CLUSTER_LABEL,
    RAYJOB_GROUP,
    RAYJOB_KIND,
    RAYJOB_PLURAL,
    RAYJOB_VERSION,
)
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.metrics import prometheus
from rocmtrain.serving.errors import Busy, Forbidden, Unauthenticated, checked
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.serving.reviews import MAX_TOKEN_BYTES, ReviewBudget, TtlCache, token_key, token_review

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
# KubeRay's node-type label and value of a head pod, and the kind that owns Ray pods.
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
HEAD_NODE_TYPE = "head"
WORKER_NODE_TYPE = "worker"
RAYCLUSTER_KIND = "RayCluster"
RAYCLUSTER_PLURAL = "rayclusters"
ACCEPTED_TTL_SECONDS = 60.0
REFUSED_TTL_SECONDS = 60.0
CACHE_ENTRIES = 1024
REFUSED_CACHE_ENTRIES = 4096
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
# TokenReviews the endpoint may send for the tokens of pods without an accepted token lately: a rate
# over them all, bursts, and at once.
REVIEW_RATE_PER_SECOND = 20.0
REVIEW_BURST = 40
REVIEWS_AT_ONCE = 8
# How long a pod whose token was accepted keeps out of that shared budget (tokens refresh hourly), and
# the reviews of its own it may spend there: beyond them, tokens claiming it share the budget again.
KNOWN_POD_SECONDS = 2 * 3600.0
KNOWN_POD_REVIEW_RATE_PER_SECOND = 0.1
KNOWN_POD_REVIEW_BURST = 5


@dataclass(frozen=True)
class Identity:
    """The pod a valid token was issued for."""

    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str


def _b64_json(segment: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def token_claims(token: str, audience: str, now: float) -> dict[str, Any]:
    """The unverified claims of a token that could be a valid projected token for `audience`.

    Raise Unauthenticated for anything else (not a JWT, too long, another audience,
    expired), so that junk never costs a TokenReview. Passing says nothing about validity.
    """
    if len(token) > MAX_TOKEN_BYTES or not _JWT.match(token):
        raise Unauthenticated("not a service-account token")
    try:
        claims = _b64_json(token.split(".")[1])
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise Unauthenticated("not a service-account token") from None
    if not isinstance(claims, dict):
        raise Unauthenticated("not a service-account token")
    audiences = claims.get("aud")
    if audiences != audience and not (isinstance(audiences, list) and audience in audiences):
        raise Unauthenticated("token not accepted")
    expires = claims.get("exp")
    if not isinstance(expires, int | float) or expires <= now:
        raise Unauthenticated("token not accepted")
    return claims


def claimed_pod_uid(claims: Mapping[str, Any]) -> str:
    """The uid of the pod a projected token's unverified claims name ("" when they name none)."""
    found: Any = claims
    for key in ("kubernetes.io", "pod", "uid"):
        found = found.get(key) if isinstance(found, Mapping) else None
    return found if isinstance(found, str) else ""


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


def _controller(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The controller owner reference of `obj` if it is of `kind`, else {}."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kind:
            return ref
    return {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _controlled(child: Mapping[str, Any], kind: str, parent: Mapping[str, Any]) -> bool:
    """Whether `parent` (of `kind`) is `child`'s controller, by uid."""
    uid = _meta(parent).get("uid")
    return uid is not None and _controller(child, kind).get("uid") == uid


def ray_pod_of_job(
    pod: Mapping[str, Any], raycluster: Mapping[str, Any], rayjob: Mapping[str, Any], job: Mapping[str, Any]
) -> str | None:
    """Why `pod` may not report for `job` (through `raycluster` and `rayjob`), or None when it may: it is the
    job's Ray head, or for a job running its own code (spec.code), one of its Ray workers.

    The pod carries KubeRay's node-type label (head, or worker for a job's own code) and cluster
    label, and the RayCluster is its controller (by uid); the RayCluster's controller is the job's
    RayJob (by name and uid); the RayJob's controller is the job (by uid); the job, once it names
    its Ray cluster in status, names this one.
    """
    labels, cluster, status = _meta(pod).get("labels") or {}, _meta(raycluster).get("name"), job.get("status") or {}
    own_code = bool((job.get("spec") or {}).get("code"))
    if labels.get(RAY_NODE_TYPE_LABEL) not in ((HEAD_NODE_TYPE, WORKER_NODE_TYPE) if own_code else (HEAD_NODE_TYPE,)):
        return "token's pod is not a Ray pod of the job" if own_code else "token's pod is not a Ray head pod"
    if labels.get(RAY_CLUSTER_LABEL) != cluster or not _controlled(pod, RAYCLUSTER_KIND, raycluster):
        return "token's pod is not controlled by the job's RayCluster"
    if status.get("rayClusterName") not in (None, cluster):
        return "token's pod belongs to another Ray cluster than the job's"
    rayjob_name = status.get("rayJobName") or rayjob_name_of(_meta(job).get("name", ""))
    if _meta(rayjob).get("name") != rayjob_name or not _controlled(raycluster, RAYJOB_KIND, rayjob):
        return "token's pod's RayCluster is not the job's RayJob's"
    if not _controlled(rayjob, KIND, job):
        return "the RayJob is not this job's"
    return None


class TokenReviewAuthenticator:
    """Authenticate bearer tokens with the API server's TokenReview, within a budget of reviews.

    The tokens of pods that have not had one accepted within `KNOWN_POD_SECONDS` share one budget
    (`reviews`, at most `reviews_at_once` at once). A token whose unverified claims name a pod (by
    uid) that has is reviewed outside it, within a small budget of that pod's own: forged tokens are
    never accepted, so however many a tenant sends from however many pods they spend only the shared
    budget, and the drivers that have reported keep their reviews. (Pod uids are random and readable
    only where the pods may be listed; tokens claiming a known uid beyond its own budget are reviewed
    within the shared one, and every source keeps to the endpoint's rate per address.)
    """

    def __init__(
        self,
        api: client.ApiClient,
        audience: str = PROGRESS_AUDIENCE,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        reviews: RateLimiter | None = None,
        reviews_at_once: int = REVIEWS_AT_ONCE,
    ) -> None:
        self._api = api
        self._audience = audience
        self._clock, self._wall_clock = clock, wall_clock
        self._accepted: TtlCache[bytes, Identity] = TtlCache(ACCEPTED_TTL_SECONDS, CACHE_ENTRIES, clock)
        self._refused: TtlCache[bytes, Unauthenticated] = TtlCache(REFUSED_TTL_SECONDS, REFUSED_CACHE_ENTRIES, clock)
        self._known_pods: TtlCache[str, bool] = TtlCache(KNOWN_POD_SECONDS, CACHE_ENTRIES, clock)
        self._shared = ReviewBudget(
            reviews or RateLimiter(REVIEW_RATE_PER_SECOND, REVIEW_BURST, clock=clock), reviews_at_once
        )
        self._pod_reviews = RateLimiter(KNOWN_POD_REVIEW_RATE_PER_SECOND, KNOWN_POD_REVIEW_BURST, clock=clock)

    async def __call__(self, token: str) -> Identity:
        """The pod identity of `token`; raise Unauthenticated, Forbidden, Busy or Unavailable."""
        key = token_key(token)
        unreviewed = prometheus.TOKENS_UNREVIEWED
        if (cached := self._accepted.get(key)) is not None:
            unreviewed.labels("cache").inc()
            return cached
        if (refused := self._refused.get(key)) is not None:
            unreviewed.labels("cache").inc()
            raise refused
        try:
            claims = token_claims(token, self._audience, self._wall_clock())
        except Unauthenticated as exc:
            unreviewed.labels("shape").inc()
            self._refused.put(key, exc)
            raise
        uid = claimed_pod_uid(claims)
        if self._known_pods.get(uid) and not self._pod_reviews.acquire(uid):
            identity = await self._review(key, token)
        else:  # within the budget shared by the pods that have not had a token accepted lately
            try:
                async with self._shared.spend():
                    identity = await self._review(key, token)
            except Busy:  # over the budget: refused before any review (`_review` raises no Busy)
                unreviewed.labels("budget").inc()
                raise
        self._known_pods.put(identity.pod_uid, True)
        # Never trust the cache past the token's own expiry.
        self._accepted.put(key, identity, until=self._clock() + claims["exp"] - self._wall_clock())
        return identity

    async def _review(self, key: bytes, token: str) -> Identity:
        prometheus.TOKEN_REVIEWS.inc()
        status = await token_review(self._api, token, [self._audience])
        try:
            return identity_from_review(status, self._audience)
        except Unauthenticated as exc:
            self._refused.put(key, exc)
            raise


class PodAuthoriser:
    """Allow a token's pod to report only for the job whose Ray head (or, running its own code, worker) it is
    (`ray_pod_of_job`)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        ttl: float = ACCEPTED_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._serialize = api.sanitize_for_serialization
        self._cache: TtlCache[tuple[str, str, str], bool] = TtlCache(ttl, CACHE_ENTRIES, clock)

    async def __call__(self, identity: Identity, job: Mapping[str, Any]) -> None:
        """Return when `identity` may write `job`'s progress; raise Forbidden or Unavailable otherwise."""
        meta, status = job.get("metadata") or {}, job.get("status") or {}
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        if identity.namespace != namespace:
            raise Forbidden("token is for another namespace")
        key = (identity.pod_uid, str(meta.get("uid", "")), status.get("rayClusterName") or "")
        if self._cache.get(key):
            return
        pod = self._serialize(await self._read("pod", self._core.read_namespaced_pod(identity.pod_name, namespace)))
        if (pod.get("metadata") or {}).get("uid") != identity.pod_uid:
            raise Forbidden("token's pod was replaced")
        cluster = _controller(pod, RAYCLUSTER_KIND).get("name")
        if not cluster:
            raise Forbidden("token's pod is not controlled by a RayCluster")
        raycluster = await self._read("RayCluster", self._ray(namespace, RAYCLUSTER_PLURAL, cluster))
        rayjob_name = status.get("rayJobName") or rayjob_name_of(name)
        rayjob = await self._read("RayJob", self._ray(namespace, RAYJOB_PLURAL, rayjob_name))
        if (why := ray_pod_of_job(pod, raycluster, rayjob, job)) is not None:
            raise Forbidden(why)
        self._cache.put(key, True)

    def _ray(self, namespace: str, plural: str, name: str) -> Any:
        return self._custom.get_namespaced_custom_object(RAYJOB_GROUP, RAYJOB_VERSION, namespace, plural, name)

    @staticmethod
    async def _read(what: str, call: Any) -> Any:
        """An object the chain needs; Forbidden when it does not exist."""
        try:
            return await checked(f"{what} lookup", call, passing=(404,))
        except ApiException:
            raise Forbidden(f"no such {what} for this token") from None

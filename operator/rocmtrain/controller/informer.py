"""List-then-watch of one kind of object, kept in memory as small views, with coalesced change handling.

The operator's own informer, rather than kopf's watches, for what it follows beyond
its jobs (RayJobs, the Ray pods, Kueue's Workloads):

- a label selector narrows what the API server sends (kopf filters labels on our side);
- a 404 or 403 means "not served" (KubeRay's or Kueue's CRD is not installed, or
  removed at run time) or "not allowed": the informer forgets what it had, waits and
  lists again, instead of stopping the operator as kopf does on a 404;
- only a view of each object (`view(obj)`, None to skip one) stays in memory;
- objects are grouped (`group(view)`: by default each object is its own group; the Ray
  pods are grouped by job), and each change is handed to `handle(kind, view)` one group
  at a time, latest first: changes of a group that arrive while its previous one is
  handled are coalesced into the last;
- a change whose handling fails (the job's status write did not go through) is handed
  over again after a backoff, unless a newer change of its group came meanwhile, so a
  job's status never stays stale until the object happens to change again;
- the watch is supervised: an unexpected exception (a bug in a view function, say) is
  logged with its traceback, counted (`rocmtrain_watch_restarts_total{watch}`), and
  the watch lists again after a capped back-off with jitter; `healthy()` is False once
  it keeps failing for longer than its `RestartPolicy` allows (`supervision`).

Each informer holds one long request per watched namespace (one in all when it watches
every namespace); the operator gives its informers an API client of their own, so that
they never take the reconciler's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.errors import ApiError
from rocmtrain.controller.supervision import DEFAULT_RESTART, RestartPolicy, Supervision, capped_backoff
from rocmtrain.metrics import prometheus

Key = tuple[str, str]
View = dict[str, Any]
Handler = Callable[[str, View], Awaitable[None]]
# lister(namespace or None for all, **query): the raw (not preloaded) response of a list or watch request.
Lister = Callable[..., Awaitable[Any]]

logger = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the server closes each watch after this; the watch resumes from its resourceVersion
ERROR_BACKOFF_SECONDS = 1.0
HANDLING_BACKOFF_MAX_SECONDS = 30.0
HANDLERS_AT_ONCE = 16
NOT_SERVED = frozenset({403, 404})


class _Expired(ApiError):
    """The watch's resourceVersion is too old (410): list again."""


def object_key(view: Mapping[str, Any]) -> Key:
    return view["metadata"]["namespace"], view["metadata"]["name"]


def custom_objects(
    api: client.ApiClient, group: str, version: str, plural: str, *, label_selector: str | None = None
) -> Lister:
    """The list (and watch) call of a namespaced custom resource."""
    objects = client.CustomObjectsApi(api)
    selector: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}

    async def call(namespace: str | None, **options: Any) -> Any:
        if namespace is None:
            return await objects.list_cluster_custom_object(group, version, plural, **selector, **options)
        return await objects.list_namespaced_custom_object(group, version, namespace, plural, **selector, **options)

    return call


def pods(api: client.ApiClient, *, label_selector: str) -> Lister:
    """The list (and watch) call of the pods with `label_selector`."""
    core = client.CoreV1Api(api)

    async def call(namespace: str | None, **options: Any) -> Any:
        if namespace is None:
            return await core.list_pod_for_all_namespaces(label_selector=label_selector, **options)
        return await core.list_namespaced_pod(namespace, label_selector=label_selector, **options)

    return call


async def _checked(response: Any) -> Any:
    """The raw response, or ApiException for a non-2xx status (raw responses do not raise by themselves)."""
    if not 200 <= response.status <= 299:
        async with response:
            raise ApiException(status=response.status, reason=(await response.text())[:200])
    return response


class Informer:
    """The views of the objects one lister returns, in memory and as a stream of changes (see module doc)."""

    def __init__(
        self,
        lister: Lister,
        view: Callable[[Mapping[str, Any]], View | None],
        handle: Handler,
        *,
        what: str,
        group: Callable[[View], Key | None] = object_key,
        namespaces: Iterable[str] = (),
        missing_retry_seconds: float = 30.0,
        restart: RestartPolicy = DEFAULT_RESTART,
    ) -> None:
        self._lister = lister
        self._view = view
        self._handle = handle
        self.what = what
        self._group = group
        self._namespaces: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._missing_retry = missing_retry_seconds
        self._supervision = {namespace: Supervision(restart) for namespace in self._namespaces}
        self.views: dict[Key, View] = {}
        self._groups: dict[Key, dict[Key, View]] = {}
        self._pending: dict[Key, tuple[str, View]] = {}
        self._workers: dict[Key, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(HANDLERS_AT_ONCE)
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        """Start watching (in the background)."""
        self._task = asyncio.create_task(self._run_all(), name=f"{self.what} watch")

    async def stop(self) -> None:
        """Stop watching and handling."""
        tasks = [t for t in (self._task, *self._workers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def healthy(self) -> bool:
        """False when a watch loop keeps failing unexpectedly (see `supervision`)."""
        return all(supervision.healthy() for supervision in self._supervision.values())

    def members(self, group: Key) -> list[View]:
        """The current views of one group."""
        return list(self._groups.get(group, {}).values())

    # ---- list and watch ---------------------------------------------------------------

    async def _run_all(self) -> None:
        await asyncio.gather(*(self._run(namespace) for namespace in self._namespaces))

    async def _run(self, namespace: str | None) -> None:
        where = namespace or "all namespaces"
        missing = False
        while True:
            try:
                version = await self._list(namespace)
                if missing:
                    logger.info("%s are served again (%s); watching", self.what, where)
                missing = False
                while True:
                    version = await self._watch(namespace, version)
            except _Expired:
                continue
            except ApiException as exc:
                what, status = self.what, exc.status
                if status not in NOT_SERVED:
                    logger.warning("%s watch (%s) failed: %s %s; listing again", what, where, status, exc.reason)
                    await asyncio.sleep(ERROR_BACKOFF_SECONDS)
                    continue
                if not missing:
                    retry = self._missing_retry
                    logger.warning("%s not served or not allowed (%s, %s); retry in %ss", what, where, status, retry)
                missing = True
                self._replace(namespace, [])  # a removed CRD took its objects with it
                await asyncio.sleep(self._missing_retry)
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
                logger.warning("%s watch (%s) broke: %r; listing again", self.what, where, exc)
                await asyncio.sleep(ERROR_BACKOFF_SECONDS)
            except Exception:
                delay = self._supervision[namespace].failed()
                logger.exception("%s watch (%s) failed unexpectedly; listing again in %.1fs", self.what, where, delay)
                prometheus.WATCH_RESTARTS.labels(self.what).inc()
                await asyncio.sleep(delay)

    async def _list(self, namespace: str | None) -> str:
        """List, replace the namespace's views, hand over the differences; the list's resourceVersion."""
        response = await _checked(await self._lister(namespace, _preload_content=False))
        async with response:
            listed = json.loads(await response.read())
        self._replace(namespace, [view for item in listed.get("items") or [] if (view := self._view(item)) is not None])
        return str(listed["metadata"]["resourceVersion"])

    def _replace(self, namespace: str | None, views: list[View]) -> None:
        """Make `views` the whole content of `namespace` (None: of every namespace), as events."""
        fresh = {object_key(view): view for view in views}
        for key, old in list(self.views.items()):
            if (namespace is None or key[0] == namespace) and key not in fresh:
                self._apply("DELETED", old)
        for key, view in fresh.items():
            known = self.views.get(key)
            if known != view:
                self._apply("ADDED" if known is None else "MODIFIED", view)

    async def _watch(self, namespace: str | None, version: str) -> str:
        """Follow one watch request from `version`; the last version seen when the server closes it."""
        response = await _checked(
            await self._lister(
                namespace,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                watch=True,
                _preload_content=False,
                _request_timeout=WATCH_SECONDS + 30,
            )
        )
        async with response:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = (obj.get("metadata") or {}).get("resourceVersion", version)
                if kind not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                view = self._view(obj)
                if view is not None:
                    self._apply(kind, view)
                elif object_key(obj) in self.views:  # no longer one to keep
                    self._apply("DELETED", self.views[object_key(obj)])
        return version

    # ---- hand-over ----------------------------------------------------------------------

    def _apply(self, kind: str, view: View) -> None:
        """Record a change, and have it handled (after its group's previous change, coalesced)."""
        key = object_key(view)
        group = self._group(view)
        if kind == "DELETED":
            self.views.pop(key, None)
        else:
            self.views[key] = view
        if group is None:
            return
        members = self._groups.setdefault(group, {})
        if kind == "DELETED":
            members.pop(key, None)
            if not members:
                del self._groups[group]
        else:
            members[key] = view
        self._pending[group] = (kind, view)
        if group not in self._workers:
            self._workers[group] = asyncio.create_task(self._drain(group), name=f"{self.what} {group[0]}/{group[1]}")

    async def _drain(self, group: Key) -> None:
        failures = 0
        try:
            while group in self._pending:
                kind, view = self._pending.pop(group)
                async with self._slots:
                    try:
                        await self._handle(kind, view)
                        failures = 0
                        continue
                    except Exception:
                        logger.exception("handling %s of %s %s/%s failed; retrying", kind, self.what, *group)
                failures += 1
                await asyncio.sleep(capped_backoff(failures, ERROR_BACKOFF_SECONDS, HANDLING_BACKOFF_MAX_SECONDS))
                self._pending.setdefault(group, (kind, view))  # a newer change, if one came, replaces it
        finally:
            self._workers.pop(group, None)

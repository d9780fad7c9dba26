"""List-then-watch of the RayJobs the operator made: an informer that survives KubeRay's CRD going away.

kopf treats a 404 on a watch as fatal, and a CRD deleted at run time produces one
(the API server's discovery lags the deletion), so the RayJobs are watched here
instead: a 404 means "KubeRay is not installed"; the watch waits and lists again.

The watch keeps a small view of every RayJob (`rayjob_view`) for the stall loop,
and hands each change to `handle`, one object at a time, latest state first:
events for a RayJob that arrive while its previous one is handled are coalesced.
A change whose handling fails (the job's status write did not go through) is
handed over again after a backoff, unless a newer change of the RayJob came meanwhile,
so a job's status never stays stale until the RayJob happens to change again.
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

from rocmtrain.kube import RAYJOBS
from rocmtrain.objects import rayjob_view

Key = tuple[str, str]
Handler = Callable[[str, dict[str, Any]], Awaitable[None]]

logger = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the server closes each watch after this; the watch resumes from its resourceVersion
ERROR_BACKOFF_SECONDS = 1.0
HANDLING_BACKOFF_MAX_SECONDS = 30.0
HANDLERS_AT_ONCE = 16


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def _key(view: Mapping[str, Any]) -> Key:
    return view["metadata"]["namespace"], view["metadata"]["name"]


class RayJobWatch:
    """The operator's RayJobs (selected by label), in memory and as a stream of changes."""

    def __init__(
        self,
        api: client.ApiClient,
        handle: Handler,
        *,
        label_selector: str,
        namespaces: Iterable[str] = (),
        missing_retry_seconds: float = 30.0,
    ) -> None:
        self._objects = client.CustomObjectsApi(api)
        self._handle = handle
        self._selector = label_selector
        self._namespaces: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._missing_retry = missing_retry_seconds
        self.views: dict[Key, dict[str, Any]] = {}
        self._pending: dict[Key, tuple[str, dict[str, Any]]] = {}
        self._workers: dict[Key, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(HANDLERS_AT_ONCE)
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        """Start watching (in the background)."""
        self._task = asyncio.create_task(self._run_all(), name="RayJob watch")

    async def stop(self) -> None:
        """Stop watching and handling."""
        tasks = [t for t in (self._task, *self._workers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The current view of one RayJob, or None."""
        return self.views.get((namespace, name))

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
                    logger.info("RayJobs are served again (%s); watching", where)
                missing = False
                while True:
                    version = await self._watch(namespace, version)
            except _Expired:
                continue
            except ApiException as exc:
                if exc.status != 404:
                    logger.warning("RayJob watch (%s) failed: %s %s; listing again", where, exc.status, exc.reason)
                    await asyncio.sleep(ERROR_BACKOFF_SECONDS)
                    continue
                if not missing:
                    logger.warning("RayJobs not served (KubeRay missing?); retry in %ss", self._missing_retry)
                missing = True
                self._replace(namespace, [])  # the CRD took its objects with it
                await asyncio.sleep(self._missing_retry)
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
                logger.warning("RayJob watch (%s) broke: %r; listing again", where, exc)
                await asyncio.sleep(ERROR_BACKOFF_SECONDS)

    async def _list(self, namespace: str | None) -> str:
        """List the RayJobs, replace the namespace's views, hand over the differences; the list's version."""
        listed = await self._list_call(namespace)
        self._replace(namespace, [rayjob_view(item) for item in listed.get("items", [])])
        return listed["metadata"]["resourceVersion"]

    async def _list_call(self, namespace: str | None, **options: Any) -> Any:
        """The labelled list (or, with `watch=True`, watch) request, cluster-wide or in `namespace`."""
        if namespace is None:
            return await self._objects.list_cluster_custom_object(
                RAYJOBS.group, RAYJOBS.version, RAYJOBS.plural, label_selector=self._selector, **options
            )
        return await self._objects.list_namespaced_custom_object(
            RAYJOBS.group, RAYJOBS.version, namespace, RAYJOBS.plural, label_selector=self._selector, **options
        )

    def _replace(self, namespace: str | None, views: list[dict[str, Any]]) -> None:
        """Make `views` the whole content of `namespace` (None: of every namespace), as events."""
        fresh = {_key(view): view for view in views}
        for key, old in list(self.views.items()):
            if (namespace is None or key[0] == namespace) and key not in fresh:
                self._apply("DELETED", old)
        for key, view in fresh.items():
            known = self.views.get(key)
            if known != view:
                self._apply("ADDED" if known is None else "MODIFIED", view)

    async def _watch(self, namespace: str | None, version: str) -> str:
        """Follow one watch request from `version`; the last version seen when the server closes it."""
        response = await self._list_call(
            namespace,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            watch=True,
            _preload_content=False,
            _request_timeout=WATCH_SECONDS + 30,
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
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(kind, rayjob_view(obj))
        return version

    # ---- hand-over ----------------------------------------------------------------------

    def _apply(self, kind: str, view: dict[str, Any]) -> None:
        """Record a change, and have it handled (after the object's previous change, coalesced)."""
        key = _key(view)
        if kind == "DELETED":
            self.views.pop(key, None)
        else:
            self.views[key] = view
        self._pending[key] = (kind, view)
        if key not in self._workers:
            self._workers[key] = asyncio.create_task(self._drain(key), name=f"RayJob {key[0]}/{key[1]}")

    async def _drain(self, key: Key) -> None:
        failures = 0
        try:
            while key in self._pending:
                kind, view = self._pending.pop(key)
                async with self._slots:
                    try:
                        await self._handle(kind, view)
                        failures = 0
                        continue
                    except Exception:
                        logger.exception("handling %s of RayJob %s/%s failed; retrying", kind, *key)
                failures += 1
                await asyncio.sleep(min(HANDLING_BACKOFF_MAX_SECONDS, ERROR_BACKOFF_SECONDS * 2 ** (failures - 1)))
                self._pending.setdefault(key, (kind, view))  # a newer change, if one came, replaces it
        finally:
            self._workers.pop(key, None)

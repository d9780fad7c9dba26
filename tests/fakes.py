"""Small stand-ins shared by the pure tests: the API server's merge patch, a clock set by hand, a progress sink
that keeps what it gets, and an API client whose requests a local server answers (for the review APIs)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7396 JSON merge patch, as the API server applies it (`null` deletes a key)."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = merge_patch(out.get(key) or {}, value)
        else:
            out[key] = value
    return out


class Sent:
    """A progress sink (the driver's `Sink`, the SDK's operator sink) that keeps every report it gets."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def emit(self, report: Any) -> None:
        self.reports.append(report)

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing to close."""


class Clock:
    """A monotonic clock that moves only when a test sets `now`."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def api_answering(
    posts: Mapping[str, Callable[[web.Request], Awaitable[web.Response]]],
) -> AsyncIterator[client.ApiClient]:
    """An API client whose POSTs to the paths of `posts` a local server answers with their handlers."""
    app = web.Application()
    for path, handler in posts.items():
        app.router.add_post(path, handler)
    async with TestServer(app) as server:
        api = client.ApiClient(client.Configuration(host=str(server.make_url(""))))
        try:
            yield api
        finally:
            await api.close()

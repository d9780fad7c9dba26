"""The operator's Kubernetes client (`rocmtrain.kube.client`): every request has a deadline."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from kubernetes_asyncio import client

from rocmtrain.kube.client import TimedApiClient


def test_every_request_of_the_operators_clients_has_a_deadline():
    """kubernetes_asyncio sends requests without one: an API server that never answers would hold the caller."""

    async def scenario() -> float:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)  # accepts the connection, reads nothing, answers nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
        api = TimedApiClient(configuration, aiohttp.ClientTimeout(total=0.5))
        start = asyncio.get_running_loop().time()
        try:
            with pytest.raises(TimeoutError):
                await client.CoreV1Api(api).list_namespace()
            return asyncio.get_running_loop().time() - start
        finally:
            await api.close()
            server.close()

    assert asyncio.run(scenario()) < 5

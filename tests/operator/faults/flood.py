"""Flood the progress endpoint with requests that carry no valid token: `python -m faults.flood URL OUT`.

Runs until SIGTERM, from several loopback source addresses (127.0.0.2, 127.0.0.3, ...: one
attacker or many), over keep-alive connections, at about `RATE` requests a second (the test
shares two cores with the operator and the API server: a flood that only loads the machine
would measure the machine), cycling through three kinds of junk:
no token, a token that is not a JWT, and a forged JWT for the right audience with a
future expiry (what only a TokenReview can refuse). Writes the count of answers by
HTTP status to OUT (JSON) every second and at the end. Certificates are not checked:
an attacker does not care.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import ssl
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import aiohttp

from rocmtrain.api.contract import PROGRESS_AUDIENCE

SOURCES = 16
CONNECTIONS_PER_SOURCE = 1
RATE = 150.0
BODY = json.dumps({"progress": {"step": 1}}).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged_token() -> str:
    claims = {"aud": [PROGRESS_AUDIENCE], "exp": int(time.time()) + 3600, "sub": f"x:{uuid.uuid4()}"}
    return ".".join((_b64(b'{"alg":"RS256"}'), _b64(json.dumps(claims).encode()), _b64(uuid.uuid4().bytes)))


def headers(turn: int) -> dict[str, str]:
    kind = turn % 3
    if kind == 0:
        return {}
    if kind == 1:
        return {"Authorization": f"Bearer junk-{uuid.uuid4().hex}"}
    return {"Authorization": f"Bearer {forged_token()}"}


async def worker(url: str, source: str, counts: Counter[str], stop: asyncio.Event) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connector = aiohttp.TCPConnector(ssl=context, local_addr=(source, 0), limit=1)
    interval = SOURCES * CONNECTIONS_PER_SOURCE / RATE
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:
        turn, due = 0, time.monotonic()
        while not stop.is_set():
            turn, due = turn + 1, due + interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            try:
                async with session.post(url, data=BODY, headers=headers(turn)) as response:
                    await response.read()
                    counts[str(response.status)] += 1
            except (aiohttp.ClientError, TimeoutError, OSError):
                counts["error"] += 1
                await asyncio.sleep(0.05)


async def main(url: str, out: Path) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    counts: Counter[str] = Counter()
    sources = [f"127.0.0.{2 + i}" for i in range(SOURCES)]
    tasks = [
        asyncio.create_task(worker(url, source, counts, stop))
        for source in sources
        for _ in range(CONNECTIONS_PER_SOURCE)
    ]
    while not stop.is_set():
        out.write_text(json.dumps(counts))
        await asyncio.wait([asyncio.create_task(stop.wait())], timeout=1.0)
    await asyncio.gather(*tasks, return_exceptions=True)
    out.write_text(json.dumps(counts))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))

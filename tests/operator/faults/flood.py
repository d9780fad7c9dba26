"""Flood the progress endpoint with requests that carry no valid token: `python -m faults.flood URL OUT`.

Runs until SIGTERM, from several loopback source addresses (127.0.0.2, 127.0.0.3, ...: one
attacker or many), over keep-alive connections, at about `RATE` requests a second (the test
shares two cores with the operator and the API server: a flood that only loads the machine
would measure the machine), cycling through four kinds of junk (`KINDS`): no token, a token
that is not a JWT, a forged JWT for the right audience with a future expiry (what only a
TokenReview can refuse), new every time, and one such forgery per source sent again and again
(once reviewed, what the cache refuses). Writes the answers to OUT (JSON) every second and at
the end, by kind and answer: the HTTP status and the endpoint's reason, as
`{"forged": {"401 token not accepted": 9, "429 busy": 3, "error": 1}}`. Certificates are not
checked: an attacker does not care. `flooding` runs it beside a block of code.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp

from rocmtrain.api.contract import PROGRESS_AUDIENCE
from rocmtrain_testworld.processes import die_with_parent

SOURCES = 16
CONNECTIONS_PER_SOURCE = 1
RATE = 150.0
BODY = json.dumps({"progress": {"step": 1}}).encode()
KINDS = ("none", "forged", "junk", "forged", "replayed")  # two in five new forgeries: over the review budget
# The answers so far, by kind and answer ("401 token not accepted", "error").
Answers = dict[str, dict[str, int]]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged_token() -> str:
    claims = {"aud": [PROGRESS_AUDIENCE], "exp": int(time.time()) + 3600, "sub": f"x:{uuid.uuid4()}"}
    return ".".join((_b64(b'{"alg":"RS256"}'), _b64(json.dumps(claims).encode()), _b64(uuid.uuid4().bytes)))


def headers(kind: str, replayed: str) -> dict[str, str]:
    """The Authorization header of one request of `kind`; `replayed`: the forgery this source sends again."""
    if kind == "none":
        return {}
    if kind == "junk":
        return {"Authorization": f"Bearer junk-{uuid.uuid4().hex}"}
    return {"Authorization": f"Bearer {replayed if kind == 'replayed' else forged_token()}"}


def answer(status: int, body: bytes) -> str:
    """An answer as counted: its HTTP status and the endpoint's reason (`{"error": reason}`)."""
    try:
        reason = json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        reason = ""
    return f"{status} {reason}".strip()


async def worker(url: str, source: str, counts: dict[str, Counter[str]], stop: asyncio.Event) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connector = aiohttp.TCPConnector(ssl=context, local_addr=(source, 0), limit=1)
    interval = SOURCES * CONNECTIONS_PER_SOURCE / RATE
    replayed = forged_token()
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:
        turn, due = 0, time.monotonic()
        while not stop.is_set():
            turn, due = turn + 1, due + interval
            kind = KINDS[turn % len(KINDS)]
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            try:
                async with session.post(url, data=BODY, headers=headers(kind, replayed)) as response:
                    counts[kind][answer(response.status, await response.read())] += 1
            except (aiohttp.ClientError, TimeoutError, OSError):
                counts[kind]["error"] += 1
                await asyncio.sleep(0.05)


def _write(out: Path, counts: dict[str, Counter[str]]) -> None:
    """Write the answers so far at once (a reader never sees half a file)."""
    part = out.with_name(out.name + ".part")
    part.write_text(json.dumps(counts))
    part.replace(out)


async def main(url: str, out: Path) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    counts: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
    sources = [f"127.0.0.{2 + i}" for i in range(SOURCES)]
    tasks = [
        asyncio.create_task(worker(url, source, counts, stop))
        for source in sources
        for _ in range(CONNECTIONS_PER_SOURCE)
    ]
    while not stop.is_set():
        _write(out, counts)
        await asyncio.wait([asyncio.create_task(stop.wait())], timeout=1.0)
    await asyncio.gather(*tasks, return_exceptions=True)
    _write(out, counts)


def sent(answers: Answers) -> int:
    """How many requests were answered (or failed) in all."""
    return sum(sum(by_answer.values()) for by_answer in answers.values())


@contextlib.contextmanager
def flooding(url: str, out: Path) -> Iterator[Callable[[], Answers]]:
    """The flood, in a process of its own, while the block runs; yields a reader of its answers so far.

    On leaving the block the flood stops (SIGTERM) and writes its final answers.
    """
    flood = subprocess.Popen(
        [sys.executable, "-m", "faults.flood", url, str(out)],
        cwd=Path(__file__).resolve().parents[1],  # `python -m` finds faults.flood in its working folder
        preexec_fn=die_with_parent,
    )

    def answers() -> Answers:
        return json.loads(out.read_text()) if out.is_file() else {}

    try:
        yield answers
        flood.send_signal(signal.SIGTERM)
        flood.wait(30)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))

"""The operator sink: progress reports pushed to the operator's HTTPS endpoint.

The operator sets three variables on the Ray head (where the driver runs), named in
`rocmtrain.api.contract`: `ROCMTRAIN_PROGRESS_URL`, `ROCMTRAIN_PROGRESS_CA` (CA bundle
file) and `ROCMTRAIN_PROGRESS_TOKEN` (projected service-account token file, audience
`rocmtrain.dev/progress`). `from_env` builds the sink from them. `rocmtrain run` serves
the same endpoint on the loopback address, over plain HTTP with a token of its own and
no CA: the one place the URL may be http.

Training never waits for the operator: `emit` only appends to a bounded queue
that drops its oldest reports, and one background thread sends them in order,
spaced to the endpoint's rate, with short timeouts and capped exponential
backoff. The token and CA files are read again for every send, since projected
tokens rotate. `close` gives the last reports a few seconds to go out.
Only the standard library is used, so the image needs no new dependency.
"""

from __future__ import annotations

import collections
import http.client
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from email.message import Message
from pathlib import Path
from typing import Any

from rocmtrain.api.contract import PROGRESS_CA_ENV, PROGRESS_RATE_PER_SECOND, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV
from rocmtrain.api.models import ProgressReport

log = logging.getLogger(__name__)

QUEUE_LENGTH = 64
TIMEOUT_SECONDS = 5.0
# Sends are spaced to the endpoint's rate per job, so a backlog never runs into 429s.
MIN_INTERVAL_SECONDS = 1.0 / PROGRESS_RATE_PER_SECOND
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
ATTEMPTS_PER_REPORT = 5
CLOSE_TIMEOUT_SECONDS = 10.0
# Answers worth another try: the token may be mid-rotation (401), the rate or
# the API server may be busy (429, 5xx).
RETRY_STATUSES = frozenset({401, 408, 429, 500, 502, 503, 504})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def is_loopback_http(url: str) -> bool:
    """Whether `url` is plain HTTP to this machine's loopback address (`rocmtrain run`'s endpoint)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: the bearer token must not travel to another address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _retry_after(headers: Message | None) -> float:
    try:
        return max(0.0, float((headers or Message()).get("Retry-After", 0)))
    except ValueError:
        return 0.0


class HttpSink:
    """Send `ProgressReport`s to the progress endpoint from a background thread."""

    def __init__(
        self,
        url: str,
        ca_file: str | Path | None,
        token_file: str | Path,
        *,
        queue_length: int = QUEUE_LENGTH,
        timeout: float = TIMEOUT_SECONDS,
        min_interval: float = MIN_INTERVAL_SECONDS,
        close_timeout: float = CLOSE_TIMEOUT_SECONDS,
    ) -> None:
        if not (url.startswith("https://") and ca_file is not None) and not is_loopback_http(url):
            raise ValueError("the progress URL must be https with a CA bundle (http only to the loopback address)")
        self.url = url
        self.ca_file = Path(ca_file) if ca_file is not None else None
        self.token_file = Path(token_file)
        self.timeout = timeout
        self.min_interval = min_interval
        self.close_timeout = close_timeout
        self.sent = 0
        self.dropped = 0
        self._queue: collections.deque[bytes] = collections.deque(maxlen=queue_length)
        self._pending = 0  # reports queued or being sent
        self._cond = threading.Condition()
        self._closed = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="rocmtrain-progress-sink", daemon=True)
        self._thread.start()

    def emit(self, report: ProgressReport) -> None:
        """Queue a report; never blocks on the network and never raises for it."""
        body = report.model_dump_json(by_alias=True, exclude_none=True).encode()
        with self._cond:
            if self._closed:
                return
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            else:
                self._pending += 1
            self._queue.append(body)
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (`close_timeout` by default) until every queued report is sent or
        dropped; whether it came to that."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, self.close_timeout if timeout is None else timeout)

    def close(self) -> None:
        """Stop accepting reports and wait up to `close_timeout` seconds for the queue to drain."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            log.warning("progress endpoint: reports still undelivered at shutdown")

    # ---- the sending thread ---------------------------------------------------------

    def _next(self) -> bytes | None:
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._closed)
            return self._queue.popleft() if self._queue else None

    def _run(self) -> None:
        failures = 0
        last_send = -self.min_interval
        while (body := self._next()) is not None:
            failures, last_send = self._deliver(body, failures, last_send)
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _deliver(self, body: bytes, failures: int, last_send: float) -> tuple[int, float]:
        """Send one report, spaced from the last send and retried; (failures in a row, time of the last send)."""
        for attempt in range(1, ATTEMPTS_PER_REPORT + 1):
            time.sleep(max(0.0, last_send + self.min_interval - time.monotonic()))
            last_send = time.monotonic()
            retry_after = self._send(body)
            if retry_after is None:
                return 0, last_send
            failures += 1
            if attempt == ATTEMPTS_PER_REPORT:
                break
            backoff = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (failures - 1))
            time.sleep(max(backoff, retry_after))
        self._count_drop()
        return failures, last_send

    def _send(self, body: bytes) -> float | None:
        """POST one report: None when done with it (sent, or refused for good), else seconds to wait."""
        try:
            token = self.token_file.read_text().strip()
            handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({}), _NoRedirect()]
            if self.ca_file is not None:
                handlers.append(
                    urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(self.ca_file)))
                )
            opener = urllib.request.build_opener(*handlers)
            request = urllib.request.Request(  # noqa: S310 - the URL is checked: https, or http to the loopback
                self.url,
                data=body,
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with opener.open(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in RETRY_STATUSES:
                self._report_failure(f"HTTP {exc.code}")
                return _retry_after(exc.headers)
            log.warning("progress endpoint refused a report with HTTP %d; dropping it", exc.code)
            self._count_drop()
            return None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self._report_failure(type(exc).__name__)
            return 0.0
        self.sent += 1
        if self._failing:
            self._failing = False
            log.info("progress endpoint reachable again")
        return None

    def _count_drop(self) -> None:
        with self._cond:
            self.dropped += 1

    def _report_failure(self, what: str) -> None:
        if not self._failing:
            self._failing = True
            log.warning("progress endpoint unavailable (%s); training continues, reports will be retried", what)


def from_env(environ: Mapping[str, str] | None = None) -> HttpSink | None:
    """The sink configured by the operator's environment variables, or None when they are unset or unusable."""
    env = os.environ if environ is None else environ
    url, ca_file, token_file = env.get(PROGRESS_URL_ENV), env.get(PROGRESS_CA_ENV), env.get(PROGRESS_TOKEN_ENV)
    if not (url and token_file and (ca_file or is_loopback_http(url))):
        return None
    try:
        return HttpSink(url, ca_file, token_file)
    except ValueError as exc:  # progress reporting is never worth failing the training for
        log.warning("progress reporting off: %s", exc)
        return None

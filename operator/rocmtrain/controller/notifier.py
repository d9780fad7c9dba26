"""Delivers phase notifications (`rocmtrain.status.notifications`); a reconcile never waits on a receiver.

`Notifier.notify` is synchronous: it works out the notices of one status write and puts them on a
bounded queue (at most `QUEUE_SIZE` notices waiting or due for another try; more are dropped, and
logged), within the job's rate (`RATE_PER_MINUTE`, bursts of `BURST`). `SENDERS` tasks take them
off: each reads the target's Secret (its URL and signing key, never kept, logged or written
anywhere), POSTs the body with a deadline, and on no answer, a 5xx, 408 or 429 schedules another
try after the back-off of `retry_delay`. A slow receiver holds one sender for at most
`REQUEST_TIMEOUT_SECONDS`.

Each receiver's last notice and its state (Pending, Delivered, Failed) are written into the job's
`status.notifications` before its first try and after its last, so delivery is at least once per
notice across operator restarts too: `resume` queues again, once per job after a start, the notices
its status holds as Pending, rebuilt from its status then, with their delivery ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import DeliveryState
from rocmtrain.controller.settings import DefaultNotification
from rocmtrain.kube.client import API_ERRORS, error_message
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.status import notifications
from rocmtrain.status.notifications import DELIVERY_HEADER, SIGNATURE_HEADER, Notice, Target

# Notices waiting (or scheduled for another try) across all jobs.
QUEUE_SIZE = 1000
# Deliveries in flight at once: a slow receiver holds one of them.
SENDERS = 4
REQUEST_TIMEOUT_SECONDS = 10.0
# Per job: notices sent on average, and in a burst; more are dropped (and logged).
RATE_PER_MINUTE = 10
BURST = 10
_URL = re.compile(r"https?://\S{1,2040}")

# secret(namespace, name): the Secret's data, decoded; None when it does not exist or may not be read.
SecretReader = Callable[[str, str], Awaitable[Mapping[str, str] | None]]
# warn(job, message): post a Warning event `NotificationFailed` on the job (`Kube.post_event`, best effort).
Warn = Callable[[Mapping[str, Any], str], Awaitable[None]]
# record(job, entries): write the job's `status.notifications`.
Record = Callable[[Mapping[str, Any], list[dict[str, Any]]], Awaitable[None]]
# Jobs whose notification states are remembered (the most recent ones).
TRACKED_JOBS = 4096

logger = logging.getLogger(__name__)


class Unusable(ConfigError):
    """A target's Secret or its keys are missing or wrong (the message names the Secret and key, never a value)."""


@dataclass
class Delivery:
    """One notice to one target: the bytes to send, and how many tries it has had."""

    job: str  # namespace/name, for logs
    ref: Mapping[str, Any]  # the job's apiVersion, kind and metadata, for its event and status
    target: Target
    notice: Notice
    body: bytes
    id: str
    attempt: int = 1
    resumed: bool = False  # queued again after a restart: its status already says Pending


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Notifier:
    """The bounded queue of notices and the tasks that send them (see the module docstring)."""

    def __init__(
        self,
        secret: SecretReader,
        default: DefaultNotification | None = None,
        *,
        warn: Warn | None = None,
        record: Record | None = None,
        queue_size: int = QUEUE_SIZE,
        senders: int = SENDERS,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        rate: RateLimiter | None = None,
        retry_scale: float = 1.0,
        now: Callable[[], dt.datetime] = _now,
    ) -> None:
        """`warn`: tells the job's owner of a notice given up; `record`: writes each notice's state into the
        job's status; `retry_scale` multiplies every back-off (tests shorten it)."""
        self._secret = secret
        self._warn = warn
        self._record = record
        # Per job uid: its status.notifications as last written, and the lock that orders those writes.
        self._states: OrderedDict[str, tuple[asyncio.Lock, list[dict[str, Any]]]] = OrderedDict()
        self._default = default
        self._default_target = (
            Target(label="default", events=default.events, signing_key_key=None) if default is not None else None
        )
        self._bound = queue_size
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._pending = 0  # queued, being sent, or scheduled for another try
        self._senders = senders
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._rate = rate or RateLimiter(RATE_PER_MINUTE / 60, BURST, max_keys=4096)
        self._retry_scale = retry_scale
        self._now = now
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.TimerHandle] = set()
        self._session: aiohttp.ClientSession | None = None

    @property
    def pending(self) -> int:
        """Notices waiting, being sent, or scheduled for another try."""
        return self._pending

    def notify(self, job: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> int:
        """Queue the notices of `job`'s status change from `old` to `new`; how many were queued. Never waits."""
        found = notifications.notices(old, new)
        if not found:
            return 0
        self._track(job)
        queued = 0
        for target in notifications.targets(job.get("spec") or {}, self._default_target):
            for notice in notifications.wanted(target, found):
                queued += self._queue_notice(job, target, notice, new, notifications.delivery_id(job, notice, new))
        return queued

    def resume(self, job: Mapping[str, Any]) -> int:
        """Queue again the notices the job's status holds as Pending, once per job after a start (an operator
        that stopped before it delivered them); how many were queued."""
        if job["metadata"]["uid"] in self._states:
            return 0
        self._track(job)
        status = job.get("status") or {}
        pending = notifications.pending(job.get("spec") or {}, status, self._default_target)
        return sum(self._queue_notice(job, target, notice, status, id, resumed=True) for target, notice, id in pending)

    def _track(self, job: Mapping[str, Any]) -> None:
        """Remember the job's status.notifications, as its status has them, unless already remembered."""
        uid = job["metadata"]["uid"]
        if uid in self._states:
            self._states.move_to_end(uid)
            return
        written = [dict(entry) for entry in (job.get("status") or {}).get("notifications") or []]
        self._states[uid] = (asyncio.Lock(), written)
        while len(self._states) > TRACKED_JOBS:
            self._states.popitem(last=False)

    def _queue_notice(
        self,
        job: Mapping[str, Any],
        target: Target,
        notice: Notice,
        status: Mapping[str, Any],
        delivery_id: str,
        *,
        resumed: bool = False,
    ) -> int:
        meta = job["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if self._rate.acquire(key) > 0:
            logger.warning("%s notification of %s to %s dropped: rate limited", notice.event, key, target.label)
            return 0
        body = notifications.encode(notifications.payload(job, notice, status, self._now()))
        ref = {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"), "metadata": meta}
        return self._offer(Delivery(key, ref, target, notice, body, delivery_id, resumed=resumed))

    def _offer(self, delivery: Delivery) -> int:
        if self._pending >= self._bound:
            logger.warning("notification of %s to %s dropped: the queue is full", delivery.job, delivery.target.label)
            return 0
        self._pending += 1
        self._queue.put_nowait(delivery)
        return 1

    def start(self) -> None:
        """Start the senders."""
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        self._tasks = [asyncio.create_task(self._send_forever(), name=f"notifier {i}") for i in range(self._senders)]

    async def stop(self) -> None:
        """Stop sending; drop what waits."""
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    async def _send_forever(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                again = await self._send(delivery)
            except Exception:
                logger.exception("notification of %s to %s failed", delivery.job, delivery.target.label)
                again = None
            if again is None:
                self._pending -= 1
            else:
                self._retry_later(delivery, again)

    def _retry_later(self, delivery: Delivery, delay: float) -> None:
        delivery.attempt += 1

        def due() -> None:
            self._timers.discard(timer)
            self._queue.put_nowait(delivery)

        timer = asyncio.get_running_loop().call_later(delay * self._retry_scale, due)
        self._timers.add(timer)

    async def _where(self, delivery: Delivery) -> tuple[str, bytes | None]:
        """The target's URL and signing key: from its Secret, or the operator's default."""
        target = delivery.target
        if target.secret is None:
            assert self._default is not None, "a target without a Secret is the default one"
            return self._default.url, self._default.signing_key
        try:
            data = await self._secret(delivery.ref["metadata"]["namespace"], target.secret)
        except API_ERRORS as exc:  # tried again, as no answer; a bug is not caught
            raise Unusable(f"Secret {target.secret} could not be read ({error_message(exc)})") from exc
        if data is None:
            raise Unusable(f"Secret {target.secret} not found or not readable")
        url = data.get(target.url_key, "").strip()
        if not _URL.fullmatch(url):
            raise Unusable(f"key {target.url_key} of Secret {target.secret} is not an http(s) URL")
        if target.signing_key_key is None:
            return url, None
        if not (key := data.get(target.signing_key_key, "")):
            raise Unusable(f"Secret {target.secret} has no key {target.signing_key_key}")
        return url, key.encode()

    async def _send(self, delivery: Delivery) -> float | None:
        """One try; the seconds before the next, or None when there is none (delivered, or given up)."""
        assert self._session is not None, "start() first"
        event, label = delivery.notice.event, delivery.target.label
        what = f"{event} notification of {delivery.job} to {label} (try {delivery.attempt})"
        if delivery.attempt == 1 and not delivery.resumed:
            await self._write(delivery, DeliveryState.PENDING)
        status: int | None = None
        problem = ""
        failure: BaseException | None = None  # why the Secret could not be read: its traceback is logged
        try:
            url, key = await self._where(delivery)
            headers = {"Content-Type": "application/json", DELIVERY_HEADER: delivery.id}
            if key is not None:
                headers[SIGNATURE_HEADER] = notifications.signature(delivery.body, key)
            async with self._session.post(url, data=delivery.body, headers=headers, allow_redirects=False) as answer:
                status = answer.status
        except Unusable as exc:
            problem, failure = str(exc), exc.__cause__
        except (aiohttp.ClientError, TimeoutError) as exc:  # its text may hold the URL: the type alone
            problem = f"no answer ({type(exc).__name__})"
        if status is not None and 200 <= status < 300:
            logger.info("%s delivered", what)
            await self._write(delivery, DeliveryState.DELIVERED)
            return None
        problem = problem or f"HTTP {status}"
        delay = notifications.retry_delay(delivery.attempt, status)
        if delay is not None:
            logger.warning("%s: %s", what, problem, exc_info=failure)
            return delay
        logger.warning("%s: %s, given up", what, problem, exc_info=failure)
        await self._write(delivery, DeliveryState.FAILED)
        if self._warn is not None:
            tries = f"{delivery.attempt} {'try' if delivery.attempt == 1 else 'tries'}"
            message = (
                f"{delivery.notice.event} notification to {delivery.target.label}: {problem}, given up after {tries}"
            )
            await self._warn(delivery.ref, message)
        return None

    async def _write(self, delivery: Delivery, state: DeliveryState) -> None:
        """Write the notice's state into the job's `status.notifications` (best effort: a failure is logged)."""
        uid = delivery.ref["metadata"]["uid"]
        if self._record is None or uid not in self._states:
            return
        lock, written = self._states[uid]
        async with lock:
            entries = notifications.recorded(written, delivery.target, delivery.notice, delivery.id, state, self._now())
            if entries == written:
                return
            try:
                await self._record(delivery.ref, entries)
            except API_ERRORS as exc:  # a bug is not caught
                logger.warning(
                    "could not record the notification state of %s: %s", delivery.job, error_message(exc), exc_info=True
                )
                return
            written[:] = entries

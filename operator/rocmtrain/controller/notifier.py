"""Delivers phase notifications (`rocmtrain.status.notifications`); a reconcile never waits on a receiver.

`Notifier.notify` is synchronous: it works out the notices of one status write and puts them on a
fair queue (`rocmtrain.controller.fair_queue`): each namespace has its own line of at most
`QUEUE_PER_NAMESPACE` notices (waiting, being sent, or due for another try), within `QUEUE_SIZE` in all,
and at most `SENDERS_PER_NAMESPACE` of the `SENDERS` tasks, taken round-robin, so one team's receivers
that never answer hold neither another team's notices nor all the senders. Each job has a rate
(`RATE_PER_MINUTE`, bursts of `BURST`). A notice that finds its namespace's line full, or its job over
its rate, is dropped: its job's `status.notifications` says Dropped, and a Warning event why.

A sender reads the target's Secret (its URL and signing key, never kept, logged or written anywhere),
resolves the URL's host and sends only when every address it resolves to is one the operator may reach
(`rocmtrain.admission.receiver_address`: not loopback, link-local, private, the cluster's networks or
the API server, unless the admin allows it). The connection's own lookup goes through the same check
(`CheckedResolver`), so it connects only to checked addresses: a second DNS answer cannot swap one in
(rebinding), and TLS is still verified against the URL's host name. It POSTs the body with a deadline;
no answer, a 5xx, 408 or 429 schedules another try after the back-off of `retry_delay`. A slow receiver
holds one sender for at most `REQUEST_TIMEOUT_SECONDS`; a receiver (URL host) that failed
`BREAKER_FAILURES` times in a row is not tried for `BREAKER_COOLDOWN_SECONDS`
(`rocmtrain.controller.receiver_breaker`).

Each receiver's last notice and its state (Pending, Delivered, Failed, Dropped) are written into the
job's `status.notifications` before its first try and after its last, so delivery is at least once per
notice across operator restarts too: `resume` queues again, once per job after a start, the notices
its status holds as Pending, rebuilt from its status then, with their delivery ids. Any error of a send
ends its notice Failed. The job's owner learns only whether a notice was delivered and a class of why
not (`DeliveryFailure`), never what answered, or how: that is a probe of the operator's network. The
operator's log keeps the detail.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import logging
import os
import re
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from rocmtrain.admission.receiver_address import Address, ReceiverRules, first_refusal
from rocmtrain.api.errors import ConfigError, InputError
from rocmtrain.api.models import DeliveryFailure, DeliveryState
from rocmtrain.controller.fair_queue import FairQueue
from rocmtrain.controller.receiver_breaker import ReceiverBreaker
from rocmtrain.controller.settings import DefaultNotification
from rocmtrain.kube.client import API_ERRORS, error_message
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.status import notifications
from rocmtrain.status.notifications import DELIVERY_HEADER, SIGNATURE_HEADER, Notice, Target

# Notices waiting (or scheduled for another try) across all jobs, and of one namespace.
QUEUE_SIZE = 1000
QUEUE_PER_NAMESPACE = 100
# Deliveries in flight at once, and of one namespace: a slow receiver holds one of them.
SENDERS = 16
SENDERS_PER_NAMESPACE = 4
REQUEST_TIMEOUT_SECONDS = 10.0
# A receiver that failed this many tries in a row is not tried for the cool-down.
BREAKER_FAILURES = 5
BREAKER_COOLDOWN_SECONDS = 60.0
# Per job: notices sent on average, and in a burst; more are dropped (Dropped in its status).
RATE_PER_MINUTE = 10
BURST = 10
# Dropped notices waiting to be written into their jobs' status (the latest per receiver of a job).
DROP_REPORTS = 256
_URL = re.compile(r"https?://\S{1,2040}")

# secret(namespace, name): the Secret's data, decoded; None when it does not exist or may not be read.
SecretReader = Callable[[str, str], Awaitable[Mapping[str, str] | None]]
# warn(job, message): post a Warning event `NotificationFailed` on the job (`Kube.post_event`, best effort).
Warn = Callable[[Mapping[str, Any], str], Awaitable[None]]
# record(job, entries): write the job's `status.notifications`.
Record = Callable[[Mapping[str, Any], list[dict[str, Any]]], Awaitable[None]]
# lookup(host, port): the addresses a host resolves to (getaddrinfo; tests give their own answers).
Lookup = Callable[[str, int], Awaitable[list[str]]]
# Jobs whose notification states are remembered (the most recent ones).
TRACKED_JOBS = 4096

logger = logging.getLogger(__name__)


class Unusable(ConfigError):
    """A target's Secret or its keys are missing or wrong (the message names the Secret and key, never a value)."""


class AddressRefused(InputError, OSError):
    """A receiver's host resolves to an address the operator may not reach (the message says its class); an
    OSError, as aiohttp expects of a resolver."""


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver that answers only addresses the rules allow, and refuses a host with any other."""

    def __init__(self, rules: ReceiverRules, lookup: Lookup = _getaddrinfo) -> None:
        self._rules, self._lookup = rules, lookup

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses `host` resolves to (any spelling: a name, `2130706433`, `0177.0.0.1`), all allowed;
        AddressRefused when one is not, OSError when there are none."""
        found = await self._lookup(host, port)
        if not found:
            raise OSError("the host resolves to no address")
        if (refused := first_refusal(found, self._rules)) is not None:
            raise AddressRefused(f"the receiver's address is refused ({refused[1]})")
        return found

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """What the connector connects to: the checked addresses, under the host's name (for TLS)."""
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in await self.addresses(host, port)
        ]

    async def close(self) -> None:
        """Nothing held."""


async def api_server_addresses(env: Mapping[str, str] = os.environ) -> list[Address]:
    """The API server's addresses, as a pod reaches it: KUBERNETES_SERVICE_HOST and what
    kubernetes.default.svc resolves to (none outside a pod)."""
    found: list[Address] = []
    if not (host := env.get("KUBERNETES_SERVICE_HOST", "").strip()):
        return found
    with contextlib.suppress(ValueError):
        found.append(ipaddress.ip_address(host))
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(5):
            found += [ipaddress.ip_address(a.split("%")[0]) for a in await _getaddrinfo("kubernetes.default.svc", 443)]
    return list(dict.fromkeys(found))


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

    @property
    def namespace(self) -> str:
        namespace: str = self.ref["metadata"]["namespace"]
        return namespace


@dataclass(frozen=True)
class _Outcome:
    """How one try went: the receiver's HTTP status (None: none), or why it was not delivered."""

    status: int | None = None
    failure: DeliveryFailure = DeliveryFailure.NOT_DELIVERED
    problem: str = ""  # for the operator's log only
    detail: str | None = None  # for the job's owner too (which of its Secret's keys cannot be used)
    retried: bool = True  # tried again (within the plan) when not delivered
    exc: BaseException | None = None  # its traceback is logged


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Notifier:
    """The fair queue of notices and the tasks that send them (see the module docstring)."""

    def __init__(
        self,
        secret: SecretReader,
        default: DefaultNotification | None = None,
        *,
        warn: Warn | None = None,
        record: Record | None = None,
        rules: ReceiverRules | None = None,
        lookup: Lookup = _getaddrinfo,
        queue_size: int = QUEUE_SIZE,
        queue_per_namespace: int = QUEUE_PER_NAMESPACE,
        senders: int = SENDERS,
        senders_per_namespace: int = SENDERS_PER_NAMESPACE,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        breaker: ReceiverBreaker | None = None,
        rate: RateLimiter | None = None,
        retry_scale: float = 1.0,
        now: Callable[[], dt.datetime] = _now,
    ) -> None:
        """`warn`: tells the job's owner of a notice given up or dropped; `record`: writes each notice's state
        into the job's status; `rules`: the receiver addresses allowed (default: public ones only);
        `retry_scale` multiplies every back-off (tests shorten it)."""
        self._secret = secret
        self._warn = warn
        self._record = record
        # Per job uid: its status.notifications as last written, and the lock that orders those writes.
        self._states: OrderedDict[str, tuple[asyncio.Lock, list[dict[str, Any]]]] = OrderedDict()
        self._default = default
        self._default_target = (
            Target(label="default", events=default.events, signing_key_key=None) if default is not None else None
        )
        self._queue: FairQueue[Delivery] = FairQueue(
            total=queue_size, per_key=queue_per_namespace, per_key_active=senders_per_namespace
        )
        self._resolver = CheckedResolver(rules or ReceiverRules(), lookup)
        self._breaker = breaker or ReceiverBreaker(BREAKER_FAILURES, BREAKER_COOLDOWN_SECONDS)
        self._dropped: OrderedDict[tuple[str, str], tuple[Delivery, DeliveryFailure]] = OrderedDict()
        self._drop_waiting = asyncio.Event()
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
        return len(self._queue)

    @property
    def drops_unreported(self) -> int:
        """Dropped notices not yet written into their jobs' status."""
        return len(self._dropped)

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
        body = notifications.encode(notifications.payload(job, notice, status, self._now()))
        ref = {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"), "metadata": meta}
        delivery = Delivery(key, ref, target, notice, body, delivery_id, resumed=resumed)
        if self._rate.acquire(key) > 0:
            return self._drop(delivery, DeliveryFailure.RATE_LIMITED, "rate limited")
        if not self._queue.offer(delivery.namespace, delivery):
            return self._drop(delivery, DeliveryFailure.QUEUE_FULL, "the queue is full")
        return 1

    def _drop(self, delivery: Delivery, failure: DeliveryFailure, why: str) -> int:
        """Log a dropped notice and keep it for its job's status and a Warning event (the latest per receiver
        of a job, at most `DROP_REPORTS`); 0, the notices queued."""
        logger.warning("%s notification of %s to %s dropped: %s", delivery.notice.event, delivery.job,
                       delivery.target.label, why)  # fmt: skip
        slot = (delivery.ref["metadata"]["uid"], delivery.target.label)
        self._dropped.pop(slot, None)
        self._dropped[slot] = (delivery, failure)
        while len(self._dropped) > DROP_REPORTS:
            (_, (lost, _)) = self._dropped.popitem(last=False)
            logger.warning("the drop of a notification of %s is not reported: too many drops", lost.job)
        self._drop_waiting.set()
        return 0

    def start(self) -> None:
        """Start the senders, and the task that reports drops."""
        connector = aiohttp.TCPConnector(resolver=self._resolver, use_dns_cache=False, force_close=True)
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        self._tasks = [asyncio.create_task(self._send_forever(), name=f"notifier {i}") for i in range(self._senders)]
        self._tasks.append(asyncio.create_task(self._report_drops(), name="notifier drops"))

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
            namespace, delivery = await self._queue.take()
            try:
                again = await self._send(delivery)
            except Exception:  # a bug in recording its state or telling its owner: the send itself ended
                logger.exception("notification of %s to %s failed", delivery.job, delivery.target.label)
                again = None
            if again is None:
                self._queue.done(namespace)
            else:
                self._queue.wait(namespace)
                self._retry_later(namespace, delivery, again)

    async def _report_drops(self) -> None:
        while True:
            await self._drop_waiting.wait()
            while self._dropped:
                (_, (delivery, failure)) = self._dropped.popitem(last=False)
                try:
                    await self._tell(delivery, DeliveryState.DROPPED, failure)
                except Exception:  # a bug: logged, the next drop is still reported
                    logger.exception("the drop of a notification of %s could not be reported", delivery.job)
            self._drop_waiting.clear()

    def _retry_later(self, namespace: str, delivery: Delivery, delay: float) -> None:
        delivery.attempt += 1

        def due() -> None:
            self._timers.discard(timer)
            self._queue.again(namespace, delivery)

        timer = asyncio.get_running_loop().call_later(delay * self._retry_scale, due)
        self._timers.add(timer)

    async def _where(self, delivery: Delivery) -> tuple[str, bytes | None]:
        """The target's URL and signing key: from its Secret, or the operator's default."""
        target = delivery.target
        if target.secret is None:
            assert self._default is not None, "a target without a Secret is the default one"
            return self._default.url, self._default.signing_key
        try:
            data = await self._secret(delivery.namespace, target.secret)
        except API_ERRORS as exc:  # tried again, as no answer; a bug is not caught
            raise Unusable(f"Secret {target.secret} could not be read") from exc
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

    async def _post(self, delivery: Delivery) -> _Outcome:
        """One try's request, within the breaker and the address rules; how it went."""
        assert self._session is not None, "start() first"
        url, key = await self._where(delivery)
        where = URL(url)
        receiver = f"{where.raw_host}:{where.port}"
        if self._breaker.is_open(receiver):
            return _Outcome(problem="not tried: the receiver failed every recent try")
        try:
            await self._resolver.addresses(where.raw_host or "", where.port or 0)
            headers = {"Content-Type": "application/json", DELIVERY_HEADER: delivery.id}
            if key is not None:
                headers[SIGNATURE_HEADER] = notifications.signature(delivery.body, key)
            async with self._session.post(where, data=delivery.body, headers=headers, allow_redirects=False) as answer:
                status = answer.status
        except AddressRefused as exc:
            return _Outcome(failure=DeliveryFailure.ADDRESS_REFUSED, problem=str(exc), retried=False)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, AddressRefused):  # the connection's own lookup answered otherwise
                return _Outcome(failure=DeliveryFailure.ADDRESS_REFUSED, problem=str(exc.os_error), retried=False)
            self._breaker.record(receiver, ok=False)
            return _Outcome(problem=f"no answer ({type(exc).__name__})")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # its text may hold the URL: the type alone
            self._breaker.record(receiver, ok=False)
            return _Outcome(problem=f"no answer ({type(exc).__name__})")
        self._breaker.record(receiver, ok=notifications.retry_delay(1, status) is None)
        return _Outcome(status=status, problem=f"HTTP {status}")

    async def _try(self, delivery: Delivery) -> _Outcome:
        """One try; any error ends as an outcome (a bug, or a URL aiohttp cannot encode: not tried again)."""
        try:
            return await self._post(delivery)
        except Unusable as exc:  # the owner is told which Secret or key; the log has the API server's error too
            cause = exc.__cause__
            problem = f"{exc} ({error_message(cause)})" if cause is not None else str(exc)
            return _Outcome(failure=DeliveryFailure.SECRET_UNUSABLE, problem=problem, detail=str(exc), exc=cause)
        except Exception as exc:  # the URL's text may be in its message: the type alone, the traceback logged
            return _Outcome(failure=DeliveryFailure.SEND_ERROR, problem=type(exc).__name__, retried=False, exc=exc)

    async def _send(self, delivery: Delivery) -> float | None:
        """One try; the seconds before the next, or None when there is none (delivered, or given up)."""
        notice, target = delivery.notice, delivery.target
        what = f"{notice.event} notification of {delivery.job} to {target.label} (try {delivery.attempt})"
        if delivery.attempt == 1 and not delivery.resumed:
            await self._write(delivery, DeliveryState.PENDING)
        outcome = await self._try(delivery)
        if outcome.status is not None and 200 <= outcome.status < 300:
            logger.info("%s delivered", what)
            await self._write(delivery, DeliveryState.DELIVERED)
            return None
        delay = notifications.retry_delay(delivery.attempt, outcome.status) if outcome.retried else None
        if delay is not None:
            logger.warning("%s: %s", what, outcome.problem, exc_info=outcome.exc)
            return delay
        logger.warning("%s: %s, given up", what, outcome.problem, exc_info=outcome.exc)
        await self._tell(delivery, DeliveryState.FAILED, outcome.failure, outcome.detail)
        return None

    async def _tell(
        self, delivery: Delivery, state: DeliveryState, failure: DeliveryFailure, detail: str | None = None
    ) -> None:
        """Record a notice not delivered, and tell its job's owner why in a Warning event (its class only)."""
        await self._write(delivery, state, failure)
        if self._warn is not None:
            await self._warn(delivery.ref, notifications.undelivered(delivery.notice, delivery.target, failure, detail))

    async def _write(self, delivery: Delivery, state: DeliveryState, failure: DeliveryFailure | None = None) -> None:
        """Write the notice's state into the job's `status.notifications` (best effort: a failure is logged)."""
        uid = delivery.ref["metadata"]["uid"]
        if self._record is None or uid not in self._states:
            return
        lock, written = self._states[uid]
        async with lock:
            entries = notifications.recorded(
                written, delivery.target, delivery.notice, delivery.id, state, self._now(), failure
            )
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

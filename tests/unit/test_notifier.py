"""Phase notifications delivered to a real HTTP receiver on loopback (`rocmtrain.controller.notifier`).

Back-offs are scaled down (`retry_scale`), so every scenario takes a fraction of a second. Loopback is
refused by default: these notifiers allow 127.0.0.0/8, as an admin allows a network
(ROCMTRAIN_NOTIFY_ALLOWED_CIDRS), unless a test checks the refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rocmtrain.admission.receiver_address import ReceiverRules, parse_networks
from rocmtrain.controller.notifier import Notifier
from rocmtrain.controller.receiver_breaker import ReceiverBreaker
from rocmtrain.controller.reconciler import JobState, Reconciler
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.serving.rate import RateLimiter
from rocmtrain.status.notifications import DELIVERY_HEADER, MAX_ATTEMPTS, SIGNATURE_HEADER

KEY = "s1gning-k3y"
TOKEN = "T0KEN-in-the-url"
RUNNING = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "reason": "Running"}]}
FAILED = {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "reason": "TrainingFailed"}]}
LOOPBACK = ReceiverRules(allowed=parse_networks("127.0.0.0/8"))


def _job(name: str, hook: str = "hooks", namespace: str = "ml", receivers: int = 1, **target: object) -> dict:
    """A job whose receivers' URL and key are in Secret `hook`."""
    ref = {"name": hook, "signingKeyKey": "key"}
    return {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}"},
        "spec": {"notifications": [{"secretRef": ref, **target}] * receivers},
        "status": {"phase": "Pending"},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Receiver:
    """An HTTP server on loopback that records each POST and answers from `answers` (then 200)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received: list[tuple[str, Mapping[str, str], bytes]] = []
        self.answers: dict[str, list[int]] = {}
        self.hold: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{TOKEN}/{path}"

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.received]

    async def _receive(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        self.received.append((path, dict(request.headers), await request.read()))
        if path in self.hold:
            await self.hold[path].wait()
        answers = self.answers.get(path) or [200]
        return web.Response(status=answers.pop(0) if len(answers) > 1 else answers[0])

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(f"/{TOKEN}/{{path}}", self._receive)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    server = Receiver(_free_port())
    yield server
    for event in server.hold.values():
        event.set()
    await server.stop()


def _secrets(receiver: Receiver, urls: Mapping[str, str] | None = None) -> Callable[[str, str], object]:
    data = {name: {"url": receiver.url(name), "key": KEY} for name in ("hooks", "slow", "fast", "gone")}
    data["bad"] = {"url": "ftp://" + TOKEN}
    data.update({name: {"url": url, "key": KEY} for name, url in (urls or {}).items()})

    async def read(namespace: str, name: str) -> Mapping[str, str] | None:
        if name == "broken":
            raise TimeoutError("the API server took too long")
        return data.get(name) if name != "missing" else None

    return read


@contextlib.asynccontextmanager
async def _notifier(
    receiver: Receiver,
    scale: float = 0.01,
    warned: list[str] | None = None,
    urls: Mapping[str, str] | None = None,
    **options: object,
) -> AsyncIterator[Notifier]:
    async def warn(job: Mapping[str, Any], message: str) -> None:
        assert job["kind"] == "RocmTrainingJob"
        (warned if warned is not None else []).append(f"{job['metadata']['name']}: {message}")

    options.setdefault("rules", LOOPBACK)
    notifier = Notifier(_secrets(receiver, urls), retry_scale=scale, warn=warn, **options)  # type: ignore[arg-type]
    notifier.start()
    try:
        yield notifier
    finally:
        await notifier.stop()


async def _until(done: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def _no_secrets_in(caplog: pytest.LogCaptureFixture) -> None:
    """The operator's log lines (the receiver's own access log aside) show neither URL nor key."""
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("rocmtrain"))
    assert text and TOKEN not in text and KEY not in text and "127.0.0.1" not in text


async def test_a_receiver_that_is_down_gets_the_notice_once_it_is_up_signed_with_the_secrets_key(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    async with _notifier(receiver) as notifier:
        assert notifier.notify(_job("bert"), {"phase": "Pending"}, RUNNING) == 1
        await _until(lambda: caplog.text.count("no answer (ClientConnectorError)") >= 2)
        await receiver.start()
        await _until(lambda: notifier.pending == 0)
    ((path, headers, body),) = receiver.received
    assert path == "hooks"
    expected = "sha256=" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers[SIGNATURE_HEADER], expected)
    document = json.loads(body)
    assert (document["event"], document["job"]["name"], document["phase"]) == ("Running", "bert", "Running")
    assert "Running" in document["text"] and len(headers[DELIVERY_HEADER]) == 32
    assert "delivered" in caplog.text
    _no_secrets_in(caplog)


async def test_a_slow_receiver_holds_neither_a_reconcile_nor_the_other_receivers(receiver: Receiver):
    receiver.hold["slow"] = asyncio.Event()
    await receiver.start()
    async with _notifier(receiver) as notifier:
        assert notifier.notify(_job("a", "slow"), {}, RUNNING) == 1
        await _until(lambda: receiver.paths() == ["slow"])

        posted: list[str] = []

        class Kube:
            async def patch_status(self, *args: object, **kwargs: object) -> dict:
                return {}

            async def post_event(self, job: object, *, reason: str, **kwargs: object) -> None:
                posted.append(reason)

        reconciler = Reconciler(Kube(), OperatorConfig(), known=lambda *_: None, notify=notifier.notify)  # type: ignore[arg-type]
        started = time.monotonic()
        for name in ("b", "c"):  # the first to the slow receiver again, the other to a fast one
            await asyncio.wait_for(
                reconciler._write(_job(name, "slow" if name == "b" else "fast"), JobState(), {}, RUNNING), 0.5
            )
        assert time.monotonic() - started < 0.2 and posted == ["Running", "Running"]
        await _until(lambda: "fast" in receiver.paths(), timeout=1.0)
        assert notifier.pending == 2, "the slow receiver still holds its two notices"
        receiver.hold["slow"].set()
        await _until(lambda: notifier.pending == 0)
    assert sorted(receiver.paths()) == ["fast", "slow", "slow"]


async def test_a_4xx_is_not_tried_again_but_429_and_5xx_are(receiver: Receiver, caplog: pytest.LogCaptureFixture):
    receiver.answers = {"hooks": [404], "fast": [429, 503, 200]}
    await receiver.start()
    warned: list[str] = []
    async with _notifier(receiver, warned=warned) as notifier:
        notifier.notify(_job("a", "hooks"), {}, RUNNING)
        notifier.notify(_job("b", "fast"), {}, RUNNING)
        await _until(lambda: notifier.pending == 0)
        await asyncio.sleep(0.05)  # several back-offs' time: nothing more comes
    assert sorted(receiver.paths()) == ["fast", "fast", "fast", "hooks"]
    assert "HTTP 404, given up" in caplog.text
    assert warned == [
        "a: Running notification to spec.notifications[0] not delivered (NotDelivered): the receiver did not take it"
    ], "the owner learns whether, never what answered"
    _no_secrets_in(caplog)


async def test_a_missing_secret_or_a_bad_url_is_logged_by_name_and_given_up_after_the_bounded_tries(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    warned: list[str] = []
    async with _notifier(receiver, scale=0.001, warned=warned) as notifier:
        notifier.notify(_job("a", "missing"), {}, RUNNING)
        notifier.notify(_job("b", "bad"), {}, RUNNING)
        notifier.notify(_job("c", "broken"), {}, RUNNING)
        await _until(lambda: notifier.pending == 0)
    assert f"(try {MAX_ATTEMPTS}): Secret missing not found or not readable, given up" in caplog.text
    broken = "Secret broken could not be read (TimeoutError: the API server took too long)"
    assert f"(try {MAX_ATTEMPTS}): {broken}, given up" in caplog.text
    unusable = "Running notification to spec.notifications[0] not delivered (SecretUnusable)"
    assert sorted(warned) == [
        f"a: {unusable}: Secret missing not found or not readable",
        f"b: {unusable}: key url of Secret bad is not an http(s) URL",
        f"c: {unusable}: Secret broken could not be read",
    ]
    _no_secrets_in(caplog)


async def test_a_secret_read_that_fails_is_logged_with_its_message_and_traceback(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    async with _notifier(receiver, scale=0.001) as notifier:
        notifier.notify(_job("c", "broken"), {}, RUNNING)
        await _until(lambda: notifier.pending == 0)
    (given_up,) = [r for r in caplog.records if r.getMessage().endswith("given up")]
    assert "could not be read (TimeoutError: the API server took too long)" in given_up.getMessage()
    assert given_up.exc_info is not None and isinstance(given_up.exc_info[1], TimeoutError)
    assert "Traceback" in caplog.text


@pytest.mark.parametrize("case", ["a bug in reading the Secret", "user info that is not Latin-1"])
async def test_any_error_of_a_send_ends_its_notice_failed_with_a_reason_and_its_traceback_logged(
    receiver: Receiver, caplog: pytest.LogCaptureFixture, case: str
):
    await receiver.start()
    records: list[list[dict[str, Any]]] = []
    warned: list[str] = []

    async def record(job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        records.append(entries)

    options: dict[str, Any] = {"urls": {"hooks": f"http://\u20ac:pw@127.0.0.1:{receiver.port}/{TOKEN}/hooks"}}
    if case == "a bug in reading the Secret":

        async def buggy(namespace: str, name: str) -> Mapping[str, str] | None:
            raise KeyError("data")

        options = {}
    async with _notifier(receiver, warned=warned, record=record, **options) as notifier:
        if not options:
            notifier._secret = buggy
        notifier.notify(_job("a"), {}, RUNNING)
        await _until(lambda: notifier.pending == 0)
    assert [(e[0]["state"], e[0].get("failure")) for e in records] == [("Pending", None), ("Failed", "SendError")]
    assert warned == [
        "a: Running notification to spec.notifications[0] not delivered (SendError): the operator could not send it"
    ]
    (failed,) = [r for r in caplog.records if r.exc_info is not None]
    assert failed.getMessage().endswith("(try 1): " + failed.exc_info[1].__class__.__name__ + ", given up")  # type: ignore[index]
    assert isinstance(failed.exc_info[1], KeyError if not options else UnicodeEncodeError)  # type: ignore[index]
    assert receiver.received == [] and "could not be read" not in caplog.text


async def test_a_state_that_cannot_be_recorded_is_logged_with_its_message_and_traceback_and_a_bug_surfaces(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    errors = [aiohttp.ClientConnectionError("the API server closed the connection"), TypeError("a bug")]

    async def record(job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        raise errors.pop(0)

    await receiver.start()
    async with _notifier(receiver, record=record) as notifier:
        notifier.notify(_job("a"), {}, RUNNING)  # Pending is not recorded, the notice is delivered, and then a bug
        await _until(lambda: notifier.pending == 0)
    unrecorded, failed = [r for r in caplog.records if r.exc_info is not None]
    assert unrecorded.getMessage() == (
        "could not record the notification state of ml/a: ClientConnectionError: the API server closed the connection"
    )
    assert failed.getMessage() == "notification of ml/a to spec.notifications[0] failed"
    assert isinstance(failed.exc_info[1], TypeError)  # type: ignore[index]
    assert len(receiver.received) == 1


async def test_the_queue_is_bounded_and_each_job_rate_limited(receiver: Receiver, caplog: pytest.LogCaptureFixture):
    notifier = Notifier(_secrets(receiver), queue_size=2, rate=RateLimiter(0.001, 1))  # not started: nothing sends
    assert notifier.notify(_job("a"), {}, RUNNING) == 1
    assert notifier.notify(_job("a"), {}, {"phase": "Succeeded"}) == 0, "rate limited"
    assert notifier.notify(_job("b"), {}, RUNNING) == 1
    assert notifier.notify(_job("c"), {}, RUNNING) == 0, "the queue is full"
    assert notifier.notify(_job("d", events=["Failed"]), {}, RUNNING) == 0, "not an event it wants"
    assert notifier.pending == 2
    assert "dropped: rate limited" in caplog.text and "dropped: the queue is full" in caplog.text


async def test_the_default_receiver_serves_jobs_without_notifications_of_their_own(receiver: Receiver):
    await receiver.start()
    default = OperatorConfig.from_env(
        {"ROCMTRAIN_NOTIFY_URL": receiver.url("default"), "ROCMTRAIN_NOTIFY_EVENTS": "Running"}
    )
    async with _notifier(receiver, default=default.notification) as notifier:
        job = {**_job("a"), "spec": {}}
        assert notifier.notify(job, {}, {"phase": "Queued"}) == 0
        assert notifier.notify(job, {}, RUNNING) == 1
        assert notifier.notify(_job("b"), {}, RUNNING) == 1, "a job's own receivers replace the default"
        await _until(lambda: notifier.pending == 0)
    assert sorted(receiver.paths()) == ["default", "hooks"]
    assert next(h for p, h, _ in receiver.received if p == "default").get(SIGNATURE_HEADER) is None


async def test_each_notice_is_recorded_and_one_left_pending_by_a_stopped_operator_goes_after_its_restart(
    receiver: Receiver,
):
    records: list[list[dict[str, Any]]] = []

    async def record(job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        assert job["metadata"]["uid"] == "uid-ml-a"
        records.append(entries)

    job = _job("a")
    async with _notifier(receiver, record=record) as notifier:  # the receiver is down: the notice stays Pending
        notifier.notify(job, {"phase": "Pending"}, RUNNING)
        await _until(lambda: len(records) == 1)
    ((entry,),) = records
    assert (entry["target"], entry["event"], entry["state"]) == ("spec.notifications[0]", "Running", "Pending")
    job["status"] = {**RUNNING, "notifications": records[-1]}  # as the operator wrote it
    await receiver.start()
    async with _notifier(receiver, record=record) as restarted:
        assert restarted.resume(job) == 1
        assert restarted.resume(job) == 0, "once per job"
        await _until(lambda: restarted.pending == 0)
    ((_, headers, body),) = receiver.received
    assert headers[DELIVERY_HEADER] == entry["deliveryId"] and json.loads(body)["event"] == "Running"
    assert [e[0]["state"] for e in records] == ["Pending", "Delivered"]
    assert all(TOKEN not in json.dumps(e) and KEY not in json.dumps(e) for e in records)


async def test_a_receiver_at_a_refused_address_never_gets_a_request_and_its_owner_learns_only_not_delivered(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
):
    """Loopback in any spelling (a name, decimal, octal, IPv4-mapped), with the default rules: nothing is
    sent, the status says Failed (AddressRefused) without what, if anything, listens there."""
    await receiver.start()
    port, path = receiver.port, f"{TOKEN}/hooks"
    spellings = ["127.0.0.1", "localhost", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]"]
    urls = {f"s{i}": f"http://{host}:{port}/{path}" for i, host in enumerate(spellings)}
    records: list[dict[str, Any]] = []
    warned: list[str] = []

    async def record(job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        records.extend(entries)

    async with _notifier(receiver, warned=warned, urls=urls, record=record, rules=ReceiverRules()) as notifier:
        for name in urls:
            assert notifier.notify(_job(name, name), {}, FAILED) == 1
        await _until(lambda: notifier.pending == 0)
    assert receiver.received == []
    failed = [(e["state"], e.get("failure")) for e in records if e["state"] != "Pending"]
    assert failed == [("Failed", "AddressRefused")] * len(urls)
    assert set(warned) == {
        f"{name}: Failed notification to spec.notifications[0] not delivered (AddressRefused): "
        "the receiver's address is not one the operator may reach"
        for name in urls
    }
    assert caplog.text.count("(try 1): the receiver's address is refused (loopback), given up") == len(urls)
    _no_secrets_in(caplog)


async def test_a_second_dns_answer_cannot_swap_in_an_address_that_was_not_checked(receiver: Receiver):
    """Rebinding: the name answers the allowed receiver when checked, then the metadata service when the
    connection looks it up; the connection takes only checked answers, so nothing is sent anywhere."""
    await receiver.start()
    answers = [["127.0.0.1"], ["127.0.0.1"], ["127.0.0.1"], ["169.254.169.254"]]
    looked_up: list[str] = []

    async def lookup(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return answers.pop(0)

    records: list[dict[str, Any]] = []

    async def record(job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        records.extend(e for e in entries if e["state"] != "Pending")

    urls = {"hooks": f"http://receiver.test:{receiver.port}/{TOKEN}/hooks"}
    async with _notifier(receiver, urls=urls, lookup=lookup, record=record) as notifier:
        notifier.notify(_job("a"), {}, RUNNING)  # checked, then connected: the same answer both times
        await _until(lambda: notifier.pending == 0)
        notifier.notify(_job("b"), {}, RUNNING)  # checked 127.0.0.1, then the connection's answer swaps
        await _until(lambda: notifier.pending == 0)
    assert looked_up == ["receiver.test"] * 4
    assert receiver.paths() == ["hooks"], "the first notice only"
    assert [(e["state"], e.get("failure")) for e in records] == [("Delivered", None), ("Failed", "AddressRefused")]


async def test_one_namespace_flooding_hung_receivers_leaves_another_namespaces_failed_notice_prompt(
    receiver: Receiver,
):
    """team-a: 250 jobs × 4 receivers that take the request and never answer. team-b's Failed notice
    is queued and delivered while team-a's backlog still waits; team-a's overflow is dropped, and its
    jobs' status and events say so."""
    receiver.hold["slow"] = asyncio.Event()
    await receiver.start()
    records: list[dict[str, Any]] = []
    warned: list[str] = []

    async def record(job: Mapping[str, Any], entries: list[dict[str, Any]]) -> None:
        records.extend(entries)

    async with _notifier(receiver, warned=warned, record=record, timeout=30.0) as notifier:
        queued = sum(notifier.notify(_job(f"a{i}", "slow", "team-a", receivers=4), {}, RUNNING) for i in range(250))
        await _until(lambda: len(receiver.received) == 4)  # team-a's share of the senders, all hung
        started = time.monotonic()
        assert notifier.notify(_job("b", "fast", "team-b"), {}, FAILED) == 1, "team-b's notice is queued"
        await _until(lambda: "fast" in receiver.paths(), timeout=10.0)
        took = time.monotonic() - started
        assert receiver.paths().count("slow") == 4 and notifier.pending == queued, "team-a's backlog all waits"
        await _until(lambda: notifier.drops_unreported == 0)
    print(f"team-b's Failed notice delivered {took * 1000:.0f} ms after it was queued, during team-a's flood")
    assert queued == 100, "team-a's share of the queue"
    assert ("Failed", "Delivered") in [(e["event"], e["state"]) for e in records]
    dropped = {(e["event"], e["state"], e.get("failure")) for e in records if e["state"] == "Dropped"}
    assert dropped == {("Running", "Dropped", "QueueFull")}
    assert warned and all(w.endswith("dropped (QueueFull): the namespace's share of the notification queue is full")
                          for w in warned)  # fmt: skip


async def test_a_receiver_that_keeps_failing_is_not_tried_until_its_cooldown(receiver: Receiver):
    """After 3 failures in a row the breaker opens: the next tries of that notice, and another job's notice
    to the same receiver, fail at once with no connection (the receiver counts them)."""
    receiver.answers = {"hooks": [503]}
    await receiver.start()
    warned: list[str] = []
    breaker = ReceiverBreaker(3, cooldown=60.0)
    async with _notifier(receiver, scale=0.001, warned=warned, breaker=breaker) as notifier:
        notifier.notify(_job("a"), {}, RUNNING)
        await _until(lambda: notifier.pending == 0)
        assert len(receiver.received) == 3, f"3 of {MAX_ATTEMPTS} tries reached it"
        notifier.notify(_job("b"), {}, RUNNING)
        await _until(lambda: notifier.pending == 0)
    assert len(receiver.received) == 3, "none of the second notice's tries"
    assert [w.split(" not delivered ")[1] for w in warned] == ["(NotDelivered): the receiver did not take it"] * 2

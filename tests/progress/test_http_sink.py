"""The training side's HTTP sink against a real local HTTPS server (no cluster).

The server here is a small recorder (stdlib http.server over TLS) whose answers
each test scripts; the sink's TLS verification, token handling, retries and
bounded queue are the real ones.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmtrain.api.contract import PROGRESS_CA_ENV, PROGRESS_TOKEN_ENV, PROGRESS_URL_ENV, progress_path
from rocmtrain.api.models import ProgressReport
from rocmtrain.progress import tls
from rocmtrain_testworld.kubecluster import free_port
from rocmtrain_train.reporting import operator_sink as http_sink
from rocmtrain_train.reporting.operator_sink import HttpSink, from_env

PATH = progress_path("team-a", "job1")


def report(step: int) -> ProgressReport:
    return ProgressReport.model_validate({"progress": {"step": step}, "metrics": {"trainLoss": 1.0 / (step + 1)}})


class Recorder(http.server.ThreadingHTTPServer):
    def __init__(self, port: int, answers: list[tuple[int, dict[str, str]]]) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.answers = answers
        self.received: list[tuple[str, str, dict]] = []


class Handler(http.server.BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers["Authorization"], json.loads(body)))
        status, headers = self.server.answers.pop(0) if self.server.answers else (204, {})
        self.send_response(status)
        for key, value in {"Content-Length": "0", **headers}.items():
            self.send_header(key, value)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    now = dt.datetime.now(dt.UTC)
    ca_crt, crt, key = tls.new_serving_cert(["localhost"], now)
    paths = {"ca": tmp_path / "ca.crt", "crt": tmp_path / "tls.crt", "key": tmp_path / "tls.key"}
    for name, data in (("ca", ca_crt), ("crt", crt), ("key", key)):
        paths[name].write_bytes(data)
    (tmp_path / "token").write_text("token-1\n")
    paths["token"] = tmp_path / "token"
    return paths


@pytest.fixture
def server(pki: dict[str, Path]) -> Iterator[Recorder]:
    recorder = Recorder(free_port(), [])
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki["crt"], pki["key"])
    recorder.socket = ctx.wrap_socket(recorder.socket, server_side=True)
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    yield recorder
    recorder.shutdown()
    recorder.server_close()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_sink, "BACKOFF_BASE_SECONDS", 0.02)


def sink_for(server: Recorder, pki: dict[str, Path], **kwargs: float) -> HttpSink:
    url = f"https://localhost:{server.server_address[1]}{PATH}"
    return HttpSink(url, pki["ca"], pki["token"], min_interval=0.0, **kwargs)


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_delivers_reports_in_order_and_rereads_the_token(server: Recorder, pki: dict[str, Path]):
    sink = sink_for(server, pki)
    sink.emit(report(1))
    wait_for(lambda: len(server.received) == 1)
    pki["token"].write_text("token-2")  # the kubelet rotated the projected token
    sink.emit(report(2))
    sink.close()
    assert [(p, auth, body["progress"]["step"]) for p, auth, body in server.received] == [
        (PATH, "Bearer token-1", 1),
        (PATH, "Bearer token-2", 2),
    ]
    assert server.received[0][2] == {"progress": {"step": 1}, "metrics": {"trainLoss": 0.5}, "final": False}
    assert sink.sent == 2 and sink.dropped == 0


def test_retries_busy_answers_and_drops_refused_reports(server: Recorder, pki: dict[str, Path]):
    server.answers = [(503, {}), (429, {"Retry-After": "0"}), (204, {}), (400, {}), (204, {})]
    sink = sink_for(server, pki)
    for step in (1, 2, 3):
        sink.emit(report(step))
    sink.close()
    assert [body["progress"]["step"] for _, _, body in server.received] == [1, 1, 1, 2, 3]
    assert sink.sent == 2 and sink.dropped == 1


def test_never_follows_redirects(server: Recorder, pki: dict[str, Path]):
    server.answers = [(307, {"Location": "https://elsewhere.example/steal"})]
    sink = sink_for(server, pki)
    sink.emit(report(1))
    sink.close()
    assert len(server.received) == 1
    assert sink.sent == 0 and sink.dropped == 1


def test_refuses_a_server_the_ca_did_not_sign(server: Recorder, pki: dict[str, Path], tmp_path: Path):
    other_ca, _ = tls.new_ca(dt.datetime.now(dt.UTC))
    (tmp_path / "other.crt").write_bytes(other_ca)
    url = f"https://localhost:{server.server_address[1]}{PATH}"
    sink = HttpSink(url, tmp_path / "other.crt", pki["token"], min_interval=0.0, close_timeout=2.0)
    sink.emit(report(1))
    sink.close()
    assert server.received == [] and sink.sent == 0


def test_training_never_waits_for_an_absent_operator(pki: dict[str, Path]):
    url = f"https://localhost:{free_port()}{PATH}"
    sink = HttpSink(url, pki["ca"], pki["token"], queue_length=8, close_timeout=0.5)
    start = time.monotonic()
    for step in range(1000):
        sink.emit(report(step))
    emitted = time.monotonic() - start
    assert emitted < 1.0, f"emit took {emitted:.2f}s for 1000 reports"
    assert sink.dropped >= 1000 - 8 - 1, "the bounded queue drops the oldest reports"
    start = time.monotonic()
    sink.close()
    assert time.monotonic() - start < 1.5
    assert sink.sent == 0


def test_from_env(pki: dict[str, Path]):
    assert from_env({}) is None
    assert from_env({PROGRESS_URL_ENV: "https://x"}) is None
    env = {
        PROGRESS_URL_ENV: f"https://localhost:{free_port()}{PATH}",
        PROGRESS_CA_ENV: str(pki["ca"]),
        PROGRESS_TOKEN_ENV: str(pki["token"]),
    }
    sink = from_env(env)
    assert isinstance(sink, HttpSink) and sink.url == env[PROGRESS_URL_ENV]
    sink.close()
    assert from_env({**env, PROGRESS_URL_ENV: "http://rocmtrain-progress.ops/x"}) is None, "never over plain HTTP"
    with pytest.raises(ValueError, match="https"):
        HttpSink("http://rocmtrain-progress.ops/x", pki["ca"], pki["token"])
    with pytest.raises(ValueError, match="https"):
        HttpSink(env[PROGRESS_URL_ENV], None, pki["token"])
    # `rocmtrain run`'s own endpoint: plain HTTP to this machine's loopback address only, without a CA.
    local = from_env({PROGRESS_URL_ENV: "http://127.0.0.1:9/x", PROGRESS_TOKEN_ENV: str(pki["token"])})
    assert isinstance(local, HttpSink) and local.ca_file is None
    local.close()

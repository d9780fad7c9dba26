"""`rocmtrain run`'s progress endpoint for a job's own code: the operator's two paths, on the loopback address.

The code reports as it would on a cluster, to the URLs of its environment contract: our reports
(`PROGRESS_PATH`, `rocmtrain_train.sdk.report`) and Kubeflow Trainer's KEP-2779 ones
(`TRAINER_STATUS_PATH`, transformers' `KubeflowCallback`). The endpoint takes the job's two paths only,
with a bearer token of its own (random, in a file only this user may read), reads bodies with the
contract's parsers (`rocmtrain.api.progress_body`: the same size limit, non-finite numbers and field
limits refused alike), and hands each report to the sinks: the console's progress bar and
`metrics.jsonl`. A step that goes backwards is counted and explained as the operator's `NotDataParallel`
condition does (`rocmtrain.api.report_checks`); its other sign, two pods that take turns reporting, has no
local twin: here every report comes from this machine, with no mark of the process that sent it (transformers'
`KubeflowCallback` sends none). It speaks plain HTTP and listens on 127.0.0.1 only;
nothing of the operator's TLS, TokenReview or rate limits is needed between two processes of one user.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import sys
import threading
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rocmtrain.api.contract import progress_path, trainer_status_path
from rocmtrain.api.models import Progress, ProgressReport
from rocmtrain.api.progress_body import MAX_BODY_BYTES, BodyError, parse_report, parse_trainer_status
from rocmtrain.api.report_checks import BACKWARD_STEPS_TO_WARN, not_data_parallel, went_backwards
from rocmtrain_train.reporting.driver_report import Sink

LOOPBACK = "127.0.0.1"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the code's own output is the console's."""

    def _answer(self, status: HTTPStatus, error: str | None = None) -> None:
        body = json.dumps({"error": error}).encode() if error else b""
        self.send_response(status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        endpoint = self.server.endpoint
        parse = endpoint.parsers.get(self.path)
        if parse is None:
            return self._answer(HTTPStatus.NOT_FOUND, "no such job")
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), endpoint.token.encode()):
            return self._answer(HTTPStatus.UNAUTHORIZED, "bearer token required")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            return self._answer(HTTPStatus.LENGTH_REQUIRED, "length required")
        if int(length) > MAX_BODY_BYTES:
            return self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        try:
            report = parse(self.rfile.read(int(length)))
        except BodyError as exc:
            return self._answer(HTTPStatus.BAD_REQUEST, str(exc))
        endpoint.take(report)
        return self._answer(HTTPStatus.NO_CONTENT)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: LocalEndpoint


def _shown(report: ProgressReport, last: ProgressReport | None) -> ProgressReport:
    """The report with the steps that a protocol may leave out (KEP-2779's last report, at 100%, has none) taken
    from the report before (a last report: all of them done), so that the console's bar and summary show them."""
    if last is None or report.progress.step is not None:
        return report
    total = report.progress.total_steps or last.progress.total_steps
    kept = {"step": total if report.final else last.progress.step, "total_steps": total}
    progress = Progress.model_validate({**kept, **report.progress.model_dump(exclude_none=True)})
    return report.model_copy(update={"progress": progress})


class LocalEndpoint:
    """The loopback endpoint of one job: serves from start to `close`, feeding `sinks` one report at a time."""

    def __init__(self, namespace: str, name: str, sinks: Sequence[Sink], token_dir: Path) -> None:
        self.sinks = list(sinks)
        self.token = secrets.token_urlsafe(32)
        self.token_file = token_dir / "token"
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.token)
        self.parsers: dict[str, Callable[[bytes], ProgressReport]] = {
            progress_path(namespace, name): parse_report,
            trainer_status_path(namespace, name): parse_trainer_status,
        }
        self.last: ProgressReport | None = None
        self.reports = 0
        self.backward_steps = 0  # as `status.backwardSteps` counts them (rocmtrain.api.report_checks)
        self._step: int | None = None
        self._failures = 0
        self._lock = threading.Lock()
        self._server = _Server((LOOPBACK, 0), _Handler)
        self._server.endpoint = self
        self._paths = tuple(self.parsers)
        self._thread = threading.Thread(target=self._server.serve_forever, name="rocmtrain-local-progress", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    @property
    def progress_url(self) -> str:
        return self.base_url + self._paths[0]

    @property
    def trainer_status_url(self) -> str:
        return self.base_url + self._paths[1]

    def take(self, report: ProgressReport) -> None:
        """Hand one report to every sink, in the order reports arrive."""
        with self._lock:
            self._check(report)
            report = _shown(report, self.last)
            self.last, self.reports = report, self.reports + 1
            for sink in self.sinks:
                sink.emit(report)

    def _check(self, report: ProgressReport) -> None:
        """Count a step that went backwards, as the operator does; say why once it means two rank 0s."""
        failures = report.worker_failures or 0
        if went_backwards(report.progress.step, self._step, restarted=failures > self._failures):
            self.backward_steps += 1
            if self.backward_steps == BACKWARD_STEPS_TO_WARN:
                print(f"warning: {not_data_parallel(self.backward_steps)}", file=sys.stderr, flush=True)
        self._step, self._failures = report.progress.step, max(failures, self._failures)

    def close(self) -> None:
        """Stop serving; a report being handled is finished first."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

"""How worker metrics reach the driver.

Workers call `ray.train.report(report.to_metrics())` with their `RankReport`. Ray Train V2
hands every report, as one metrics dict per rank, to `UserCallback.after_report` on its
controller actor (which runs next to the driver, not in the driver process). `ReportRelay`
is that callback: it pushes each report, and each worker failure, into `Inbox`, a small
actor owned by the driver, and waits for the push to land so that nothing is still in
flight when `trainer.fit()` returns. A `Pump` thread on the driver drains the inbox twice
a second, turns each rank's dict back into a `RankReport` and hands them to the
`Reporter`, which aggregates and feeds the sinks in the driver process (where the console
and the operator's progress endpoint are). Each item in the inbox is a `Message`: its kind,
its payload, and (for a report) the checkpoint's path.
"""

from __future__ import annotations

import enum
import threading
from typing import Any

import ray
from ray.train import Checkpoint, UserCallback

from rocmtrain_train.reporting.driver_report import Reporter
from rocmtrain_train.reporting.rank_report import RankReport

# Longest error text passed on per failed worker (the full error is in the worker's log).
MAX_ERROR_CHARS = 500


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message` of an error (of its cause, where Ray wrapped a task's error)."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:MAX_ERROR_CHARS]


class MessageKind(enum.StrEnum):
    """What an inbox message carries."""

    REPORT = "report"  # every rank's metrics dict of one report, and the checkpoint's path (or None)
    FAILURE = "failure"  # each failed worker's rank and `error_line`


# (kind, payload, checkpoint path): a report's metrics dicts and path, or a failure's errors and None.
Message = tuple[MessageKind, Any, Any]


@ray.remote(num_cpus=0)
class Inbox:
    """A mailbox between the Ray Train controller and the driver."""

    def __init__(self) -> None:
        self._items: list[Message] = []

    def push(self, item: Message) -> None:
        self._items.append(item)

    def drain(self) -> list[Message]:
        items, self._items = self._items, []
        return items


class ReportRelay(UserCallback):
    """Runs on the Ray Train controller: forwards reports and worker failures to the driver's inbox."""

    def __init__(self, inbox: ray.actor.ActorHandle) -> None:
        self._inbox = inbox

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        ray.get(self._inbox.push.remote((MessageKind.REPORT, metrics, checkpoint.path if checkpoint else None)))

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        errors = {rank: error_line(exc) for rank, exc in worker_exceptions.items()}
        ray.get(self._inbox.push.remote((MessageKind.FAILURE, errors, None)))


class Pump(threading.Thread):
    """Drains the inbox into the reporter until stopped, then drains it one last time."""

    def __init__(self, inbox: ray.actor.ActorHandle, reporter: Reporter, period_s: float = 0.5) -> None:
        super().__init__(name="rocmtrain-report-pump", daemon=True)
        self._inbox = inbox
        self._reporter = reporter
        self._period_s = period_s
        self._stopped = threading.Event()

    def drain(self) -> None:
        items: list[Message] = ray.get(self._inbox.drain.remote())
        for kind, payload, extra in items:
            match kind:
                case MessageKind.REPORT:
                    self._reporter.on_report([RankReport.from_metrics(m) for m in payload], extra)
                case MessageKind.FAILURE:
                    self._reporter.on_failure(payload)

    def run(self) -> None:
        while not self._stopped.wait(self._period_s):
            self.drain()

    def stop(self) -> None:
        self._stopped.set()
        self.join()
        self.drain()

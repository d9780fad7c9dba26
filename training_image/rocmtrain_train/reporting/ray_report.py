"""Ray Train's own reports (`ray.train.report`) into the job's status, for code that reports nothing else.

An unchanged Ray Train script reports only through `ray.train.report(metrics)`. The environment contract sets
`RAY_TRAIN_CALLBACKS` (`rocmtrain.api.code`), which Ray Train v2 reads when a trainer starts: it makes a
`RayReportForwarder` in the driver and hands it to its controller (a Ray actor with the job's environment, so
the progress channel) and to its workers. After each `ray.train.report` of every rank, the controller forwards
rank 0's metrics (`forwarded`): `loss` (or `train_loss`) into the loss field, `step` and `epoch` into the
progress, KEP-2779's other names into theirs (`rocmtrain.api.trainer_status`), other numbers as custom metrics
within their bound; the rest (text, lists) is left out.

No report twice: code that reports by itself (`sdk.report`, or a Hugging Face `Trainer`, whose
`KubeflowCallback` reports while the channel is set) would send a second, partial stream. So rank 0's worker,
at each `ray.train.report`, tells the controller through Ray's internal key-value store when its process
reports by itself (`reports_by_itself`), and from then on the controller forwards nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, TrainContextCallback

from rocmtrain.api.contract import KUBEFLOW_URL_ENV
from rocmtrain.api.models import MAX_CUSTOM_METRICS, ProgressReport
from rocmtrain.api.patterns import METRIC_NAME
from rocmtrain.api.trainer_status import (
    KUBEFLOW_METRICS,
    TrainerStatusError,
    place_metrics,
    report_from,
)
from rocmtrain_train.reporting import operator_sink

log = logging.getLogger(__name__)

METRIC_NAME_RE = re.compile(METRIC_NAME)
KV_NAMESPACE = "rocmtrain"
KUBEFLOW_OFF_ENV = "DISABLE_KUBEFLOW_INTEGRATION"  # transformers' is_kubeflow_available: TRUE turns it off
_OWN = {"sent": False}  # this process reported through sdk.report


def mark_own_report() -> None:
    """Note that this process reports by itself (`sdk.report` calls it)."""
    _OWN["sent"] = True


def reports_by_itself(modules: Mapping[str, object], environ: Mapping[str, str]) -> bool:
    """Whether this process reports without Ray Train: it called `sdk.report`, or runs a Hugging Face `Trainer`
    while KEP-2779's channel is set (its `KubeflowCallback` is then on, unless DISABLE_KUBEFLOW_INTEGRATION)."""
    kubeflow = environ.get(KUBEFLOW_URL_ENV) and environ.get(KUBEFLOW_OFF_ENV, "").upper() != "TRUE"
    return _OWN["sent"] or ("transformers.trainer" in modules and bool(kubeflow))


def forwarded(metrics: Mapping[str, Any]) -> ProgressReport | None:
    """The progress report of one `ray.train.report`'s metrics; None where they hold no number to report.

    `step` fills the step (where it is a whole number), KEP-2779's names their fields (`loss`, `train_loss`,
    `epoch`, ...), and the first MAX_CUSTOM_METRICS other numbers with a valid metric name the custom metrics.
    """
    numbers = {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(name, str)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and METRIC_NAME_RE.match(name)
    }
    step = numbers.pop("step", None)
    others = [name for name in numbers if name not in KUBEFLOW_METRICS]
    for name in others[MAX_CUSTOM_METRICS:]:
        del numbers[name]
    if not numbers and step is None:
        return None
    progress, placed, source = place_metrics(numbers)
    if step is not None and step.is_integer() and step >= 0:
        progress["step"] = int(step)
    try:
        return report_from(progress, placed, source, False)
    except TrainerStatusError as exc:
        log.warning("ray.train.report not forwarded: %s", exc)
        return None


def _own_reports_key() -> bytes:
    """The key, per Ray job (the script's driver), under which rank 0 tells that it reports by itself."""
    import ray

    return f"own-reports-{ray.get_runtime_context().get_job_id()}".encode()


class RayReportForwarder(ReportCallback, TrainContextCallback, ControllerCallback):
    """Ray Train v2's callback (`RAY_TRAIN_CALLBACKS`): rank 0's `ray.train.report` metrics into the job's
    status, unless rank 0 reports by itself."""

    def __init__(self) -> None:
        self.sink: operator_sink.HttpSink | None = None
        self.own = False  # rank 0 reports by itself (on the controller: as the worker told)
        self.told = False  # on rank 0's worker: the controller was told

    @contextlib.contextmanager
    def on_report(self) -> Iterator[None]:  # on each worker, around its ray.train.report
        if not self.told and reports_by_itself(sys.modules, os.environ):
            import ray.train
            from ray.experimental import internal_kv

            if ray.train.get_context().get_world_rank() == 0:
                internal_kv._internal_kv_put(_own_reports_key(), b"1", namespace=KV_NAMESPACE)
                self.told = True
        yield

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:  # on the controller
        from ray.experimental import internal_kv

        self.own = self.own or internal_kv._internal_kv_exists(_own_reports_key(), namespace=KV_NAMESPACE)
        if self.own or not metrics or (report := forwarded(metrics[0])) is None:
            return
        if self.sink is None:
            self.sink = operator_sink.from_env()
            if self.sink is None:
                self.own = True  # no channel: nothing to forward to
                return
        self.sink.emit(report)

    def after_controller_finish(self, result: Any) -> None:
        """Give the last forwarded reports the sink's time to go out before the controller ends."""
        if self.sink is not None:
            self.sink.close()

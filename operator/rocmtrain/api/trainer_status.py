"""Kubeflow Trainer's progress protocol (KEP-2779) read as a `ProgressReport` (pure).

Training code that speaks KEP-2779, such as transformers' `KubeflowCallback` (which every Hugging Face
`Trainer` registers when `KUBEFLOW_TRAINER_SERVER_URL` is set), POSTs::

    {"trainerStatus": {"progressPercentage": 45, "estimatedRemainingSeconds": 795,
                       "metrics": [{"name": "loss", "value": "0.2347"}, ...],
                       "lastUpdatedTime": "2025-01-23T10:30:45Z"}}

to `rocmtrain.api.contract.TRAINER_STATUS_PATH`. `to_progress_report` puts what it says where our own
reports put it: the percentage and the remaining seconds into `status.progress`, the metrics
`KUBEFLOW_METRICS` names into their fields of `status.progress` and `status.metrics`, and any other
metric into `status.metrics.custom` (at most `MAX_CUSTOM_METRICS`). Values are numbers written as
strings (as KEP-2779 has them); one that is not a finite number refuses the report, as a non-finite
number refuses one of ours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import ConfigDict, Field, StringConstraints, ValidationError
from pydantic.alias_generators import to_snake
from pydantic_core import ErrorDetails

from rocmtrain.api.errors import InputError
from rocmtrain.api.models import MAX_CUSTOM_METRICS, ApiModel, ProgressReport
from rocmtrain.api.types import MetricName

# Metrics one report may carry: those with a field of their own and MAX_CUSTOM_METRICS more.
MAX_KUBEFLOW_METRICS: Final = 64
PERCENT_DONE: Final = 100

# KEP-2779 metric name -> (status section, field): transformers' names for what our reports carry. Where two
# names fill one field, the later one here wins (`current_epoch`, rounded from the trainer's state at each step,
# over the `epoch` of its last log; the last logged `loss` over `train_loss`, the mean over the whole run that a
# `Trainer` and TRL log at the end, which is the only loss of a run shorter than its `logging_steps`).
KUBEFLOW_METRICS: Final = {
    "train_loss": ("metrics", "trainLoss"),
    "loss": ("metrics", "trainLoss"),
    "learning_rate": ("metrics", "learningRate"),
    "eval_loss": ("metrics", "evalLoss"),
    "eval_accuracy": ("metrics", "evalAccuracy"),
    "eval_f1": ("metrics", "evalF1"),
    "eval_mse": ("metrics", "evalMse"),
    "eval_mae": ("metrics", "evalMae"),
    "samples_per_second": ("metrics", "samplesPerSecond"),
    "train_samples_per_second": ("metrics", "samplesPerSecond"),
    "tokens_per_second": ("metrics", "tokensPerSecond"),
    "train_tokens_per_second": ("metrics", "tokensPerSecond"),
    "train_runtime": ("metrics", "trainSeconds"),
    "epoch": ("progress", "epoch"),
    "current_epoch": ("progress", "epoch"),
    "current_step": ("progress", "step"),
    "total_steps": ("progress", "totalSteps"),
}
# KEP-2779's own fields -> the field of status.progress they fill.
KUBEFLOW_FIELDS: Final = {"progressPercentage": "percent", "estimatedRemainingSeconds": "etaSeconds"}
_WHOLE = frozenset({"step", "totalSteps"})

MetricValue = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class KubeflowMetric(ApiModel):
    """One metric of a KEP-2779 report: its name and its value as a string."""

    name: MetricName
    value: MetricValue


class TrainerStatus(ApiModel):
    """KEP-2779's `trainerStatus`."""

    model_config = ConfigDict(allow_inf_nan=False)

    progress_percentage: float | None = Field(default=None, ge=0, le=PERCENT_DONE)
    estimated_remaining_seconds: float | None = Field(default=None, ge=0, le=1e9)
    metrics: list[KubeflowMetric] = Field(default_factory=list, max_length=MAX_KUBEFLOW_METRICS)
    last_updated_time: Annotated[str, StringConstraints(max_length=64)] | None = None


class TrainerStatusReport(ApiModel):
    """A KEP-2779 request body."""

    trainer_status: TrainerStatus


class TrainerStatusError(InputError):
    """A KEP-2779 report that cannot be a ProgressReport; the message names its fields, never its values."""


def _number(metric: KubeflowMetric, index: int) -> float:
    where = f"trainerStatus.metrics[{index}].value"
    try:
        value = float(metric.value)
    except ValueError:
        raise TrainerStatusError(f"{where} is not a number") from None
    if not math.isfinite(value):
        raise TrainerStatusError(f"{where}: non-finite number is not allowed")
    return value


def place_metrics(
    values: Mapping[str, float], where: str = "metrics"
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(progress fields, metrics fields, the metric name each field came from) of named metric values: the
    `KUBEFLOW_METRICS` names into their fields, the others into `metrics["custom"]`; TrainerStatusError beyond
    MAX_CUSTOM_METRICS others. `rocmtrain_train.sdk.report` places its metrics with this too."""
    sections: dict[str, dict[str, Any]] = {"progress": {}, "metrics": {}}
    source: dict[str, str] = {}
    for name, (section, field) in KUBEFLOW_METRICS.items():
        if name in values:
            value = values[name]
            sections[section][field] = int(value) if field in _WHOLE and float(value).is_integer() else value
            source[f"{section}.{field}"] = name
    custom = [{"name": name, "value": value} for name, value in values.items() if name not in KUBEFLOW_METRICS]
    if len(custom) > MAX_CUSTOM_METRICS:
        raise TrainerStatusError(
            f"{where}: {len(custom)} metrics without a status field of their own, at most {MAX_CUSTOM_METRICS}"
        )
    if custom:
        sections["metrics"]["custom"] = custom
    return sections["progress"], sections["metrics"], source


def _values(status: TrainerStatus) -> dict[str, float]:
    """The metrics of a trainerStatus by name, as numbers."""
    values: dict[str, float] = {}
    for index, metric in enumerate(status.metrics):
        if metric.name in values:
            raise TrainerStatusError(f"trainerStatus.metrics[{index}]: duplicate name")
        values[metric.name] = _number(metric, index)
    return values


def report_from(
    progress: dict[str, Any], metrics: dict[str, Any], source: dict[str, str], final: bool
) -> ProgressReport:
    """The ProgressReport of placed fields; TrainerStatusError naming (by `source`) the fields out of bounds."""
    try:
        return ProgressReport.model_validate({"progress": progress, "metrics": metrics, "final": final})
    except ValidationError as exc:
        fields = sorted({_where(e, source) for e in exc.errors()})
        raise TrainerStatusError(f"invalid values: {', '.join(fields[:8])}") from None


def _where(error: ErrorDetails, source: dict[str, str]) -> str:
    """The field a ProgressReport validation error is in, with the name it was reported as."""
    loc = ".".join(str(part) for part in error["loc"][:2])
    return f"{loc} ({source[loc]})" if loc in source else loc


def to_progress_report(report: TrainerStatusReport) -> ProgressReport:
    """The ProgressReport a KEP-2779 report says; TrainerStatusError naming the field that cannot be one."""
    status = report.trainer_status
    progress, metrics, source = place_metrics(_values(status), "trainerStatus.metrics")
    for wire, field in KUBEFLOW_FIELDS.items():
        if (value := getattr(status, to_snake(wire))) is not None:
            progress[field] = value
            source[f"progress.{field}"] = wire
    return report_from(progress, metrics, source, final=status.progress_percentage == PERCENT_DONE)

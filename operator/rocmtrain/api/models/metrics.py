"""status.metrics and status.history: the training metrics, their display table, the loss curve."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import ConfigDict, Field

from rocmtrain.api.models.base import ApiModel
from rocmtrain.api.types import MetricName


class _Evaluation:
    """Marks a `Metrics` field that an evaluation produces (see `EVAL_METRICS`)."""


_EVALUATION = _Evaluation()
EvalMetric = Annotated[float | None, _EVALUATION]


@dataclass(frozen=True)
class Shown:
    """How a `Metrics` field is shown (`metric_rows`): its label, unit and format spec."""

    label: str
    format: str
    unit: str = ""


MAX_CUSTOM_METRICS = 32


class CustomMetric(ApiModel):
    """A metric your code reports that has no field of its own in status.metrics."""

    model_config = ConfigDict(allow_inf_nan=False)

    name: MetricName = Field(description="Its name as reported, such as grad_norm.")
    value: float = Field(ge=-1e30, le=1e30, description="Its latest value.")


class Metrics(ApiModel):
    """Latest training metrics, aggregated over all workers."""

    model_config = ConfigDict(allow_inf_nan=False)

    train_loss: Annotated[float | None, Shown("train loss", ".4f")] = Field(
        default=None, ge=-1e12, le=1e12, description="Mean training loss, last interval."
    )
    learning_rate: Annotated[float | None, Shown("learning rate", ".2e")] = Field(
        default=None, ge=0, le=10, description="Current learning rate."
    )
    eval_loss: Annotated[EvalMetric, Shown("eval loss", ".4f")] = Field(
        default=None, ge=-1e12, le=1e12, description="Loss on the evaluation set."
    )
    eval_accuracy: Annotated[EvalMetric, Shown("eval accuracy", ".4f")] = Field(
        default=None, ge=0, le=1, description="Accuracy on the evaluation set."
    )
    eval_f1: Annotated[EvalMetric, Shown("eval macro-F1", ".4f")] = Field(
        default=None, ge=0, le=1, description="Macro-F1 on the evaluation set."
    )
    eval_mse: Annotated[EvalMetric, Shown("eval MSE", ".4f")] = Field(
        default=None, ge=0, le=1e12, description="Mean squared error (regression)."
    )
    eval_mae: Annotated[EvalMetric, Shown("eval MAE", ".4f")] = Field(
        default=None, ge=0, le=1e12, description="Mean absolute error (regression)."
    )
    eval_perplexity: Annotated[EvalMetric, Shown("eval perplexity", ".4g")] = Field(
        default=None,
        ge=1,
        le=1e300,
        description="causal-lm: perplexity on the evaluation set, exp(evalLoss) (the mean over the tokens that carry "
        "loss).",
    )
    eval_exact_match: Annotated[EvalMetric, Shown("eval exact match", ".4f")] = Field(
        default=None,
        ge=0,
        le=1,
        description="causal-lm with evaluation.generate: share of generated responses equal to the reference.",
    )
    train_seconds: Annotated[float | None, Shown("train time", ".1f", "s")] = Field(
        default=None, ge=0, le=1e9, description="Seconds spent training so far."
    )
    eval_seconds: Annotated[float | None, Shown("eval time", ".1f", "s")] = Field(
        default=None, ge=0, le=1e9, description="Seconds spent evaluating so far."
    )
    samples_per_second: Annotated[float | None, Shown("samples/s", ".1f")] = Field(
        default=None, ge=0, le=1e9, description="Training throughput, all workers."
    )
    tokens_per_second: Annotated[float | None, Shown("tokens/s", ".0f")] = Field(
        default=None, ge=0, le=1e12, description="Non-padding tokens per second, all workers."
    )
    data_wait_fraction: Annotated[float | None, Shown("data wait", ".1%")] = Field(
        default=None, ge=0, le=1, description="Share of training time spent waiting for data."
    )
    trainable_parameters: Annotated[int | None, Shown("trainable parameters", ",")] = Field(
        default=None, ge=0, le=10**15, description="Parameters that train (an adapter's only, with spec.adapter)."
    )
    total_parameters: Annotated[int | None, Shown("parameters", ",")] = Field(
        default=None, ge=0, le=10**15, description="Parameters of the model, adapter included."
    )
    records_cut: Annotated[int | None, Shown("records cut", ",")] = Field(
        default=None,
        ge=0,
        le=10**12,
        description="causal-lm: training and evaluation records whose tail model.maxSeqLength cut off "
        "(data.truncation); per data file in the run's log and summary.",
    )
    records_dropped: Annotated[int | None, Shown("records dropped", ",")] = Field(
        default=None,
        ge=0,
        le=10**12,
        description="causal-lm: training and evaluation records dropped: no token that carries loss fits "
        "model.maxSeqLength (with data.truncation drop, not all of them do); per data file in the run's log and "
        "summary.",
    )
    cpu_utilization_percent: Annotated[float | None, Shown("CPU use", ".0f", "% of a core")] = Field(
        default=None, ge=0, le=100_000, description="CPU use of the training processes, in percent of one core."
    )
    gpu_memory_peak_bytes: Annotated[int | None, Shown("GPU memory peak", ",", "bytes")] = Field(
        default=None, ge=0, le=2**50, description="Largest GPU memory peak of any rank, in bytes, last interval."
    )
    gpu_memory_peak_bytes_min: Annotated[int | None, Shown("GPU memory peak, lowest rank", ",", "bytes")] = Field(
        default=None, ge=0, le=2**50, description="Smallest GPU memory peak of any rank, in bytes, last interval."
    )
    gpu_memory_planned_bytes: Annotated[int | None, Shown("GPU memory planned", ",", "bytes")] = Field(
        default=None,
        ge=0,
        le=2**50,
        description="What the memory plan (rocmtrain plan) expects each GPU to need, in bytes, margin included.",
    )
    gpu_memory_reserved_bytes: Annotated[int | None, Shown("GPU memory reserved", ",", "bytes")] = Field(
        default=None,
        ge=0,
        le=2**50,
        description="Most GPU memory the allocator of any rank held, in bytes, last interval.",
    )
    gpu_utilization_percent: Annotated[float | None, Shown("GPU utilisation", ".0f", "%")] = Field(
        default=None,
        ge=0,
        le=100,
        description="GPU utilisation averaged over the last interval and the ranks, in percent.",
    )
    gpu_utilization_percent_min: Annotated[float | None, Shown("GPU utilisation, lowest rank", ".0f", "%")] = Field(
        default=None, ge=0, le=100, description="Lowest interval-average GPU utilisation of any rank, in percent."
    )
    gpu_utilization_percent_max: Annotated[float | None, Shown("GPU utilisation, highest rank", ".0f", "%")] = Field(
        default=None, ge=0, le=100, description="Highest interval-average GPU utilisation of any rank, in percent."
    )
    custom: list[CustomMetric] | None = Field(
        default=None,
        max_length=MAX_CUSTOM_METRICS,
        description=(
            f"Metrics of your own code (spec.code) without a field above, as last reported: at most "
            f"{MAX_CUSTOM_METRICS}, each a name of up to 64 characters and a number."
        ),
    )


# The field of the metrics without a field of their own: a list, not a row of the display table.
CUSTOM_METRICS = "custom"
# Metrics an evaluation produces: identical on every rank, and new only after an evaluation.
EVAL_METRICS = tuple(name for name, info in Metrics.model_fields.items() if _EVALUATION in info.metadata)


@dataclass(frozen=True)
class MetricRow:
    """One row of the metric display table: a `Metrics` field and how it is shown."""

    name: str  # the field's name in `Metrics`
    key: str  # its key in `status.metrics` (the wire name)
    label: str
    unit: str
    format: str
    description: str

    @property
    def heading(self) -> str:
        """The label with its unit: `GPU utilisation (%)`."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def text(self, value: float) -> str:
        """The value as this row shows it."""
        return format(value, self.format)


def metric_rows() -> tuple[MetricRow, ...]:
    """The metric display table, one row per `Metrics` field in field order (but `custom`, a list):
    `rocmtrain status`, the run summary and the reference show the metrics by it. A field without its
    `Shown` is an error."""
    rows = []
    for name, info in Metrics.model_fields.items():
        if name == CUSTOM_METRICS:
            continue
        shown = next((m for m in info.metadata if isinstance(m, Shown)), None)
        if shown is None:
            raise TypeError(f"Metrics.{name} has no Shown(label, format, unit) annotation")
        rows.append(MetricRow(name, info.alias or name, shown.label, shown.unit, shown.format, info.description or ""))
    return tuple(rows)


HISTORY_LENGTH = 50


class HistoryPoint(ApiModel):
    """One point of the loss curve."""

    model_config = ConfigDict(allow_inf_nan=False)

    step: int = Field(ge=0, le=10**12, description="Optimiser step.")
    train_loss: float | None = Field(default=None, ge=-1e12, le=1e12, description="Training loss at this step.")
    eval_loss: float | None = Field(default=None, ge=-1e12, le=1e12, description="Evaluation loss, if evaluated.")
    eval_accuracy: float | None = Field(default=None, ge=0, le=1, description="Evaluation accuracy, if evaluated.")

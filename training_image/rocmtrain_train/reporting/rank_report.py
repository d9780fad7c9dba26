"""What one training worker hands the driver at every `ray.train.report`: a typed `RankReport`.

Workers report it as a flat dict (`to_metrics`), because Ray Train keeps reported
metrics as JSON; the driver turns each rank's dict back into a RankReport
(`from_metrics`) before `driver_report` aggregates them. Fields that mean per rank what a
status `Metrics` field means for the job carry that field's name, so nothing is renamed
on the way; evaluation results are keyed by `EVAL_METRICS`. What `model.maxSeqLength` did to each data
file's records (`FileTruncation`, language models) travels in every report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rocmtrain.api.models import EVAL_METRICS, Truncation

# Evaluation results by `EVAL_METRICS` name (eval_loss, eval_accuracy, ...).
Evaluation = dict[str, float]


@dataclass(frozen=True)
class FileTruncation:
    """What `model.maxSeqLength` did to one data file's records, counted over every rank (`data.truncation`)."""

    data: Literal["train", "eval"]
    uri: str
    records: int
    cut: int  # their tail cut off; each still carries loss
    dropped: int  # none of their tokens that carry loss fit (with `drop`: not all of them)
    max_length: int
    truncation: Truncation

    def line(self) -> str | None:
        """One line for the driver's log (None where every record fits whole)."""
        if not (self.cut or self.dropped):
            return None
        limit = f"maxSeqLength {self.max_length}"
        why = f"nothing to learn within {limit}" if self.truncation == "cut" else f"tokens to learn past {limit}"
        parts = [f"{self.dropped} dropped ({why}, data.truncation: {self.truncation})"] if self.dropped else []
        parts += [f"{self.cut} cut at the end to {limit}"] if self.cut else []
        return f"{self.data} data {self.uri}: of {self.records} records, {', '.join(parts)}"


@dataclass(frozen=True)
class RankReport:
    """One rank's state at a report: where training stands, running totals, the last interval, resources."""

    rank: int
    world_size: int
    step: int  # optimiser steps done in the whole run
    total_steps: int
    epoch: float  # fractional
    learning_rate: float
    # Running totals of the whole run (they survive restarts from a checkpoint).
    samples: int
    tokens: int
    train_seconds: float
    eval_seconds: float
    data_wait_seconds: float
    # Since the previous report.
    interval_samples: int
    train_loss: float | None  # mean loss over the interval's loss items; None without any
    samples_per_second: float
    tokens_per_second: float
    data_wait_fraction: float
    cpu_utilization_percent: float  # of one core
    padded_tokens: int = 0  # running total of tokens including padding (what the model computed on)
    # What the interval's loss is averaged over: its samples (classifiers), or its tokens that carry loss.
    interval_loss_items: int = 0
    gpu_memory_peak_bytes: int | None = None  # measured on GPUs only
    gpu_memory_reserved_bytes: int | None = None  # the allocator's peak reservation, GPUs only
    gpu_utilization_percent: float | None = None  # interval mean, where amdsmi or rocm-smi can tell
    evaluation: Evaluation = field(default_factory=dict)  # new results, or (final report) the last ones
    generation_samples: list[dict[str, str]] = field(default_factory=list)  # of the evaluation (language models)
    trainable_parameters: int | None = None
    total_parameters: int | None = None
    resumed_from_step: int | None = None  # the checkpoint step this attempt started from
    epoch_end: bool = False
    final: bool = False
    model_path: str | None = None  # where the final model went (final report)
    merged_model_path: str | None = None  # where an adapter's merged model went (final report, adapter.merge)
    weights_checksum: float | None = None  # sum of all weights (final report): equal on every rank
    network: dict[str, Any] | None = None  # rank 0: the network RCCL chose (a NetworkTransport's wire form)
    truncation: list[FileTruncation] = field(default_factory=list)  # per data file (language models)

    def __post_init__(self) -> None:
        if unknown := sorted(set(self.evaluation) - set(EVAL_METRICS)):
            raise ValueError(f"not evaluation metrics: {', '.join(unknown)} (known: {', '.join(EVAL_METRICS)})")

    def to_metrics(self) -> dict[str, Any]:
        """The dict `ray.train.report` takes (JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> RankReport:
        """The report of one rank from what Ray Train hands the driver (keys Ray may add are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        found = {key: value for key, value in metrics.items() if key in names}
        found["truncation"] = [FileTruncation(**f) for f in found.get("truncation", [])]
        return cls(**found)

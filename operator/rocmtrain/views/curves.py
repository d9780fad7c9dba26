"""Loss and accuracy curves of a job (`rocmtrain plot`), from its `status.history` or a local run's
`metrics.jsonl` (every ProgressReport of the run, as `rocmtrain run` writes it).

A local run's reports become points exactly as the operator turns reports into `status.history`
(`rocmtrain.status.progress_patch`), without the operator's bound on the number of points.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.api.models import ProgressReport
from rocmtrain.status.progress_patch import extend_history, history_point

Series = list[tuple[int, float]]  # (step, value)


@dataclass(frozen=True)
class Curves:
    """One job's curves."""

    label: str
    train_loss: Series = field(default_factory=list)
    eval_loss: Series = field(default_factory=list)
    eval_accuracy: Series = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.train_loss or self.eval_loss or self.eval_accuracy)


def _series(points: Sequence[Mapping[str, Any]], key: str) -> Series:
    return [(int(p["step"]), float(p[key])) for p in points if p.get(key) is not None]


def from_history(label: str, history: Sequence[Mapping[str, Any]]) -> Curves:
    """Curves from `status.history` points (wire form)."""
    return Curves(
        label=label,
        train_loss=_series(history, "trainLoss"),
        eval_loss=_series(history, "evalLoss"),
        eval_accuracy=_series(history, "evalAccuracy"),
    )


def from_reports(label: str, lines: Iterable[str]) -> Curves:
    """Curves from the JSON lines of a local run's `metrics.jsonl`; blank lines are skipped."""
    history: list[dict[str, Any]] = []
    metrics: Mapping[str, Any] = {}
    for line in lines:
        if not line.strip():
            continue
        report = ProgressReport.model_validate_json(line)
        if (point := history_point(report, metrics)) is not None:
            history = extend_history(history, point, limit=None)
        metrics = {**metrics, **report.metrics.dump()}
    return from_history(label, history)

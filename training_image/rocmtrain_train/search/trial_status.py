"""Where a hyper-parameter search stands, as `status.tuning` shows it (pure).

The driver keeps one `TrialView` per trial of Ray Tune (its id, state, hyper-parameters and
the results it reported) and turns them into the contract's `TuningStatus`: counts, the best
trial by the search's metric and mode, and a bounded table of trials; and the network RCCL chose
(`search_network`), which the trials' rank 0 read as a single run's does (`rccl_log`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic.alias_generators import to_snake

from rocmtrain.api.models import (
    EVAL_METRICS,
    TRIAL_TABLE_LENGTH,
    NetworkTransport,
    Trial,
    TrialConfig,
    TrialState,
    TuningStatus,
)

# Ray Tune's trial states, as the status names them; TERMINATED is split by whether the run finished.
_STATES: dict[str, TrialState] = {"PENDING": "Pending", "RUNNING": "Running", "PAUSED": "Running", "ERROR": "Failed"}
DONE_STATES = frozenset({"Succeeded", "Stopped", "Failed"})


@dataclass(frozen=True)
class TrialView:
    """One trial as the driver sees it."""

    id: str
    tune_state: str  # Ray Tune's: PENDING, RUNNING, PAUSED, TERMINATED, ERROR
    config: Mapping[str, Any]  # hyper-parameters by TrainingSpec field name
    result: Mapping[str, Any] = field(default_factory=dict)  # its last reported result (see `tune_trials.tune_result`)
    finished: bool = False  # the run reached its end (not stopped early)
    checkpoint: str | None = None  # its latest checkpoint, or its exported model once finished

    @property
    def state(self) -> TrialState:
        if self.tune_state == "TERMINATED":
            return "Succeeded" if self.finished else "Stopped"
        return _STATES.get(self.tune_state, "Pending")

    def metric(self, metric: str) -> float | None:
        """Its latest value of `metric` (wire name), if finite."""
        value = self.result.get(to_snake(metric))
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    @property
    def evaluations(self) -> int:
        return int(self.result.get("evaluations") or 0)

    def evaluation(self) -> dict[str, float]:
        """Its latest evaluation results by `Metrics` field name."""
        return {
            k: float(v) for k in EVAL_METRICS if isinstance(v := self.result.get(k), int | float) and math.isfinite(v)
        }


def best_trial(trials: Iterable[TrialView], metric: str, mode: Literal["max", "min"]) -> TrialView | None:
    """The trial with the best value of `metric` (ties: the earliest id); None while none reported it."""
    scored = [t for t in trials if t.metric(metric) is not None and t.state != "Failed"]
    if not scored:
        return None
    sign = -1.0 if mode == "max" else 1.0
    return min(scored, key=lambda t: (sign * (t.metric(metric) or 0.0), t.id))


def search_network(trials: Iterable[TrialView], best: TrialView | None) -> NetworkTransport | None:
    """The network RCCL chose, as the best trial's rank 0 read it, else the first trial (in Tune's order) that
    reported one; None while none did. The trials of a search run on the same pods with the same settings, so
    they find the same network; the best trial's is that of the run whose model the search keeps, and it changes
    only with the best trial."""
    for trial in [*([best] if best else []), *trials]:
        if (found := trial.result.get("network")) is not None:
            return NetworkTransport.model_validate(found)
    return None


def _row(trial: TrialView, metric: str) -> Trial:
    return Trial(
        id=trial.id,
        state=trial.state,
        config=TrialConfig.model_validate(dict(trial.config)),
        metric=trial.metric(metric),
        iterations=trial.evaluations,
    )


def tuning_status(trials: Iterable[TrialView], *, metric: str, mode: Literal["max", "min"], total: int) -> TuningStatus:
    """The search's status: counts, the best trial, and the table (running trials first, then the best)."""
    trials = list(trials)
    best = best_trial(trials, metric, mode)
    done = sum(t.state in DONE_STATES for t in trials)
    running = sum(t.state == "Running" for t in trials)
    sign = -1.0 if mode == "max" else 1.0

    def order(t: TrialView) -> tuple[int, float, str]:
        value = t.metric(metric)
        return (t.state != "Running", math.inf if value is None else sign * value, t.id)

    return TuningStatus(
        metric=metric,
        mode=mode,
        trials_total=total,
        trials_done=done,
        trials_running=running,
        trials_pending=max(0, total - done - running),
        best_trial_id=best.id if best else None,
        best_metric=best.metric(metric) if best else None,
        best_config=TrialConfig.model_validate(dict(best.config)) if best else None,
        best_checkpoint=best.checkpoint if best else None,
        trials=[_row(t, metric) for t in sorted(trials, key=order)[:TRIAL_TABLE_LENGTH]],
    )

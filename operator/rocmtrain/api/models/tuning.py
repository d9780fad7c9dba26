"""spec.tuning: a hyper-parameter search, its search space and early stopping."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.adapter import ADAPTER_RANKS
from rocmtrain.api.models.base import ApiModel, _cel

# Metrics a search may optimise (`Metrics` fields by wire name), with the mode each is best in,
# and the tasks that produce them.
TUNING_METRICS: dict[str, tuple[Literal["max", "min"], tuple[str, ...]]] = {
    "evalAccuracy": ("max", ("sequence-classification",)),
    "evalF1": ("max", ("sequence-classification",)),
    "evalLoss": ("min", ("sequence-classification", "regression", "causal-lm")),
    "evalMse": ("min", ("regression",)),
    "evalPerplexity": ("min", ("causal-lm",)),
    "evalExactMatch": ("max", ("causal-lm",)),
}
TuningMetric = Literal["evalAccuracy", "evalF1", "evalLoss", "evalMse", "evalPerplexity", "evalExactMatch"]
# The metric that ranks a search's trials when spec.tuning.metric is unset.
DEFAULT_TUNING_METRIC: dict[str, TuningMetric] = {
    "sequence-classification": "evalAccuracy",
    "regression": "evalMse",
    "causal-lm": "evalPerplexity",
}
MIN_BELOW_MAX = "min must be less than max"


class Range(ApiModel):
    """A continuous range of a hyper-parameter: min below max."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [_cel("self.min < self.max", MIN_BELOW_MAX, fieldPath=".min")]}
    )

    min: float = Field(ge=0, le=1, description="Lowest value.")
    max: float = Field(ge=0, le=1, description="Highest value.")

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min >= self.max:
            raise ValueError(MIN_BELOW_MAX)
        return self


class SearchSpace(ApiModel):
    """The hyper-parameters a search varies; the others keep their `spec.training` values."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.learningRate) || has(self.batchSizePerWorker) || has(self.warmupRatio) "
                    "|| has(self.weightDecay) || has(self.epochs) || has(self.adapterRank)",
                    "the search space must vary at least one hyper-parameter",
                )
            ]
        }
    )

    learning_rate: Range | None = Field(
        default=None, description="Peak learning rate, sampled log-uniformly between min (> 0) and max."
    )
    batch_size_per_worker: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None, min_length=1, max_length=16, description="Micro-batch sizes per rank to choose from."
    )
    warmup_ratio: Range | None = Field(
        default=None, description="Warmup share of the steps, sampled uniformly (at most 0.5)."
    )
    weight_decay: Range | None = Field(default=None, description="AdamW weight decay, sampled uniformly.")
    epochs: list[Annotated[int, Field(ge=1, le=1000)]] | None = Field(
        default=None, min_length=1, max_length=16, description="Numbers of epochs to choose from."
    )
    adapter_rank: list[ADAPTER_RANKS] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="LoRA ranks to choose from (needs spec.adapter; alpha follows the rank where adapter.alpha is "
        "unset).",
    )

    @model_validator(mode="after")
    def _not_empty(self) -> SearchSpace:
        if not self.dump():
            raise ValueError("the search space must vary at least one hyper-parameter")
        return self


class TuningScheduler(ApiModel):
    """Early stopping of trials that fall behind."""

    type: Literal["ASHA", "None"] = Field(
        default="ASHA",
        description=(
            "ASHA (asynchronous successive halving: at each rung, trials below the best 1/reductionFactor "
            "stop) or None (every trial runs to its end)."
        ),
    )
    grace_period: int = Field(
        default=1, ge=1, le=1000, description="Evaluations every trial completes before it may be stopped."
    )
    reduction_factor: int = Field(
        default=2, ge=2, le=16, description="Keep the best 1/reductionFactor of the trials at each rung."
    )


class TuningSpec(ApiModel):
    """A hyper-parameter search: many trials of the job, each a full data-parallel run."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.maxConcurrentTrials <= self.numTrials",
                    "maxConcurrentTrials must not exceed numTrials",
                    fieldPath=".maxConcurrentTrials",
                )
            ]
        }
    )

    search_space: SearchSpace = Field(description="The hyper-parameters to search and their ranges or choices.")
    num_trials: int = Field(default=4, ge=1, le=1000, description="Trials to run in all.")
    max_concurrent_trials: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Trials that run at once; the Ray cluster gets workers x maxConcurrentTrials worker pods.",
    )
    metric: TuningMetric | None = Field(
        default=None,
        description=(
            "Evaluation metric that ranks the trials; evalAccuracy for sequence-classification, evalMse for "
            "regression and evalPerplexity for causal-lm when unset. Needs spec.data.eval."
        ),
    )
    mode: Literal["max", "min"] | None = Field(
        default=None, description="Whether the metric is best high or low; from the metric when unset."
    )
    scheduler: TuningScheduler = Field(default_factory=TuningScheduler, description="Early stopping.")
    seed: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Seed of the search's sampling; training.seed when unset."
    )

    @model_validator(mode="after")
    def _concurrency(self) -> TuningSpec:
        if self.max_concurrent_trials > self.num_trials:
            raise ValueError("maxConcurrentTrials must not exceed numTrials")
        return self

    def metric_for(self, task: str) -> str:
        """The metric (wire name) that ranks the trials of a job of `task`."""
        return self.metric or DEFAULT_TUNING_METRIC[task]

    def mode_for(self, task: str) -> Literal["max", "min"]:
        """Whether the metric is best high or low."""
        return self.mode or TUNING_METRICS[self.metric_for(task)][0]

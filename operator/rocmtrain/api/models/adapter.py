"""spec.adapter and spec.evaluation: a LoRA adapter, and generation on held-out prompts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.types import ModuleName

ALL_LINEAR = "all-linear"
ALL_LINEAR_ALONE = "all-linear stands alone in targetModules"
ADAPTER_RANKS = Annotated[int, Field(ge=1, le=1024)]


def _all_linear_alone(modules: list[str]) -> list[str]:
    if ALL_LINEAR in modules and len(modules) > 1:
        raise ValueError(ALL_LINEAR_ALONE)
    return modules


TargetModules = Annotated[
    list[ModuleName],
    AfterValidator(_all_linear_alone),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(f"!self.exists(m, m == '{ALL_LINEAR}') || self.size() == 1", ALL_LINEAR_ALONE)
            ]
        }
    ),
]


class AdapterSpec(ApiModel):
    """A LoRA adapter (peft): only its low-rank matrices train, the base model stays frozen."""

    type: Literal["lora"] = Field(default="lora", description="Adapter kind: lora.")
    rank: ADAPTER_RANKS = Field(default=16, description="Rank r of the low-rank update matrices.")
    alpha: int | None = Field(
        default=None,
        ge=1,
        le=16_384,
        description="Scale numerator: updates are scaled by alpha / rank; 2 x rank when unset.",
    )
    dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: TargetModules | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description=(
            "Modules to adapt: names (q_proj, v_proj, ...) matched against the ends of the model's module paths, "
            "or [all-linear] for every linear layer but the output head; peft's default for the model family "
            "(Llama, Qwen, Mistral: q_proj and v_proj) when unset. Names that match no module are refused "
            "before training, with the model's linear module names listed."
        ),
    )
    merge: bool = Field(
        default=False,
        description="Also export the base model with the adapter merged in, loadable without peft.",
    )

    @property
    def scale_numerator(self) -> int:
        """LoRA's alpha: `alpha`, or 2 x rank."""
        return self.alpha if self.alpha is not None else 2 * self.rank


class GenerateSpec(ApiModel):
    """Greedy generation on held-out prompts, scored by exact match against their responses."""

    max_new_tokens: int = Field(default=64, ge=1, le=4096, description="Most tokens generated per prompt.")
    records: int = Field(
        default=32, ge=1, le=10_000, description="Evaluation records (the first, after shuffling) to generate for."
    )


class EvaluationSpec(ApiModel):
    """What evaluation measures beyond the loss."""

    generate: GenerateSpec | None = Field(
        default=None,
        description=(
            "causal-lm: generate responses to the evaluation prompts and report evalExactMatch; a few samples go "
            "to the run's log and summary, never to the status."
        ),
    )

"""spec.model: the pretrained Transformer to fine-tune, and its task."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.patterns import TEXT
from rocmtrain.api.types import Location

Task = Literal["sequence-classification", "regression", "causal-lm"]
LM_NO_LABELS = "numLabels is for classification; a causal-lm job predicts tokens"
CHAT_TEMPLATE_LM = "chatTemplate is for task causal-lm"
CHAT_TEMPLATE_LENGTH = 16_384


class ModelSpec(ApiModel):
    """The pretrained Transformer to fine-tune."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.task != 'sequence-classification' || has(self.numLabels)",
                    "numLabels is required when task is sequence-classification",
                    fieldPath=".numLabels",
                ),
                _cel(
                    "self.task != 'regression' || !has(self.numLabels) || self.numLabels == 1",
                    "numLabels must be 1 or unset when task is regression",
                    fieldPath=".numLabels",
                ),
                _cel("self.task != 'causal-lm' || !has(self.numLabels)", LM_NO_LABELS, fieldPath=".numLabels"),
                _cel(
                    "self.task == 'causal-lm' || !has(self.chatTemplate)", CHAT_TEMPLATE_LM, fieldPath=".chatTemplate"
                ),
            ]
        }
    )

    source: Location = Field(
        description=(
            "Where the pretrained weights and tokenizer are: an absolute path (a mounted "
            "volume), an object-store URI (s3://, gs://, abfs://), or a Hugging Face hub id "
            "(`org/name` or `hf://org/name`) where the cluster can reach the hub; `rocmtrain run` "
            "also accepts a `./` path relative to the job file."
        )
    )
    task: Task = Field(
        default="sequence-classification",
        description=(
            "What to train: sequence-classification with numLabels classes, regression (one output), or "
            "causal-lm (a language model: instruction pairs, chats or plain text, see spec.data)."
        ),
    )
    num_labels: int | None = Field(
        default=None,
        ge=1,
        le=10000,
        description="Number of classes; required for sequence-classification (at least 2).",
    )
    max_seq_length: int = Field(
        default=256,
        ge=8,
        le=131_072,
        description="Longest tokenised input (causal-lm: the whole record, prompt and response); longer ones are "
        "truncated at the end.",
    )
    chat_template: Annotated[str, StringConstraints(pattern=TEXT, max_length=CHAT_TEMPLATE_LENGTH)] | None = Field(
        default=None,
        description=(
            "causal-lm with chat records (data.messagesField): the Jinja chat template that renders them, where the "
            "model's tokenizer has none (it replaces the tokenizer's own where set)."
        ),
    )

    @model_validator(mode="after")
    def _labels_match_task(self) -> ModelSpec:
        if self.task == "sequence-classification":
            if self.num_labels is None:
                raise ValueError("numLabels is required when task is sequence-classification")
            if self.num_labels < 2:
                raise ValueError("numLabels must be at least 2 for sequence-classification")
        elif self.task == "regression" and self.num_labels not in (None, 1):
            raise ValueError("numLabels must be 1 or unset when task is regression")
        elif self.task == "causal-lm" and self.num_labels is not None:
            raise ValueError(LM_NO_LABELS)
        if self.task != "causal-lm" and self.chat_template is not None:
            raise ValueError(CHAT_TEMPLATE_LM)
        return self

"""spec.data: the training and evaluation records."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.types import DnsLabel, FieldName, Location


class DataSource(ApiModel):
    """One data set: a file or folder of records, or a hub data set."""

    uri: Location = Field(
        description=(
            "An absolute path (file or folder on a volume), an object-store URI (s3://, gs://, "
            "abfs://), or a hub data set (`hf://datasets/org/name`); `rocmtrain run` also accepts "
            "a `./` path relative to the job file."
        )
    )
    format: Literal["jsonl", "csv", "parquet"] | None = Field(
        default=None,
        description="Record format; inferred from the file extension when unset.",
    )
    split: DnsLabel | None = Field(
        default=None, description="Split of a hub data set (for example train, test); hub sources only."
    )
    max_samples: int | None = Field(
        default=None, ge=1, le=1_000_000_000, description="Use at most this many records (after shuffling)."
    )


RecordShape = Literal["pairs", "chat", "text"]
PAIR_FIELDS_TOGETHER = "promptField and responseField go together"
ONE_RECORD_SHAPE = "set either messagesField or promptField and responseField, not both"


class DataSpec(ApiModel):
    """Training and evaluation data."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.promptField) == has(self.responseField)", PAIR_FIELDS_TOGETHER, fieldPath=".promptField"
                ),
                _cel(
                    "!has(self.messagesField) || !has(self.promptField)", ONE_RECORD_SHAPE, fieldPath=".messagesField"
                ),
            ]
        }
    )

    train: DataSource = Field(description="Training records.")
    eval: DataSource | None = Field(default=None, description="Evaluation records; without it, evaluation is skipped.")
    text_field: FieldName = Field(
        default="text",
        description="Record field holding the input text (causal-lm: the plain text, where neither promptField nor "
        "messagesField is set).",
    )
    text_pair_field: FieldName | None = Field(
        default=None, description="Optional second text field, for sentence-pair tasks."
    )
    label_field: FieldName = Field(
        default="label", description="Record field holding the label (class index or number)."
    )
    prompt_field: FieldName | None = Field(
        default=None, description="causal-lm instruction pairs: the record field holding the prompt."
    )
    response_field: FieldName | None = Field(
        default=None, description="causal-lm instruction pairs: the record field holding the response to learn."
    )
    messages_field: FieldName | None = Field(
        default=None,
        description=(
            "causal-lm chats: the record field holding a list of {role, content} messages (roles system, user, "
            "assistant, tool), rendered by the tokenizer's chat template or model.chatTemplate."
        ),
    )
    shuffle_seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Seed for shuffling records before sharding.")

    @model_validator(mode="after")
    def _one_shape(self) -> DataSpec:
        if (self.prompt_field is None) != (self.response_field is None):
            raise ValueError(PAIR_FIELDS_TOGETHER)
        if self.messages_field is not None and self.prompt_field is not None:
            raise ValueError(ONE_RECORD_SHAPE)
        return self

    @property
    def record_shape(self) -> RecordShape:
        """What a causal-lm record is: an instruction pair, a chat, or plain text."""
        if self.messages_field is not None:
            return "chat"
        return "pairs" if self.prompt_field is not None else "text"

    @property
    def lm_fields(self) -> tuple[str, ...]:
        """The fields that name causal-lm records (those set)."""
        fields = (self.prompt_field, self.response_field, self.messages_field)
        return tuple(f for f in fields if f is not None)

"""spec.data: the training and evaluation records."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.models.chat_template_args import (
    ARGS_FOR_CHATS,
    ARGS_RESERVED,
    CHAT_TEMPLATE_ARGS,
    RESERVED_RULE,
    ChatTemplateArgs,
    reserved_args,
)
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
Truncation = Literal["cut", "drop"]
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
                _cel(
                    "!has(self.chatTemplateArgs) || has(self.messagesField)",
                    ARGS_FOR_CHATS,
                    fieldPath=".chatTemplateArgs",
                ),
                _cel(RESERVED_RULE, ARGS_RESERVED, fieldPath=".chatTemplateArgs"),
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
    chat_template_args: ChatTemplateArgs | None = Field(
        default=None,
        max_length=CHAT_TEMPLATE_ARGS,
        description=(
            "causal-lm chats: options the chat template reads, passed to it in training and in evaluation's "
            'generation prompts, such as {enable_thinking: "false"} for Qwen3. Each value is text of at most 1024 '
            'characters: a JSON boolean, number or string in double quotes (false, 3, 0.5, "on") reaches the '
            "template as that value, other text as itself."
        ),
    )
    truncation: Truncation | None = Field(
        default=None,
        description=(
            "Records longer than model.maxSeqLength tokens: cut (the default: keep each, its tail cut off) or drop "
            "(causal-lm: "
            "drop a record whose tokens that carry loss would be cut). Either way a record left with no token that "
            "carries loss is dropped: it has nothing to teach. cut, as TRL truncates, keeps every record that still "
            "teaches something; drop trains on whole responses only. The run's log and summary count the records "
            "cut and dropped per file, the status in all."
        ),
    )
    shuffle_seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Seed for shuffling records before sharding.")

    @property
    def over_length(self) -> Truncation:
        """What happens to a record longer than maxSeqLength: `truncation`, else cut (as every job did before the
        field existed: unset, a stored job renders as it did)."""
        return self.truncation or "cut"

    @model_validator(mode="after")
    def _one_shape(self) -> DataSpec:
        if (self.prompt_field is None) != (self.response_field is None):
            raise ValueError(PAIR_FIELDS_TOGETHER)
        if self.messages_field is not None and self.prompt_field is not None:
            raise ValueError(ONE_RECORD_SHAPE)
        return self

    @model_validator(mode="after")
    def _chat_template_args(self) -> DataSpec:
        if self.chat_template_args is not None and self.messages_field is None:
            raise ValueError(ARGS_FOR_CHATS)
        if self.chat_template_args is not None and reserved_args(self.chat_template_args):
            raise ValueError(ARGS_RESERVED)
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

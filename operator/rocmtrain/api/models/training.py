"""spec.training: the optimisation hyper-parameters."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.base import ApiModel, _cel

FSDP_FP16 = "sharding: fsdp computes in bf16 or fp32: fp16 would need a sharded gradient scaler; use bf16"
VARLEN_PACKING = (
    "packing and attentionImplementation: varlen are two layouts: varlen puts each micro-batch's records in one "
    "row already (padding-free); packing cuts them into rows of maxSeqLength; choose one"
)


class TrainingSpec(ApiModel):
    """Optimisation hyper-parameters."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.sharding) || self.sharding != 'fsdp' || !has(self.precision) "
                    "|| self.precision != 'fp16'",
                    FSDP_FP16,
                    fieldPath=".precision",
                ),
                _cel(
                    "!self.packing || !has(self.attentionImplementation) || self.attentionImplementation != 'varlen'",
                    VARLEN_PACKING,
                    fieldPath=".packing",
                ),
            ]
        }
    )

    epochs: int = Field(default=3, ge=1, le=1000, description="Passes over the training data.")
    batch_size_per_worker: int = Field(
        default=32, ge=1, le=4096, description="Micro-batch size of each rank (each GPU, or each worker on CPUs)."
    )
    learning_rate: float = Field(
        default=5e-5, gt=0, le=1, description="Peak learning rate for the base world size of one rank."
    )
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        default="none",
        description=(
            "How the learning rate grows with the world size W (workers x gpusPerWorker, or workers on CPUs): "
            "none, linear (x W), or sqrt (x sqrt W)."
        ),
    )
    warmup_ratio: float = Field(
        default=0.06, ge=0, le=0.5, description="Share of optimiser steps spent in linear warmup."
    )
    weight_decay: float = Field(default=0.01, ge=0, le=1, description="AdamW weight decay.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, le=1024, description="Micro-batches per optimiser step.")
    max_grad_norm: float = Field(default=1.0, ge=0, le=1000, description="Gradient clipping norm; 0 disables clipping.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="bf16",
        description="Autocast precision on GPUs; runs without GPUs always use fp32.",
    )
    eval_every_steps: int = Field(
        default=0,
        ge=0,
        le=10_000_000,
        description="Evaluate every N optimiser steps; 0 evaluates at the end of each epoch only.",
    )
    seed: int = Field(default=42, ge=0, le=2**31 - 1, description="Seed for weights, dropout and sampling.")
    attention_implementation: Literal["sdpa", "eager", "varlen"] = Field(
        default="sdpa",
        description=(
            "Attention kernels: sdpa (PyTorch scaled-dot-product attention, which runs flash and "
            "memory-efficient kernels on ROCm), eager (the model's own implementation, for models without "
            "SDPA support), or varlen (causal-lm, padding-free: each micro-batch is one row of its records back "
            "to back, positions restarting at each record, no attention across records; on GPUs "
            "flash-attention's variable-length kernel where the flash-attn package is installed, as in the "
            "training image, else SDPA with a block-diagonal mask, as on CPUs)."
        ),
    )
    tokens_per_worker: int | None = Field(
        default=None,
        ge=64,
        le=1_048_576,
        description=(
            "causal-lm: fill each micro-batch with records up to this many tokens (padding counted) instead of "
            "batchSizePerWorker records, and each optimiser step with about workers x gpusPerWorker x "
            "gradientAccumulationSteps micro-batches' worth: every step carries about the same work. At least "
            "maxSeqLength. batchSizePerWorker then sizes evaluation's batches only. Unset: steps of records."
        ),
    )
    loss_implementation: Literal["chunked", "fused", "model"] | None = Field(
        default=None,
        description=(
            "causal-lm: how the next-token loss meets the vocabulary. chunked: the output head and the "
            "cross-entropy a few hundred tokens at a time (PyTorch; the logits of the whole batch are never held); "
            "fused: Liger's fused linear cross-entropy kernel (GPUs, with the liger-kernel package); model: the "
            "model's own head and loss (every token's float32 logits). Unset: fused where Liger is installed on "
            "GPUs, else chunked; model for heads that are not one plain linear layer (soft-capped logits)."
        ),
    )
    compile: bool = Field(
        default=False,
        description=(
            "Compile the model with torch.compile; batches are then padded to multiples of 64 tokens so that "
            "only a few shapes compile. Start-up takes minutes longer; long GPU runs gain."
        ),
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description=(
            "Recompute activations during the backward pass instead of keeping them: much less GPU memory "
            "for large models or long sequences, for about a third more compute."
        ),
    )
    sharding: Literal["none", "fsdp"] = Field(
        default="none",
        description=(
            "How the model is spread over the ranks: none (data parallelism: every GPU holds the whole model, its "
            "gradients and optimiser state) or fsdp (PyTorch FSDP2: each transformer block's parameters, gradients "
            "and optimiser state sharded over the ranks, gathered one block at a time), for models larger than one "
            "GPU."
        ),
    )
    sharding_scope: Literal["pod", "job"] = Field(
        default="pod",
        description=(
            "fsdp: shard within each worker pod and replicate across pods (hybrid sharding: the all-gathers stay on "
            "a node's xGMI links; each pod holds the whole model; pods of one GPU shard over the job), or shard over "
            "every rank of the job (least memory per GPU, all-gathers across nodes)."
        ),
    )
    loss_on: Literal["response", "all"] | None = Field(
        default=None,
        description=(
            "causal-lm: the tokens that carry loss: response (the responses, or the assistant's messages) or all "
            "(prompts too). response where records have prompts or chats, all for plain text, when unset. The loss "
            "is the mean over those tokens of the whole global batch."
        ),
    )
    packing: bool = Field(
        default=False,
        description=(
            "causal-lm: pack several records into rows of maxSeqLength tokens, with no attention across records "
            "(positions restart per record), instead of padding each record; batchSizePerWorker then counts rows."
        ),
    )

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingSpec:
        if self.sharding == "fsdp" and self.precision == "fp16":
            raise ValueError(FSDP_FP16)
        if self.packing and self.varlen:
            raise ValueError(VARLEN_PACKING)
        return self

    @property
    def varlen(self) -> bool:
        """Padding-free micro-batches: one row of records, positions restarting at each (`attentionImplementation`)."""
        return self.attention_implementation == "varlen"

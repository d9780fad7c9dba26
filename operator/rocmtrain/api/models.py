"""The RocmTrainingJob API: spec and status models.

These pydantic models are the single source of truth for the custom resource:
`rocmtrain.api.crd` generates `crds/` from them, the operator validates and
renders from them, and the training image reads its configuration through them.
Cross-field rules live next to the model they constrain, once as a pydantic
validator and once as the equivalent CEL rule (`x-kubernetes-validations`);
the test suite checks both reject the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel, to_snake

from rocmtrain.api.contract import GPU_NODE_LABELS, GPU_RESOURCE, PYTHON
from rocmtrain.api.patterns import (
    CURRENCY,
    DELIVERY_ID,
    DNS_SUBDOMAIN,
    EXTENDED_RESOURCE,
    FS_TYPE,
    HCA_NAME,
    INTERFACE_NAME,
    NETWORK_ATTACHMENT,
    NOTIFICATION_TARGET,
    RCCL_NETWORK,
    TEXT,
)
from rocmtrain.api.types import (
    AbsPath,
    AmdResourceName,
    ConfigKey,
    DnsLabel,
    DnsSubdomain,
    EnvName,
    FieldName,
    GpuPartition,
    Image,
    LabelKey,
    LabelledName,
    LabelValue,
    Location,
    MetricName,
    ModuleName,
    PythonModule,
    Quantity,
    RelPath,
    Text,
)

SINGULAR = "rocmtrainingjob"
SHORT_NAMES = ["rtj"]
CATEGORIES = ["rocmtrain", "ml"]
DEFAULT_IMAGE = "ghcr.io/rocm-train-operator/training:0.1.0"
# Longest job name: derived names (`<name>-xxxxx-head-xxxxx` pods, services)
# must stay within DNS-1123 label limits, as KubeRay's own validation requires.
MAX_NAME_LENGTH = 40


def _cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"rule": rule, "message": message, **extra}


def _cel_with_model_and_data(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    """A rule reading spec.model and spec.data, checked only where both are given (a job with code may lack them).

    CEL fails on a missing key, and `||` absorbs that error only when another operand is true: the guards do.
    """
    return _cel(f"!has(self.model) || !has(self.data) || ({rule})", message, **extra)


class ApiModel(BaseModel):
    """Base for API objects: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def dump(self) -> dict[str, Any]:
        """Return the wire form: camelCase keys, unset optionals omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --- model ----------------------------------------------------------------------

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


# --- data -----------------------------------------------------------------------


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


# --- hyper-parameters -------------------------------------------------------------


FSDP_FP16 = "sharding: fsdp computes in bf16 or fp32: fp16 would need a sharded gradient scaler; use bf16"


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
                )
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
    attention_implementation: Literal["sdpa", "eager"] = Field(
        default="sdpa",
        description=(
            "Attention kernels: sdpa (PyTorch scaled-dot-product attention, which runs flash and "
            "memory-efficient kernels on ROCm) or eager (the model's own implementation, for models without "
            "SDPA support)."
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
    def _sharded_precision(self) -> TrainingSpec:
        if self.sharding == "fsdp" and self.precision == "fp16":
            raise ValueError(FSDP_FP16)
        return self


# --- language models: adapters and generation -----------------------------------------

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


# --- resources and scheduling -----------------------------------------------------


class HeadResources(ApiModel):
    """Resources of the Ray head pod (it runs the driver, no training)."""

    cpu: Quantity = Field(default="2", description="CPU request and limit of the head container.")
    memory: Quantity = Field(default="8Gi", description="Memory request and limit of the head container.")


RESOURCE_NOT_PARTITION = "with a partition, resourceName must be amd.com/<partition> (mixed naming)"


class GpuSelector(ApiModel):
    """GPU model selection through the AMD GPU node-labeller's node labels."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.resourceName) || !has(self.partition) "
                    "|| self.resourceName == 'amd.com/' + self.partition",
                    RESOURCE_NOT_PARTITION,
                    fieldPath=".resourceName",
                )
            ]
        }
    )

    product_name: LabelValue | None = Field(
        default=None,
        description=f"Value of `{GPU_NODE_LABELS['product_name']}`, for example AMD_Instinct_MI300X_OAM.",
    )
    family: LabelValue | None = Field(
        default=None, description=f"Value of `{GPU_NODE_LABELS['family']}`, for example AI (CDNA)."
    )
    vram: LabelValue | None = Field(
        default=None, description=f"Value of `{GPU_NODE_LABELS['vram']}`, for example 192G."
    )
    partition: GpuPartition | None = Field(
        default=None,
        description=f"Compute and memory partition, the value of `{GPU_NODE_LABELS['partition']}` (for example "
        "cpx_nps4): each worker GPU is one partition of a GPU. With the device plugin's `single` naming the pods "
        f"request `{GPU_RESOURCE}`; with `mixed` naming set resourceName too.",
    )
    resource_name: AmdResourceName | None = Field(
        default=None,
        description="The device plugin's resource to request instead of `amd.com/gpu`, for `mixed` naming: "
        "`amd.com/<partition>` (for example amd.com/cpx_nps4); Ray is told the worker's GPUs (`num-gpus`).",
    )

    @model_validator(mode="after")
    def _resource_names_its_partition(self) -> GpuSelector:
        named = self.resource_name is not None and self.partition is not None
        if named and self.resource_name != f"amd.com/{self.partition}":
            raise ValueError(RESOURCE_NOT_PARTITION)
        return self

    @property
    def resource(self) -> str:
        """The extended resource the worker pods request for their GPUs."""
        return self.resource_name or GPU_RESOURCE

    def node_labels(self) -> dict[str, str]:
        """The node labels (and values) a node must carry to match: one per field that is set."""
        return {label: value for field, label in GPU_NODE_LABELS.items() if (value := getattr(self, field)) is not None}


RDMA_WITHOUT_RESOURCE = "RDMA settings (ibHca, gidIndex) need rdmaResource when workers > 1"


class NetworkSpec(ApiModel):
    """Multi-node networking of the workers: RDMA NICs, a secondary network and RCCL's settings.

    RCCL reads the NCCL_* variables. Without RDMA it falls back to TCP over the pod network.
    """

    rdma_resource: Annotated[str, StringConstraints(pattern=EXTENDED_RESOURCE, max_length=253)] | None = Field(
        default=None,
        description="Extended resource of the RDMA NICs the network operator exposes (rdma/rdma_shared_device_a).",
    )
    rdma_per_worker: int = Field(default=1, ge=1, le=16, description="rdmaResource requested per worker pod.")
    networks: list[Annotated[str, StringConstraints(pattern=NETWORK_ATTACHMENT, max_length=160)]] = Field(
        default_factory=list,
        max_length=8,
        description="Multus secondary networks of the worker pods ([namespace/]name[@interface]), the value of "
        "`k8s.v1.cni.cncf.io/networks`.",
    )
    ib_hca: list[Annotated[str, StringConstraints(pattern=HCA_NAME, max_length=68)]] = Field(
        default_factory=list, max_length=32, description="HCAs RCCL uses (NCCL_IB_HCA), for example mlx5_0."
    )
    socket_interface: Annotated[str, StringConstraints(pattern=INTERFACE_NAME)] | None = Field(
        default=None, description="Interface for RCCL's bootstrap and socket traffic (NCCL_SOCKET_IFNAME)."
    )
    gid_index: int | None = Field(default=None, ge=0, le=255, description="RoCE GID index (NCCL_IB_GID_INDEX).")

    @property
    def names_rdma(self) -> bool:
        """Whether RCCL's RDMA settings are given."""
        return bool(self.ib_hca) or self.gid_index is not None

    def nccl_env(self) -> dict[str, str]:
        """RCCL's variables, for the set fields only (plain values: no shell reads them)."""
        values = {
            "NCCL_IB_HCA": ",".join(self.ib_hca) or None,
            "NCCL_SOCKET_IFNAME": self.socket_interface,
            "NCCL_IB_GID_INDEX": None if self.gid_index is None else str(self.gid_index),
        }
        return {name: value for name, value in values.items() if value is not None}


class ResourcesSpec(ApiModel):
    """Workers, GPUs and pod resources."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.gpusPerWorker > 0 || !has(self.gpu)",
                    "gpu model selection requires gpusPerWorker > 0",
                    fieldPath=".gpu",
                ),
                _cel(
                    "self.workers <= 1 || self.gpusPerWorker == 0 || !has(self.network) "
                    "|| has(self.network.rdmaResource) || !has(self.network.gidIndex) "
                    "&& (!has(self.network.ibHca) || size(self.network.ibHca) == 0)",
                    RDMA_WITHOUT_RESOURCE,
                    fieldPath=".network.rdmaResource",
                ),
            ]
        }
    )

    workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Worker pods; each runs one Ray Train worker (a DDP rank) per GPU, or one on CPUs.",
    )
    gpus_per_worker: int = Field(
        default=1,
        ge=0,
        le=16,
        description=f"AMD GPUs (`{GPU_RESOURCE}`) per worker pod, each trained on by its own rank; 0 trains on CPU.",
    )
    cpus_per_worker: Quantity = Field(default="8", description="CPU request and limit per worker pod.")
    memory_per_worker: Quantity = Field(default="64Gi", description="Memory request and limit per worker pod.")
    shared_memory: Quantity = Field(
        default="16Gi", description="Size of the in-memory /dev/shm volume for data loaders and RCCL."
    )
    head: HeadResources = Field(default_factory=HeadResources, description="Ray head pod resources.")
    gpu: GpuSelector | None = Field(
        default=None, description="Required GPU model, matched against AMD node-labeller labels."
    )

    network: NetworkSpec | None = Field(
        default=None, description="Multi-node networking of the workers: RDMA, secondary network, RCCL settings."
    )

    @property
    def gpu_resource(self) -> str:
        """The extended resource a worker's GPUs are requested as: `amd.com/gpu`, or a partition's (mixed naming)."""
        return self.gpu.resource if self.gpu is not None else GPU_RESOURCE

    @model_validator(mode="after")
    def _gpu_selection_needs_gpus(self) -> ResourcesSpec:
        if self.gpu is not None and self.gpus_per_worker == 0:
            raise ValueError("gpu model selection requires gpusPerWorker > 0")
        return self

    @model_validator(mode="after")
    def _rdma_needs_a_resource(self) -> ResourcesSpec:
        network = self.network
        if self.workers > 1 and self.gpus_per_worker and network and network.names_rdma and not network.rdma_resource:
            raise ValueError(f"{RDMA_WITHOUT_RESOURCE} (without it RCCL falls back to TCP over the pod network)")
        return self

    @property
    def total_gpus(self) -> int:
        """AMD GPUs the job asks for in all: the one place this is computed."""
        return self.workers * self.gpus_per_worker


class Toleration(ApiModel):
    """A Kubernetes toleration for the Ray pods."""

    key: LabelKey | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: LabelValue | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="For NoExecute: how long the pod stays bound after the taint."
    )


TopologyMode = Literal["required", "preferred"]
TOPOLOGY_NEEDS_QUEUE = (
    "topology needs scheduling.queueName: Kueue's Topology Aware Scheduling places the pods, and only a job "
    "queued in Kueue is placed by it"
)


class TopologySpec(ApiModel):
    """Kueue's Topology Aware Scheduling: keep the Ray pods within one domain of a topology level."""

    level: LabelKey = Field(
        description="Node label of a level of the Kueue Topology that the job's ResourceFlavor uses, for example "
        "cloud.provider.com/topology-rack: the head's and the workers' pods are placed in one domain of it."
    )
    mode: TopologyMode = Field(
        default="preferred",
        description="required: the job waits (Queued) until its pods fit in one domain of the level; preferred: "
        "Kueue packs them as tightly as it can, in one domain where they fit.",
    )


class SchedulingSpec(ApiModel):
    """Where and in which order the Ray pods are placed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("!has(self.topology) || has(self.queueName)", TOPOLOGY_NEEDS_QUEUE, fieldPath=".topology")
            ]
        }
    )

    queue_name: LabelledName | None = Field(
        default=None,
        description="Kueue LocalQueue; sets `kueue.x-k8s.io/queue-name` (a label: at most 63 characters) and lets "
        "Kueue admit the job.",
    )
    kueue_priority_class: LabelledName | None = Field(
        default=None,
        description="Kueue WorkloadPriorityClass; sets `kueue.x-k8s.io/priority-class` (a label: at most 63 "
        "characters).",
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None, description="Kubernetes PriorityClass of the Ray pods."
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Extra node labels the Ray pods require."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations for the Ray pods."
    )
    topology: TopologySpec | None = Field(
        default=None,
        description="Topology-aware placement by Kueue (needs queueName): Kueue's pod-set topology annotation on "
        "the head's and the workers' pod templates.",
    )

    @model_validator(mode="after")
    def _topology_needs_queue(self) -> SchedulingSpec:
        if self.topology is not None and self.queue_name is None:
            raise ValueError(TOPOLOGY_NEEDS_QUEUE)
        return self


# --- pod extras -------------------------------------------------------------------


class LocalObjectReference(ApiModel):
    """A reference to an object in the job's namespace by name."""

    name: DnsSubdomain = Field(description="Object name.")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: DnsSubdomain = Field(description="Secret name.")
    key: ConfigKey = Field(description="Key within the Secret.")


NotifyEvent = Literal["Queued", "Running", "Succeeded", "Failed", "Stalled", "NewBestTrial"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("Queued", "Running", "Succeeded", "Failed", "Stalled", "NewBestTrial")
# Receivers one job may notify.
MAX_NOTIFICATIONS = 4


class NotificationSecretRef(ApiModel):
    """The Secret in the job's namespace that holds a receiver's URL (and signing key)."""

    name: DnsSubdomain = Field(description="Secret name (the operator needs `get` on it: docs/guides/observing.md).")
    url_key: ConfigKey = Field(default="url", description="Key holding the receiver's http(s) URL.")
    signing_key_key: ConfigKey | None = Field(
        default=None,
        description="Key holding the HMAC-SHA256 signing key; when set, each body is signed (X-Rocmtrain-Signature).",
    )


class Notification(ApiModel):
    """An HTTP receiver told about the job's phase changes (a JSON POST, Slack-compatible `text`)."""

    secret_ref: NotificationSecretRef = Field(description="Where the receiver's URL and signing key are.")
    events: list[NotifyEvent] | None = Field(
        default=None,
        min_length=1,
        max_length=len(NOTIFY_EVENTS),
        description="Events that notify it; all when unset.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from."""

    secret_key_ref: SecretKeyRef = Field(description="A key of a Secret in the job's namespace.")


class EnvVar(ApiModel):
    """An extra environment variable for the Ray containers."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("!(has(self.value) && has(self.valueFrom))", "set either value or valueFrom, not both")
            ]
        }
    )

    name: EnvName = Field(description="Variable name.")
    value: Text | None = Field(default=None, description="Literal value; only ever data, never run by a shell.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret (credentials stay out of the spec)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set either value or valueFrom, not both")
        return self


class PersistentVolumeClaimSource(ApiModel):
    """A PersistentVolumeClaim in the job's namespace."""

    claim_name: DnsSubdomain = Field(description="Name of the PersistentVolumeClaim.")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


FileMode = Annotated[int, Field(ge=0, le=0o777)]
# Files one ConfigMap or Secret volume may pick (Kubernetes has no limit; a pod rarely needs a dozen).
MAX_VOLUME_ITEMS = 64


class KeyToPath(ApiModel):
    """One key of a ConfigMap or Secret, projected as a file."""

    key: ConfigKey = Field(description="Key within the ConfigMap or Secret.")
    path: RelPath = Field(description="File path, relative to the mount.")
    mode: FileMode | None = Field(default=None, description="File mode bits (0-0777); defaultMode if unset.")


class ProjectedKeys(ApiModel):
    """What a ConfigMap and a Secret volume share: the keys to project and the files' mode."""

    items: list[KeyToPath] | None = Field(
        default=None,
        max_length=MAX_VOLUME_ITEMS,
        description="Keys to project; every key as a file of its name if unset.",
    )
    default_mode: FileMode | None = Field(default=None, description="Mode bits of the files (0-0777).")
    optional: bool | None = Field(default=None, description="Start the pod even if the object or a key is missing.")


class ConfigMapVolumeSource(ProjectedKeys):
    """A ConfigMap in the job's namespace, projected as files."""

    name: DnsSubdomain = Field(description="ConfigMap name.")


class SecretVolumeSource(ProjectedKeys):
    """A Secret in the job's namespace, projected as files."""

    secret_name: DnsSubdomain = Field(description="Secret name.")


class EmptyDirVolumeSource(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = Field(
        default=None, description="Memory for a tmpfs (counts towards the container's memory); node disk if unset."
    )
    size_limit: Quantity | None = Field(default=None, description="Most the volume may hold, e.g. 20Gi.")


class NfsVolumeSource(ApiModel):
    """An NFS export."""

    server: DnsSubdomain = Field(description="Host name or IPv4 address of the NFS server.")
    path: AbsPath = Field(description="Path exported by the server.")
    read_only: bool | None = Field(default=None, description="Mount the export read-only.")


CSI_ATTRIBUTES = 32
CsiAttribute = Annotated[str, StringConstraints(pattern=TEXT, max_length=1024)]


class CsiVolumeSource(ApiModel):
    """A CSI volume, for example an object-store FUSE driver."""

    driver: Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=63)] = Field(
        description="Name of the CSI driver, e.g. s3.csi.aws.com."
    )
    read_only: bool | None = Field(default=None, description="Mount the volume read-only.")
    fs_type: Annotated[str, StringConstraints(pattern=FS_TYPE, max_length=16)] | None = Field(
        default=None, description="Filesystem type, e.g. ext4; the driver's default if unset."
    )
    volume_attributes: dict[LabelKey, CsiAttribute] | None = Field(
        default=None,
        max_length=CSI_ATTRIBUTES,
        description="Driver-specific attributes: at most 32, keys shaped like label keys, values of at most "
        "1,024 characters.",
    )
    node_publish_secret_ref: LocalObjectReference | None = Field(
        default=None, description="Secret with the credentials the driver needs to mount the volume."
    )


class StorageRequest(ApiModel):
    """The size an ephemeral volume asks for."""

    storage: Quantity = Field(description="Capacity, e.g. 100Gi.")


class ClaimResources(ApiModel):
    """Resources of an ephemeral volume's claim."""

    requests: StorageRequest = Field(description="Requested capacity.")


class EphemeralClaimSpec(ApiModel):
    """The PersistentVolumeClaim that an ephemeral volume creates for each pod."""

    access_modes: list[Literal["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        min_length=1, max_length=4, description="Access modes of the claim."
    )
    resources: ClaimResources = Field(description="Requested capacity.")
    storage_class_name: DnsSubdomain | None = Field(
        default=None, description="StorageClass; the cluster's default if unset."
    )
    volume_mode: Literal["Filesystem", "Block"] | None = Field(default=None, description="Filesystem if unset.")


class EphemeralClaimTemplate(ApiModel):
    """Template of the claim an ephemeral volume creates."""

    spec: EphemeralClaimSpec = Field(description="The claim's spec.")


class EphemeralVolumeSource(ApiModel):
    """A generic ephemeral volume: a claim created with the pod and deleted with it."""

    volume_claim_template: EphemeralClaimTemplate = Field(description="The claim to create.")


VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "nfs", "csi", "ephemeral")


class Volume(ApiModel):
    """A pod volume: a name and exactly one source (hostPath is not offered)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "[" + ", ".join(f"has(self.{s})" for s in VOLUME_SOURCES) + "].filter(x, x).size() == 1",
                    "a volume needs exactly one source of: " + ", ".join(VOLUME_SOURCES),
                )
            ],
        },
    )

    name: DnsLabel = Field(description="Volume name, referenced by volumeMounts.")
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        default=None, description="A PersistentVolumeClaim (shared storage for data, models and checkpoints)."
    )
    config_map: ConfigMapVolumeSource | None = Field(default=None, description="A ConfigMap projected as files.")
    secret: SecretVolumeSource | None = Field(default=None, description="A Secret projected as files.")
    empty_dir: EmptyDirVolumeSource | None = Field(
        default=None, description="Scratch space that lives as long as the pod."
    )
    nfs: NfsVolumeSource | None = Field(default=None, description="An NFS export.")
    csi: CsiVolumeSource | None = Field(
        default=None, description="A CSI volume (for example an object-store FUSE driver)."
    )
    ephemeral: EphemeralVolumeSource | None = Field(default=None, description="A generic ephemeral volume.")

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        if sum(getattr(self, to_snake(s)) is not None for s in VOLUME_SOURCES) != 1:
            raise ValueError("a volume needs exactly one source of: " + ", ".join(VOLUME_SOURCES))
        return self


class VolumeMount(ApiModel):
    """Where a volume appears inside the Ray containers."""

    name: DnsLabel = Field(description="Name of a volume in spec.volumes.")
    mount_path: AbsPath = Field(description="Absolute mount path.")
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: RelPath | None = Field(default=None, description="Relative path inside the volume to mount.")


# --- checkpoints, fault tolerance, lifecycle --------------------------------------------


class CheckpointSpec(ApiModel):
    """Ray Train checkpoints."""

    storage_path: Location | None = Field(
        default=None,
        description=(
            "Where checkpoints and the trained model go: an object-store URI or an absolute path on a "
            "writable shared volume (a ReadWriteMany claim). Required on a cluster, where every worker "
            "pod uploads its own checkpoints; `rocmtrain run` also accepts a `./` path relative to the job "
            "file and defaults to ./runs."
        ),
    )
    keep_last: int = Field(default=2, ge=1, le=100, description="Checkpoints to keep; older ones are deleted.")
    every_steps: int = Field(
        default=0, ge=0, le=10_000_000, description="Also checkpoint every N optimiser steps; 0 means per epoch only."
    )
    resume: Literal["auto", "never"] = Field(
        default="auto",
        description="auto resumes from the latest checkpoint under storagePath; never starts fresh.",
    )


class FaultToleranceSpec(ApiModel):
    """What a failure costs."""

    max_worker_failures: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Worker failures Ray Train recovers from (restoring the last checkpoint) before the run fails.",
    )
    job_retries: int = Field(
        default=0, ge=0, le=20, description="Whole-job retries on a new Ray cluster (RayJob backoffLimit)."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=31_536_000, description="Fail the job when it runs longer than this."
    )


class LifecycleSpec(ApiModel):
    """What happens after the job ends."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.ttlSecondsAfterFinished) || self.shutdownAfterJobFinishes",
                    "ttlSecondsAfterFinished requires shutdownAfterJobFinishes",
                    fieldPath=".ttlSecondsAfterFinished",
                )
            ]
        }
    )

    shutdown_after_job_finishes: bool = Field(
        default=True, description="Delete the Ray cluster when the job ends, freeing its GPUs."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=31_536_000, description="Seconds to keep the Ray cluster after the job ends."
    )

    @model_validator(mode="after")
    def _ttl_needs_shutdown(self) -> LifecycleSpec:
        if self.ttl_seconds_after_finished is not None and not self.shutdown_after_job_finishes:
            raise ValueError("ttlSecondsAfterFinished requires shutdownAfterJobFinishes")
        return self


# --- hyper-parameter search -----------------------------------------------------------

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
# Rows of `status.tuning.trials` (the progress channel carries at most 16 KiB).
TRIAL_TABLE_LENGTH = 20
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


# --- your own training code -------------------------------------------------------------

# Arguments of spec.code: at most this many, and this many characters in all (joined by spaces), so that
# the quoted command line stays far below Linux's 128 KiB limit on one argument: KubeRay's submitter runs
# `ray job submit -- <entrypoint>` as one `bash -c` argument.
MAX_CODE_ARGS = 256
MAX_CODE_CHARS = 16384
CODE_ONE_OF = "set exactly one of command or module"
ARGS_NEED_MODULE = "args go with module; with command, the arguments are part of command"
PROGRAM_EMPTY = "the program, command[0], must not be empty"
COMMAND_TOO_LONG = f"command holds at most {MAX_CODE_CHARS} characters in all"
ARGS_TOO_LONG = f"args hold at most {MAX_CODE_CHARS} characters in all"


def _joined_length(arguments: list[str] | None) -> int:
    """The characters of `arguments` joined by spaces (CEL's `size(list.join(' '))`)."""
    return len(" ".join(arguments or []))


class CodeSpec(ApiModel):
    """Your own training code, run instead of the built-in loop: a command in spec.image on the Ray head,
    where Ray's job API runs it as the Ray job's driver (see docs/guides/own-code.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("has(self.command) != has(self.module)", CODE_ONE_OF),
                _cel("!has(self.args) || has(self.module)", ARGS_NEED_MODULE, fieldPath=".args"),
                _cel("!has(self.command) || size(self.command[0]) > 0", PROGRAM_EMPTY, fieldPath=".command"),
                _cel(
                    f"!has(self.command) || size(self.command.join(' ')) <= {MAX_CODE_CHARS}",
                    COMMAND_TOO_LONG,
                    fieldPath=".command",
                ),
                _cel(
                    f"!has(self.args) || size(self.args.join(' ')) <= {MAX_CODE_CHARS}",
                    ARGS_TOO_LONG,
                    fieldPath=".args",
                ),
            ]
        }
    )

    command: list[Text] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CODE_ARGS,
        description=(
            f"The command line as a list: the program, then its arguments (at most {MAX_CODE_ARGS}, "
            f"{MAX_CODE_CHARS} characters in all), for example [python, /code/train.py, --epochs, '3']. "
            "Every argument is passed as it is written, quoted: no shell interprets it."
        ),
    )
    module: PythonModule | None = Field(
        default=None, description=f"A Python module to run as `{PYTHON} -m <module> <args>`, instead of command."
    )
    args: list[Text] | None = Field(
        default=None,
        max_length=MAX_CODE_ARGS,
        description=f"The arguments of module (at most {MAX_CODE_ARGS}, {MAX_CODE_CHARS} characters in all).",
    )
    working_dir: AbsPath | None = Field(
        default=None,
        description=(
            "The folder the command runs in (in the image or on a volume); Ray's job folder on a cluster and "
            "the job file's folder with `rocmtrain run` when unset."
        ),
    )

    @model_validator(mode="after")
    def _one_command(self) -> CodeSpec:
        if (self.command is None) == (self.module is None):
            raise ValueError(CODE_ONE_OF)
        if self.args is not None and self.module is None:
            raise ValueError(ARGS_NEED_MODULE)
        if self.command is not None and not self.command[0]:
            raise ValueError(PROGRAM_EMPTY)
        if _joined_length(self.command) > MAX_CODE_CHARS:
            raise ValueError(COMMAND_TOO_LONG)
        if _joined_length(self.args) > MAX_CODE_CHARS:
            raise ValueError(ARGS_TOO_LONG)
        return self

    def argv(self) -> list[str]:
        """The command line: `command`, or the interpreter running `module` with `args`."""
        if self.command is not None:
            return list(self.command)
        return [PYTHON, "-m", str(self.module), *(self.args or [])]


# --- the job --------------------------------------------------------------------------

# Fields that may change after creation; every other spec field is immutable.
MUTABLE_FIELDS = ("suspend", "lifecycle")
QUEUE_NEEDS_SHUTDOWN = "Kueue (scheduling.queueName) requires lifecycle.shutdownAfterJobFinishes"
SUSPEND_NEEDS_SHUTDOWN = (
    "suspend requires lifecycle.shutdownAfterJobFinishes (KubeRay suspends by deleting the cluster)"
)
SUSPEND_QUEUED = (
    "suspend cannot be set on a Kueue job (scheduling.queueName): Kueue owns its RayJob's suspend and "
    "unsuspends it on admission; delete the job to stop it, and create it again to resume from its checkpoints"
)
LM_FIELDS = "promptField, responseField and messagesField are for task causal-lm"
LM_TRAINING = "lossOn and packing are for task causal-lm"
ADAPTER_LM = "adapter (LoRA) is for task causal-lm"
TEXT_PAIRS_NOT_LM = "textPairField is for sequence-classification and regression"
RESPONSE_LOSS_NEEDS_RESPONSES = (
    "lossOn: response needs responses: data.promptField and data.responseField, or data.messagesField "
    "(plain-text records have none; use all)"
)
GENERATE_NEEDS_PROMPTS = (
    "evaluation.generate needs held-out prompts: task causal-lm with data.eval and data.promptField/responseField "
    "or data.messagesField"
)
RANK_SEARCH_NEEDS_ADAPTER = "searchSpace.adapterRank needs spec.adapter"
MODEL_REQUIRED = "model is required unless code runs your own training code"
DATA_REQUIRED = "data is required unless code runs your own training code"
# Fields only the built-in loop reads: refused with spec.code (`rocmtrain.api.validate` names their paths).
TUNING_WITH_CODE = "tuning (a hyper-parameter search) runs the built-in loop, not your own code"
EVERY_STEPS_WITH_CODE = "checkpoint.everySteps is the built-in loop's: with code, your code decides when to checkpoint"
RESUME_WITH_CODE = (
    "checkpoint.resume: never is the built-in loop's: with code, Ray Train resumes the run of the same name "
    "from its checkpoints"
)
ADAPTER_WITH_CODE = "adapter is the built-in loop's: with code, your code builds its own model (peft for LoRA)"
PACKING_WITH_CODE = "training.packing is the built-in loop's: with code, your code makes its own batches"
LOSS_ON_WITH_CODE = "training.lossOn is the built-in loop's: with code, your code computes its own loss"
GENERATE_WITH_CODE = "evaluation.generate is the built-in loop's: with code, your code evaluates its own model"
SHARDING_WITH_CODE = (
    "training.sharding: fsdp is the built-in loop's: with code, your code chooses its own strategy "
    "(Ray Train's prepare_model, FSDP or DeepSpeed)"
)
STORAGE_REQUIRED = (
    "checkpoint.storagePath is required for a cluster job: every worker pod uploads its own checkpoints, "
    "and checkpoints and the trained model must outlive the pods; set an object-store URI "
    "(s3://bucket/path) or an absolute path on a writable volume in spec.volumeMounts "
    "(a ReadWriteMany PersistentVolumeClaim)"
)


class RocmTrainingJobSpec(ApiModel):
    """The desired fine-tuning job."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.volumeMounts.all(m, self.volumes.exists(v, v.name == m.name))",
                    "every volumeMount must name a volume in spec.volumes",
                    fieldPath=".volumeMounts",
                ),
                _cel(
                    "!has(self.scheduling.queueName) || self.lifecycle.shutdownAfterJobFinishes",
                    QUEUE_NEEDS_SHUTDOWN,
                    fieldPath=".lifecycle.shutdownAfterJobFinishes",
                ),
                _cel(
                    "!self.suspend || self.lifecycle.shutdownAfterJobFinishes",
                    SUSPEND_NEEDS_SHUTDOWN,
                    fieldPath=".suspend",
                ),
                _cel("!self.suspend || !has(self.scheduling.queueName)", SUSPEND_QUEUED, fieldPath=".suspend"),
                _cel_with_model_and_data(
                    "self.model.task == 'causal-lm' || !(has(self.data.promptField) || has(self.data.messagesField))",
                    LM_FIELDS,
                    fieldPath=".data",
                ),
                _cel_with_model_and_data(
                    "self.model.task == 'causal-lm' || (!has(self.training.lossOn) && !self.training.packing)",
                    LM_TRAINING,
                    fieldPath=".training",
                ),
                _cel_with_model_and_data(
                    "self.model.task == 'causal-lm' || !has(self.adapter)", ADAPTER_LM, fieldPath=".adapter"
                ),
                _cel_with_model_and_data(
                    "self.model.task != 'causal-lm' || !has(self.data.textPairField)",
                    TEXT_PAIRS_NOT_LM,
                    fieldPath=".data.textPairField",
                ),
                _cel_with_model_and_data(
                    "!has(self.training.lossOn) || self.training.lossOn == 'all' || has(self.data.promptField) "
                    "|| has(self.data.messagesField)",
                    RESPONSE_LOSS_NEEDS_RESPONSES,
                    fieldPath=".training.lossOn",
                ),
                _cel_with_model_and_data(
                    "!has(self.evaluation.generate) || (self.model.task == 'causal-lm' && has(self.data.eval) "
                    "&& (has(self.data.promptField) || has(self.data.messagesField)))",
                    GENERATE_NEEDS_PROMPTS,
                    fieldPath=".evaluation.generate",
                ),
                _cel(
                    "!has(self.tuning) || !has(self.tuning.searchSpace.adapterRank) || has(self.adapter)",
                    RANK_SEARCH_NEEDS_ADAPTER,
                    fieldPath=".tuning.searchSpace.adapterRank",
                ),
                # Every job the API server holds runs on a cluster; `rocmtrain run` needs no storage path,
                # so the pydantic side of this rule is `rocmtrain.api.validate`'s, in the cluster context.
                _cel("has(self.checkpoint.storagePath)", STORAGE_REQUIRED, fieldPath=".checkpoint.storagePath"),
                _cel("has(self.code) || has(self.model)", MODEL_REQUIRED, fieldPath=".model"),
                _cel("has(self.code) || has(self.data)", DATA_REQUIRED, fieldPath=".data"),
                _cel("!has(self.code) || !has(self.tuning)", TUNING_WITH_CODE, fieldPath=".tuning"),
                _cel(
                    "!has(self.code) || self.checkpoint.everySteps == 0",
                    EVERY_STEPS_WITH_CODE,
                    fieldPath=".checkpoint.everySteps",
                ),
                _cel(
                    "!has(self.code) || self.checkpoint.resume == 'auto'",
                    RESUME_WITH_CODE,
                    fieldPath=".checkpoint.resume",
                ),
                _cel("!has(self.code) || !has(self.adapter)", ADAPTER_WITH_CODE, fieldPath=".adapter"),
                _cel("!has(self.code) || !self.training.packing", PACKING_WITH_CODE, fieldPath=".training.packing"),
                _cel("!has(self.code) || !has(self.training.lossOn)", LOSS_ON_WITH_CODE, fieldPath=".training.lossOn"),
                _cel(
                    "!has(self.code) || !has(self.evaluation.generate)",
                    GENERATE_WITH_CODE,
                    fieldPath=".evaluation.generate",
                ),
                _cel(
                    "!has(self.code) || self.training.sharding != 'fsdp'",
                    SHARDING_WITH_CODE,
                    fieldPath=".training.sharding",
                ),
            ]
        }
    )

    # Optional with spec.code: read them as `model` and `data` (the built-in loop's, which a job without code has).
    model_spec: ModelSpec | None = Field(
        default=None,
        alias="model",
        description="Pretrained model and task; required unless code is set, and then passed to it as ROCMTRAIN_MODEL.",
    )
    data_spec: DataSpec | None = Field(
        default=None,
        alias="data",
        description=(
            "Training and evaluation data; required unless code is set, and then passed to it as ROCMTRAIN_DATA."
        ),
    )
    training: TrainingSpec = Field(
        default_factory=TrainingSpec,
        description="Hyper-parameters; a job with code is given them (defaults filled in) as ROCMTRAIN_TRAINING.",
    )
    adapter: AdapterSpec | None = Field(
        default=None,
        description="causal-lm: train a LoRA adapter instead of every weight (full fine-tuning when unset).",
    )
    evaluation: EvaluationSpec = Field(
        default_factory=EvaluationSpec, description="What evaluation measures beyond the loss."
    )
    code: CodeSpec | None = Field(
        default=None,
        description=(
            "Your own training code (a Ray Train script), run instead of the built-in loop; see "
            "docs/guides/own-code.md for what it is given and how it reports progress."
        ),
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Workers, GPUs and pod resources.")
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec, description="Kueue queue, priorities and node placement."
    )
    image: Image = Field(default=DEFAULT_IMAGE, description="Training image for the Ray head and workers.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the Ray containers."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the image."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables for the Ray containers.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=16,
        description="Volumes for data, models and checkpoints.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=16,
        description="Mounts of spec.volumes into the Ray containers.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["mountPath"]},
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing and resume.")
    fault_tolerance: FaultToleranceSpec = Field(
        default_factory=FaultToleranceSpec, description="Worker-failure recovery, retries and deadline."
    )
    lifecycle: LifecycleSpec = Field(default_factory=LifecycleSpec, description="Clean-up after the job ends.")
    tuning: TuningSpec | None = Field(
        default=None,
        description=(
            "Hyper-parameter search: run numTrials trials of this job with hyper-parameters from a search "
            "space, maxConcurrentTrials at a time, and keep the best one's model."
        ),
    )
    notifications: list[Notification] = Field(
        default_factory=list,
        max_length=MAX_NOTIFICATIONS,
        description=(
            "HTTP receivers of the job's phase changes (the operator's default receiver, if any, when empty); "
            "see docs/guides/observing.md#notifications."
        ),
    )
    suspend: bool = Field(
        default=False,
        description=(
            "Suspend the job: the Ray cluster is deleted until it is set back to false. "
            "Not on a Kueue job, whose suspend is Kueue's."
        ),
    )

    @model_validator(mode="after")
    def _cross_field(self) -> RocmTrainingJobSpec:
        volume_names = {v.name for v in self.volumes}
        if len(volume_names) != len(self.volumes):
            raise ValueError("volume names must be unique")
        if missing := sorted({m.name for m in self.volume_mounts} - volume_names):
            raise ValueError(f"every volumeMount must name a volume in spec.volumes (missing: {', '.join(missing)})")
        if len({m.mount_path for m in self.volume_mounts}) != len(self.volume_mounts):
            raise ValueError("volumeMount paths must be unique")
        if len({e.name for e in self.env}) != len(self.env):
            raise ValueError("env names must be unique")
        if self.scheduling.queue_name and not self.lifecycle.shutdown_after_job_finishes:
            raise ValueError(QUEUE_NEEDS_SHUTDOWN)
        if self.suspend and not self.lifecycle.shutdown_after_job_finishes:
            raise ValueError(SUSPEND_NEEDS_SHUTDOWN)
        if self.suspend and self.scheduling.queue_name:
            raise ValueError(SUSPEND_QUEUED)
        if self.code is None:
            if self.model_spec is None:
                raise ValueError(MODEL_REQUIRED)
            if self.data_spec is None:
                raise ValueError(DATA_REQUIRED)
        else:
            self._check_code()
        self._check_language_model()
        return self

    def _check_code(self) -> None:
        """Fields that only the built-in loop reads are refused with spec.code."""
        training = self.training
        if self.tuning is not None:
            raise ValueError(TUNING_WITH_CODE)
        if self.checkpoint.every_steps != 0:
            raise ValueError(EVERY_STEPS_WITH_CODE)
        if self.checkpoint.resume != "auto":
            raise ValueError(RESUME_WITH_CODE)
        if self.adapter is not None:
            raise ValueError(ADAPTER_WITH_CODE)
        if training.packing:
            raise ValueError(PACKING_WITH_CODE)
        if training.loss_on is not None:
            raise ValueError(LOSS_ON_WITH_CODE)
        if self.evaluation.generate is not None:
            raise ValueError(GENERATE_WITH_CODE)
        if training.sharding == "fsdp":
            raise ValueError(SHARDING_WITH_CODE)

    def _check_language_model(self) -> None:
        """The causal-lm fields appear only on causal-lm jobs, and fit their records.

        A job with code may lack model or data: the rules that read them are then skipped, as in CEL
        (`_cel_with_model_and_data`).
        """
        if self.tuning is not None and self.tuning.search_space.adapter_rank and self.adapter is None:
            raise ValueError(RANK_SEARCH_NEEDS_ADAPTER)
        model, data, training = self.model_spec, self.data_spec, self.training
        if model is None or data is None:
            return
        language_model = model.task == "causal-lm"
        if not language_model and (data.prompt_field or data.messages_field):
            raise ValueError(LM_FIELDS)
        if not language_model and (training.loss_on is not None or training.packing):
            raise ValueError(LM_TRAINING)
        if not language_model and self.adapter is not None:
            raise ValueError(ADAPTER_LM)
        if language_model and data.text_pair_field is not None:
            raise ValueError(TEXT_PAIRS_NOT_LM)
        if training.loss_on == "response" and data.record_shape == "text":
            raise ValueError(RESPONSE_LOSS_NEEDS_RESPONSES)
        has_prompts = language_model and data.eval is not None and data.record_shape != "text"
        if self.evaluation.generate is not None and not has_prompts:
            raise ValueError(GENERATE_NEEDS_PROMPTS)

    @property
    def loss_on(self) -> Literal["response", "all"]:
        """The tokens of a causal-lm record that carry loss (`training.lossOn` or its default)."""
        if self.training.loss_on is not None:
            return self.training.loss_on
        return "all" if self.data.record_shape == "text" else "response"

    @property
    def model(self) -> ModelSpec:
        """spec.model, which every job of the built-in loop has (a job with code may not)."""
        if self.model_spec is None:
            raise ValueError("spec.model is not set: the job runs its own code (spec.code)")
        return self.model_spec

    @property
    def data(self) -> DataSpec:
        """spec.data, which every job of the built-in loop has (a job with code may not)."""
        if self.data_spec is None:
            raise ValueError("spec.data is not set: the job runs its own code (spec.code)")
        return self.data_spec

    @property
    def concurrent_runs(self) -> int:
        """Training runs at once: the trials a search runs together, else one."""
        return self.tuning.max_concurrent_trials if self.tuning is not None else 1

    @property
    def worker_pods(self) -> int:
        """Worker pods of the Ray cluster: `workers` for every run at once."""
        return self.resources.workers * self.concurrent_runs

    @property
    def total_gpus(self) -> int:
        """AMD GPUs the job asks for in all, trials at once included."""
        return self.resources.total_gpus * self.concurrent_runs


# --- status ---------------------------------------------------------------------------

Phase = Literal["Pending", "Queued", "Initializing", "Running", "Succeeded", "Failed", "Suspended"]


class Condition(ApiModel):
    """A condition, following Kubernetes API conventions."""

    type: str = Field(max_length=316, description="Condition type, for example Ready or Admitted.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation this condition was computed from."
    )


class Progress(ApiModel):
    """Training progress."""

    model_config = ConfigDict(allow_inf_nan=False)

    epoch: float | None = Field(default=None, ge=0, le=1e6, description="Current epoch (fractional).")
    step: int | None = Field(default=None, ge=0, le=10**12, description="Optimiser steps done.")
    total_steps: int | None = Field(default=None, ge=0, le=10**12, description="Optimiser steps in the whole run.")
    percent: float | None = Field(default=None, ge=0, le=100, description="Share of steps done, in percent.")
    eta_seconds: float | None = Field(default=None, ge=0, le=1e9, description="Estimated seconds until training ends.")


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


WORKER_FAILURES = (
    "Worker failures Ray Train recovered from in the current run, each by restarting the workers "
    "from the last checkpoint."
)


class TrialConfig(ApiModel):
    """The hyper-parameters one trial trains with (those the search space varies)."""

    model_config = ConfigDict(allow_inf_nan=False)

    learning_rate: float | None = Field(default=None, gt=0, le=1, description="Peak learning rate.")
    batch_size_per_worker: int | None = Field(default=None, ge=1, le=4096, description="Micro-batch size per rank.")
    warmup_ratio: float | None = Field(default=None, ge=0, le=0.5, description="Warmup share of the steps.")
    weight_decay: float | None = Field(default=None, ge=0, le=1, description="AdamW weight decay.")
    epochs: int | None = Field(default=None, ge=1, le=1000, description="Epochs.")
    adapter_rank: int | None = Field(default=None, ge=1, le=1024, description="LoRA rank.")


TrialState = Literal["Pending", "Running", "Succeeded", "Stopped", "Failed"]


class Trial(ApiModel):
    """One trial of a search."""

    model_config = ConfigDict(allow_inf_nan=False)

    id: str = Field(max_length=64, description="Ray Tune's trial id.")
    state: TrialState = Field(
        description="Pending, Running, Succeeded (ran to its end), Stopped (stopped early by the scheduler) or Failed."
    )
    config: TrialConfig = Field(default_factory=TrialConfig, description="Its hyper-parameters.")
    metric: float | None = Field(default=None, ge=-1e12, le=1e12, description="Its latest value of the metric.")
    iterations: int = Field(default=0, ge=0, le=10**9, description="Evaluations it reported.")


class TuningStatus(ApiModel):
    """Where a hyper-parameter search stands."""

    model_config = ConfigDict(allow_inf_nan=False)

    metric: TuningMetric = Field(description="The metric that ranks the trials.")
    mode: Literal["max", "min"] = Field(description="Whether it is best high or low.")
    trials_total: int = Field(ge=0, le=1000, description="Trials the search runs in all.")
    trials_done: int = Field(default=0, ge=0, le=1000, description="Trials that ended (succeeded, stopped, failed).")
    trials_running: int = Field(default=0, ge=0, le=1000, description="Trials running.")
    trials_pending: int = Field(default=0, ge=0, le=1000, description="Trials not started yet.")
    best_trial_id: str | None = Field(default=None, max_length=64, description="The best trial so far.")
    best_metric: float | None = Field(default=None, ge=-1e12, le=1e12, description="Its metric.")
    best_config: TrialConfig | None = Field(default=None, description="Its hyper-parameters.")
    best_checkpoint: str | None = Field(
        default=None, max_length=1024, description="Its latest checkpoint, or its exported model once done."
    )
    trials: list[Trial] = Field(
        default_factory=list,
        max_length=TRIAL_TABLE_LENGTH,
        description=f"The trials: running ones first, then the best; at most {TRIAL_TABLE_LENGTH}.",
    )


RCCL_DEVICES_LIMIT = 16


class NetworkTransport(ApiModel):
    """The network RCCL chose between nodes, as rank 0's RCCL log tells at its first collective."""

    transport: str = Field(
        pattern=RCCL_NETWORK,
        description="RCCL's network: IB (InfiniBand or RoCE verbs, RDMA), Socket (TCP), or a net plugin's name.",
    )
    devices: list[Annotated[str, StringConstraints(pattern=HCA_NAME, max_length=68)]] = Field(
        default_factory=list,
        max_length=RCCL_DEVICES_LIMIT,
        description="The HCA ports (mlx5_0:1) or interfaces (eth0) it uses, as RCCL names them (IB and Socket).",
    )
    link: Literal["InfiniBand", "RoCE", "mixed"] | None = Field(
        default=None, description="The link layer of IB's devices: InfiniBand, RoCE (Ethernet), or mixed."
    )

    @property
    def summary(self) -> str:
        """One line: `IB over mlx5_0:1, mlx5_1:1 (RoCE)`."""
        over = f" over {', '.join(self.devices)}" if self.devices else ""
        return f"{self.transport}{over}" + (f" ({self.link})" if self.link else "")


# Characters of the driver's pre-flight refusal, in a report and in the status.
PREFLIGHT_ERROR_LIMIT = 2048
PREFLIGHT_ERROR = (
    "Why the training driver's pre-flight refused the job (an object store it cannot reach or write, in the "
    "store's own words): the job failed at once (reason PreflightFailed) and spent no retry."
)


class ProgressReport(ApiModel):
    """What the training driver pushes to the operator's progress endpoint."""

    progress: Progress = Field(description="Training progress.")
    metrics: Metrics = Field(default_factory=Metrics, description="Aggregated metrics.")
    final: bool = Field(default=False, description="True on the last report of a run.")
    worker_failures: int | None = Field(default=None, ge=1, le=10_000, description=WORKER_FAILURES)
    resumed_from_step: int | None = Field(
        default=None, ge=0, le=10**12, description="Step of the checkpoint the workers of this run last resumed from."
    )
    tuning: TuningStatus | None = Field(default=None, description="The search, for a job with spec.tuning.")
    network: NetworkTransport | None = Field(
        default=None, description="The network RCCL chose between nodes (GPU jobs, where its log tells)."
    )
    preflight_error: str | None = Field(
        default=None,
        max_length=PREFLIGHT_ERROR_LIMIT,
        description="The driver's pre-flight refusal, on the last report of a run that never started.",
    )


class NotificationState(ApiModel):
    """The last notice of one receiver of the job, and whether it got there."""

    target: Annotated[str, StringConstraints(pattern=NOTIFICATION_TARGET, max_length=32)] = Field(
        description="The receiver: spec.notifications[i], or default (the operator's)."
    )
    event: NotifyEvent = Field(description="The event notified.")
    reason: str = Field(max_length=128, description="The event's reason, as the notice told it.")
    delivery_id: str = Field(pattern=DELIVERY_ID, description="The X-Rocmtrain-Delivery header of every try.")
    state: Literal["Pending", "Delivered", "Failed"] = Field(
        description="Pending (sent again after an operator restart), Delivered, or Failed (given up)."
    )
    time: str = Field(max_length=40, description="When the state was last written (RFC 3339).")


class Cost(ApiModel):
    """What a job's GPU-seconds cost at the operator's prices."""

    model_config = ConfigDict(allow_inf_nan=False)

    amount: float = Field(ge=0, le=1e15, description="Cost of gpuSeconds so far.")
    currency: str = Field(pattern=CURRENCY, description="ISO 4217 currency code (ROCMTRAIN_COST_CURRENCY).")


QUEUE_BASIS_LIMIT = 256


class QueueEstimate(ApiModel):
    """When a job that Kueue holds in its queue is expected to start (`rocmtrain.status.queue`)."""

    position: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Its place among the workloads waiting in its ClusterQueue, in Kueue's order (priority, then "
        "creation): 1 is next.",
    )
    expected_start_time: str | None = Field(
        default=None,
        max_length=32,
        description="When it is expected to start (RFC 3339); absent when unknown (basis says why).",
    )
    basis: str = Field(
        max_length=QUEUE_BASIS_LIMIT,
        description="What the estimate rests on (running jobs' ETAs, jobs ahead, the quota), or why it is unknown.",
    )


class RocmTrainingJobStatus(ApiModel):
    """The observed state, written by the operator."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase of the job.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=32,
        description="Current conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(default=None, ge=0, description="Last spec generation acted on.")
    ray_job_name: str | None = Field(default=None, description="Name of the owned RayJob.")
    ray_cluster_name: str | None = Field(default=None, description="Name of the Ray cluster KubeRay created.")
    job_id: str | None = Field(default=None, description="Ray job submission id.")
    dashboard_url: str | None = Field(default=None, description="Ray dashboard address inside the cluster.")
    workers_desired: int | None = Field(default=None, ge=0, description="Worker pods the job asks for.")
    workers_ready: int | None = Field(default=None, ge=0, description="Worker pods ready.")
    gpus: int | None = Field(
        default=None,
        ge=0,
        description="AMD GPUs the job requests in total; GPU partitions where spec.resources.gpu names a partition "
        "(then gpusHeld, gpuSeconds and cost count partitions too).",
    )
    start_time: str | None = Field(default=None, description="When the Ray job started (RFC 3339).")
    completion_time: str | None = Field(default=None, description="When the Ray job ended (RFC 3339).")
    restarts: int | None = Field(default=None, ge=0, description="Whole-job retries so far.")
    worker_failures: int | None = Field(default=None, ge=0, description=WORKER_FAILURES)
    gpu_seconds: float | None = Field(
        default=None,
        ge=0,
        le=1e15,
        allow_inf_nan=False,
        description="AMD GPU-seconds held so far: ready Ray workers × GPUs per worker, summed over time.",
    )
    gpus_held: int | None = Field(
        default=None, ge=0, description="AMD GPUs the job's ready Ray workers hold, as last observed."
    )
    accounted_until: str | None = Field(
        default=None, description="Until when gpuSeconds and cost are counted (RFC 3339)."
    )
    cost: Cost | None = Field(
        default=None, description="What gpuSeconds cost at the operator's price per GPU-hour (ROCMTRAIN_GPU_PRICES)."
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    metrics: Metrics | None = Field(default=None, description="Latest training metrics.")
    history: list[HistoryPoint] = Field(
        default_factory=list,
        max_length=HISTORY_LENGTH,
        description=f"The last {HISTORY_LENGTH} reported points, for plotting the loss curve.",
    )
    last_progress_time: str | None = Field(default=None, description="When progress was last reported (RFC 3339).")
    tuning: TuningStatus | None = Field(default=None, description="The hyper-parameter search (spec.tuning).")
    queue: QueueEstimate | None = Field(
        default=None,
        description="While Queued: its place in its Kueue ClusterQueue and when it is expected to start, from the "
        "running jobs' ETAs; cleared on admission.",
    )
    notifications: list[NotificationState] = Field(
        default_factory=list,
        max_length=MAX_NOTIFICATIONS + 1,
        description="The last notice of each receiver (spec.notifications, or the operator's default) and its state.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["target"]},
    )
    network: NetworkTransport | None = Field(
        default=None,
        description="The network RCCL chose between the workers, as the job's progress reports tell it from rank "
        "0's RCCL log (GPU jobs, where it tells): Socket where spec.resources.network names RDMA means RDMA is not "
        "in use.",
    )
    preflight_error: str | None = Field(default=None, max_length=PREFLIGHT_ERROR_LIMIT, description=PREFLIGHT_ERROR)


class ObjectMeta(ApiModel):
    """The part of Kubernetes object metadata the API reads."""

    model_config = ConfigDict(extra="ignore")

    # The tighter limit must sit inside Annotated: Field(max_length=...) does not narrow DnsLabel's own.
    name: Annotated[DnsLabel, StringConstraints(max_length=MAX_NAME_LENGTH)] = Field(description="Job name.")
    namespace: DnsLabel = Field(default="default", description="Job namespace.")
    uid: str | None = Field(default=None, description="Object uid.")
    generation: int | None = Field(default=None, description="Spec generation.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")


class RocmTrainingJob(ApiModel):
    """A RocmTrainingJob object."""

    # A Literal spells its value out; tests/unit/test_boundary.py checks both equal the contract's.
    api_version: Literal["rocmtrain.dev/v1alpha1"] = Field(default="rocmtrain.dev/v1alpha1", description="API version.")
    kind: Literal["RocmTrainingJob"] = Field(default="RocmTrainingJob", description="Kind.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: RocmTrainingJobSpec = Field(description="Desired state.")
    status: RocmTrainingJobStatus | None = Field(default=None, description="Observed state.")

"""The RocmTrainingJob: its spec, with the rules that span its sections, its metadata, and the CRD's names."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from rocmtrain.api.models.adapter import AdapterSpec, EvaluationSpec
from rocmtrain.api.models.base import ApiModel, _cel, _cel_with_model_and_data
from rocmtrain.api.models.checkpoint import CheckpointSpec, FaultToleranceSpec
from rocmtrain.api.models.code import CodeSpec
from rocmtrain.api.models.data import DataSpec
from rocmtrain.api.models.env import EnvVar, LocalObjectReference
from rocmtrain.api.models.lifecycle import LifecycleSpec
from rocmtrain.api.models.model import ModelSpec
from rocmtrain.api.models.notifications import MAX_NOTIFICATIONS, Notification
from rocmtrain.api.models.resources import ResourcesSpec
from rocmtrain.api.models.scheduling import SchedulingSpec
from rocmtrain.api.models.status import RocmTrainingJobStatus
from rocmtrain.api.models.training import TrainingSpec
from rocmtrain.api.models.tuning import TuningSpec
from rocmtrain.api.models.volumes import Volume, VolumeMount
from rocmtrain.api.types import DnsLabel, Image

SINGULAR = "rocmtrainingjob"
SHORT_NAMES = ["rtj"]
CATEGORIES = ["rocmtrain", "ml"]
DEFAULT_IMAGE = "ghcr.io/rocm-train-operator/training:0.1.0"
# Longest job name: derived names (`<name>-xxxxx-head-xxxxx` pods, services)
# must stay within DNS-1123 label limits, as KubeRay's own validation requires.
MAX_NAME_LENGTH = 40


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
LM_TRAINING = (
    "lossOn, packing, tokensPerWorker, lossImplementation and attentionImplementation: varlen are for task causal-lm"
)
TOKENS_BELOW_LENGTH = (
    "tokensPerWorker must be at least model.maxSeqLength: a micro-batch holds at least one whole record"
)
ADAPTER_LM = "adapter (LoRA) is for task causal-lm"
TEXT_PAIRS_NOT_LM = "textPairField is for sequence-classification and regression"
DROP_LM = "truncation: drop is for task causal-lm (a classifier's texts are cut)"
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
PACKING_WITH_CODE = (
    "training.packing and tokensPerWorker are the built-in loop's: with code, your code makes its own batches"
)
LOSS_KERNEL_WITH_CODE = "training.lossImplementation is the built-in loop's: with code, your code computes its own loss"
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
                    "self.model.task == 'causal-lm' || (!has(self.training.lossOn) && !self.training.packing "
                    "&& !has(self.training.tokensPerWorker) && !has(self.training.lossImplementation) "
                    "&& self.training.attentionImplementation != 'varlen')",
                    LM_TRAINING,
                    fieldPath=".training",
                ),
                _cel_with_model_and_data(
                    "!has(self.training.tokensPerWorker) || self.training.tokensPerWorker >= self.model.maxSeqLength",
                    TOKENS_BELOW_LENGTH,
                    fieldPath=".training.tokensPerWorker",
                ),
                _cel_with_model_and_data(
                    "self.model.task == 'causal-lm' || !has(self.adapter)", ADAPTER_LM, fieldPath=".adapter"
                ),
                _cel_with_model_and_data(
                    "self.model.task == 'causal-lm' || !has(self.data.truncation) || self.data.truncation == 'cut'",
                    DROP_LM,
                    fieldPath=".data.truncation",
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
                _cel(
                    "!has(self.code) || (!self.training.packing && !has(self.training.tokensPerWorker))",
                    PACKING_WITH_CODE,
                    fieldPath=".training.packing",
                ),
                _cel(
                    "!has(self.code) || !has(self.training.lossImplementation)",
                    LOSS_KERNEL_WITH_CODE,
                    fieldPath=".training.lossImplementation",
                ),
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
        if training.packing or training.tokens_per_worker is not None:
            raise ValueError(PACKING_WITH_CODE)
        if training.loss_implementation is not None:
            raise ValueError(LOSS_KERNEL_WITH_CODE)
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
        lm_training = (training.loss_on, training.tokens_per_worker, training.loss_implementation)
        if not language_model and (training.packing or training.varlen or any(v is not None for v in lm_training)):
            raise ValueError(LM_TRAINING)
        if training.tokens_per_worker is not None and training.tokens_per_worker < model.max_seq_length:
            raise ValueError(TOKENS_BELOW_LENGTH)
        if not language_model and self.adapter is not None:
            raise ValueError(ADAPTER_LM)
        if not language_model and data.over_length == "drop":
            raise ValueError(DROP_LM)
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

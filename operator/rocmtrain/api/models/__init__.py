"""The RocmTrainingJob API: spec and status models.

These pydantic models are the single source of truth for the custom resource:
`rocmtrain.api.crd` generates `crds/` from them, the operator validates and
renders from them, and the training image reads its configuration through them.
Cross-field rules live next to the model they constrain, once as a pydantic
validator and once as the equivalent CEL rule (`x-kubernetes-validations`);
the test suite checks both reject the same objects.

One module per section of the spec (`model`, `data`, `training`, `adapter`, `resources`,
`scheduling`, `env`, `volumes`, `notifications`, `checkpoint`, `lifecycle`, `tuning`, `code`),
`job` for the object and the rules that span its sections, `status` and `metrics` for what the
operator observes; this package re-exports the names the rest of the code imports.
"""

from rocmtrain.api.models.adapter import ALL_LINEAR, AdapterSpec, GenerateSpec
from rocmtrain.api.models.base import ApiModel
from rocmtrain.api.models.code import MAX_CODE_CHARS, CodeSpec
from rocmtrain.api.models.data import DataSource, DataSpec, RecordShape, Truncation
from rocmtrain.api.models.job import (
    CATEGORIES,
    DEFAULT_IMAGE,
    MAX_NAME_LENGTH,
    MUTABLE_FIELDS,
    SHORT_NAMES,
    SINGULAR,
    STORAGE_REQUIRED,
    RocmTrainingJob,
    RocmTrainingJobSpec,
)
from rocmtrain.api.models.metrics import (
    CUSTOM_METRICS,
    EVAL_METRICS,
    HISTORY_LENGTH,
    MAX_CUSTOM_METRICS,
    HistoryPoint,
    Metrics,
    metric_rows,
)
from rocmtrain.api.models.model import ModelSpec
from rocmtrain.api.models.notifications import (
    MAX_NOTIFICATIONS,
    NOTIFY_EVENTS,
    DeliveryFailure,
    DeliveryState,
    NotifyEvent,
)
from rocmtrain.api.models.resources import GpuSelector, NetworkSpec, ResourcesSpec
from rocmtrain.api.models.status import (
    PREFLIGHT_ERROR_LIMIT,
    QUEUE_BASIS_LIMIT,
    RCCL_DEVICES_LIMIT,
    TRIAL_TABLE_LENGTH,
    Condition,
    NetworkTransport,
    NotificationState,
    Phase,
    Progress,
    ProgressReport,
    QueueEstimate,
    RocmTrainingJobStatus,
    Trial,
    TrialConfig,
    TrialState,
    TuningStatus,
)
from rocmtrain.api.models.training import TrainingSpec
from rocmtrain.api.models.tuning import TUNING_METRICS, TuningSpec

__all__ = [
    "ALL_LINEAR",
    "CATEGORIES",
    "CUSTOM_METRICS",
    "DEFAULT_IMAGE",
    "EVAL_METRICS",
    "HISTORY_LENGTH",
    "MAX_CODE_CHARS",
    "MAX_CUSTOM_METRICS",
    "MAX_NAME_LENGTH",
    "MAX_NOTIFICATIONS",
    "MUTABLE_FIELDS",
    "NOTIFY_EVENTS",
    "PREFLIGHT_ERROR_LIMIT",
    "QUEUE_BASIS_LIMIT",
    "RCCL_DEVICES_LIMIT",
    "SHORT_NAMES",
    "SINGULAR",
    "STORAGE_REQUIRED",
    "TRIAL_TABLE_LENGTH",
    "TUNING_METRICS",
    "AdapterSpec",
    "ApiModel",
    "CodeSpec",
    "Condition",
    "DataSource",
    "DataSpec",
    "DeliveryFailure",
    "DeliveryState",
    "GenerateSpec",
    "GpuSelector",
    "HistoryPoint",
    "Metrics",
    "ModelSpec",
    "NetworkSpec",
    "NetworkTransport",
    "NotificationState",
    "NotifyEvent",
    "Phase",
    "Progress",
    "ProgressReport",
    "QueueEstimate",
    "RecordShape",
    "ResourcesSpec",
    "RocmTrainingJob",
    "RocmTrainingJobSpec",
    "RocmTrainingJobStatus",
    "TrainingSpec",
    "Trial",
    "TrialConfig",
    "TrialState",
    "Truncation",
    "TuningSpec",
    "TuningStatus",
    "metric_rows",
]

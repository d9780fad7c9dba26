"""Every name and number that two sides of the project must agree on, written once.

The operator (`rocmtrain.controller`, `rocmtrain.kube.client`, `rocmtrain.progress`), the
renderer (`rocmtrain.render`) and the training image (`rocmtrain_train`) import
these instead of spelling them again; a value that two modules would otherwise
both write belongs here. Sections:

- the RocmTrainingJob API's identity;
- the marks the operator puts on what it makes (labels, field manager);
- KubeRay's RayJob API, and the labels KubeRay puts on Ray pods;
- Kueue: its labels and its Workload API;
- AMD GPUs on Kubernetes;
- the training image: its driver module, user, Ray version;
- where models, data and checkpoints may live;
- the environment and the volumes of the Ray containers;
- the progress channel from the training driver to the operator;
- your own training code (`spec.code`): the environment it is given, the Kubeflow names.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

# ---- the RocmTrainingJob API ------------------------------------------------------------

GROUP: Final = "rocmtrain.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "RocmTrainingJob"
PLURAL: Final = "rocmtrainingjobs"

# ---- what the operator makes --------------------------------------------------------------

# The operator's name: field manager of its writes, source of its events, and the
# managed-by label value its RayJob and Ray pod watches select on.
OPERATOR_NAME: Final = "rocm-train-operator"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
APP_NAME_LABEL: Final = "app.kubernetes.io/name"
APP_NAME: Final = "rocmtrain"
# Labels on every object the operator creates (RayJobs, their pods, the progress Secret and ConfigMaps).
MANAGED_LABELS: Final = MappingProxyType({MANAGED_BY_LABEL: OPERATOR_NAME, APP_NAME_LABEL: APP_NAME})
# The label selector that finds them again.
MANAGED_SELECTOR: Final = f"{MANAGED_BY_LABEL}={OPERATOR_NAME}"
# The job a RayJob and its pods belong to.
JOB_NAME_LABEL: Final = f"{GROUP}/job-name"

# ---- KubeRay ------------------------------------------------------------------------------

KUBERAY_VERSION: Final = "v1.5.1"
RAYJOB_GROUP: Final = "ray.io"
RAYJOB_VERSION: Final = "v1"
RAYJOB_API_VERSION: Final = f"{RAYJOB_GROUP}/{RAYJOB_VERSION}"
RAYJOB_KIND: Final = "RayJob"
RAYJOB_PLURAL: Final = "rayjobs"
# KubeRay labels every pod of a Ray cluster with the cluster's name, and with its node type (head, worker).
RAY_CLUSTER_LABEL: Final = "ray.io/cluster"
RAY_NODE_TYPE_LABEL: Final = "ray.io/node-type"
# The Ray pods (head and workers) of the operator's jobs: the labels of the rendered
# templates (KubeRay keeps them) and KubeRay's cluster label, which the submitter pod lacks.
RAY_PODS_SELECTOR: Final = f"{MANAGED_SELECTOR},{RAY_CLUSTER_LABEL}"
# Ray's dashboard and job API on the head (KubeRay's default port), which KubeRay's operator polls.
RAY_DASHBOARD_PORT: Final = 8265
# The NetworkPolicy the operator makes around each job's Ray pods.
NETWORK_POLICY_GROUP: Final = "networking.k8s.io"
NETWORK_POLICY_VERSION: Final = "v1"
NETWORK_POLICY_API_VERSION: Final = f"{NETWORK_POLICY_GROUP}/{NETWORK_POLICY_VERSION}"
NETWORK_POLICY_PLURAL: Final = "networkpolicies"

# ---- Kueue --------------------------------------------------------------------------------

# The LocalQueue and WorkloadPriorityClass of a RayJob (set by the renderer, or the queue by
# Kueue's webhook in a namespace with a LocalQueue named `default`).
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
# Kueue's Workload: one per queued RayJob, owned by it, where Kueue says why it waits.
WORKLOAD_GROUP: Final = "kueue.x-k8s.io"
WORKLOAD_VERSION: Final = "v1beta2"
WORKLOAD_PLURAL: Final = "workloads"
# Queues: a LocalQueue (namespaced) names its ClusterQueue, which holds the quota.
LOCAL_QUEUE_PLURAL: Final = "localqueues"
CLUSTER_QUEUE_PLURAL: Final = "clusterqueues"
# Topology Aware Scheduling: on a pod set's template, the topology level (a node label of the
# flavor's Topology) that all of its pods must, or should, share.
KUEUE_TOPOLOGY_ANNOTATIONS: Final = MappingProxyType(
    {
        "required": "kueue.x-k8s.io/podset-required-topology",
        "preferred": "kueue.x-k8s.io/podset-preferred-topology",
    }
)

# ---- AMD GPUs -----------------------------------------------------------------------------

# The AMD GPU device plugin's extended resource.
GPU_RESOURCE: Final = "amd.com/gpu"
# Node labels of the AMD GPU node labeller, by `GpuSelector` field.
GPU_NODE_LABELS: Final = MappingProxyType(
    {
        "product_name": "amd.com/gpu.product-name",
        "family": "amd.com/gpu.family",
        "vram": "amd.com/gpu.vram",
        "partition": "amd.com/compute-memory-partition",
    }
)
# A GPU's compute partitions (an MI300X's 8 XCDs: SPX one GPU, DPX 2, QPX 4, CPX 8 devices) and memory
# partitions (NPS1, NPS2, NPS4), as the node labeller writes them: `cpx_nps4`.
COMPUTE_PARTITIONS: Final = MappingProxyType({"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8})
MEMORY_PARTITIONS: Final = ("nps1", "nps2", "nps4")


def partitions_per_gpu(partition: str | None) -> int:
    """Devices one physical GPU is split into by `partition` (`cpx_nps4`: 8); 1 without one."""
    return COMPUTE_PARTITIONS[partition.split("_")[0]] if partition else 1


# ---- multi-node networking ----------------------------------------------------------------

# Multus: the secondary networks a pod attaches to (`[namespace/]name[@interface]`, comma-separated).
MULTUS_NETWORKS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"

# ---- the training image -------------------------------------------------------------------

# The driver the RayJob runs (`python -m rocmtrain_train`); no user string is ever part of it.
DRIVER_MODULE: Final = "rocmtrain_train"
# Starts the driver's one-line error in its log, which KubeRay quotes in a failed RayJob's message;
# the operator puts that line first in the job's Failed condition.
DRIVER_ERROR_PREFIX: Final = "rocmtrain driver error: "
# The Ray version of the image (pinned in pyproject's `train` extra) and the RayJob's rayVersion.
RAY_VERSION: Final = "2.60.0"
# The image's non-root user and group; the pods run as them.
RUN_AS_USER: Final = 10001
RUN_AS_GROUP: Final = 10001

# ---- locations ----------------------------------------------------------------------------

# Object stores the training image reads and writes (pyarrow filesystems); validation admits these only.
OBJECT_STORE_SCHEMES: Final = ("s3://", "gs://", "gcs://", "abfs://")
HUB_SCHEME: Final = "hf://"
# A location relative to the job file: `rocmtrain run` only.
RELATIVE_PREFIX: Final = "./"


def is_local(location: str) -> bool:
    """A path: absolute (on a volume) or `./` relative to the job file."""
    return location.startswith(("/", RELATIVE_PREFIX))


def is_object_store(location: str) -> bool:
    """An object-store URI of a scheme the training image reads."""
    return location.startswith(OBJECT_STORE_SCHEMES)


def join_location(base: str, *parts: str) -> str:
    """Join path segments onto a local path or an object-store URI."""
    return "/".join([base.rstrip("/"), *parts])


def is_hub(location: str) -> bool:
    """A Hugging Face hub reference: `hf://...`, or a bare `org/name` (neither a path nor an object store)."""
    return location.startswith(HUB_SCHEME) or not (is_local(location) or is_object_store(location))


# ---- the Ray containers -------------------------------------------------------------------

# Every variable the operator sets starts with this; users may not set such names.
OWNED_ENV_PREFIX: Final = "ROCMTRAIN_"
# The job (compact JSON of the RocmTrainingJob) for the driver, on the head only.
JOB_ENV: Final = "ROCMTRAIN_JOB"
# Where the driver reports progress: the endpoint's URL, its CA bundle file, the token file.
PROGRESS_URL_ENV: Final = "ROCMTRAIN_PROGRESS_URL"
PROGRESS_CA_ENV: Final = "ROCMTRAIN_PROGRESS_CA"
PROGRESS_TOKEN_ENV: Final = "ROCMTRAIN_PROGRESS_TOKEN"  # noqa: S105 (a variable name, not a secret)
# The ConfigMap, in each job's namespace, where the operator publishes the CA bundle of its progress endpoint.
PROGRESS_CA_CONFIGMAP: Final = "rocmtrain-progress-ca"

# Volumes and mount paths of the operator's own; spec.volumes and spec.volumeMounts may not use them.
SHM_VOLUME: Final = "dshm"
SHM_PATH: Final = "/dev/shm"  # noqa: S108 (a mount point in the pod, not a file opened here)
PROGRESS_VOLUME: Final = "rocmtrain-progress"
PROGRESS_DIR: Final = f"/var/run/secrets/{GROUP}/progress"
# The containers' root filesystem is read-only; Ray, the driver and the libraries they
# load write below /tmp (Ray's session directory) and HOME (caches), which is /tmp too.
TMP_VOLUME: Final = "rocmtrain-tmp"
TMP_PATH: Final = "/tmp"  # noqa: S108 (a mount point in the pod, not a file opened here)
RESERVED_VOLUMES: Final = (SHM_VOLUME, PROGRESS_VOLUME, TMP_VOLUME)
RESERVED_MOUNT_PATHS: Final = (SHM_PATH, PROGRESS_DIR, TMP_PATH)

# ---- the progress channel -----------------------------------------------------------------

# Audience of the projected service-account token the driver presents.
PROGRESS_AUDIENCE: Final = f"{GROUP}/progress"
# Where the endpoint takes a job's reports (a template for the server's router).
PROGRESS_PATH: Final = f"/v1/namespaces/{{namespace}}/{PLURAL}/{{name}}/progress"
# Reports the endpoint accepts per job: this many a second on average, in bursts of PROGRESS_BURST.
PROGRESS_RATE_PER_SECOND: Final = 2.0
PROGRESS_BURST: Final = 10


def progress_path(namespace: str, name: str) -> str:
    """The endpoint path of one job's reports."""
    return PROGRESS_PATH.format(namespace=namespace, name=name)


# Where the endpoint takes a job's Kubeflow Trainer status (KEP-2779's `{"trainerStatus": ...}`), under the
# same authentication and limits as PROGRESS_PATH: the URL the Kubeflow variables below point at.
TRAINER_STATUS_PATH: Final = f"/v1/namespaces/{{namespace}}/{PLURAL}/{{name}}/trainerstatus"


def trainer_status_path(namespace: str, name: str) -> str:
    """The endpoint path of one job's Kubeflow Trainer status reports."""
    return TRAINER_STATUS_PATH.format(namespace=namespace, name=name)


# ---- your own training code (spec.code) ---------------------------------------------------
#
# The environment contract of a job with spec.code: what the operator (on the Ray head and every
# worker) and `rocmtrain run` (for the command and its embedded Ray) give the code, besides
# PROGRESS_*_ENV. docs/guides/own-code.md documents each; `rocmtrain_train.sdk` reads them.

# The job's name and namespace.
JOB_NAME_ENV: Final = "ROCMTRAIN_JOB_NAME"
JOB_NAMESPACE_ENV: Final = "ROCMTRAIN_JOB_NAMESPACE"
# Ray Train workers (ranks) to start: one per GPU of each worker pod, or one per pod without GPUs.
WORLD_SIZE_ENV: Final = "ROCMTRAIN_WORLD_SIZE"
# Worker pods, AMD GPUs per worker pod, and CPUs each rank may reserve (its share of its pod's).
WORKERS_ENV: Final = "ROCMTRAIN_WORKERS"
GPUS_PER_WORKER_ENV: Final = "ROCMTRAIN_GPUS_PER_WORKER"
CPUS_PER_RANK_ENV: Final = "ROCMTRAIN_CPUS_PER_RANK"
# The job's run folder, `<checkpoint.storagePath>/<namespace>/<name>`: Ray Train's storage_path/name.
STORAGE_PATH_ENV: Final = "ROCMTRAIN_STORAGE_PATH"
# Ray Train's FailureConfig(max_failures) and CheckpointConfig(num_to_keep), from the spec.
MAX_WORKER_FAILURES_ENV: Final = "ROCMTRAIN_MAX_WORKER_FAILURES"
CHECKPOINTS_TO_KEEP_ENV: Final = "ROCMTRAIN_CHECKPOINTS_TO_KEEP"
# spec.model, spec.data and spec.training as compact JSON (their wire form), where the job has them.
MODEL_ENV: Final = "ROCMTRAIN_MODEL"
DATA_ENV: Final = "ROCMTRAIN_DATA"
TRAINING_ENV: Final = "ROCMTRAIN_TRAINING"
# The progress channel under Kubeflow Trainer's names (KEP-2779), which transformers' KubeflowCallback
# reads: the TRAINER_STATUS_PATH URL, the CA bundle file, the projected token file.
KUBEFLOW_URL_ENV: Final = "KUBEFLOW_TRAINER_SERVER_URL"
KUBEFLOW_CA_ENV: Final = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
KUBEFLOW_TOKEN_ENV: Final = "KUBEFLOW_TRAINER_SERVER_TOKEN"  # noqa: S105 (a variable name, not a secret)
KUBEFLOW_ENV: Final = (KUBEFLOW_URL_ENV, KUBEFLOW_CA_ENV, KUBEFLOW_TOKEN_ENV)
# Ray Train v2's callbacks to load, `module.Class` by comma (ray.train.v2's _initialize_env_callbacks): a job's
# code gets the training image's forwarder of `ray.train.report` into its status, after any the job names.
RAY_TRAIN_CALLBACKS_ENV: Final = "RAY_TRAIN_CALLBACKS"
RAY_REPORT_FORWARDER: Final = "rocmtrain_train.reporting.ray_report.RayReportForwarder"
# The interpreter that runs `spec.code.module` (`python -m <module> <args>`), found on the image's PATH.
PYTHON: Final = "python"

"""Validate a RocmTrainingJob: every problem at once, each with its field path.

`validate_job` is the one validation of every entry point: `rocmtrain validate`
and `rocmtrain render`, `rocmtrain run` (context "local"), the operator, and the
training image's driver (context "cluster"). It runs
the pydantic models (strict types, as the API server checks them), then the
checks the models cannot express: names KubeRay derives from the job, names and
paths the renderer reserves, resource sizes, and where data, models and
checkpoints may live for the context the job runs in ("cluster" or "local").
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from rocmtrain.api import crd, names
from rocmtrain.api.contract import (
    KUBEFLOW_ENV,
    OWNED_ENV_PREFIX,
    RELATIVE_PREFIX,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUMES,
    is_hub,
)
from rocmtrain.api.job_config import JOB_CONFIG_LIMIT, job_config_size
from rocmtrain.api.models import STORAGE_REQUIRED, TUNING_METRICS, RocmTrainingJob, TrainingSpec
from rocmtrain.api.models.volumes import Volume, VolumeMount
from rocmtrain.api.patterns import DNS_1035_LABEL, describe_pattern
from rocmtrain.api.quantity import parse_quantity

Context = Literal["cluster", "local"]
# Variables users may not set besides the operator's own (`OWNED_ENV_PREFIX`): KubeRay sets or
# checks them (utils/constant.go), Ray assigns the devices of each worker process itself, and the
# operator gives a job's own code the progress channel under Kubeflow Trainer's names too.
RESERVED_ENV = frozenset(
    {
        "FQ_RAY_IP",
        "KUBERAY_GEN_RAY_START_CMD",
        "RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_CLOUD_INSTANCE_ID",
        "RAY_CLUSTER_NAME",
        "RAY_IP",
        "RAY_NODE_TYPE_NAME",
        "RAY_PORT",
        "RAY_REDIS_ADDRESS",
        "RAY_enable_autoscaler_v2",
        "REDIS_PASSWORD",
        "REDIS_USERNAME",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        *KUBEFLOW_ENV,
    }
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FieldError:
    """One problem: the dotted camelCase path of the field (`spec.resources.workers`) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def validate_job(obj: Any, *, context: Context = "cluster") -> tuple[RocmTrainingJob | None, list[FieldError]]:
    """The job and no errors, or None and every error found.

    Pydantic reports all field errors together; the further checks run once the
    object is well-formed, and also report everything they find.
    """
    if not isinstance(obj, dict):
        return None, [FieldError("", "a job must be a mapping with apiVersion, kind, metadata and spec")]
    try:
        job = RocmTrainingJob.model_validate(obj, strict=True)
    except ValidationError as exc:
        return None, [_pydantic_error(error) for error in exc.errors()]
    errors = [
        *_check_name(job),
        *_check_locations(job, context),
        *_check_env(job),
        *_check_volumes(job),
        *_check_resources(job),
        *_check_tuning(job),
    ]
    if not errors:
        errors.extend(_check_size(job))
    return (None, errors) if errors else (job, [])


# --- pydantic errors -----------------------------------------------------------------


def _format_path(loc: tuple[str | int, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _IDENTIFIER.match(part):
            path += f".{part}" if path else part
        else:  # a map key such as a label key: quoted, so no input character shapes the output
            path += f"[{json.dumps(part)}]"
    return path


@functools.cache
def _cel_field_paths() -> dict[str, str]:
    """Message of each cross-field rule -> the field it blames (its CEL fieldPath)."""
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                if "fieldPath" in rule:
                    found[rule["message"]] = rule["fieldPath"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd.openapi_schema())
    return found


def _blamed_field(message: str) -> str:
    """The CEL fieldPath of the cross-field rule that `message` reports (it may add detail), or ""."""
    for rule_message, field in _cel_field_paths().items():
        if message == rule_message or message.startswith(rule_message + " "):
            return field
    return ""


def _pydantic_error(error: ErrorDetails) -> FieldError:
    loc = tuple(part for part in error["loc"] if part != "[key]")
    path = _format_path(loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "string_pattern_mismatch":
        message = "must be " + describe_pattern(str(ctx["pattern"]))
    elif kind == "missing":
        message = "required field is missing"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        message = "must be an object"
    elif kind == "extra_forbidden":
        message = "unknown field (field names are camelCase; see `rocmtrain crd`)"
    elif kind == "value_error":
        message = str(ctx.get("error", error["msg"]))
        path += _blamed_field(message)
    else:
        message = error["msg"]
    if "[key]" in error["loc"]:
        message = "key " + message
    return FieldError(path, message)


# --- checks beyond the models ------------------------------------------------------------


def _check_name(job: RocmTrainingJob) -> Iterator[FieldError]:
    """The job name must yield valid names for everything KubeRay derives from it."""
    name = job.metadata.name
    if not re.fullmatch(DNS_1035_LABEL, name):
        yield FieldError(
            "metadata.name",
            "must start with a letter: KubeRay names the RayJob, its RayCluster and their Services "
            "after the job, and requires DNS-1035 names",
        )
        return
    yield from check_derived_names(name, names.worker_group_name(job))


def check_derived_names(name: str, group: str) -> Iterator[FieldError]:
    """Errors for every derived name that breaks its DNS rule or length limit."""
    for derived in names.derived_names(name, group):
        if len(derived.name) > derived.max_length or not re.fullmatch(derived.pattern, derived.name):
            yield FieldError(
                "metadata.name",
                f"too long: the {derived.what} name derived from it, {derived.name!r} ({len(derived.name)} "
                f"characters), must be {describe_pattern(derived.pattern)} of at most {derived.max_length}",
            )


def _locations(job: RocmTrainingJob) -> Iterator[tuple[str, str]]:
    spec = job.spec
    if spec.model_spec is not None:
        yield "spec.model.source", spec.model_spec.source
    if spec.data_spec is not None:
        yield "spec.data.train.uri", spec.data_spec.train.uri
        if spec.data_spec.eval is not None:
            yield "spec.data.eval.uri", spec.data_spec.eval.uri
    if spec.checkpoint.storage_path is not None:
        yield "spec.checkpoint.storagePath", spec.checkpoint.storage_path


def _check_locations(job: RocmTrainingJob, context: Context) -> Iterator[FieldError]:
    for path, location in _locations(job):
        if context == "cluster" and location.startswith(RELATIVE_PREFIX):
            yield FieldError(
                path,
                "a ./relative path is only for `rocmtrain run`; a cluster job needs an absolute path on a "
                "mounted volume, an object-store URI or a hub id",
            )
    data = job.spec.data_spec
    for field, source in (("train", data.train), ("eval", data.eval)) if data is not None else ():
        if source is not None and source.split is not None and not is_hub(source.uri):
            yield FieldError(f"spec.data.{field}.split", "split applies to hub data sets only")
    storage = job.spec.checkpoint.storage_path
    if storage is None:
        if context == "cluster":  # the API server's CEL rule of the same message (see `models`)
            yield FieldError("spec.checkpoint.storagePath", STORAGE_REQUIRED)
        return
    if is_hub(storage):
        yield FieldError(
            "spec.checkpoint.storagePath", "must be an absolute path on a shared volume or an object-store URI"
        )
    elif context == "cluster" and storage.startswith("/") and (problem := _storage_volume_problem(job, storage)):
        yield FieldError("spec.checkpoint.storagePath", problem)


def normalize_path(path: str) -> str:
    """An absolute path as the container runtime resolves it: no empty or `.` segments, no trailing '/'."""
    return "/" + "/".join(part for part in path.split("/") if part not in ("", "."))


def _under(path: str, root: str) -> bool:
    """Whether normalised `path` is `root` or lies below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


# Volume kinds whose bytes every pod shares and that outlive the pods; why each other kind is not.
SHARED_VOLUMES = ("persistentVolumeClaim", "nfs")
UNSHARED_VOLUMES = {
    "emptyDir": "each pod would keep its own checkpoints, deleted with the pod",
    "ephemeral": "each pod gets a claim of its own, deleted with the pod",
    "csi": "an inline CSI volume may be each pod's own (its driver decides): mount a shared one through a "
    "PersistentVolumeClaim",
    "secret": "its files are the Secret's, read-only",
    "configMap": "its files are the ConfigMap's, read-only",
}
_SHARED_STORAGE = (
    "write checkpoints to an object-store URI (s3://bucket/path) or to a path on a writable persistentVolumeClaim "
    "(ReadWriteMany) or nfs volume, so that every Ray pod reads and writes the same checkpoints and they outlive "
    "the pods"
)


def volume_holding(job: RocmTrainingJob, path: str) -> tuple[VolumeMount, Volume] | None:
    """The mount, and its volume, that hold absolute `path`: the deepest (a mount inside another hides what lies
    below), or None on the pod's own disk."""
    where = normalize_path(path)
    mounts = [m for m in job.spec.volume_mounts if _under(where, normalize_path(m.mount_path))]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(normalize_path(m.mount_path)))
    return mount, next(v for v in job.spec.volumes if v.name == mount.name)


def _storage_volume_problem(job: RocmTrainingJob, path: str) -> str | None:
    """Why checkpoints at absolute `path` would not be shared by every pod and outlive them, or None."""
    if (holding := volume_holding(job, path)) is None:
        return f"{path} lies on no volume in spec.volumeMounts (the pod's own disk): {_SHARED_STORAGE}"
    mount, volume = holding
    if volume.source not in SHARED_VOLUMES:
        why = UNSHARED_VOLUMES[volume.source]
        return f"{path} lies on volume {volume.name} ({volume.source}): {why}; {_SHARED_STORAGE}"
    if mount.read_only or volume.read_only_source:
        return f"{path} lies on volume {volume.name}, mounted read-only: {_SHARED_STORAGE}"
    return None


def _check_env(job: RocmTrainingJob) -> Iterator[FieldError]:
    for index, var in enumerate(job.spec.env):
        if var.name.startswith(OWNED_ENV_PREFIX) or var.name in RESERVED_ENV:
            yield FieldError(f"spec.env[{index}].name", f"{var.name} is set by the operator, KubeRay or Ray")


def _check_size(job: RocmTrainingJob) -> Iterator[FieldError]:
    size = job_config_size(job)
    if size > JOB_CONFIG_LIMIT:
        yield FieldError(
            "spec",
            f"the job is {size:,} bytes as its driver reads it (ROCMTRAIN_JOB), at most {JOB_CONFIG_LIMIT:,}: "
            "keep large data (env values, configuration) in a ConfigMap or Secret mounted as a volume",
        )


def _check_volumes(job: RocmTrainingJob) -> Iterator[FieldError]:
    for index, volume in enumerate(job.spec.volumes):
        if volume.name in RESERVED_VOLUMES:
            yield FieldError(f"spec.volumes[{index}].name", f"{volume.name} is reserved for the operator's volumes")
    for index, mount in enumerate(job.spec.volume_mounts):
        path = normalize_path(mount.mount_path)
        # At, below or above a reserved path: above would hide the operator's mount.
        if any(_under(path, reserved) or _under(reserved, path) for reserved in RESERVED_MOUNT_PATHS):
            reserved = ", ".join(RESERVED_MOUNT_PATHS)
            yield FieldError(
                f"spec.volumeMounts[{index}].mountPath",
                f"{mount.mount_path} is reserved: it is, contains or lies in a path the operator mounts ({reserved})",
            )


def _check_resources(job: RocmTrainingJob) -> Iterator[FieldError]:
    res = job.spec.resources
    sizes = {
        "spec.resources.cpusPerWorker": res.cpus_per_worker,
        "spec.resources.memoryPerWorker": res.memory_per_worker,
        "spec.resources.sharedMemory": res.shm_size,
        "spec.resources.head.cpu": res.head.cpu,
        "spec.resources.head.memory": res.head.memory,
    }
    for path, quantity in sizes.items():
        if parse_quantity(quantity) <= 0:
            yield FieldError(path, "must be greater than zero")
    if parse_quantity(res.shm_size) > parse_quantity(res.memory_per_worker):  # the default never does
        yield FieldError(
            "spec.resources.sharedMemory",
            "must not exceed memoryPerWorker: /dev/shm is memory-backed and counts towards the worker's memory",
        )


def _check_tuning(job: RocmTrainingJob) -> Iterator[FieldError]:
    """A search needs evaluation data, a metric the task produces, and ranges within the training bounds."""
    tuning, spec = job.spec.tuning, job.spec
    if tuning is None:
        return
    if spec.data.eval is None:
        yield FieldError("spec.data.eval", "a hyper-parameter search (spec.tuning) ranks trials by evaluation: set it")
    metric = tuning.metric_for(spec.model.task)
    if spec.model.task not in TUNING_METRICS[metric][1]:
        fits = sorted(m for m, (_, tasks) in TUNING_METRICS.items() if spec.model.task in tasks)
        yield FieldError(
            "spec.tuning.metric", f"a {spec.model.task} job does not produce {metric}; use one of {', '.join(fits)}"
        )
    space = tuning.search_space
    if space.learning_rate is not None and space.learning_rate.min <= 0:
        yield FieldError("spec.tuning.searchSpace.learningRate.min", "must be greater than 0 (sampled log-uniformly)")
    warmup_limit = TrainingSpec.model_fields["warmup_ratio"].metadata
    if space.warmup_ratio is not None and space.warmup_ratio.max > _upper_bound(warmup_limit):
        yield FieldError(
            "spec.tuning.searchSpace.warmupRatio.max", f"must be at most {_upper_bound(warmup_limit)}, as warmupRatio"
        )
    if metric == "evalExactMatch" and spec.evaluation.generate is None:
        yield FieldError("spec.tuning.metric", "evalExactMatch comes from generation: set spec.evaluation.generate")
    choices_of = {
        "batchSizePerWorker": space.batch_size_per_worker,
        "epochs": space.epochs,
        "adapterRank": space.adapter_rank,
    }
    for name, choices in choices_of.items():
        if choices is not None and len(set(choices)) != len(choices):
            yield FieldError(f"spec.tuning.searchSpace.{name}", "must not repeat a value")


def _upper_bound(metadata: list[Any]) -> float:
    """The `le` bound among a pydantic field's constraints."""
    return next(float(m.le) for m in metadata if getattr(m, "le", None) is not None)

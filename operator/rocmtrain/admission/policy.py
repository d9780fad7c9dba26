"""The cluster admin's allow-lists and limits: which images and priority classes jobs may use, how large a
job may be, and where none may run (pure).

Creating a RocmTrainingJob makes the operator create pods in the job's namespace
with the job's image, volumes and priority class, so it carries the authority to
run any image there. `Policy` narrows that: image references must start with an
allowed registry or repository prefix, and priority classes (Kubernetes
`PriorityClass`, Kueue `WorkloadPriorityClass`) must be listed. An empty list
allows everything. The operator reads them from `ROCMTRAIN_ALLOWED_IMAGES`,
`ROCMTRAIN_ALLOWED_PRIORITY_CLASSES` and `ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES`
(`rocmtrain.controller.settings`) and refuses a job outside them with reason
`NotAllowed`.

A job's size is capped, so that one job cannot ask KubeRay for a cluster that floods the API server
and the scheduler: at most `max_worker_pods` worker pods (workers × trials at once;
`ROCMTRAIN_MAX_WORKER_PODS`) and `max_gpus` GPUs (`ROCMTRAIN_MAX_JOB_GPUS`). And no job runs in a
protected namespace (`ROCMTRAIN_PROTECTED_NAMESPACES`: `kube-system` and the operator's own by default),
where its pods would sit beside the cluster's and the operator's own.

Volumes reach outside the namespace too: an `nfs` volume names any server, a `csi` volume any driver
installed on the nodes. `ROCMTRAIN_ALLOWED_NFS_SERVERS` and `ROCMTRAIN_ALLOWED_CSI_DRIVERS` list those
a job may use (exact names; empty allows every one).

A job that names no Kueue queue runs outside every quota. `default_queue`
(`ROCMTRAIN_DEFAULT_QUEUE`) gives one to each job that names none and can be queued: a job that keeps
its Ray cluster (`lifecycle.shutdownAfterJobFinishes: false`) or is suspended cannot (Kueue's rules,
which a job naming a queue meets through the CRD), and the default is never what refuses a job.
`require_queue` (`ROCMTRAIN_REQUIRE_QUEUE`) refuses every job left without a queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rocmtrain.api.models import RocmTrainingJob, RocmTrainingJobSpec
from rocmtrain.api.validate import FieldError

# Where an image name ends and its tag or digest begins, or where a repository path continues.
_BOUNDARIES = ("/", ":", "@")
DEFAULT_REGISTRY = "docker.io"


def _is_registry(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost"


def normalize_image(reference: str) -> str:
    """An image reference with its registry spelled out, as the container runtime reads it.

    `ubuntu:24.04` is `docker.io/library/ubuntu:24.04`, `rocm/pytorch` is
    `docker.io/rocm/pytorch`; a first component with a '.' or ':', or `localhost`, is a registry.
    """
    first, slash, _ = reference.partition("/")
    if slash and _is_registry(first):
        return reference
    return f"{DEFAULT_REGISTRY}/{reference}" if slash else f"{DEFAULT_REGISTRY}/library/{reference}"


def normalize_prefix(prefix: str) -> str:
    """An allow-list entry as `normalize_image` spells references.

    An entry without '/' that is a host (with a '.', or `localhost`) and maybe a port names a
    whole registry: `registry.local` and `registry.local:5000` allow everything they serve.
    """
    host, _, port = prefix.partition(":")
    if "/" not in prefix and ("." in host or host == "localhost") and (not port or port.isdigit()):
        return prefix + "/"
    return normalize_image(prefix)


def image_allowed(reference: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `reference` lies under one of `prefixes` (registry or repository paths), or no prefix is set.

    A prefix matches whole path components only: `ghcr.io/acme` allows `ghcr.io/acme/x:1`
    and `ghcr.io/acme:1`, never `ghcr.io/acme-evil/x`.
    """
    if not prefixes:
        return True
    image = normalize_image(reference)
    for prefix in map(normalize_prefix, prefixes):
        if image == prefix:
            return True
        if image.startswith(prefix) and (prefix.endswith(_BOUNDARIES) or image[len(prefix)] in _BOUNDARIES):
            return True
    return False


DEFAULT_MAX_WORKER_PODS = 1024
DEFAULT_MAX_GPUS = 4096


@dataclass(frozen=True)
class Policy:
    """The allow-lists (an empty tuple allows everything), the size limits, the protected namespaces and the
    Kueue queue of jobs that name none."""

    images: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    kueue_priority_classes: tuple[str, ...] = ()
    max_worker_pods: int = DEFAULT_MAX_WORKER_PODS
    max_gpus: int = DEFAULT_MAX_GPUS
    protected_namespaces: tuple[str, ...] = ("kube-system",)
    nfs_servers: tuple[str, ...] = ()
    csi_drivers: tuple[str, ...] = ()
    default_queue: str | None = None
    require_queue: bool = False

    def check(self, spec: RocmTrainingJobSpec, namespace: str) -> list[FieldError]:
        """Every field of `spec`, a job in `namespace`, that the allow-lists and limits refuse (the default queue
        applied or not)."""
        return list(self._problems(spec, namespace))

    def queue_for(self, spec: RocmTrainingJobSpec) -> str | None:
        """The Kueue queue `spec` runs in: its own, else the default queue where the job can be queued, else none."""
        if spec.scheduling.queue_name is not None:
            return spec.scheduling.queue_name
        queueable = spec.lifecycle.shutdown_after_job_finishes and not spec.suspend
        return self.default_queue if queueable else None

    def with_defaults(self, job: RocmTrainingJob) -> RocmTrainingJob:
        """`job` as the operator renders it: in the default queue where it names none and can be queued."""
        spec = job.spec
        queue = self.queue_for(spec)
        if queue == spec.scheduling.queue_name:
            return job
        scheduling = spec.scheduling.model_copy(update={"queue_name": queue})
        return job.model_copy(update={"spec": spec.model_copy(update={"scheduling": scheduling})})

    def _problems(self, spec: RocmTrainingJobSpec, namespace: str) -> Iterator[FieldError]:
        if namespace in self.protected_namespaces:
            yield FieldError("metadata.namespace", f"no job may run in the protected namespace {namespace}")
        if spec.worker_pods > self.max_worker_pods:
            yield FieldError(
                "spec.resources.workers",
                f"{spec.worker_pods} worker pods (workers × trials at once) is over the limit of "
                f"{self.max_worker_pods}",
            )
        if spec.total_gpus > self.max_gpus:
            yield FieldError(
                "spec.resources.gpusPerWorker", f"{spec.total_gpus} GPUs in all is over the limit of {self.max_gpus}"
            )
        if not image_allowed(spec.image, self.images):
            yield FieldError("spec.image", f"{spec.image} is not from an allowed registry ({', '.join(self.images)})")
        scheduling = spec.scheduling
        for path, name, allowed in (
            ("spec.scheduling.priorityClassName", scheduling.priority_class_name, self.priority_classes),
            ("spec.scheduling.kueuePriorityClass", scheduling.kueue_priority_class, self.kueue_priority_classes),
        ):
            if name is not None and allowed and name not in allowed:
                yield FieldError(path, f"{name} is not an allowed priority class ({', '.join(allowed)})")
        yield from self._volume_problems(spec)
        if self.require_queue and self.queue_for(spec) is None:
            yield FieldError("spec.scheduling.queueName", self._queue_required(spec))

    def _volume_problems(self, spec: RocmTrainingJobSpec) -> Iterator[FieldError]:
        for index, volume in enumerate(spec.volumes):
            if volume.nfs is not None and self.nfs_servers and volume.nfs.server not in self.nfs_servers:
                yield FieldError(
                    f"spec.volumes[{index}].nfs.server",
                    f"{volume.nfs.server} is not an allowed NFS server ({', '.join(self.nfs_servers)})",
                )
            if volume.csi is not None and self.csi_drivers and volume.csi.driver not in self.csi_drivers:
                yield FieldError(
                    f"spec.volumes[{index}].csi.driver",
                    f"{volume.csi.driver} is not an allowed CSI driver ({', '.join(self.csi_drivers)})",
                )

    def _queue_required(self, spec: RocmTrainingJobSpec) -> str:
        message = "this cluster runs every job in a Kueue queue (ROCMTRAIN_REQUIRE_QUEUE): name a LocalQueue"
        if self.default_queue is None:
            return message
        why = (
            "suspended job (Kueue owns a queued job's suspend)"
            if spec.suspend
            else "job that keeps its Ray cluster (lifecycle.shutdownAfterJobFinishes: false; Kueue requires true)"
        )
        return f"{message}; the default queue {self.default_queue} takes no {why}"

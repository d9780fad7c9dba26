"""Pod templates of the Ray head, the Ray workers and the submitter Job."""

from __future__ import annotations

from typing import Any

from rocmtrain.api.contract import MULTUS_NETWORKS_ANNOTATION, RUN_AS_GROUP, RUN_AS_USER
from rocmtrain.api.models import GpuSelector, RocmTrainingJob
from rocmtrain.api.quantity import parse_quantity
from rocmtrain.render import container, env, volumes
from rocmtrain.render.options import RenderOptions


def pod_security_context(supplemental_groups: tuple[int, ...] = ()) -> dict[str, Any]:
    """The training image's non-root user, RuntimeDefault seccomp, volumes owned by the user's group (fsGroup)."""
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_GROUP,
        "fsGroup": RUN_AS_GROUP,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if supplemental_groups:
        context["supplementalGroups"] = list(supplemental_groups)
    return context


def gpu_affinity(selector: GpuSelector | None) -> dict[str, Any] | None:
    """Required node affinity on the AMD node-labeller labels the selector names; None without any."""
    if selector is None:
        return None
    expressions = [
        {"key": label, "operator": "In", "values": [value]} for label, value in selector.node_labels().items()
    ]
    if not expressions:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    }


def _pod_spec(
    job: RocmTrainingJob,
    containers: list[dict[str, Any]],
    *,
    volumes_: list[dict[str, Any]] | None = None,
    affinity: dict[str, Any] | None = None,
    supplemental_groups: tuple[int, ...] = (),
) -> dict[str, Any]:
    """What every pod of the job shares: scheduling, pull secrets, security; empty fields left out."""
    scheduling = job.spec.scheduling
    spec: dict[str, Any] = {
        # Ray needs no Kubernetes API access; the progress token is projected explicitly.
        "automountServiceAccountToken": False,
        "containers": containers,
        "securityContext": pod_security_context(supplemental_groups),
    }
    optional: dict[str, Any] = {
        "affinity": affinity,
        "imagePullSecrets": [secret.dump() for secret in job.spec.image_pull_secrets],
        "nodeSelector": dict(scheduling.node_selector),
        "priorityClassName": scheduling.priority_class_name,
        "tolerations": [toleration.dump() for toleration in scheduling.tolerations],
        "volumes": volumes_,
    }
    spec.update({key: value for key, value in optional.items() if value})
    return spec


def _template(labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def _smaller(a: str, b: str) -> str:
    return a if parse_quantity(a) <= parse_quantity(b) else b


def head_template(job: RocmTrainingJob, options: RenderOptions, labels: dict[str, str]) -> dict[str, Any]:
    """The head pod: runs the driver (`ROCMTRAIN_JOB`), reports progress, trains nothing."""
    res = job.spec.resources
    # The head trains nothing; its /dev/shm is no larger than its memory.
    pod_volumes = [
        volumes.shm_volume(_smaller(res.shm_size, res.head.memory)),
        volumes.tmp_volume(),
        *volumes.user_volumes(job),
    ]
    mounts = [volumes.shm_mount(), volumes.tmp_mount(), *volumes.user_mounts(job)]
    if options.progress_base_url:
        pod_volumes.append(volumes.progress_volume(options))
        mounts.append(volumes.progress_mount())
    head = container.ray_container(
        job,
        name=container.HEAD_CONTAINER,
        resources=container.guaranteed_resources(res.head.cpu, res.head.memory),
        env=env.container_env(job, env.head_defaults(job, res.head.cpu), env.owned_head_env(job, options)),
        mounts=mounts,
    )
    return _template(labels, _pod_spec(job, [head], volumes_=pod_volumes))


def worker_template(job: RocmTrainingJob, options: RenderOptions, labels: dict[str, str]) -> dict[str, Any]:
    """A worker pod: one Ray Train worker per GPU (one without GPUs), with its CPUs, memory and AMD GPUs; for a
    job's own code also the environment contract and the progress credentials (Ray Train's rank 0, which
    reports, runs on a worker)."""
    res = job.spec.resources
    pod_volumes = [volumes.shm_volume(res.shm_size), volumes.tmp_volume(), *volumes.user_volumes(job)]
    mounts = [volumes.shm_mount(), volumes.tmp_mount(), *volumes.user_mounts(job)]
    if options.progress_base_url and job.spec.code is not None:  # rank 0 of the code reports from a worker
        pod_volumes.append(volumes.progress_volume(options))
        mounts.append(volumes.progress_mount())
    worker = container.ray_container(
        job,
        name=container.WORKER_CONTAINER,
        resources=container.guaranteed_resources(res.cpus_per_worker, res.memory_per_worker, worker_devices(job)),
        env=env.container_env(
            job,
            env.runtime_defaults(res.cpus_per_worker, res.gpus_per_worker) + env.network_env(res.network),
            env.owned_worker_env(job, options),
        ),
        mounts=mounts,
    )
    spec = _pod_spec(
        job,
        [worker],
        volumes_=pod_volumes,
        affinity=gpu_affinity(res.gpu),
        supplemental_groups=options.gpu_device_groups if res.gpus_per_worker else (),
    )
    template = _template(labels, spec)
    if res.network is not None and res.network.networks:
        template["metadata"]["annotations"] = {MULTUS_NETWORKS_ANNOTATION: ",".join(res.network.networks)}
    return template


def worker_devices(job: RocmTrainingJob) -> dict[str, int]:
    """A worker's extended resources: its AMD GPUs (or partitions) and its RDMA NICs, by resource name."""
    res = job.spec.resources
    devices = {res.gpu_resource: res.gpus_per_worker}
    if res.network is not None and res.network.rdma_resource is not None:
        devices[res.network.rdma_resource] = res.network.rdma_per_worker
    return devices


def submitter_template(job: RocmTrainingJob, labels: dict[str, str]) -> dict[str, Any]:
    """The submitter Job's pod: `ray job submit` with the fixed entrypoint, as KubeRay writes it."""
    spec = _pod_spec(job, [container.submitter_container(job)], volumes_=[volumes.tmp_volume()])
    spec["restartPolicy"] = "Never"
    return _template(labels, spec)

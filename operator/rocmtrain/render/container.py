"""Containers of the Ray pods and of the submitter pod.

No container gets a command or args: KubeRay builds the Ray containers'
`ray start` line from rayStartParams and the submitter's `ray job submit` line
from the RayJob's entrypoint, both of which hold only operator constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.render import env, volumes

HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
# KubeRay's utils.SubmitterContainerName; it fills in this container's command.
SUBMITTER_CONTAINER = "ray-job-submitter"
# `ray job submit` followed by `ray job logs --follow`: one small Python process.
SUBMITTER_CPU = "500m"
SUBMITTER_MEMORY = "512Mi"


def container_security_context() -> dict[str, Any]:
    """Restricted Pod Security: no privilege escalation, no capabilities, never root; a read-only
    root filesystem (writes go to the /tmp, /dev/shm and user volumes)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def guaranteed_resources(cpu: str, memory: str, devices: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Requests equal to limits (Guaranteed QoS); devices (AMD GPUs or partitions, RDMA NICs) as extended
    resources, those with a count of 0 left out."""
    amounts: dict[str, str] = {"cpu": cpu, "memory": memory}
    amounts.update({name: str(count) for name, count in (devices or {}).items() if count})
    return {"limits": dict(amounts), "requests": dict(amounts)}


def ray_container(
    job: RocmTrainingJob,
    *,
    name: str,
    resources: dict[str, Any],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    """A Ray node container (the first container of a Ray pod, as KubeRay requires)."""
    return {
        "name": name,
        "image": job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        "env": env,
        "resources": resources,
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }


def submitter_container(job: RocmTrainingJob) -> dict[str, Any]:
    """The submitter container: the training image, so `ray` matches the cluster's version."""
    return {
        "name": SUBMITTER_CONTAINER,
        "image": job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        "env": [env.home()],
        "resources": guaranteed_resources(SUBMITTER_CPU, SUBMITTER_MEMORY),
        "securityContext": container_security_context(),
        "volumeMounts": [volumes.tmp_mount()],
    }

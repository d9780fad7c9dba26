"""Pod volumes and container mounts: /dev/shm, the user's volumes, the progress credentials."""

from __future__ import annotations

from typing import Any

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.render.options import RenderOptions

SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"  # noqa: S108 (a mount point in the pod, not a file opened here)
PROGRESS_VOLUME = "rocmtrain-progress"
PROGRESS_DIR = "/var/run/secrets/rocmtrain.dev/progress"
PROGRESS_TOKEN_PATH = f"{PROGRESS_DIR}/token"
PROGRESS_CA_PATH = f"{PROGRESS_DIR}/ca.crt"
# Lifetime of the projected token; the kubelet refreshes it at 80% of it.
TOKEN_EXPIRATION_SECONDS = 3600
RESERVED_VOLUMES = (SHM_VOLUME, PROGRESS_VOLUME)
RESERVED_MOUNT_PATHS = (SHM_PATH, PROGRESS_DIR)


def shm_volume(size: str) -> dict[str, Any]:
    """A memory-backed /dev/shm of `size` (tmpfs pages count towards the container's memory)."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def shm_mount() -> dict[str, Any]:
    """The /dev/shm mount for a Ray container."""
    return {"name": SHM_VOLUME, "mountPath": SHM_PATH}


def user_volumes(job: RocmTrainingJob) -> list[dict[str, Any]]:
    """spec.volumes, as given (their sources follow the Kubernetes Volume API)."""
    return [volume.dump() for volume in job.spec.volumes]


def user_mounts(job: RocmTrainingJob) -> list[dict[str, Any]]:
    """spec.volumeMounts, as given."""
    return [mount.dump() for mount in job.spec.volume_mounts]


def progress_volume(options: RenderOptions) -> dict[str, Any]:
    """A projected volume with a pod-bound service account token and, if given, the endpoint's CA."""
    sources: list[dict[str, Any]] = [
        {
            "serviceAccountToken": {
                "audience": options.progress_token_audience,
                "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
                "path": "token",
            }
        }
    ]
    if options.progress_ca_configmap:
        sources.append(
            {
                "configMap": {
                    "name": options.progress_ca_configmap,
                    "items": [{"key": options.progress_ca_key, "path": "ca.crt"}],
                }
            }
        )
    return {"name": PROGRESS_VOLUME, "projected": {"sources": sources}}


def progress_mount() -> dict[str, Any]:
    """The read-only mount of the progress credentials."""
    return {"name": PROGRESS_VOLUME, "mountPath": PROGRESS_DIR, "readOnly": True}

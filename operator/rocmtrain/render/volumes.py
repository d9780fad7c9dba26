"""Pod volumes and container mounts: /dev/shm, /tmp, the user's volumes, the progress credentials.

The operator's own volume names and mount paths are in `rocmtrain.api.contract`, where
validation finds them too (spec.volumes and spec.volumeMounts may not use them).
"""

from __future__ import annotations

from typing import Any

from rocmtrain.api.contract import PROGRESS_DIR, PROGRESS_VOLUME, SHM_PATH, SHM_VOLUME, TMP_PATH, TMP_VOLUME
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.render.options import RenderOptions

PROGRESS_TOKEN_PATH = f"{PROGRESS_DIR}/token"
PROGRESS_CA_PATH = f"{PROGRESS_DIR}/ca.crt"
# Lifetime of the projected token; the kubelet refreshes it at 80% of it.
TOKEN_EXPIRATION_SECONDS = 3600


def shm_volume(size: str) -> dict[str, Any]:
    """A memory-backed /dev/shm of `size` (tmpfs pages count towards the container's memory)."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def shm_mount() -> dict[str, Any]:
    """The /dev/shm mount for a Ray container."""
    return {"name": SHM_VOLUME, "mountPath": SHM_PATH}


def tmp_volume() -> dict[str, Any]:
    """The writable scratch space of a container whose root filesystem is read-only (node disk, like
    the container's own layer was)."""
    return {"name": TMP_VOLUME, "emptyDir": {}}


def tmp_mount() -> dict[str, Any]:
    """The /tmp mount: Ray's session directory, HOME and its caches."""
    return {"name": TMP_VOLUME, "mountPath": TMP_PATH}


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

"""The largest RocmTrainingJobs a tenant can make, for the operator's memory bench and test.

- `largest_body`: the largest job the operator accepts, every env value as long as the 96 KiB
  `ROCMTRAIN_JOB` limit lets it be;
- `stored_body`: the largest job the API server stores (about 1.5 MB: etcd's request limit), within
  every field bound of the CRD, which the operator refuses for its size; `oversized_body`, every env entry
  at the CRD's bounds (about 270 KB), refused for its size too, and far cheaper for the API server to store
  (each 1.5 MB write takes it seconds);
- `invalid_body`: `largest_body` with a variable the operator reserves, which only the operator refuses.
"""

from __future__ import annotations

from typing import Any

from rocmtrain.api.job_config import JOB_CONFIG_LIMIT, job_config_size
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import validate_job

ENV_VALUE_LIMIT = 4096  # the models' bound on one env value
ENV_COUNT_LIMIT = 64  # and on the number of env entries
# spec.volumes as stored_body fills them: ConfigMap volumes of 64 items, each key and path as long as
# the CRD lets it be; 15 of them and every env entry make about 1.52 MB, and a 16th goes over etcd's limit.
STORED_VOLUMES = 15
VOLUME_ITEMS = 64


def job_body(name: str, namespace: str, resources: dict[str, Any] | None = None) -> dict[str, Any]:
    """A small valid job: two workers of 8 GPUs (unless `resources`), checkpoints in an object store."""
    return {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"source": "distilbert/distilbert-base-uncased", "numLabels": 2},
            "data": {"train": {"uri": "s3://datasets/reviews/train.jsonl"}},
            "resources": resources or {"workers": 2, "gpusPerWorker": 8},
            "checkpoint": {"storagePath": f"s3://checkpoints/{namespace}/{name}"},
        },
    }


def largest_body(name: str, namespace: str) -> dict[str, Any]:
    """`job_body` with as much env as validation accepts: the largest job the operator runs."""
    body = job_body(name, namespace)
    env: list[dict[str, str]] = body["spec"].setdefault("env", [])

    def size() -> int:
        return job_config_size(RocmTrainingJob.model_validate(body))

    while len(env) < ENV_COUNT_LIMIT:
        env.append({"name": f"BENCH_{len(env):02d}", "value": ""})
        room = JOB_CONFIG_LIMIT - size()
        env[-1]["value"] = "x" * max(min(ENV_VALUE_LIMIT, room), 0)
        if room <= ENV_VALUE_LIMIT:
            break
    job, errors = validate_job(body)
    if job is None:
        raise RuntimeError(f"the largest job is refused: {errors}")
    return body


def oversized_body(name: str, namespace: str) -> dict[str, Any]:
    """`job_body` with every env entry at the CRD's bounds: about 270 KB, refused for its size."""
    body = job_body(name, namespace)
    body["spec"]["env"] = [
        {"name": f"BIG_{i:02d}_" + "X" * 120, "value": "v" * ENV_VALUE_LIMIT} for i in range(ENV_COUNT_LIMIT)
    ]
    return body


def stored_body(name: str, namespace: str) -> dict[str, Any]:
    """`oversized_body` with `STORED_VOLUMES` ConfigMap volumes at the CRD's bounds too: about 1.5 MB, which the
    API server stores and the operator refuses (over 96 KiB as its driver would read it)."""
    body = oversized_body(name, namespace)
    body["spec"]["volumes"] = [
        {
            "name": f"cm-{v:02d}",
            "configMap": {
                "name": "c" * 253,
                "items": [
                    {"key": f"k{i:02d}" + "k" * 250, "path": f"p{i:02d}" + "/p" * 510} for i in range(VOLUME_ITEMS)
                ],
            },
        }
        for v in range(STORED_VOLUMES)
    ]
    return body


def invalid_body(name: str, namespace: str) -> dict[str, Any]:
    """`largest_body` whose first variable is one the operator reserves (the CRD lets it through)."""
    body = largest_body(name, namespace)
    body["spec"]["env"][0]["name"] = "RAY_ADDRESS"
    return body

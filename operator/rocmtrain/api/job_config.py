"""The job as the training driver reads it: one environment variable, so bounded in size.

Linux refuses to start a process with one environment string longer than 128 KiB
(MAX_ARG_STRLEN), so a head container whose `ROCMTRAIN_JOB` were longer would never
start. `JOB_CONFIG_LIMIT` leaves room below that, and bounds what a job's spec can
add to its RayJob (the spec's env and volumes appear once per pod template).
"""

from __future__ import annotations

import json
from typing import Any, Final

from rocmtrain.api.contract import API_VERSION, KIND
from rocmtrain.api.models import MUTABLE_FIELDS, RocmTrainingJob

JOB_CONFIG_LIMIT: Final = 96 * 1024  # bytes of UTF-8
# What the uid the API server assigns adds to the document (`,"uid":"` 36 characters `"`): a job
# validated before it has one (`rocmtrain validate`) is sized as it will be on the cluster.
UID_BYTES: Final = len(',"uid":""') + 36


def job_config_size(job: RocmTrainingJob) -> int:
    """Bytes of the job's `job_config_json` once it is stored, whether or not it has its uid yet."""
    return len(job_config_json(job).encode()) + (0 if job.metadata.uid else UID_BYTES)


def job_config_json(job: RocmTrainingJob) -> str:
    """The job as the training driver reads it from `ROCMTRAIN_JOB` (compact, sorted JSON).

    The spec's mutable fields (suspend, lifecycle) are left out: the driver does not
    use them, and leaving them out keeps the pod templates unchanged when they change.
    """
    metadata: dict[str, Any] = {"name": job.metadata.name, "namespace": job.metadata.namespace}
    if job.metadata.uid:
        metadata["uid"] = job.metadata.uid
    spec = {key: value for key, value in job.spec.dump().items() if key not in MUTABLE_FIELDS}
    document = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

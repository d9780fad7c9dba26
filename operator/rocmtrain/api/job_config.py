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

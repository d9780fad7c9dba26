"""spec.checkpoint and spec.faultTolerance: checkpoints, and what a failure costs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rocmtrain.api.models.base import ApiModel
from rocmtrain.api.types import Location


class CheckpointSpec(ApiModel):
    """Ray Train checkpoints."""

    storage_path: Location | None = Field(
        default=None,
        description=(
            "Where checkpoints and the trained model go, the same bytes for every Ray pod and outliving them: "
            "an object-store URI that names its bucket or container (s3://bucket/path, gs://, gcs://, abfs://), "
            "or an absolute path on a writable persistentVolumeClaim (ReadWriteMany) or nfs volume in "
            "spec.volumeMounts; a path on an emptyDir, ephemeral, csi, secret or configMap volume is refused. "
            "Required on a cluster, where every worker pod uploads its own checkpoints; `rocmtrain run` also "
            "accepts a `./` path relative to the job file and defaults to ./runs."
        ),
    )
    keep_last: int = Field(default=2, ge=1, le=100, description="Checkpoints to keep; older ones are deleted.")
    every_steps: int = Field(
        default=0, ge=0, le=10_000_000, description="Also checkpoint every N optimiser steps; 0 means per epoch only."
    )
    resume: Literal["auto", "never"] = Field(
        default="auto",
        description="auto resumes from the latest checkpoint under storagePath; never starts fresh.",
    )


class FaultToleranceSpec(ApiModel):
    """What a failure costs."""

    max_worker_failures: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Worker failures Ray Train recovers from (restoring the last checkpoint) before the run fails.",
    )
    job_retries: int = Field(
        default=0, ge=0, le=20, description="Whole-job retries on a new Ray cluster (RayJob backoffLimit)."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=31_536_000, description="Fail the job when it runs longer than this."
    )

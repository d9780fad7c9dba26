"""spec.lifecycle: what happens after the job ends."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.base import ApiModel, _cel


class LifecycleSpec(ApiModel):
    """What happens after the job ends."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.ttlSecondsAfterFinished) || self.shutdownAfterJobFinishes",
                    "ttlSecondsAfterFinished requires shutdownAfterJobFinishes",
                    fieldPath=".ttlSecondsAfterFinished",
                )
            ]
        }
    )

    shutdown_after_job_finishes: bool = Field(
        default=True, description="Delete the Ray cluster when the job ends, freeing its GPUs."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=31_536_000, description="Seconds to keep the Ray cluster after the job ends."
    )

    @model_validator(mode="after")
    def _ttl_needs_shutdown(self) -> LifecycleSpec:
        if self.ttl_seconds_after_finished is not None and not self.shutdown_after_job_finishes:
            raise ValueError("ttlSecondsAfterFinished requires shutdownAfterJobFinishes")
        return self

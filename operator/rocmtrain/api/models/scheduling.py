"""spec.scheduling: Kueue queue and priorities, node placement, tolerations and topology."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.types import DnsSubdomain, LabelKey, LabelledName, LabelValue


class Toleration(ApiModel):
    """A Kubernetes toleration for the Ray pods."""

    key: LabelKey | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: LabelValue | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="For NoExecute: how long the pod stays bound after the taint."
    )


TopologyMode = Literal["required", "preferred"]
TOPOLOGY_NEEDS_QUEUE = (
    "topology needs scheduling.queueName: Kueue's Topology Aware Scheduling places the pods, and only a job "
    "queued in Kueue is placed by it"
)


class TopologySpec(ApiModel):
    """Kueue's Topology Aware Scheduling: keep the Ray pods within one domain of a topology level."""

    level: LabelKey = Field(
        description="Node label of a level of the Kueue Topology that the job's ResourceFlavor uses, for example "
        "cloud.provider.com/topology-rack: the head's and the workers' pods are placed in one domain of it."
    )
    mode: TopologyMode = Field(
        default="preferred",
        description="required: the job waits (Queued) until its pods fit in one domain of the level; preferred: "
        "Kueue packs them as tightly as it can, in one domain where they fit.",
    )


class SchedulingSpec(ApiModel):
    """Where and in which order the Ray pods are placed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel("!has(self.topology) || has(self.queueName)", TOPOLOGY_NEEDS_QUEUE, fieldPath=".topology")
            ]
        }
    )

    queue_name: LabelledName | None = Field(
        default=None,
        description="Kueue LocalQueue; sets `kueue.x-k8s.io/queue-name` (a label: at most 63 characters) and lets "
        "Kueue admit the job.",
    )
    kueue_priority_class: LabelledName | None = Field(
        default=None,
        description="Kueue WorkloadPriorityClass; sets `kueue.x-k8s.io/priority-class` (a label: at most 63 "
        "characters).",
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None, description="Kubernetes PriorityClass of the Ray pods."
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Extra node labels the Ray pods require."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations for the Ray pods."
    )
    topology: TopologySpec | None = Field(
        default=None,
        description="Topology-aware placement by Kueue (needs queueName): Kueue's pod-set topology annotation on "
        "the head's and the workers' pod templates.",
    )

    @model_validator(mode="after")
    def _topology_needs_queue(self) -> SchedulingSpec:
        if self.topology is not None and self.queue_name is None:
            raise ValueError(TOPOLOGY_NEEDS_QUEUE)
        return self

"""spec.resources: workers, GPUs and their selection, pod resources, multi-node networking."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from rocmtrain.api.contract import GPU_NODE_LABELS, GPU_RESOURCE
from rocmtrain.api.models.base import ApiModel, _cel
from rocmtrain.api.patterns import EXTENDED_RESOURCE, HCA_NAME, INTERFACE_NAME, NETWORK_ATTACHMENT
from rocmtrain.api.quantity import parse_quantity, quantity_text
from rocmtrain.api.types import AmdResourceName, GpuPartition, LabelValue, Quantity


class HeadResources(ApiModel):
    """Resources of the Ray head pod (it runs the driver, no training)."""

    cpu: Quantity = Field(default="2", description="CPU request and limit of the head container.")
    memory: Quantity = Field(default="8Gi", description="Memory request and limit of the head container.")


SHM_CAP = "16Gi"  # the largest /dev/shm a worker gets without spec.resources.sharedMemory
RESOURCE_NOT_PARTITION = "with a partition, resourceName must be amd.com/<partition> (mixed naming)"


class GpuSelector(ApiModel):
    """GPU model selection through the AMD GPU node-labeller's node labels."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.resourceName) || !has(self.partition) "
                    "|| self.resourceName == 'amd.com/' + self.partition",
                    RESOURCE_NOT_PARTITION,
                    fieldPath=".resourceName",
                )
            ]
        }
    )

    product_name: LabelValue | None = Field(
        default=None,
        description=f"Value of `{GPU_NODE_LABELS['product_name']}`, for example AMD_Instinct_MI300X_OAM.",
    )
    family: LabelValue | None = Field(
        default=None, description=f"Value of `{GPU_NODE_LABELS['family']}`, for example AI (CDNA)."
    )
    vram: LabelValue | None = Field(
        default=None, description=f"Value of `{GPU_NODE_LABELS['vram']}`, for example 192G."
    )
    partition: GpuPartition | None = Field(
        default=None,
        description=f"Compute and memory partition, the value of `{GPU_NODE_LABELS['partition']}` (for example "
        "cpx_nps4): each worker GPU is one partition of a GPU. With the device plugin's `single` naming the pods "
        f"request `{GPU_RESOURCE}`; with `mixed` naming set resourceName too.",
    )
    resource_name: AmdResourceName | None = Field(
        default=None,
        description="The device plugin's resource to request instead of `amd.com/gpu`, for `mixed` naming: "
        "`amd.com/<partition>` (for example amd.com/cpx_nps4); Ray is told the worker's GPUs (`num-gpus`).",
    )

    @model_validator(mode="after")
    def _resource_names_its_partition(self) -> GpuSelector:
        named = self.resource_name is not None and self.partition is not None
        if named and self.resource_name != f"amd.com/{self.partition}":
            raise ValueError(RESOURCE_NOT_PARTITION)
        return self

    @property
    def resource(self) -> str:
        """The extended resource the worker pods request for their GPUs."""
        return self.resource_name or GPU_RESOURCE

    def node_labels(self) -> dict[str, str]:
        """The node labels (and values) a node must carry to match: one per field that is set."""
        return {label: value for field, label in GPU_NODE_LABELS.items() if (value := getattr(self, field)) is not None}


RDMA_WITHOUT_RESOURCE = "RDMA settings (ibHca, gidIndex) need rdmaResource when workers > 1"


class NetworkSpec(ApiModel):
    """Multi-node networking of the workers: RDMA NICs, a secondary network and RCCL's settings.

    RCCL reads the NCCL_* variables. Without RDMA it falls back to TCP over the pod network.
    """

    rdma_resource: Annotated[str, StringConstraints(pattern=EXTENDED_RESOURCE, max_length=253)] | None = Field(
        default=None,
        description="Extended resource of the RDMA NICs the network operator exposes (rdma/rdma_shared_device_a).",
    )
    rdma_per_worker: int = Field(default=1, ge=1, le=16, description="rdmaResource requested per worker pod.")
    networks: list[Annotated[str, StringConstraints(pattern=NETWORK_ATTACHMENT, max_length=160)]] = Field(
        default_factory=list,
        max_length=8,
        description="Multus secondary networks of the worker pods ([namespace/]name[@interface]), the value of "
        "`k8s.v1.cni.cncf.io/networks`.",
    )
    ib_hca: list[Annotated[str, StringConstraints(pattern=HCA_NAME, max_length=68)]] = Field(
        default_factory=list, max_length=32, description="HCAs RCCL uses (NCCL_IB_HCA), for example mlx5_0."
    )
    socket_interface: Annotated[str, StringConstraints(pattern=INTERFACE_NAME)] | None = Field(
        default=None, description="Interface for RCCL's bootstrap and socket traffic (NCCL_SOCKET_IFNAME)."
    )
    gid_index: int | None = Field(default=None, ge=0, le=255, description="RoCE GID index (NCCL_IB_GID_INDEX).")

    @property
    def names_rdma(self) -> bool:
        """Whether RCCL's RDMA settings are given."""
        return bool(self.ib_hca) or self.gid_index is not None

    def nccl_env(self) -> dict[str, str]:
        """RCCL's variables, for the set fields only (plain values: no shell reads them)."""
        values = {
            "NCCL_IB_HCA": ",".join(self.ib_hca) or None,
            "NCCL_SOCKET_IFNAME": self.socket_interface,
            "NCCL_IB_GID_INDEX": None if self.gid_index is None else str(self.gid_index),
        }
        return {name: value for name, value in values.items() if value is not None}


class ResourcesSpec(ApiModel):
    """Workers, GPUs and pod resources."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.gpusPerWorker > 0 || !has(self.gpu)",
                    "gpu model selection requires gpusPerWorker > 0",
                    fieldPath=".gpu",
                ),
                _cel(
                    "self.workers <= 1 || self.gpusPerWorker == 0 || !has(self.network) "
                    "|| has(self.network.rdmaResource) || !has(self.network.gidIndex) "
                    "&& (!has(self.network.ibHca) || size(self.network.ibHca) == 0)",
                    RDMA_WITHOUT_RESOURCE,
                    fieldPath=".network.rdmaResource",
                ),
            ]
        }
    )

    workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Worker pods; each runs one Ray Train worker (a DDP rank) per GPU, or one on CPUs.",
    )
    gpus_per_worker: int = Field(
        default=1,
        ge=0,
        le=16,
        description=f"AMD GPUs (`{GPU_RESOURCE}`) per worker pod, each trained on by its own rank; 0 trains on CPU.",
    )
    cpus_per_worker: Quantity = Field(default="8", description="CPU request and limit per worker pod.")
    memory_per_worker: Quantity = Field(default="64Gi", description="Memory request and limit per worker pod.")
    shared_memory: Quantity | None = Field(
        default=None,
        description=(
            "Size of the in-memory /dev/shm volume for data loaders and RCCL; at most memoryPerWorker (its pages "
            f"count towards the worker's memory). Unset: the smaller of {SHM_CAP} and half of memoryPerWorker."
        ),
    )
    head: HeadResources = Field(default_factory=HeadResources, description="Ray head pod resources.")
    gpu: GpuSelector | None = Field(
        default=None, description="Required GPU model, matched against AMD node-labeller labels."
    )

    network: NetworkSpec | None = Field(
        default=None, description="Multi-node networking of the workers: RDMA, secondary network, RCCL settings."
    )

    @property
    def gpu_resource(self) -> str:
        """The extended resource a worker's GPUs are requested as: `amd.com/gpu`, or a partition's (mixed naming)."""
        return self.gpu.resource if self.gpu is not None else GPU_RESOURCE

    @model_validator(mode="after")
    def _gpu_selection_needs_gpus(self) -> ResourcesSpec:
        if self.gpu is not None and self.gpus_per_worker == 0:
            raise ValueError("gpu model selection requires gpusPerWorker > 0")
        return self

    @model_validator(mode="after")
    def _rdma_needs_a_resource(self) -> ResourcesSpec:
        network = self.network
        if self.workers > 1 and self.gpus_per_worker and network and network.names_rdma and not network.rdma_resource:
            raise ValueError(f"{RDMA_WITHOUT_RESOURCE} (without it RCCL falls back to TCP over the pod network)")
        return self

    @property
    def shm_size(self) -> str:
        """The size of a worker's /dev/shm: sharedMemory, else the smaller of SHM_CAP and half of memoryPerWorker."""
        if self.shared_memory is not None:
            return self.shared_memory
        half = parse_quantity(self.memory_per_worker) / 2
        return SHM_CAP if half >= parse_quantity(SHM_CAP) else quantity_text(half)

    @property
    def total_gpus(self) -> int:
        """AMD GPUs the job asks for in all: the one place this is computed."""
        return self.workers * self.gpus_per_worker

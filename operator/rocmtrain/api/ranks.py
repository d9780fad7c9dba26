"""How a job's worker pods become data-parallel ranks: one Ray Train worker per GPU, packed per pod.

A worker pod (`spec.resources.workers` of them) holds `gpusPerWorker` AMD GPUs. Each GPU gets its
own Ray Train worker, that is its own DDP rank, with one GPU and an equal share of the pod's CPUs;
the ranks of one pod are placed together, so all-reduce inside a node stays on xGMI. A pod without
GPUs runs one rank. The world size, the learning-rate scaling and `status.gpus` all follow from this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Ray counts resources in units of 1/10000; a rank's CPU share is rounded down to one, so that the
# shares of a pod's ranks never add up to more than the pod's CPUs.
RAY_RESOURCE_UNIT = 10_000


@dataclass(frozen=True)
class RankLayout:
    """The ranks of a job: how many pods, ranks in each, and what each rank reserves."""

    pods: int
    ranks_per_pod: int
    gpus_per_rank: int  # 1 with GPUs, 0 on CPUs
    cpus_per_rank: float

    @property
    def world_size(self) -> int:
        return self.pods * self.ranks_per_pod

    @property
    def total_gpus(self) -> int:
        return self.world_size * self.gpus_per_rank

    def pod_of(self, rank: int) -> int:
        """The pod that rank `rank` runs in (ranks are numbered pod by pod)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        return rank // self.ranks_per_pod

    def resources_per_rank(self) -> dict[str, float]:
        """What each Ray Train worker reserves (ScalingConfig.resources_per_worker)."""
        resources = {"CPU": self.cpus_per_rank}
        if self.gpus_per_rank:
            resources["GPU"] = float(self.gpus_per_rank)
        return resources


def rank_layout(workers: int, gpus_per_worker: int, cpus_per_worker: float) -> RankLayout:
    """The layout of `workers` pods with `gpus_per_worker` GPUs and `cpus_per_worker` CPUs each."""
    if workers < 1 or gpus_per_worker < 0 or cpus_per_worker <= 0:
        raise ValueError(f"no layout for {workers} pods, {gpus_per_worker} GPUs and {cpus_per_worker} CPUs each")
    ranks = max(gpus_per_worker, 1)
    share = math.floor(cpus_per_worker * RAY_RESOURCE_UNIT / ranks) / RAY_RESOURCE_UNIT
    if share <= 0:
        raise ValueError(f"{cpus_per_worker} CPUs cannot be shared among {ranks} ranks")
    return RankLayout(pods=workers, ranks_per_pod=ranks, gpus_per_rank=1 if gpus_per_worker else 0, cpus_per_rank=share)


def shard_group(world_size: int, ranks_per_pod: int, scope: str) -> int:
    """Ranks that share one copy of a sharded model (`training.sharding: fsdp`): a pod's, where the job has
    several pods of several ranks and `shardingScope` is pod (hybrid sharding: replicas across pods), else all."""
    if scope == "pod" and 1 < ranks_per_pod < world_size and world_size % ranks_per_pod == 0:
        return ranks_per_pod
    return world_size

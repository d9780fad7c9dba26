"""The rank layout: one Ray Train worker (DDP rank) per GPU, packed per pod; one per pod on CPUs."""

from __future__ import annotations

import pytest

from rocmtrain.api.models import ResourcesSpec
from rocmtrain.api.quantity import parse_quantity
from rocmtrain.api.ranks import RankLayout, rank_layout

# (workers, gpusPerWorker, cpusPerWorker) -> (world size, ranks per pod, resources per rank)
LAYOUTS = [
    ((1, 0, "8"), (1, 1, {"CPU": 8.0})),
    ((2, 0, "1"), (2, 1, {"CPU": 1.0})),
    ((1, 1, "16"), (1, 1, {"CPU": 16.0, "GPU": 1.0})),
    ((4, 1, "16"), (4, 1, {"CPU": 16.0, "GPU": 1.0})),
    ((1, 8, "96"), (8, 8, {"CPU": 12.0, "GPU": 1.0})),
    ((2, 8, "96"), (16, 8, {"CPU": 12.0, "GPU": 1.0})),
    ((3, 2, "12500m"), (6, 2, {"CPU": 6.25, "GPU": 1.0})),
    # Shares are rounded down to Ray's resource unit (1/10000), so 3 ranks never ask for more than 8 CPUs.
    ((2, 3, "8"), (6, 3, {"CPU": 2.6666, "GPU": 1.0})),
    ((1, 16, "500m"), (16, 16, {"CPU": 0.0312, "GPU": 1.0})),
]


@pytest.mark.parametrize(("resources", "expected"), LAYOUTS, ids=[f"{w}x{g}gpu-{c}cpu" for (w, g, c), _ in LAYOUTS])
def test_layout(resources: tuple[int, int, str], expected: tuple[int, int, dict[str, float]]) -> None:
    workers, gpus, cpus = resources
    layout = rank_layout(workers, gpus, float(parse_quantity(cpus)))
    world_size, ranks_per_pod, _ = expected
    assert (layout.world_size, layout.ranks_per_pod, layout.resources_per_rank()) == expected
    assert layout.pods == workers
    assert layout.cpus_per_rank * layout.ranks_per_pod <= float(parse_quantity(cpus))
    # Ranks are numbered pod by pod: each pod holds a contiguous block of ranks_per_pod ranks.
    assert [layout.pod_of(rank) for rank in range(world_size)] == [r // ranks_per_pod for r in range(world_size)]
    assert [sum(1 for r in range(world_size) if layout.pod_of(r) == pod) for pod in range(workers)] == [
        ranks_per_pod
    ] * workers
    # status.gpus (ResourcesSpec.total_gpus) counts exactly the GPUs the ranks hold.
    spec = ResourcesSpec(workers=workers, gpusPerWorker=gpus, cpusPerWorker=cpus)
    assert layout.total_gpus == spec.total_gpus
    assert layout.world_size == (spec.total_gpus or workers)


@pytest.mark.parametrize(("workers", "gpus", "cpus"), [(0, 1, 1.0), (1, -1, 1.0), (1, 1, 0.0), (1, 16, 0.0001)])
def test_impossible_layouts_are_refused(workers: int, gpus: int, cpus: float) -> None:
    with pytest.raises(ValueError, match=r"no layout|cannot be shared"):
        rank_layout(workers, gpus, cpus)


def test_ranks_outside_the_world_belong_to_no_pod() -> None:
    layout = RankLayout(pods=2, ranks_per_pod=8, gpus_per_rank=1, cpus_per_rank=12.0)
    with pytest.raises(ValueError, match="outside"):
        layout.pod_of(16)

"""Pre-flight: worker placement against node capacity and GPU labels (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from rocmtrain.admission.node_fit import NodeInfo, check, node_info
from rocmtrain.api.condition_reasons import Reason
from rocmtrain.api.models import RocmTrainingJobSpec

MI300X = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "amd.com/gpu.family": "AI", "amd.com/gpu.vram": "192G"}
NODES = [NodeInfo("a", 8, MI300X), NodeInfo("b", 8, MI300X), NodeInfo("cpu", 0, {})]


def spec(workers: int = 1, gpus: int = 8, **extra: Any) -> RocmTrainingJobSpec:
    return RocmTrainingJobSpec.model_validate(
        {
            "model": {"source": "org/model", "numLabels": 2},
            "data": {"train": {"uri": "s3://b/train.jsonl"}},
            "resources": {"workers": workers, "gpusPerWorker": gpus, **extra},
        }
    )


@pytest.mark.parametrize(
    ("job", "reason", "message"),
    [
        (spec(gpus=16), Reason.INSUFFICIENT_GPUS, "needs 16 amd.com/gpu per worker; the largest node has 8"),
        (
            spec(workers=3),
            Reason.INSUFFICIENT_GPUS,
            "needs 3 workers with 8 amd.com/gpu each; the nodes can hold only 2 such workers",
        ),
        (
            spec(gpu={"productName": "AMD_Instinct_MI250X"}),
            Reason.GPU_MODEL_UNAVAILABLE,
            "no node with amd.com/gpu has amd.com/gpu.product-name=AMD_Instinct_MI250X "
            "(GPU models on the nodes: AMD_Instinct_MI300X_OAM)",
        ),
        (
            spec(gpus=4, workers=5, gpu={"vram": "192G"}),
            Reason.INSUFFICIENT_GPUS,
            "needs 5 workers with 4 amd.com/gpu each; the nodes can hold only 4 such workers",
        ),
    ],
)
def test_unschedulable_jobs_say_why_with_numbers(job, reason, message):
    hold = check(job, NODES)
    assert hold is not None
    assert (hold.reason, hold.message) == (reason, message)


@pytest.mark.parametrize(
    "job",
    [spec(), spec(workers=2), spec(gpus=4, workers=4), spec(gpus=0, workers=50), spec(gpu={"family": "AI"})],
)
def test_jobs_that_fit_pass(job):
    assert check(job, NODES) is None


def test_node_selector_narrows_the_nodes():
    job = RocmTrainingJobSpec.model_validate(
        {
            "model": {"source": "org/model", "numLabels": 2},
            "data": {"train": {"uri": "s3://b/train.jsonl"}},
            "scheduling": {"nodeSelector": {"pool": "big"}},
        }
    )
    nodes = [NodeInfo("a", 8, {"pool": "small"})]
    hold = check(job, nodes)
    assert hold is not None and hold.reason == Reason.GPU_MODEL_UNAVAILABLE and "pool=big" in hold.message
    assert check(job, [*nodes, NodeInfo("b", 1, {"pool": "big"})]) is None


def test_no_gpu_nodes_at_all():
    hold = check(spec(gpus=1), [NodeInfo("cpu", 0, {})])
    assert hold is not None and hold.message == "needs 1 amd.com/gpu per worker; the largest node has 0"


def test_node_info_reads_allocatable_and_skips_cordoned_nodes():
    node = {
        "metadata": {"name": "n1", "labels": MI300X},
        "status": {"allocatable": {"amd.com/gpu": "8", "cpu": "192"}},
    }
    assert node_info(node) == NodeInfo("n1", 8, MI300X)
    assert node_info({**node, "spec": {"unschedulable": True}}) is None
    assert node_info({"metadata": {"name": "n2"}, "status": {}}) == NodeInfo("n2", 0, {})


CPX = {**MI300X, "amd.com/compute-memory-partition": "cpx_nps4"}


def test_partitions_count_as_devices_of_their_own_resource():
    node = {
        "metadata": {"name": "p1", "labels": CPX},
        "status": {"allocatable": {"amd.com/cpx_nps4": "64", "amd.com/gpu": "0", "example.com/other": "3"}},
    }
    info = node_info(node)
    assert info == NodeInfo("p1", 0, CPX, {"amd.com/cpx_nps4": 64, "example.com/other": 3})
    mixed = spec(workers=16, gpus=4, gpu={"partition": "cpx_nps4", "resourceName": "amd.com/cpx_nps4"})
    assert check(mixed, [info]) is None
    hold = check(spec(workers=17, gpus=4, gpu={"resourceName": "amd.com/cpx_nps4"}), [info])
    assert hold is not None
    assert hold.message == "needs 17 workers with 4 amd.com/cpx_nps4 each; the nodes can hold only 16 such workers"
    # Whole GPUs are not partitions: a job asking amd.com/gpu finds no devices on the mixed-naming node.
    assert check(spec(gpus=1), [info]) is not None


def test_single_naming_partitions_are_selected_by_their_label():
    single = [NodeInfo("whole", 8, MI300X), NodeInfo("cpx", 64, CPX)]
    assert check(spec(workers=8, gpus=8, gpu={"partition": "cpx_nps4"}), single) is None
    hold = check(spec(gpu={"partition": "dpx_nps1"}), single)
    assert hold is not None and hold.reason == Reason.GPU_MODEL_UNAVAILABLE
    assert "amd.com/compute-memory-partition=dpx_nps1" in hold.message


def test_rdma_nics_bound_the_workers_a_node_holds():
    rdma = {"rdmaResource": "rdma/roce", "rdmaPerWorker": 2}
    nodes = [NodeInfo("a", 8, MI300X, {"rdma/roce": 2}), NodeInfo("b", 8, MI300X, {"rdma/roce": 4})]
    assert check(spec(workers=3, gpus=4, network=rdma), nodes) is None  # a holds 1 worker, b 2
    hold = check(spec(workers=4, gpus=4, network=rdma), nodes)
    assert hold is not None
    assert hold.message == "needs 4 workers with 4 amd.com/gpu each; the nodes can hold only 3 such workers"
    hold = check(spec(workers=2, network={"rdmaResource": "rdma/roce", "rdmaPerWorker": 8}), nodes)
    assert hold is not None and hold.message == "needs 8 rdma/roce per worker; the largest node with its GPUs has 4"

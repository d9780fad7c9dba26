"""Pre-flight: worker placement against node capacity and GPU labels (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from rocmtrain.api.conditions import Reason
from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.node_fit import NodeInfo, check, node_info

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

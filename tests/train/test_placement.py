"""Ranks on a multi-node Ray cluster: one per GPU, the ranks of one pod together, numbered pod by pod.

What is faked: the GPUs and the pods. `ray.cluster_utils.Cluster` starts a real Ray cluster of
several nodes on this machine; each worker node stands for a worker pod and declares two `GPU`
resources, as KubeRay's `--num-gpus` does for `amd.com/gpu`. Ray Train places the ranks with the
trainer's own ScalingConfig (`trainer.scaling_config`); no GPU is touched (the ranks only report
where they run, over gloo).
"""

from __future__ import annotations

import sys
import uuid
from collections import defaultdict

import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster
from ray.train import RunConfig
from ray.train.torch import TorchConfig, TorchTrainer

from rocmtrain_train.config import local_settings
from rocmtrain_train.reporting.relay import Inbox, MessageKind, ReportRelay
from rocmtrain_train.trainer.torch_trainer import scaling_config
from train.jobs import EXAMPLES, job

pytestmark = pytest.mark.ray

PODS, GPUS, CPUS = 2, 2, 2


@pytest.fixture(scope="module")
def pods():
    """PODS nodes (the first is Ray's head) with GPUS fake GPUs and CPUS CPUs each, in place of the embedded Ray
    (the next module that needs that starts it again)."""
    ray.shutdown()
    # The Cluster would write its address to this machine's /tmp/ray/ray_current_cluster, where any Ray
    # started beside it without an address (the other tests' session) would find it and join it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray._private.utils, "write_ray_address", lambda *_: None)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CPUS, "num_gpus": GPUS})
    nodes = [cluster.head_node, *(cluster.add_node(num_cpus=CPUS, num_gpus=GPUS) for _ in range(PODS - 1))]
    cluster.wait_for_nodes()
    # The ranks run this module's functions, sent by value: Ray's workers cannot import the tests.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield {node.node_id for node in nodes}
    finally:
        ray.shutdown()
        cluster.shutdown()


def where(config: dict) -> None:
    ctx = ray.train.get_context()
    ray.train.report(
        {
            "rank": ctx.get_world_rank(),
            "world_size": ctx.get_world_size(),
            "node": ray.get_runtime_context().get_node_id(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }
    )


def test_each_gpu_is_a_rank_and_each_pod_holds_a_block_of_ranks(pods, tmp_path):
    resources = {"workers": PODS, "gpusPerWorker": GPUS, "cpusPerWorker": str(CPUS)}
    settings = local_settings(
        job("placement", {"resources": resources}),
        job_dir=str(EXAMPLES),
        run_id=uuid.uuid4().hex,
        storage=str(tmp_path),
        cpu_count=PODS * CPUS,
    )
    inbox = Inbox.remote()  # the driver's mailbox, as in training: what every rank reported
    TorchTrainer(
        where,
        scaling_config=scaling_config(settings),
        torch_config=TorchConfig(backend="gloo"),  # the ranks exchange nothing but their placement
        run_config=RunConfig(name="placement", storage_path=str(tmp_path), callbacks=[ReportRelay(inbox)]),
    ).fit()

    ((kind, reports, _),) = ray.get(inbox.drain.remote())
    assert kind is MessageKind.REPORT
    ranks = sorted(reports, key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == list(range(PODS * GPUS))
    assert {r["world_size"] for r in ranks} == {PODS * GPUS} == {settings.world_size}
    by_node: dict[str, list[int]] = defaultdict(list)
    for r in ranks:
        assert len(r["gpus"]) == 1  # one GPU per rank
        by_node[r["node"]].append(r["rank"])
    assert set(by_node) == pods
    # Each pod holds GPUS consecutive ranks (rank k*G .. k*G+G-1), each on a GPU of its own.
    assert sorted(by_node.values()) == [list(range(p * GPUS, (p + 1) * GPUS)) for p in range(PODS)]
    for node, members in by_node.items():
        gpus = [g for r in ranks if r["node"] == node for g in r["gpus"]]
        assert len(set(gpus)) == len(members) == settings.layout.ranks_per_pod

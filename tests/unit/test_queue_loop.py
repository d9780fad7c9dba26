"""The queue loop (`rocmtrain.controller.handlers.estimate_queues`): each queued job's expected start, written
from the watched Workloads and the running jobs' ETAs, with Kueue's objects answered from memory."""

from __future__ import annotations

import asyncio
import datetime as dt
import types

from rocmtrain.api.timestamps import rfc3339
from rocmtrain.controller.handlers import estimate_queues
from rocmtrain.controller.reconciler import Reconciler
from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.status.workload import workload_view


class _QueueKube:
    """The reads and status writes the queue loop makes, answered from memory."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str | None, str]] = []
        self.listable = True
        self.patches: list[tuple[str, dict]] = []
        self.objects = {
            ("localqueues", "ml", "lq"): {"spec": {"clusterQueue": "team-a"}},
            ("clusterqueues", None, "team-a"): {
                "metadata": {"name": "team-a"},
                "spec": {
                    "resourceGroups": [{"flavors": [{"resources": [{"name": "amd.com/gpu", "nominalQuota": 8}]}]}]
                },
                "status": {"flavorsReservation": [{"resources": [{"name": "amd.com/gpu", "total": 8}]}]},
            },
        }

    async def get_readable(self, ref, namespace, name):
        self.reads.append((ref.plural, namespace, name))
        return self.objects.get((ref.plural, namespace, name))

    async def list_readable(self, ref):
        self.reads.append((ref.plural, None, "*"))
        if not self.listable:
            return None
        return [obj for (plural, _, _), obj in self.objects.items() if plural == ref.plural]

    async def patch_status(self, ref, namespace, name, status, *, uid):
        self.patches.append((name, status))
        return {"status": status}

    async def post_event(self, *args, **kwargs):
        raise AssertionError("an estimate is no transition")


def _indexed_job(name: str, phase: str, **status) -> dict:
    meta = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1}
    return {
        "apiVersion": "rocmtrain.dev/v1alpha1",
        "kind": "RocmTrainingJob",
        "metadata": meta,
        "spec": {},
        "status": {"phase": phase, **status},
    }


def _workload(owner: str, gpus: int, admitted: bool) -> dict:
    pod_set = {"count": 1, "template": {"spec": {"containers": [{"resources": {"limits": {"amd.com/gpu": gpus}}}]}}}
    status = {"admission": {"clusterQueue": "team-a"}, "conditions": [{"type": "Admitted", "status": "True"}]}
    return workload_view(
        {
            "metadata": {
                "namespace": "ml",
                "name": f"w-{owner}",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": owner, "uid": owner}],
            },
            "spec": {"queueName": "lq", "podSets": [pod_set]},
            "status": status if admitted else {},
        }
    )


def _queue_runtime(kube: _QueueKube, jobs: list[dict], workloads: list[dict]) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        jobs={("ml", j["metadata"]["name"]): [j] for j in jobs},
        workloads=types.SimpleNamespace(
            views={(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in workloads}
        ),
        kube=kube,
        reconciler=Reconciler(kube, OperatorConfig.from_env({}), known=lambda namespace, name: None),
    )


def test_the_queue_loop_writes_each_queued_jobs_estimate_from_the_watched_workloads_and_etas():
    reported = dt.datetime.now(dt.UTC).replace(microsecond=0)
    last, soon = rfc3339(reported), rfc3339(reported + dt.timedelta(minutes=10))
    running = _indexed_job("a", "Running", progress={"etaSeconds": 600}, lastProgressTime=last)
    other = _indexed_job("b", "Running")  # no ETA reported yet
    queued = _indexed_job("c", "Queued")
    kube = _QueueKube()
    workloads = [_workload("a", 4, True), _workload("b", 4, True), _workload("c", 4, False)]

    async def scenario() -> None:
        runtime = _queue_runtime(kube, [running, other, queued], workloads)
        await estimate_queues(runtime)
        await estimate_queues(runtime)  # nothing changed: nothing written again
        queued["status"]["phase"] = "Pending"  # admitted meanwhile: the loop reads nothing
        await estimate_queues(runtime)

    asyncio.run(scenario())
    assert kube.reads == [("localqueues", "ml", "lq"), ("clusterqueues", None, "*")] * 2
    assert kube.patches == [
        (
            "c",
            {
                "queue": {
                    "position": 1,
                    "expectedStartTime": soon,
                    "basis": "1 running job's ETA, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs",
                }
            },
        )
    ]


def test_the_queue_loop_lists_the_cluster_queues_for_what_the_cohort_lends():
    kube = _QueueKube()
    kube.objects[("clusterqueues", None, "team-a")]["spec"]["cohortName"] = "research"
    kube.objects[("clusterqueues", None, "team-b")] = {
        "metadata": {"name": "team-b"},
        "spec": {
            "cohortName": "research",
            "resourceGroups": [{"flavors": [{"resources": [{"name": "amd.com/gpu", "nominalQuota": 8}]}]}],
        },
        "status": {"flavorsReservation": []},
    }
    queued = _indexed_job("c", "Queued")
    runtime = _queue_runtime(kube, [queued], [_workload("a", 8, True), _workload("c", 4, False)])
    asyncio.run(estimate_queues(runtime))
    assert kube.patches[-1][1]["queue"]["basis"] == (
        "GPUs free now, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs, "
        "borrowing without limit from cohort research: team-b lends 8"
    )
    # An older ClusterRole (get, no list): team-a read alone, and what its cohort lends is not known.
    kube.listable, kube.reads = False, []
    asyncio.run(estimate_queues(runtime))
    assert kube.reads == [("localqueues", "ml", "lq"), ("clusterqueues", None, "*"), ("clusterqueues", None, "team-a")]
    assert kube.patches[-1][1]["queue"] == {
        "position": 1,
        "basis": "unknown: the ClusterQueues of cohort research cannot be listed",
    }

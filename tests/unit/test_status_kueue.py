"""Kueue's Workload read into an admission verdict (pure: `rocmtrain.status.workload`, no cluster).

The Workloads are written the way Kueue v0.17 writes them (conditions and messages as
seen in the world); test_kueue.py shows the same against the real Kueue.
"""

from __future__ import annotations

from typing import Any

from rocmtrain.status.workload import Admission, admission, rayjob_owner, workload_view

WAITING = (
    "couldn't assign flavors to pod set gpu: insufficient unused quota for amd.com/gpu in flavor mi300x, 8 more needed"
)
PREEMPTED = "Preempted to accommodate a workload (UID: 1, JobUID: 2) due to prioritization in the ClusterQueue"
OWNER = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "bert", "uid": "rj-1", "controller": True}
ADMISSION = {
    "clusterQueue": "team-a",
    "podSetAssignments": [
        {"name": "head", "flavors": {"cpu": "any-node", "memory": "any-node"}},
        {"name": "gpu", "flavors": {"amd.com/gpu": "mi300x", "cpu": "any-node", "memory": "any-node"}},
    ],
}


def workload(*conditions: tuple[str, str, str, str], admission_: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    }
    if admission_:
        status["admission"] = admission_
    return {
        "metadata": {"name": "rayjob-bert-1", "namespace": "ml", "ownerReferences": [OWNER], "uid": "w"},
        "spec": {"podSets": ["large"]},
        "status": status,
    }


def verdict(*conditions: tuple[str, str, str, str], admission_: dict[str, Any] | None = None) -> Admission:
    return admission(workload_view(workload(*conditions, admission_=admission_)))


def test_waiting_carries_kueues_message():
    assert verdict(("QuotaReserved", "False", "Pending", WAITING)) == Admission(admitted=False, waiting=WAITING)


def test_admitted_names_the_cluster_queue_and_the_gpu_flavor():
    got = verdict(
        ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue team-a"),
        ("Admitted", "True", "Admitted", "The workload is admitted"),
        admission_=ADMISSION,
    )
    assert got == Admission(admitted=True, cluster_queue="team-a", flavors=("mi300x",))
    cpu_only = {**ADMISSION, "podSetAssignments": ADMISSION["podSetAssignments"][:1]}
    assert verdict(("Admitted", "True", "Admitted", ""), admission_=cpu_only).flavors == ("any-node",)


def test_evicted_is_not_admitted_even_before_kueue_withdraws_the_admission():
    got = verdict(
        ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue team-a"),
        ("Evicted", "True", "Preempted", PREEMPTED),
        ("Admitted", "True", "Admitted", "The workload is admitted"),
        ("Preempted", "True", "InClusterQueue", PREEMPTED),
        admission_=ADMISSION,
    )
    assert got == Admission(admitted=False, evicted=("Preempted", PREEMPTED))
    requeued = verdict(
        ("QuotaReserved", "False", "Pending", WAITING),
        ("Evicted", "True", "Preempted", PREEMPTED),
        ("Admitted", "False", "NoReservation", "The workload has no reservation"),
    )
    assert requeued == Admission(admitted=False, waiting=WAITING, evicted=("Preempted", PREEMPTED))


def test_readmitted_after_an_eviction():
    got = verdict(
        ("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue team-a"),
        ("Evicted", "False", "QuotaReserved", f"Previously: {PREEMPTED}"),
        ("Admitted", "True", "Admitted", "The workload is admitted"),
        admission_=ADMISSION,
    )
    assert got.admitted and got.evicted is None


def test_only_workloads_of_rayjobs_are_kept_small():
    mine = workload(("Admitted", "True", "Admitted", ""), admission_=ADMISSION)
    assert rayjob_owner(mine) == OWNER
    view = workload_view(mine)
    assert view["metadata"]["owner"] == {"name": "bert", "uid": "rj-1"} and "spec" not in view
    batch = {
        **mine,
        "metadata": {**mine["metadata"], "ownerReferences": [{**OWNER, "apiVersion": "batch/v1", "kind": "Job"}]},
    }
    assert rayjob_owner(batch) is None

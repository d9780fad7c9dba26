"""When a queued job will start (pure: `rocmtrain.status.queue`, no cluster)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rocmtrain.api.models import QUEUE_BASIS_LIMIT, RocmTrainingJobStatus
from rocmtrain.status.kueue import workload_view
from rocmtrain.status.queue import (
    Holder,
    Known,
    Quota,
    Waiting,
    cluster_queue_quota,
    estimate,
    estimates,
    expected_end,
    kueue_order,
)

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
QUOTA = Quota("team-a", 8, 8)


def at(minutes: float) -> dt.datetime:
    return NOW + dt.timedelta(minutes=minutes)


def stamp(minutes: float) -> str:
    return at(minutes).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting(name: str, gpus: int) -> Waiting:
    return Waiting(("ml", name), gpus)


RUNNING = [Holder("ml/a", 4, at(10)), Holder("ml/b", 4, at(30))]


def test_a_job_starts_when_the_first_eta_frees_enough_gpus() -> None:
    queue = estimate(QUOTA, RUNNING, [], 4, NOW)
    assert queue == {
        "position": 1,
        "expectedStartTime": stamp(10),
        "basis": "1 running job's ETA, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs",
    }
    RocmTrainingJobStatus.model_validate({"queue": queue})


def test_the_basis_says_a_cohort_may_lend_more() -> None:
    queue = estimate(Quota("team-a", 8, 8, "research"), RUNNING, [], 4, NOW)
    assert queue["basis"] == (
        "1 running job's ETA, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs, "
        "not counting what cohort research may lend"
    )


def test_a_job_needing_more_waits_for_as_many_releases_as_it_takes() -> None:
    queue = estimate(QUOTA, RUNNING, [], 8, NOW)
    assert queue["expectedStartTime"] == stamp(30)
    assert queue["basis"].startswith("2 running jobs' ETAs")


def test_the_jobs_ahead_start_first_and_keep_their_gpus() -> None:
    queue = estimate(QUOTA, RUNNING, [waiting("first", 4)], 4, NOW)
    assert queue["position"] == 2
    assert queue["expectedStartTime"] == stamp(30)
    assert "1 job ahead" in queue["basis"]


def test_a_job_that_fits_now_starts_now() -> None:
    queue = estimate(Quota("team-a", 8, 4), [Holder("ml/a", 4, at(10))], [], 2, NOW)
    assert queue["expectedStartTime"] == stamp(0)
    assert queue["basis"].startswith("GPUs free now")


def test_an_overdue_eta_counts_as_now() -> None:
    assert estimate(QUOTA, [Holder("ml/a", 8, at(-5))], [], 8, NOW)["expectedStartTime"] == stamp(0)


def test_gpus_held_without_an_eta_make_it_unknown_when_the_job_needs_them() -> None:
    holders = [Holder("ml/a", 4, at(10)), Holder("ml/starting", 4, None)]
    queue = estimate(QUOTA, holders, [], 8, NOW)
    assert queue == {
        "position": 1,
        "basis": "unknown: the GPUs it waits for are held without an ETA by ml/starting (4 GPUs)",
    }
    # ... but not when what has an ETA frees enough.
    assert estimate(QUOTA, holders, [], 4, NOW)["expectedStartTime"] == stamp(10)


def test_gpus_reserved_by_workloads_the_operator_does_not_follow_have_no_eta() -> None:
    queue = estimate(Quota("team-a", 8, 8), [Holder("ml/a", 4, at(10))], [], 8, NOW)
    assert "expectedStartTime" not in queue
    assert "workloads the operator does not follow (4 GPUs)" in queue["basis"]


def test_an_unknown_quota_or_a_job_larger_than_it_is_unknown() -> None:
    assert estimate(Quota("team-a", None), RUNNING, [], 4, NOW) == {
        "position": 1,
        "basis": "unknown: ClusterQueue team-a has no amd.com/gpu quota the operator can read",
    }
    assert estimate(QUOTA, RUNNING, [], 16, NOW)["basis"] == (
        "unknown: the job needs 16 GPUs, more than ClusterQueue team-a's quota of 8"
    )


def test_gpus_the_jobs_ahead_will_hold_make_it_unknown() -> None:
    queue = estimate(QUOTA, RUNNING, [waiting("first", 6)], 4, NOW)
    assert queue == {
        "position": 2,
        "basis": "unknown: the GPUs it needs go to the 1 job ahead first, whose ends are not known yet",
    }


def test_a_job_ahead_that_can_never_fit_does_not_block() -> None:
    assert estimate(QUOTA, RUNNING, [waiting("huge", 16)], 4, NOW)["expectedStartTime"] == stamp(10)


def test_the_basis_is_bounded() -> None:
    holders = [Holder("ml/" + "x" * 300, 8, None)]
    queue = estimate(Quota("q" * 300, 8, 8), holders, [], 8, NOW)
    assert len(queue["basis"]) == QUEUE_BASIS_LIMIT
    RocmTrainingJobStatus.model_validate({"queue": queue})


def test_kueue_order_is_priority_then_creation() -> None:
    old, new, urgent = (
        Waiting(("ml", "old"), 1, 0, at(-10)),
        Waiting(("ml", "new"), 1, 0, at(-5)),
        Waiting(("ml", "urgent"), 1, 100, at(-1)),
    )
    assert kueue_order([new, old, urgent]) == [urgent, old, new]


@pytest.mark.parametrize(
    ("status", "end"),
    [
        ({"phase": "Running", "progress": {"etaSeconds": 600}, "lastProgressTime": stamp(-1)}, at(9)),
        ({"phase": "Running", "progress": {"etaSeconds": 600}}, None),
        ({"phase": "Running", "progress": {}, "lastProgressTime": stamp(-1)}, None),
        ({"phase": "Initializing"}, None),
        ({"phase": "Initializing", "progress": {"etaSeconds": 600}, "lastProgressTime": stamp(-1)}, at(9)),
        ({"phase": "Succeeded", "progress": {"etaSeconds": 600}, "lastProgressTime": stamp(-1)}, None),
    ],
)
def test_a_holding_jobs_end_is_its_last_report_plus_its_eta(status: dict[str, Any], end: dt.datetime | None) -> None:
    assert expected_end(status) == end


def cluster_queue(status: dict[str, Any] | None = None) -> dict[str, Any]:
    flavors = [
        {
            "name": "mi300x",
            "resources": [{"name": "cpu", "nominalQuota": 64}, {"name": "amd.com/gpu", "nominalQuota": 8}],
        },
        {"name": "mi250", "resources": [{"name": "amd.com/gpu", "nominalQuota": "4"}]},
    ]
    return {"metadata": {"name": "team-a"}, "spec": {"resourceGroups": [{"flavors": flavors}]}, "status": status or {}}


def test_the_quota_is_the_gpus_of_every_flavor_and_their_reservation() -> None:
    reserved = {"flavorsReservation": [{"name": "mi300x", "resources": [{"name": "amd.com/gpu", "total": "6"}]}]}
    assert cluster_queue_quota(cluster_queue(reserved)) == Quota("team-a", 12, 6)
    assert cluster_queue_quota(cluster_queue()) == Quota("team-a", 12, None)
    shared = cluster_queue()
    shared["spec"]["cohortName"] = "research"
    assert cluster_queue_quota(shared) == Quota("team-a", 12, None, "research")
    assert cluster_queue_quota({"metadata": {"name": "cpu-only"}}) == Quota("cpu-only", None, None)
    partitioned = cluster_queue({"flavorsReservation": [{"resources": [{"name": "amd.com/cpx_nps4", "total": "16"}]}]})
    partitioned["spec"]["resourceGroups"][0]["flavors"].append(
        {"name": "cpx", "resources": [{"name": "amd.com/cpx_nps4", "nominalQuota": 64}]}
    )
    assert cluster_queue_quota(partitioned) == Quota("team-a", 76, 16)  # partitions (mixed naming) count as GPUs


def workload(
    owner: str, gpus: int, *, admitted: str | None = None, priority: int = 0, created: float = 0, **conditions: str
) -> dict[str, Any]:
    pod_sets = [
        {"name": "head", "count": 1, "template": {"spec": {"containers": [{"resources": {}}]}}},
        {
            "name": "gpu",
            "count": 2,
            "template": {"spec": {"containers": [{"resources": {"limits": {"amd.com/gpu": str(gpus // 2)}}}]}},
        },
    ]
    status: dict[str, Any] = {"conditions": [{"type": t, "status": s} for t, s in conditions.items()]}
    if admitted:
        status["admission"] = {"clusterQueue": admitted, "podSetAssignments": []}
        status["conditions"] += [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]
    return workload_view(
        {
            "metadata": {
                "name": f"rayjob-{owner}",
                "namespace": "ml",
                "creationTimestamp": stamp(created),
                "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": owner, "uid": owner}],
            },
            "spec": {"queueName": "lq", "priority": priority, "podSets": pod_sets},
            "status": status,
        }
    )


def test_estimates_of_a_cluster_queue_from_its_workloads_and_the_jobs_etas() -> None:
    views = [
        workload("a", 4, admitted="team-a"),
        workload("b", 4, admitted="team-a"),
        workload("done", 8, admitted="team-a", Finished="True"),
        workload("later", 4, created=-1),
        workload("sooner", 4, created=-2),
        workload("elsewhere", 2, created=-3),
    ]
    views[-1]["queueName"] = "other"
    known = {("ml", "a"): Known("job-a", at(10)), ("ml", "b"): Known("job-b", at(30))}
    result = estimates(views, {("ml", "lq"): "team-a"}, {"team-a": QUOTA}, known, NOW)
    assert result[("ml", "sooner")] == {
        "position": 1,
        "expectedStartTime": stamp(10),
        "basis": "1 running job's ETA, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs",
    }
    assert result[("ml", "later")]["position"] == 2
    assert result[("ml", "later")]["expectedStartTime"] == stamp(30)
    assert result[("ml", "elsewhere")] == {
        "basis": "unknown: LocalQueue ml/other or its ClusterQueue cannot be read",
    }
    assert set(result) == {("ml", "sooner"), ("ml", "later"), ("ml", "elsewhere")}


def test_a_holder_the_operator_does_not_know_has_no_eta() -> None:
    views = [workload("a", 4, admitted="team-a"), workload("mine", 8)]
    result = estimates(views, {("ml", "lq"): "team-a"}, {"team-a": Quota("team-a", 8, 4)}, {}, NOW)
    assert result[("ml", "mine")]["basis"] == "unknown: the GPUs it waits for are held without an ETA by ml/a (4 GPUs)"


def test_workload_gpus_count_every_pod_of_every_set() -> None:
    assert workload("a", 8)["gpus"] == 8

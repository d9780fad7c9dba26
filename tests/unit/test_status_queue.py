"""When a queued job will start (pure: `rocmtrain.status.queue_estimate`, no cluster)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rocmtrain.api.models import QUEUE_BASIS_LIMIT, RocmTrainingJobStatus
from rocmtrain.status.queue_estimate import (
    Holder,
    Known,
    Member,
    Quota,
    Waiting,
    cluster_queue_quota,
    estimate,
    estimates,
    expected_end,
    kueue_order,
)
from rocmtrain.status.workload import workload_view

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


MI300X = frozenset({("mi300x", "amd.com/gpu")})
TEAM_A = Quota("team-a", 8, 8, "research", flavors=MI300X)
IDLE_B = Quota("team-b", 8, 0, "research", flavors=MI300X)


def test_an_idle_cohort_member_lends_its_gpus_and_the_job_starts_now() -> None:
    queue = estimate(TEAM_A, RUNNING, [], 4, NOW, [Member(IDLE_B, [], [])])
    assert queue == {
        "position": 1,
        "expectedStartTime": stamp(0),
        "basis": "GPUs free now, 0 jobs ahead, ClusterQueue team-a's quota of 8 GPUs, "
        "borrowing without limit from cohort research: team-b lends 8",
    }
    # All of both quotas: when team-a's own jobs have ended.
    assert estimate(TEAM_A, RUNNING, [], 16, NOW, [Member(IDLE_B, [], [])])["expectedStartTime"] == stamp(30)
    # A cohort without another ClusterQueue of its flavors lends nothing.
    alone = estimate(TEAM_A, RUNNING, [], 4, NOW)
    assert alone["expectedStartTime"] == stamp(10)
    assert alone["basis"].endswith(
        "borrowing without limit from cohort research, where no other ClusterQueue has its GPU flavors"
    )


def test_the_borrowing_limit_bounds_what_it_borrows() -> None:
    limited = Quota("team-a", 8, 8, "research", borrowing_limit=2, flavors=MI300X)
    queue = estimate(limited, RUNNING, [], 4, NOW, [Member(IDLE_B, [], [])])
    assert queue["expectedStartTime"] == stamp(10)  # 2 borrowed and 2 of its own
    assert queue["basis"].endswith("borrowing up to 2 from cohort research: team-b lends 8")
    assert estimate(limited, RUNNING, [], 11, NOW, [Member(IDLE_B, [], [])])["basis"] == (
        "unknown: the job needs 11 GPUs, more than ClusterQueue team-a's quota of 8 "
        "and the 2 GPUs cohort research may lend it"
    )


def test_the_lending_limit_bounds_what_a_member_lends() -> None:
    keeping = Quota("team-b", 8, 0, "research", lending_limit=2, flavors=MI300X)
    queue = estimate(TEAM_A, RUNNING, [], 4, NOW, [Member(keeping, [], [])])
    assert queue["expectedStartTime"] == stamp(10)
    assert queue["basis"].endswith("from cohort research: team-b lends 2")
    assert estimate(TEAM_A, RUNNING, [], 2, NOW, [Member(keeping, [], [])])["expectedStartTime"] == stamp(0)


def test_a_lenders_holder_gives_its_gpus_back_at_its_eta() -> None:
    busy_b = Quota("team-b", 8, 8, "research", flavors=MI300X)
    queue = estimate(TEAM_A, RUNNING, [], 4, NOW, [Member(busy_b, [Holder("ml/b", 8, at(5))], [])])
    assert queue["expectedStartTime"] == stamp(5)
    assert queue["basis"].startswith("1 running job's ETA")
    # Held without an ETA: only team-a's own jobs free GPUs; for more than they free, unknown.
    starting = [Member(busy_b, [Holder("ml/b", 8, None)], [])]
    assert estimate(TEAM_A, RUNNING, [], 4, NOW, starting)["expectedStartTime"] == stamp(10)
    assert estimate(TEAM_A, RUNNING, [], 12, NOW, starting)["basis"] == (
        "unknown: the GPUs it waits for are held without an ETA by ml/b (8 GPUs)"
    )
    # Reserved by workloads the operator does not follow: named with their ClusterQueue.
    unseen = estimate(TEAM_A, RUNNING, [], 12, NOW, [Member(busy_b, [], [])])
    assert unseen["basis"].endswith("workloads the operator does not follow in team-b (8 GPUs)")


def test_a_members_workload_ahead_takes_what_the_cohort_lends_first() -> None:
    first = Waiting(("ml", "b-first"), 8, 0, at(-10))
    queue = estimate(TEAM_A, RUNNING, [], 4, NOW, [Member(IDLE_B, [], [first])])
    assert queue["expectedStartTime"] == stamp(10)
    assert "0 jobs ahead (and 1 in cohort research)" in queue["basis"]
    # One that cannot start before its own GPUs are free does not block the job.
    busy_b = Quota("team-b", 8, 8, "research", flavors=MI300X)
    blocked = Member(busy_b, [Holder("ml/b", 8, at(60))], [first])
    assert estimate(TEAM_A, RUNNING, [], 4, NOW, [blocked])["expectedStartTime"] == stamp(10)


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
    flavors = frozenset({("mi300x", "amd.com/gpu"), ("mi250", "amd.com/gpu")})
    assert cluster_queue_quota(cluster_queue(reserved)) == Quota("team-a", 12, 6, flavors=flavors)
    assert cluster_queue_quota(cluster_queue()) == Quota("team-a", 12, None, flavors=flavors)
    assert cluster_queue_quota({"metadata": {"name": "cpu-only"}}) == Quota("cpu-only", None, None)
    partitioned = cluster_queue({"flavorsReservation": [{"resources": [{"name": "amd.com/cpx_nps4", "total": "16"}]}]})
    partitioned["spec"]["resourceGroups"][0]["flavors"].append(
        {"name": "cpx", "resources": [{"name": "amd.com/cpx_nps4", "nominalQuota": 64}]}
    )
    quota = cluster_queue_quota(partitioned)  # partitions (mixed naming) count as GPUs
    assert (quota.gpus, quota.reserved, ("cpx", "amd.com/cpx_nps4") in quota.flavors) == (76, 16, True)


def test_the_quota_of_a_cohort_member_with_its_limits() -> None:
    shared = cluster_queue()
    shared["spec"]["cohortName"] = "research"
    quota = cluster_queue_quota(shared)
    assert (quota.cohort, quota.borrowing_limit, quota.lending_limit, quota.lendable, quota.guaranteed) == (
        "research",
        None,
        None,
        12,
        0,
    )
    mi300x, mi250 = (flavor["resources"][-1] for flavor in shared["spec"]["resourceGroups"][0]["flavors"])
    mi300x |= {"borrowingLimit": 4, "lendingLimit": 16}  # lends at most its nominal quota
    mi250 |= {"borrowingLimit": "2", "lendingLimit": 1}
    quota = cluster_queue_quota(shared)
    assert (quota.borrowing_limit, quota.lending_limit, quota.lendable, quota.guaranteed) == (6, 9, 9, 3)
    del mi300x["borrowingLimit"]  # one resource without a limit: no limit
    assert cluster_queue_quota(shared).borrowing_limit is None


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
    result = estimates(views, {("ml", "lq"): "team-a"}, {"team-a": QUOTA}, known, NOW, listed=True)
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
    result = estimates(views, {("ml", "lq"): "team-a"}, {"team-a": Quota("team-a", 8, 4)}, {}, NOW, listed=True)
    assert result[("ml", "mine")]["basis"] == "unknown: the GPUs it waits for are held without an ETA by ml/a (4 GPUs)"


def test_estimates_count_the_cohorts_cluster_queues_that_share_a_flavor() -> None:
    views = [
        workload("a", 8, admitted="team-a"),
        workload("mine", 4, created=-2),
        workload("b-sooner", 8, created=-3),
        workload("b-later", 8, created=-1),
        workload("elsewhere", 4, admitted="other-flavor"),
    ]
    views[2]["queueName"] = views[3]["queueName"] = "lq-b"
    quotas = {
        "team-a": TEAM_A,
        "team-b": Quota("team-b", 16, 0, "research", flavors=MI300X),
        "other-flavor": Quota("other-flavor", 4, 4, "research", flavors=frozenset({("mi250", "amd.com/gpu")})),
        "outside": Quota("outside", 8, 0, flavors=MI300X),
    }
    cluster_queue_of = {("ml", "lq"): "team-a", ("ml", "lq-b"): "team-b"}
    result = estimates(views, cluster_queue_of, quotas, {}, NOW, listed=True)
    # team-b's older workload takes 8 of its 16 first, its newer one comes after the job: 8 left to borrow.
    assert result[("ml", "mine")] == {
        "position": 1,
        "expectedStartTime": stamp(0),
        "basis": "GPUs free now, 0 jobs ahead (and 1 in cohort research), ClusterQueue team-a's quota of 8 GPUs, "
        "borrowing without limit from cohort research: team-b lends 16",
    }
    # team-b's newer one waits for team-a's job to end, the GPUs the job borrows being taken.
    assert result[("ml", "b-later")]["basis"] == (
        "unknown: the GPUs it waits for are held without an ETA by ml/a (8 GPUs)"
    )
    known = {("ml", "a"): Known("job-a", at(20))}
    assert estimates(views, cluster_queue_of, quotas, known, NOW, listed=True)[("ml", "b-later")] == {
        "position": 2,
        "expectedStartTime": stamp(20),
        "basis": "1 running job's ETA, 1 job ahead (and 1 in cohort research), ClusterQueue team-b's quota of 16 GPUs, "
        "borrowing without limit from cohort research: team-a lends 8",
    }
    # Without every ClusterQueue listed, the cohort's lenders and borrowers are not known.
    unlisted = estimates(views, cluster_queue_of, quotas, {}, NOW, listed=False)
    assert unlisted[("ml", "mine")] == {
        "position": 1,
        "basis": "unknown: the ClusterQueues of cohort research cannot be listed",
    }


def test_workload_gpus_count_every_pod_of_every_set() -> None:
    assert workload("a", 8)["gpus"] == 8

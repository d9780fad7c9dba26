"""Reading TokenReview answers and matching pods to jobs (pure, no cluster)."""

from __future__ import annotations

import pytest

from rocmtrain.api.contract import JOB_NAME_LABEL, PROGRESS_AUDIENCE, RAY_CLUSTER_LABEL
from rocmtrain.progress.auth import (
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    Identity,
    TtlCache,
    identity_from_review,
    pod_belongs_to_job,
)
from rocmtrain.progress.errors import Forbidden, Unauthenticated

BOUND = {
    "authenticated": True,
    "audiences": [PROGRESS_AUDIENCE],
    "user": {
        "username": "system:serviceaccount:team-a:ray-head",
        "extra": {POD_NAME_EXTRA: ["job1-abcde-head-x1y2z"], POD_UID_EXTRA: ["0f1e"]},
    },
}


def test_bound_service_account_token_names_its_pod():
    assert identity_from_review(BOUND, PROGRESS_AUDIENCE) == Identity(
        "team-a", "ray-head", "job1-abcde-head-x1y2z", "0f1e"
    )


@pytest.mark.parametrize(
    "status",
    [
        {},
        {**BOUND, "authenticated": False},
        {**BOUND, "audiences": ["https://kubernetes.default.svc.cluster.local"]},
        {**BOUND, "audiences": None},
    ],
)
def test_rejected_or_other_audience_is_unauthenticated(status: dict):
    with pytest.raises(Unauthenticated):
        identity_from_review(status, PROGRESS_AUDIENCE)


@pytest.mark.parametrize(
    "user",
    [
        {"username": "alice", "extra": BOUND["user"]["extra"]},
        {"username": "system:serviceaccount:team-a", "extra": BOUND["user"]["extra"]},
        {"username": "system:serviceaccount:team-a:ray-head"},
        {"username": "system:serviceaccount:team-a:ray-head", "extra": {POD_NAME_EXTRA: ["p"]}},
        {
            "username": "system:serviceaccount:team-a:ray-head",
            "extra": {POD_NAME_EXTRA: ["p", "q"], POD_UID_EXTRA: ["u"]},
        },
    ],
    ids=["user", "malformed-sa", "unbound", "no-uid", "two-pods"],
)
def test_tokens_not_bound_to_exactly_one_pod_are_forbidden(user: dict):
    with pytest.raises(Forbidden):
        identity_from_review({**BOUND, "user": user}, PROGRESS_AUDIENCE)


@pytest.mark.parametrize(
    ("labels", "cluster", "allowed"),
    [
        ({RAY_CLUSTER_LABEL: "job1-abcde", JOB_NAME_LABEL: "job1"}, "job1-abcde", True),
        ({RAY_CLUSTER_LABEL: "job1-abcde"}, "job1-abcde", True),
        ({RAY_CLUSTER_LABEL: "job2-fghij", JOB_NAME_LABEL: "job2"}, "job1-abcde", False),
        ({RAY_CLUSTER_LABEL: "job1-abcde", JOB_NAME_LABEL: "job2"}, "job1-abcde", False),
        ({JOB_NAME_LABEL: "job1"}, "job1-abcde", False),
        ({JOB_NAME_LABEL: "job1"}, None, True),
        ({RAY_CLUSTER_LABEL: "job1-abcde"}, None, False),
        ({}, None, False),
    ],
)
def test_pod_belongs_to_job(labels: dict, cluster: str | None, allowed: bool):
    assert pod_belongs_to_job(labels, "job1", cluster) is allowed


def test_ttl_cache_expires_and_stays_bounded():
    now = [0.0]
    cache: TtlCache[str, int] = TtlCache(ttl=10, size=2, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None, "least recently used goes first"
    assert cache.get("a") == 1
    now[0] = 10.0
    assert cache.get("a") is None and cache.get("c") is None

"""A flood of reports with junk tokens costs only its TokenReview budget, and never holds up reconciles or status.

Real parts: kube-apiserver, etcd, the controller-manager; the operator as its own process with its
progress endpoint on, talking to the API server through the fault proxy (`faults.proxy`), which counts
the TokenReviews the API server gets and can hang them; a flood client process (`faults.flood`) posting
four kinds of junk from 16 loopback addresses. Faked: KubeRay's status writes.

What it shows, by counts and order (the clock's share, the latency during a flood against before and
after, is `bench/flood_bench.py`'s, since a busy machine moves it as much as the code does):

1. While every TokenReview hangs, the review budget's slots are full and forgeries are refused as
   `429 busy` before any review, both before jobs are created and after they are Running: their
   reconciles (RayJob, `Pending`) and status (`Running`) went through meanwhile.
2. With the API server answering again, a forgery sent again is refused from the cache.
3. Each kind of junk is refused by the check meant for it, and the operator's counts of the path each
   token took (`rocmtrain_progress_tokens_unreviewed_total{why}`, `..._token_reviews_total`) agree with
   the answers the flood got and the TokenReviews the API server got, within the budget.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
from operator_testkit import OPERATOR_NAMESPACE, Api, job_manifest, wait_until

import flood_bench
from faults.flood import SOURCES, Answers, flooding, sent
from faults.operator_process import OperatorProcess
from faults.proxy import Fault, FaultProxy
from rocmtrain.api.contract import progress_path
from rocmtrain.progress.auth import REFUSED_TTL_SECONDS, REVIEW_BURST, REVIEW_RATE_PER_SECOND, REVIEWS_AT_ONCE
from rocmtrain_testworld.kubecluster import KubeCluster, free_port

pytestmark = pytest.mark.cluster

JOBS = 20
FLOOD_REQUESTS = 2500  # at least; the flood goes on until the jobs are Running and the cache has answered
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
# What each kind of junk may be answered, by the check that refuses it (`faults.flood` counts "error" apart).
SOURCE_LIMIT = "429 source rate limited"
ANSWERS = {
    "none": {"401 bearer token required", SOURCE_LIMIT},
    "junk": {"401 not a service-account token", SOURCE_LIMIT},
    "forged": {"401 token not accepted", SOURCE_LIMIT, "429 busy", "503"},
    "replayed": {"401 token not accepted", SOURCE_LIMIT, "429 busy", "503"},
}
FORGERIES = ("forged", "replayed")


def _count(answers: Answers, kinds: tuple[str, ...], *wanted: str) -> int:
    """Answers of `kinds` that are one of `wanted` (a bare status stands for any reason)."""
    return sum(
        n
        for kind in kinds
        for answer, n in answers.get(kind, {}).items()
        if answer in wanted or answer.split()[0] in wanted
    )


def test_an_invalid_token_flood_leaves_reconciles_and_status_alone(
    kube: KubeCluster, api: Api, operator_kubeconfig: Path, tmp_path: Path
):
    if kube.external:
        pytest.skip("the proxy needs the local control plane's CA key")
    flooded, jobs_ns = kube.new_namespace("flooded"), kube.new_namespace("beside")
    proxy = FaultProxy(kube, tmp_path)
    hang = True
    proxy.fault = lambda method, path: Fault.hang() if hang and method == "POST" and TOKEN_REVIEWS in path else None
    port = free_port()
    operator = OperatorProcess(
        proxy.kubeconfig(operator_kubeconfig, tmp_path / "kubeconfig"),
        tmp_path,
        [flooded, jobs_ns],
        env={
            "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
            "ROCMTRAIN_PROGRESS_PORT": str(port),
            "ROCMTRAIN_PROGRESS_ADVERTISE_HOST": "localhost",
            "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": str(port),
            "ROCMTRAIN_METRICS_SECURE": "false",  # the test reads the operator's counts over plain HTTP on loopback
        },
    )

    def paths() -> dict[str, float]:
        """The operator's count of the path each token took."""
        unreviewed = {
            why: operator.metric("rocmtrain_progress_tokens_unreviewed_total", why=why)
            for why in ("cache", "shape", "budget")
        }
        return {**unreviewed, "review": operator.metric("rocmtrain_progress_token_reviews_total")}

    names = [f"job-{i:02d}" for i in range(JOBS)]
    try:
        operator.start()
        started = time.monotonic()
        with flooding(
            f"https://127.0.0.1:{port}{progress_path(flooded, 'job-00')}", tmp_path / "flood.json"
        ) as answers:
            # 1. Every TokenReview hangs: the budget's slots fill, and forgeries are refused without a review.
            wait_until(lambda: paths()["budget"] > 0, timeout=60, interval=0.2, what="forgeries refused as busy")
            wait_until(
                lambda: len(proxy.requests("POST", TOKEN_REVIEWS)) >= REVIEWS_AT_ONCE,
                timeout=10,
                what="every slot held",
            )
            saturated = paths()
            for name in names:
                kube.create(job_manifest(name, jobs_ns))
            wait_until(
                lambda: all(
                    (api.status(jobs_ns, n).get("rayJobName") and api.phase(jobs_ns, n) == "Pending") for n in names
                ),
                timeout=60,
                interval=0.2,
                what="every job reconciled while the reviews hang",
            )
            for name in names:
                api.fake_kuberay(jobs_ns, name, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
            wait_until(
                lambda: all(api.phase(jobs_ns, n) == "Running" for n in names),
                timeout=60,
                interval=0.2,
                what="every job's status while the reviews hang",
            )
            done = paths()
            wait_until(lambda: paths()["budget"] > done["budget"], timeout=30, interval=0.2, what="still busy")
            assert not [s for s in proxy.requests("POST", TOKEN_REVIEWS) if s.outcome != "hang"], "no review answered"
            # 2. The API server answers again: a refused forgery, sent again, is refused from the cache.
            hang = False
            wait_until(
                lambda: paths()["cache"] > 0 and sent(answers()) >= FLOOD_REQUESTS,
                timeout=120,
                interval=0.2,
                what=f"{FLOOD_REQUESTS} flood requests, and one refused from the cache",
            )
        seconds = time.monotonic() - started
        final, counts = paths(), answers()
        reviewed_by_server = len(proxy.requests("POST", TOKEN_REVIEWS))
    finally:
        operator.stop()
        proxy.stop()
    print("\nflood:", json.dumps({"answers": counts, "paths": final, "saturated": saturated, "seconds": seconds}))
    # 3. Each kind refused by its own check; nothing without a valid token gets further.
    for kind, allowed in ANSWERS.items():
        seen = set(counts[kind]) - {"error"}
        assert all(a in allowed or a.split()[0] in allowed for a in seen), f"{kind}: {seen - allowed}"
    assert sent(counts) >= FLOOD_REQUESTS and done["budget"] > saturated["budget"] > 0
    # Every token took one path, as the operator counts them, the flood's answers show them, and the API server
    # saw them (a request the flood gave up on, "error", may have been counted by the operator or not).
    slack = _count(counts, tuple(ANSWERS), "error")
    reviewed_or_cached = _count(counts, FORGERIES, "401 token not accepted", "503")
    checks = {
        "shape": (final["shape"], _count(counts, ("junk",), "401 not a service-account token")),
        "budget": (final["budget"], _count(counts, FORGERIES, "429 busy")),
        "review and cache": (final["review"] + final["cache"], reviewed_or_cached),
        "reviews the API server got": (final["review"], reviewed_by_server),
    }
    for what, (operator_count, seen) in checks.items():
        assert seen <= operator_count <= seen + slack, f"{what}: the operator counted {operator_count}, {seen} seen"
    assert final["review"] <= REVIEW_BURST + REVIEW_RATE_PER_SECOND * seconds, "TokenReviews stay within their budget"
    # A replayed forgery is reviewed once while its refusal is cached; the rest are refused from the cache.
    reviews_per_replay = math.ceil(seconds / REFUSED_TTL_SECONDS)
    assert _count(counts, ("replayed",), "401 token not accepted") <= final["cache"] + SOURCES * reviews_per_replay


def test_the_flood_bench_runs_in_its_smoke_mode(kube: KubeCluster, tmp_path: Path):
    """`bench/flood_bench.py --smoke`: two jobs a span, a short flood; the figures, never a target (the clock's)."""
    figures = asyncio.run(flood_bench.flood_bench(kube, flood_bench.SMOKE, tmp_path))
    spans = [figures[span] for span in ("before", "during", "after")]
    assert all(set(span) == set(figures["ratio"]) and min(span.values()) > 0 for span in spans)
    assert sent(figures["flood"]["answers"]) >= flood_bench.SMOKE.requests
    assert isinstance(figures["within_target"], bool)

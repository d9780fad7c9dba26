"""The operator's memory with 200 of the largest jobs a tenant can make, half of them refused.

Real parts: kube-apiserver, etcd, the controller-manager; the operator as its own process (its RSS read
from /proc). Faked: nothing; there is no KubeRay controller, so the accepted jobs stay Pending with their
RayJob. The jobs, made at once, 8 requests in flight:
- 100 accepted, the largest the operator runs (96 KiB as their driver reads them);
- 50 refused for their size, every env entry at the CRD's bounds (about 270 KB; the largest the API
  server stores, 1.5 MB, takes it seconds a write: `large_jobs.stored_body`, for the bench);
- 50 refused for a variable the operator reserves, as large as the accepted ones.
The operator has seen them all when its job index (the `rocmtrain_jobs` gauge) counts 100 Pending and
100 Failed. Its RSS, high-water included, is then under `MEMORY_BOUND_MIB`: docs/operations/install.md#memory.
What the job index keeps of each job is tested pure (tests/unit/test_status_objects.py).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from operator_testkit import wait_until

from faults.operator_process import OperatorProcess
from rocmtrain_testworld.kubecluster import KubeCluster
from rocmtrain_testworld.large_jobs import invalid_body, largest_body, oversized_body

pytestmark = pytest.mark.cluster

ACCEPTED, OVERSIZED, INVALID = 100, 50, 50
JOBS_PATH = "/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs"
# The documented bound (docs/operations/install.md#memory): 130 MiB at rest and 0.6 MiB a job.
MEMORY_BOUND_MIB = 130 + 0.6 * (ACCEPTED + OVERSIZED + INVALID)


def test_two_hundred_largest_jobs_half_refused_stay_within_the_memory_bound(
    kube: KubeCluster, operator_kubeconfig: Path, tmp_path: Path
):
    ns = kube.new_namespace("memory")
    bodies = (
        [largest_body(f"ok-{i:03d}", ns) for i in range(ACCEPTED)]
        + [oversized_body(f"big-{i:03d}", ns) for i in range(OVERSIZED)]
        + [invalid_body(f"bad-{i:03d}", ns) for i in range(INVALID)]
    )
    operator = OperatorProcess(operator_kubeconfig, tmp_path, [ns])
    operator.start()
    try:
        idle = operator.rss_mib()
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda body: kube.request("POST", JOBS_PATH.format(ns=ns), body=body), bodies))
        created = time.monotonic() - started

        def seen() -> bool:
            return (
                operator.metric("rocmtrain_jobs", phase="Pending") == ACCEPTED
                and operator.metric("rocmtrain_jobs", phase="Failed") == OVERSIZED + INVALID
            )

        wait_until(seen, timeout=300, what="the operator's index to count every job's status", interval=0.5)
        seen_after = time.monotonic() - started
        rss = operator.rss_mib()
        print(
            f"\noperator RSS {idle:.1f} MiB idle, {rss:.1f} MiB with {len(bodies)} jobs "
            f"({(rss - idle) / len(bodies) * 1024:.0f} KiB a job); created in {created:.1f} s, seen {seen_after:.1f} s"
        )
        assert rss < MEMORY_BOUND_MIB
        annotations = kube.request("GET", JOBS_PATH.format(ns=ns) + "/big-000")["metadata"].get("annotations") or {}
        assert not [key for key in annotations if key.startswith("kopf.")]  # kopf keeps no copy of a job in it
    finally:
        operator.stop()

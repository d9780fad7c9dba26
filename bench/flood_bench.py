"""The operator's reconciles and status under a flood of junk tokens, timed: before, during and after it.

On a real control plane, the operator as its own process with its progress endpoint on, and the flood
test's client (`tests/operator/faults/flood.py`: about 150 requests a second of no token, junk, and
forged tokens new and replayed, from 16 loopback addresses) posting to that endpoint. In three
namespaces of their own, before the flood, during it and after it:

- reconcile: N jobs (default 50) created at once, until each has its RayJob and a status;
- status: a RayJob status write (as KubeRay writes it) until the job shows it, one at a time, two
  changes for each of the first S jobs (default 20).

"Without the flood" is the worse of before and after, so that a change in the machine's other load is
not blamed on the flood. Target: during the flood, each figure within 2x of that. The mechanism (the
review budget, the cache, reconciles going on while reviews hang) is `tests/operator/faults/test_flood.py`'s;
this is the clock's share, which a busy machine moves as much as the code does.

There is no KubeRay controller there: RayJob status is written by this script.

    python bench/flood_bench.py                       # starts a local control plane
    python bench/flood_bench.py --kubeconfig PATH     # or uses an existing cluster
    python bench/flood_bench.py --smoke               # two jobs and a short flood: that it runs (a test runs it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from operator_bench import latency, operator_process, percentile, throughput
from rocmtrain.api.contract import progress_path
from rocmtrain.kube.client import Kube
from rocmtrain_testworld.kubecluster import KubeCluster, free_port, running_cluster

# The flood client is the flood test's own (tests/operator/faults/flood.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "operator"))
from faults.flood import flooding, sent

TARGET_RATIO = 2.0


@dataclass(frozen=True)
class Plan:
    """How much to measure: `jobs` reconciled at once, the first `samples` of them through two status changes,
    and at least `requests` flood requests."""

    jobs: int
    samples: int
    requests: int


FULL = Plan(jobs=50, samples=20, requests=2500)
SMOKE = Plan(jobs=2, samples=1, requests=100)


async def measure(kube: Kube, namespace: str, plan: Plan) -> dict[str, float]:
    """Reconcile seconds for `plan.jobs` jobs at once, and the status latency p50 and p95 of the first samples."""
    reconcile = await throughput(kube, namespace, plan.jobs)
    status = await latency(kube, namespace, [f"job-{i:04d}" for i in range(plan.samples)])
    return {
        "reconcile_seconds": round(reconcile["seconds"], 3),
        "status_p50_seconds": round(statistics.median(status), 3),
        "status_p95_seconds": round(percentile(status, 95), 3),
    }


async def flood_bench(cluster: KubeCluster, plan: Plan, folder: Path) -> dict[str, Any]:
    """Measure before, during and after the flood; the figures, the ratios and the flood's answers."""
    operator_ns = cluster.new_namespace("flood-operator")
    spans = {span: cluster.new_namespace(f"flood-{span}") for span in ("before", "during", "after")}
    port = free_port()
    settings = {
        "ROCMTRAIN_NAMESPACES": ",".join(spans.values()),
        "ROCMTRAIN_OPERATOR_NAMESPACE": operator_ns,
        "ROCMTRAIN_PROGRESS_PORT": str(port),
        "ROCMTRAIN_PROGRESS_ADVERTISE_HOST": "localhost",
        "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": str(port),
        "ROCMTRAIN_METRICS_SECURE": "false",
    }
    url = f"https://127.0.0.1:{port}{progress_path(spans['during'], 'job-0000')}"
    kube = await Kube.connect(kubeconfig=str(cluster.kubeconfig))
    figures: dict[str, Any] = {"plan": asdict(plan)}
    try:
        with operator_process(cluster.kubeconfig, folder / "operator.log", settings):
            figures["before"] = await measure(kube, spans["before"], plan)
            with flooding(url, folder / "flood.json") as answers:
                started = time.monotonic()
                while sent(answers()) < min(200, plan.requests):  # under way
                    await asyncio.sleep(0.1)
                figures["during"] = await measure(kube, spans["during"], plan)
                while sent(answers()) < plan.requests:
                    await asyncio.sleep(0.1)
            figures["flood"] = {"seconds": round(time.monotonic() - started, 1), "answers": answers()}
            figures["after"] = await measure(kube, spans["after"], plan)
    finally:
        await kube.close()
    without = {figure: max(figures["before"][figure], figures["after"][figure]) for figure in figures["before"]}
    figures["ratio"] = {figure: round(value / without[figure], 2) for figure, value in figures["during"].items()}
    figures["within_target"] = all(ratio <= TARGET_RATIO for ratio in figures["ratio"].values())
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=FULL.jobs, help="jobs created at once, each span")
    parser.add_argument("--samples", type=int, default=FULL.samples, help="jobs driven through two status changes")
    parser.add_argument("--requests", type=int, default=FULL.requests, help="flood requests, at least")
    parser.add_argument("--smoke", action="store_true", help="two jobs, a short flood: that the bench runs")
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (else a local control plane starts)")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    plan = SMOKE if args.smoke else Plan(args.jobs, args.samples, args.requests)
    if not 1 <= plan.samples <= plan.jobs:
        parser.error("need 1 <= --samples <= --jobs")
    if args.kubeconfig:
        os.environ["ROCMTRAIN_TEST_KUBECONFIG"] = str(args.kubeconfig)
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / "rocmtrain-flood-bench"  # noqa: S108
    folder.mkdir(exist_ok=True)
    with running_cluster() as cluster:
        figures = asyncio.run(flood_bench(cluster, plan, folder))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the cluster path costs: the same job, applied to the local world vs `rocmtrain run`.

Side by side, alternating, on the same data: the wall time from `create` of the
RocmTrainingJob to its status `Succeeded` on the world (real KubeRay starting a
real Ray cluster of a head and two workers as processes of the TEST-ONLY process
runtime, the submitter Job, the driver, the progress push, KubeRay noticing the
end), against `rocmtrain run job.yaml` of the very same job document (an
embedded Ray on this machine, from the command's start to its exit). The world
and the operator are up before the clock starts (`make cluster-up` state).

Jobs: the e2e tests' job (2 CPU workers, 64 reviews, 1 epoch) and the quick
start (examples/quickstart.yaml: 2,000 reviews), whose training outweighs the
start-up. Needs root (network namespaces).

    python bench/cluster_path.py [--repeat 2] [--out runs/bench-cluster-path.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rocmtrain_testworld import demo, rocmtrain_operator, world
from rocmtrain_testworld.jobs import Watch, claim, copy_data, cpu_job
from rocmtrain_testworld.paths import VOLUMES_DIR
from rocmtrain_testworld.world import Scope, World


def run_local(job: dict[str, Any], folder: Path) -> float:
    """`rocmtrain run` of ``job`` (written to ``folder``): seconds from start to exit."""
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    began = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "rocmtrain"), "run", str(path)], check=True, capture_output=True)
    return time.monotonic() - began


def run_cluster(w: World, make: Callable[[str, Path], dict[str, Any]], folder: Path) -> dict[str, float]:
    """Apply the job made by ``make`` in a new served namespace; seconds to Running and to Succeeded."""
    scope = Scope(w)
    try:
        ns = scope.namespace("bench", processes=True)
        job = make(ns, folder)
        claim(scope, ns, folder)
        watch = Watch(w.cluster, ns, job["metadata"]["name"])
        began = time.monotonic()
        w.cluster.create(job)
        final = watch.until(lambda s: s.get("phase") in ("Succeeded", "Failed"), "the job to end", timeout=3600)
        seconds = time.monotonic() - began
        if final["phase"] != "Succeeded":
            raise RuntimeError(f"{ns}: {final}")
        running = next(t for t, phase in watch.timeline if phase == "Running")
        return {"succeeded_s": seconds, "running_s": running}
    finally:
        scope.close(timeout=300)


def e2e_job(ns: str, folder: Path) -> dict[str, Any]:
    return cpu_job("minilm", ns, copy_data(folder))


def quickstart_job(ns: str, folder: Path) -> dict[str, Any]:
    return demo.cluster_job(copy_data(folder), ns, "storage")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    VOLUMES_DIR.mkdir(parents=True, exist_ok=True)
    w = world.start()
    try:
        rocmtrain_operator.start(w)
        for label, make in (("e2e job (64 reviews)", e2e_job), ("quick start (2,000 reviews)", quickstart_job)):
            local, cluster = [], []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(prefix="bench-", dir=VOLUMES_DIR) as tmp:
                    job = make("bench", Path(tmp) / "volume")  # the same document, run here
                    local.append(run_local(job, Path(tmp)))
                with tempfile.TemporaryDirectory(prefix="bench-", dir=VOLUMES_DIR) as tmp:
                    cluster.append(run_cluster(w, make, Path(tmp) / "volume"))
                print(f"{label}: local {local[-1]:.1f}s, cluster {cluster[-1]}", flush=True)
            results[label] = {
                "rocmtrain_run_s": local,
                "apply_to_succeeded_s": [c["succeeded_s"] for c in cluster],
                "apply_to_running_s": [c["running_s"] for c in cluster],
                "ratio_median": statistics.median(c["succeeded_s"] for c in cluster) / statistics.median(local),
            }
    finally:
        w.stop()
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

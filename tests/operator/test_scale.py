"""`rocmtrain scale --cluster`: the sizes become RocmTrainingJobs, one after the other, and their final
status.metrics become the report. The operator runs for real; KubeRay and the training driver are faked
(the test writes the RayJob status as KubeRay does and the final metrics as the progress endpoint does).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml
from operator_testkit import JOBS, Api, job_manifest, wait_until

from rocmtrain_testworld.kubecluster import KubeCluster
from rocmtrain_train.cli import scale_study as scale

pytestmark = pytest.mark.cluster

# What each size "measures": train seconds, eval seconds, samples/s, accuracy.
MEASURED = {1: (60.0, 4.0, 32.0, 0.90), 2: (32.0, 2.5, 60.0, 0.91)}


def play_kuberay_and_driver(kube: KubeCluster, api: Api, ns: str, name: str, workers: int) -> None:
    wait_until(lambda: api.rayjob(ns, name), timeout=30, what=f"RayJob {name}")
    api.fake_kuberay(ns, name, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    wait_until(lambda: api.phase(ns, name) == "Running", what=f"{name} Running")
    train, evaluation, throughput, accuracy = MEASURED[workers]
    metrics = {
        "trainSeconds": train,
        "evalSeconds": evaluation,
        "samplesPerSecond": throughput,
        "evalAccuracy": accuracy,
    }
    kube.request(
        "PATCH",
        JOBS.format(ns=ns) + f"/{name}/status",
        body={"status": {"metrics": metrics}},
        content_type="application/merge-patch+json",
    )
    api.fake_kuberay(ns, name, {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "succeeded": 1})


def test_scale_on_the_cluster_runs_each_size_as_a_job(
    kube: KubeCluster,
    api: Api,
    ns: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.setattr(scale, "POLL_SECONDS", 0.2)
    manifest = job_manifest("bert", ns)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    argv = [str(tmp_path / "job.yaml"), "--workers", "2,1", "--cluster", "-n", ns]
    argv += ["--kubeconfig", str(kube.kubeconfig), "--out", str(tmp_path / "report")]
    result: dict[str, int] = {}
    runner = threading.Thread(target=lambda: result.update(code=scale.main(argv)))
    runner.start()
    try:
        play_kuberay_and_driver(kube, api, ns, "bert-w1", 1)
        assert api.job(ns, "bert-w2") is None  # one size at a time
        play_kuberay_and_driver(kube, api, ns, "bert-w2", 2)
    finally:
        runner.join(timeout=60)
    assert result == {"code": 0}
    for name, workers in (("bert-w1", 1), ("bert-w2", 2)):
        spec = api.job(ns, name)["spec"]
        assert spec["resources"]["workers"] == workers and spec["checkpoint"]["resume"] == "never"
    report = json.loads((tmp_path / "report" / "scaling.json").read_text())
    assert [(r["workers"], r["train_seconds"], r["eval_accuracy"]) for r in report] == [
        (1, 60.0, 0.90),
        (2, 32.0, 0.91),
    ]
    assert report[1]["speedup"] == pytest.approx(60 / 32)
    out = capsys.readouterr().out
    assert f"bert, on the cluster (namespace {ns})" in out and "| 2 | 32.0 | 2.5 | 60.0 | 1.88x | 94% | 0.910 |" in out
    assert (tmp_path / "report" / "scaling.png").is_file()

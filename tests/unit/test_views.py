"""The views of `rocmtrain pool`, `status` and `plot` from plain objects (pure; the cluster tests read real ones)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from rocmtrain.api.models import HISTORY_LENGTH
from rocmtrain.views.curves import from_history, from_reports
from rocmtrain.views.job import duration, job_text, progress_bar
from rocmtrain.views.pool import pod_gpus, pool_text, pool_view
from rocmtrain.views.table import table

NOW = dt.datetime(2026, 1, 2, 12, 0, 0, tzinfo=dt.UTC)
MI300X = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}


def node(name: str, gpus: int, labels: dict[str, str], *, ready: bool = True, cordoned: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "allocatable": {"amd.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name: str, node_name: str | None, gpus: int, *, job: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": {"rocmtrain.dev/job-name": job} if job else {}},
        "spec": {
            **({"nodeName": node_name} if node_name else {}),
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": str(gpus)}}}],
            **extra,
        },
        "status": {"phase": "Running"},
    }


def test_a_pods_request_is_the_schedulers():
    init = [{"name": "i", "resources": {"requests": {"amd.com/gpu": "4"}}}]
    assert pod_gpus(pod("p", "n", 2)) == 2
    assert pod_gpus(pod("p", "n", 2, initContainers=init)) == 4  # the largest init container wins
    assert pod_gpus({"spec": {"containers": [{"name": "c"}]}}) == 0


def test_free_gpus_leave_out_unavailable_nodes_and_ended_pods():
    nodes = [
        node("a", 8, MI300X),
        node("b", 8, MI300X, cordoned=True),
        node("c", 8, MI300X, ready=False),
        node("cpu", 0, {}),
        node("bare", 2, {}),
    ]
    done = pod("done", "a", 8, job="old")
    done["status"]["phase"] = "Succeeded"
    pods = [pod("w-0", "a", 4, job="bert"), pod("w-1", "b", 4, job="bert"), done, pod("nb", "bare", 1)]
    jobs = [{"metadata": {"namespace": "ml", "name": "bert"}, "status": {"phase": "Running"}}]
    view = pool_view(nodes, pods, jobs)
    (bare, mi300x) = view.models
    assert (mi300x.nodes, mi300x.unavailable_nodes, mi300x.allocatable, mi300x.requested, mi300x.free) == (
        3,
        2,
        24,
        8,
        4,
    )
    assert [(h.name, h.gpus, h.phase) for h in mi300x.holders] == [("bert", 8, "Running")]
    assert bare.model == "(no product-name label)" and bare.holders[0].kind == "Pod"
    assert view.kueue is None and view.unbound == []
    text = pool_text(view)
    assert "3 (2 unavailable)" in text and "Kueue is not installed." in text


def test_partitions_count_as_devices_of_their_own_kind_in_either_naming():
    partitioned = {**MI300X, "amd.com/compute-memory-partition": "cpx_nps4"}
    mixed = node("mixed", 0, partitioned)
    mixed["status"]["allocatable"] = {"amd.com/cpx_nps4": "64"}
    nodes = [
        node("whole", 8, {**MI300X, "amd.com/compute-memory-partition": "spx_nps1"}),
        node("single", 64, partitioned),
        mixed,
    ]
    held = pod("w-0", "mixed", 0, job="bert")
    held["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/cpx_nps4": "2"}}
    jobs = [{"metadata": {"namespace": "ml", "name": "bert"}, "status": {"phase": "Running"}}]
    view = pool_view(nodes, [held, pod("w-1", "single", 1, job="bert")], jobs)
    rows = {m.model: (m.nodes, m.allocatable, m.requested, m.free) for m in view.models}
    assert rows == {
        "AMD_Instinct_MI300X_OAM": (1, 8, 0, 8),
        "AMD_Instinct_MI300X_OAM cpx_nps4": (2, 128, 3, 125),
    }
    assert pod_gpus(held) == 2


def test_table_aligns_and_marks_missing_values():
    assert table(["A", "LONGER"], [["x", None], ["yyyy", 3]]).splitlines() == [
        "A      LONGER",
        "x      -",
        "yyyy   3",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"), [(5, "5s"), (125, "2m05s"), (3 * 3600 + 65, "3h01m"), (2 * 86400 + 3600, "2d01h")]
)
def test_durations(seconds: float, text: str):
    assert duration(seconds) == text


def test_progress_bar():
    assert progress_bar(50.0, width=10) == "[#####-----]  50%"
    assert progress_bar(None, width=4) == "[    ]    -"
    assert progress_bar(140.0, width=4) == "[####] 140%"


def test_a_job_the_operator_has_not_seen_still_shows():
    job = {"metadata": {"namespace": "ml", "name": "new"}, "spec": {"resources": {"workers": 2, "gpusPerWorker": 8}}}
    text = job_text(job, [], [], {}, NOW)
    assert text.startswith("ml/new   not yet seen by the operator")
    assert "16 requested (2 workers x 8)" in text
    job["spec"]["resources"]["gpu"] = {"resourceName": "amd.com/cpx_nps4"}
    assert "16 requested (2 workers x 8 cpx_nps4 partitions)" in job_text(job, [], [], {}, NOW)


QUEUE = {"position": 2, "expectedStartTime": "2026-01-02T12:12:05Z", "basis": "1 running job's ETA, 1 job ahead"}
UNKNOWN = {"position": 1, "basis": "unknown: ClusterQueue team-a has no amd.com/gpu quota the operator can read"}


def queued_job(name: str, queue: dict[str, Any]) -> dict[str, Any]:
    status = {"phase": "Queued", "gpus": 8, "queue": queue}
    return {
        "metadata": {"namespace": "ml", "name": name},
        "spec": {"resources": {"gpusPerWorker": 8}},
        "status": status,
    }


def test_status_says_when_a_queued_job_is_expected_to_start():
    text = job_text(queued_job("next", QUEUE), [], [], {}, NOW)
    assert (
        "queue      position 2, expected to start in 12m05s (2026-01-02T12:12:05Z): 1 running job's ETA, 1 job ahead"
    ) in text.splitlines()
    unknown = job_text(queued_job("stuck", UNKNOWN), [], [], {}, NOW)
    assert f"queue      position 1: {UNKNOWN['basis']}" in unknown.splitlines()
    assert "queue " not in job_text(queued_job("admitted", {}), [], [], {}, NOW)


def test_status_says_which_network_rccl_chose_and_flags_sockets_where_rdma_was_asked_for():
    roce = {"transport": "IB", "devices": ["mlx5_0:1", "mlx5_1:1"], "link": "RoCE"}
    spec = {"resources": {"workers": 2, "network": {"rdmaResource": "rdma/roce"}}}
    running = {"metadata": {"namespace": "ml", "name": "big"}, "spec": spec, "status": {"phase": "Running"}}
    assert "network " not in job_text(running, [], [], {}, NOW)
    running["status"]["network"] = roce
    assert "network    IB over mlx5_0:1, mlx5_1:1 (RoCE)" in job_text(running, [], [], {}, NOW).splitlines()
    running["status"]["network"] = {"transport": "Socket", "devices": ["eth0"]}
    lines = job_text(running, [], [], {}, NOW).splitlines()
    assert "network    Socket over eth0: not RDMA, although the job requests rdma/roce" in lines
    spec["resources"]["workers"] = 1  # one pod: no network between pods to miss
    assert "network    Socket over eth0" in job_text(running, [], [], {}, NOW).splitlines()


def test_pool_lists_the_queued_jobs_soonest_first_the_unknown_last():
    jobs = [queued_job("stuck", UNKNOWN), queued_job("next", QUEUE), {"metadata": {"namespace": "ml", "name": "run"}}]
    view = pool_view([], [], jobs)
    assert [(q.name, q.position, q.expected_start) for q in view.queued] == [
        ("next", 2, "2026-01-02T12:12:05Z"),
        ("stuck", 1, None),
    ]
    lines = pool_text(view).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("NAMESPACE   QUEUED JOB"))
    assert lines[header + 1].split()[:5] == ["ml", "next", "8", "2", "2026-01-02T12:12:05Z"]
    assert lines[header + 2].split()[:5] == ["ml", "stuck", "8", "1", "-"]


def report(step: int, loss: float | None = None, **metrics: Any) -> str:
    body = {
        "progress": {"step": step, "totalSteps": 100},
        "metrics": {**({"trainLoss": loss} if loss else {}), **metrics},
    }
    return json.dumps(body)


def test_curves_from_a_local_run_log_are_the_operators_history_unbounded():
    lines = [report(s, 1.0 / (s + 1)) for s in range(0, 120)]
    lines.insert(60, report(59, 0.2, evalLoss=0.3, evalAccuracy=0.8))  # an evaluation at step 59
    lines.append(report(119, 0.01, evalLoss=0.1, evalAccuracy=0.95))
    lines.append("")
    curves = from_reports("local", lines)
    assert len(curves.train_loss) == 120 > HISTORY_LENGTH
    assert curves.eval_accuracy == [(59, 0.8), (119, 0.95)]
    assert curves.eval_loss == [(59, 0.3), (119, 0.1)]


def test_a_restart_from_a_checkpoint_drops_the_points_after_it():
    lines = [report(s, 1.0) for s in (10, 20, 30)] + [report(15, 0.5)]
    assert [s for s, _ in from_reports("r", lines).train_loss] == [10, 15]


def test_curves_from_status_history():
    curves = from_history("ml/bert", [{"step": 1, "trainLoss": 0.9}, {"step": 2, "evalAccuracy": 0.7}])
    assert curves.train_loss == [(1, 0.9)] and curves.eval_accuracy == [(2, 0.7)] and curves.eval_loss == []
    assert from_history("x", []).empty


def test_plot_of_local_runs_needs_no_cluster(tmp_path, capsys):
    from PIL import Image

    from rocmtrain.cli import cluster as cluster_cli

    for name, scale in (("run-a", 1.0), ("run-b", 0.5)):
        logs = tmp_path / "runs" / name / "logs"
        logs.mkdir(parents=True)
        lines = [report(s, scale / (s + 1)) for s in range(1, 20)] + [report(20, 0.05, evalAccuracy=0.9)]
        (logs / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    png = tmp_path / "curves.png"
    code = cluster_cli.plot(
        [str(tmp_path / "runs" / "run-a"), str(tmp_path / "runs" / "run-b" / "logs"), "-o", str(png)]
    )
    assert (code, capsys.readouterr().out) == (0, f"wrote {png}\n")
    with Image.open(png) as image:
        assert image.format == "PNG"

"""Ray Train's own reports (`ray.train.report`) into the job's status: the mapping of their metrics, when they are
not forwarded, and the `RAY_TRAIN_CALLBACKS` a job's code gets (rendered and for `rocmtrain run`).

Pure: the forwarder's work on Ray's controller runs in tests/commands/test_run_outside_scripts.py (Ray's linear
example).
"""

from __future__ import annotations

from typing import Any

import pytest

from rocmtrain.api.code import CodeRun, code_environment
from rocmtrain.api.contract import KUBEFLOW_URL_ENV, RAY_REPORT_FORWARDER, RAY_TRAIN_CALLBACKS_ENV
from rocmtrain.api.models import MAX_CUSTOM_METRICS, RocmTrainingJob
from rocmtrain.api.validate import validate_job
from rocmtrain.render import RenderOptions, render_rayjob
from rocmtrain_train.reporting import ray_report
from unit.samples import minimal_job

RUN = CodeRun(run_path="/runs/ml/job", gpus_per_worker=0, cpus_per_worker=2.0)


def code_job(env: list[dict[str, Any]] | None = None) -> RocmTrainingJob:
    manifest = minimal_job()
    del manifest["spec"]["model"], manifest["spec"]["data"]
    manifest["spec"]["code"] = {"command": ["python", "train.py"]}
    manifest["spec"]["env"] = env or []
    job, errors = validate_job(manifest)
    assert job is not None, errors
    return job


def test_the_loss_step_and_epoch_fill_their_fields_and_other_numbers_the_custom_ones() -> None:
    report = ray_report.forwarded({"loss": 0.25, "step": 7, "epoch": 1.5, "grad_norm": 3, "note": "text", "ok": True})
    assert report is not None and not report.final
    assert (report.metrics.train_loss, report.progress.step, report.progress.epoch) == (0.25, 7, 1.5)
    assert [(m.name, m.value) for m in report.metrics.custom or []] == [("grad_norm", 3.0)]
    assert ray_report.forwarded({"train_loss": 0.5}).metrics.train_loss == 0.5  # type: ignore[union-attr]


def test_what_cannot_be_reported_is_left_out_and_nothing_numeric_sends_nothing() -> None:
    many = {f"m{i}": float(i) for i in range(MAX_CUSTOM_METRICS + 5)}
    report = ray_report.forwarded({**many, "loss": 1.0, "bad name": 2.0, "nan": float("nan"), "step": 1.5})
    assert report is not None and report.metrics.train_loss == 1.0 and report.progress.step is None
    assert [m.name for m in report.metrics.custom or []] == [f"m{i}" for i in range(MAX_CUSTOM_METRICS)]
    assert ray_report.forwarded({"text": "a", "nested": {"loss": 1.0}}) is None


def test_a_process_that_reports_by_itself_is_not_forwarded_as_well(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ray_report._OWN, "sent", False)
    channel = {KUBEFLOW_URL_ENV: "http://127.0.0.1:1/trainerstatus"}
    assert not ray_report.reports_by_itself({"torch": object()}, channel)
    assert not ray_report.reports_by_itself({"transformers.trainer": object()}, {})
    assert ray_report.reports_by_itself({"transformers.trainer": object()}, channel), "its KubeflowCallback reports"
    off = channel | {ray_report.KUBEFLOW_OFF_ENV: "true"}
    assert not ray_report.reports_by_itself({"transformers.trainer": object()}, off), "its KubeflowCallback is off"
    ray_report.mark_own_report()
    assert ray_report.reports_by_itself({}, {}), "sdk.report marks it"


@pytest.mark.parametrize(
    ("spec_env", "inherited", "expected"),
    [
        (None, None, RAY_REPORT_FORWARDER),
        ([{"name": RAY_TRAIN_CALLBACKS_ENV, "value": "team.Cb"}], None, f"team.Cb,{RAY_REPORT_FORWARDER}"),
        (None, {RAY_TRAIN_CALLBACKS_ENV: "a.B, c.D"}, f"a.B,c.D,{RAY_REPORT_FORWARDER}"),
        ([{"name": RAY_TRAIN_CALLBACKS_ENV, "value": RAY_REPORT_FORWARDER}], None, RAY_REPORT_FORWARDER),
    ],
)
def test_the_code_gets_the_forwarder_after_the_callbacks_the_user_named(
    spec_env: list[dict[str, Any]] | None, inherited: dict[str, str] | None, expected: str
) -> None:
    assert code_environment(code_job(spec_env), RUN, inherited)[RAY_TRAIN_CALLBACKS_ENV] == expected


def test_the_rendered_head_and_workers_get_it_last_so_that_it_wins() -> None:
    job = code_job([{"name": RAY_TRAIN_CALLBACKS_ENV, "value": "team.Cb"}])
    cluster = render_rayjob(job, options=RenderOptions())["spec"]["rayClusterSpec"]
    for pod in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
        values = [
            v["value"] for v in pod["template"]["spec"]["containers"][0]["env"] if v["name"] == RAY_TRAIN_CALLBACKS_ENV
        ]
        assert values[-1] == f"team.Cb,{RAY_REPORT_FORWARDER}"

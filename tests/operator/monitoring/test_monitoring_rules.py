"""The alerts and the dashboard under manifests/monitoring/, checked with promtool (Prometheus's own parser).

promtool is built from the Prometheus Go module by rocmtrain_testworld/build.sh. That every
metric they name is in the operator's real /metrics output is checked against a running
operator in test_monitoring.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring.promql import (
    RULES,
    dashboard,
    dashboard_expressions,
    grafana_to_promql,
    metric_names,
    rule_expressions,
    rule_groups,
)
from rocmtrain.api.contract import JOB_NAME_LABEL
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.metrics.prometheus import JOB_LABEL
from rocmtrain.render import render_rayjob
from rocmtrain_testworld.gotools import go_tool
from unit.samples import full_job

HERE = Path(__file__).resolve().parent


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(go_tool("promtool")), *args], cwd=cwd, capture_output=True, text=True, check=False)


def write_rules(folder: Path, groups: list[dict]) -> Path:
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_the_rules_parse_and_lint_clean(tmp_path: Path):
    write_rules(tmp_path, rule_groups())
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_the_alerts_fire_as_their_unit_tests_say(tmp_path: Path):
    write_rules(tmp_path, rule_groups())
    shutil.copy(HERE / "rules_test.yaml", tmp_path / "rules_test.yaml")
    result = promtool("test", "rules", "rules_test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "rules_test.yaml").read_text()))
    assert tested == {name for name, _ in rule_expressions()}  # every alert has a unit test


def test_every_dashboard_query_parses(tmp_path: Path):
    """Each query, as Grafana sends it, becomes a recording rule: promtool parses every one in one run."""
    queries = list(dashboard_expressions())
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(expr)} for i, (_, expr) in enumerate(queries)]
    write_rules(tmp_path, [{"name": "dashboard", "rules": rules}])
    result = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_a_broken_query_is_caught(tmp_path: Path):
    write_rules(tmp_path, [{"name": "bad", "rules": [{"record": "bad:query", "expr": "sum by (le (rate(x[1m]))"}]}])
    assert promtool("check", "rules", "rules.yaml", cwd=tmp_path).returncode != 0


def test_the_dashboard_has_the_three_views_and_a_tidy_layout():
    board = dashboard()
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Fleet", "Training: $namespace / $job", "GPUs: $namespace / $job"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    cells = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
    assert all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} for p in panels)
    names = {name for _, expr in dashboard_expressions() for name in metric_names(expr)}
    for needed in ("rocmtrain_jobs", "rocmtrain_reconcile_errors_total", "rocmtrain_queue_wait_seconds_bucket"):
        assert needed in names  # the fleet: jobs by phase, reconcile errors and latency, queue wait
    for needed in ("rocmtrain_job_train_loss", "rocmtrain_job_eval_accuracy", "rocmtrain_job_eta_seconds"):
        assert needed in names  # training: loss, accuracy, throughput, ETA
    for needed in ("rocmtrain_job_gpus", "gpu_gfx_activity"):
        assert needed in names  # GPUs per job, from the operator and from AMD's exporter


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (phase) (rocmtrain_jobs{phase!="x"})', {"rocmtrain_jobs"}),
        ("histogram_quantile(0.9, sum by (le) (rate(a_bucket[$__rate_interval])))", {"a_bucket"}),
        ('time() - max(a and on (namespace, job_name) b{phase="Queued"} == 1) > 3600', {"a", "b"}),
        ('absent(up{job="x"} == 1)', {"up"}),
        ("a / ignoring(code) group_left(x) b offset 5m", {"a", "b"}),
    ],
)
def test_metric_names_are_read_from_expressions(expr: str, names: set[str]):
    assert metric_names(expr) == names


def test_the_rule_file_is_a_prometheus_rule():
    document = yaml.safe_load(RULES.read_text())
    assert document["apiVersion"] == "monitoring.coreos.com/v1" and document["kind"] == "PrometheusRule"


def test_amd_gpu_metrics_join_jobs_by_the_label_the_docs_configure():
    """The docs' ExtraPodLabels copies the pods' job label; the exporter lowercases its key to the metrics' label."""
    guide = (Path(__file__).resolve().parents[3] / "docs" / "guides" / "observing.md").read_text()
    (snippet,) = re.findall(r'\{ "GPUConfig": .*\}', guide)
    ((key, label),) = json.loads(snippet)["GPUConfig"]["ExtraPodLabels"].items()
    assert label == JOB_NAME_LABEL and key.lower() == JOB_LABEL
    job = RocmTrainingJob.model_validate(full_job())
    cluster = render_rayjob(job)["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    assert all(t["metadata"]["labels"][JOB_NAME_LABEL] == job.metadata.name for t in templates)
    gpu_queries = [expr for _, expr in dashboard_expressions() if metric_names(expr) & {"gpu_gfx_activity"}]
    assert gpu_queries and all(f"by (namespace, {JOB_LABEL})" in expr for expr in gpu_queries)

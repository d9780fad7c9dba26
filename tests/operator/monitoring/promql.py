"""The PromQL of manifests/monitoring/: every expression of the dashboard and the rules, and the metric names in one.

`metric_names` reads an expression with a small lexer: enough for these expressions,
whose syntax Prometheus's own parser checks separately (promtool, in test_monitoring_rules).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parents[3] / "manifests" / "monitoring"
DASHBOARD = MONITORING / "rocmtrain-dashboard.json"
RULES = MONITORING / "prometheusrule.yaml"
# Metrics the operator does not export: Prometheus's own, and the AMD device metrics exporter's
# (names from its metrics list, GPU_GFX_ACTIVITY and so on, lowercased as it exports them).
EXTERNAL_METRICS = frozenset({"up", "gpu_gfx_activity", "gpu_used_vram", "gpu_power_usage"})
# What Grafana puts in place of its variables before it sends a query.
GRAFANA_VALUES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$namespace": "ml-team",
    "$job": "bert",
    "${datasource}": "prometheus",
}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {*_LABEL_LISTS, "bool", "offset", "and", "or", "unless", "atan2", "inf", "nan"}
_TOKEN = re.compile(
    r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|`[^`]*`"  # strings
    r"|\{[^}]*\}|\[[^\]]*\]"  # label matchers, ranges
    r"|[A-Za-z_:][A-Za-z0-9_:]*"  # identifiers
    r"|[0-9.]+[a-zA-Z]*"  # numbers, durations
    r"|\S"
)


def grafana_to_promql(expr: str) -> str:
    """The query Grafana sends for `expr`: its variables replaced by sample values."""
    for variable, value in GRAFANA_VALUES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects."""
    tokens = _TOKEN.findall(expr)
    names = set()
    skip_list = False
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if skip_list:
            skip_list = token != ")"
            continue
        if token in _LABEL_LISTS and following == "(":
            skip_list = True
            continue
        called = following == "(" or following in ("by", "without")  # a function, or `sum by (...) (...)`
        if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", token) or token in _KEYWORDS or called:
            continue
        if i and tokens[i - 1] == "offset":
            continue
        names.add(token)
    return names


def rule_groups() -> list[dict[str, Any]]:
    """The PrometheusRule's groups: a Prometheus rule file's content."""
    return yaml.safe_load(RULES.read_text())["spec"]["groups"]


def rule_expressions() -> Iterator[tuple[str, str]]:
    """(alert name, expression) of every rule."""
    for group in rule_groups():
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _label_values_query(query: str) -> str | None:
    """The series selector inside Grafana's `label_values(selector, label)`."""
    found = re.fullmatch(r"label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)", query.strip())
    return found.group(1) if found else None


def dashboard_expressions() -> Iterator[tuple[str, str]]:
    """(where, expression) of every panel query and every query variable, as Grafana writes them."""
    board = dashboard()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            selector = _label_values_query(variable["query"]["query"])
            assert selector is not None, f"variable {variable['name']}: not label_values(selector, label)"
            yield f"variable {variable['name']}", selector

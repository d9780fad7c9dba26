"""Argo CD's health check and Flux's kstatus on job objects recorded from real operator runs (`recorded/`).

Recorded by test_gitops.py:
`ROCMTRAIN_RECORD_STATUSES=tests/operator/gitops/recorded pytest tests/operator/gitops/test_gitops.py`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gitops.health import ARGOCD_CM_PATCH, ARGOCD_KEY, CASES, HEALTH_LUA, RECORDED, argocd_health, kstatus


def recorded(case: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{case}.json").read_text())


def test_every_case_is_recorded():
    assert sorted(p.stem for p in RECORDED.glob("*.json")) == sorted(CASES)


def test_the_cases_reach_every_health_and_every_phase():
    assert {argo for argo, _ in CASES.values()} == {"Healthy", "Progressing", "Degraded", "Suspended"}
    phases = {recorded(case).get("status", {}).get("phase") for case in CASES}
    assert phases >= {"Pending", "Queued", "Initializing", "Running", "Succeeded", "Failed", "Suspended"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_argocd_health_of_a_recorded_job(case: str):
    health = argocd_health(recorded(case))
    assert health["status"] == CASES[case][0]
    assert health["message"]


def test_kstatus_of_every_recorded_job():
    cases = sorted(CASES)
    got = kstatus([recorded(case) for case in cases])
    assert {case: result["status"] for case, result in zip(cases, got, strict=True)} == {
        case: CASES[case][1] for case in cases
    }


def test_the_argocd_cm_patch_carries_health_lua_unchanged():
    patch = yaml.safe_load(ARGOCD_CM_PATCH.read_text())
    assert patch["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}
    assert patch["data"][ARGOCD_KEY] == HEALTH_LUA.read_text()


def test_health_lua_uses_only_what_argo_cd_offers():
    """Argo CD runs health scripts with Lua 5.1's base and string libraries; no os, io or require."""
    source = HEALTH_LUA.read_text()
    for forbidden in ("os.", "io.", "require", "load", "dofile"):
        assert forbidden not in source

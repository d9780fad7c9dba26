"""A job's `Phase` and the vocabularies beside it: each predicate of each phase, reading a phase as written,
and no phase spelled as a string outside the contract (read with `ast`, as `test_boundary` reads the
sources; nothing is imported to check); pure."""

from __future__ import annotations

import ast
import inspect
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.kuberay import JobDeploymentStatus
from rocmtrain.api.kubernetes import PodPhase
from rocmtrain.api.models import DeliveryState, Phase
from rocmtrain.api.models.status import NotificationState
from rocmtrain.status.phase import phase_of

P = Phase
PREDICATES = ("is_terminal", "is_ready", "holds_gpus", "is_waiting", "is_active")
# Each phase's predicates, in the order of PREDICATES.
TABLE = {
    P.PENDING:      (False, False, False, True,  True),
    P.QUEUED:       (False, False, False, True,  True),
    P.INITIALIZING: (False, False, True,  False, True),
    P.RUNNING:      (False, True,  True,  False, True),
    P.SUCCEEDED:    (True,  True,  False, False, False),
    P.FAILED:       (True,  False, False, False, False),
    P.SUSPENDED:    (False, True,  False, False, False),
}  # fmt: skip


def test_the_table_names_every_phase_as_the_crd_spells_it() -> None:
    assert list(TABLE) == list(Phase)
    assert [p.value for p in Phase] == [
        "Pending", "Queued", "Initializing", "Running", "Succeeded", "Failed", "Suspended"
    ]  # fmt: skip


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("predicate", PREDICATES)
def test_each_predicate_of_each_phase(phase: Phase, predicate: str) -> None:
    assert getattr(phase, predicate) is TABLE[phase][PREDICATES.index(predicate)]


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({"phase": "Running"}, Phase.RUNNING),
        ({"phase": "Suspended", "conditions": []}, Phase.SUSPENDED),
        ({}, None),  # not yet seen by the operator
        (None, None),
        ({"phase": None}, None),
        ({"phase": ""}, None),
        ({"phase": "Starting"}, None),  # not a phase of this operator
        ({"phase": "running"}, None),
    ],
)
def test_a_status_as_written_is_read_once_into_its_phase(status: dict[str, Any] | None, phase: Phase | None) -> None:
    assert phase_of(status) is phase


@pytest.mark.parametrize(("pod", "ended"), [(p, p in (PodPhase.SUCCEEDED, PodPhase.FAILED)) for p in PodPhase])
def test_a_pod_has_ended_once_it_succeeded_or_failed(pod: PodPhase, ended: bool) -> None:
    assert pod.has_ended is ended


def test_the_pod_phases_are_kubernetes_own() -> None:
    assert [p.value for p in PodPhase] == ["Pending", "Running", "Succeeded", "Failed", "Unknown"]


@pytest.mark.parametrize("state", list(DeliveryState))
def test_every_delivery_state_is_one_the_status_takes(state: DeliveryState) -> None:
    entry = {"target": "default", "event": "Running", "reason": "Running", "deliveryId": "a" * 32, "time": "t"}
    assert NotificationState.model_validate({**entry, "state": state}).dump()["state"] == state.value
    with pytest.raises(ValidationError):
        NotificationState.model_validate({**entry, "state": state.value.lower()})


# ---- no phase spelled as a string --------------------------------------------------------------

SOURCE = Path(__file__).resolve().parents[2] / "operator" / "rocmtrain"
# The contract: `Phase` itself, and the notification events named after phases (`NotifyEvent`).
CONTRACT = SOURCE / "api" / "models"
# Other vocabularies that share words with `Phase`: only their members' own definitions may spell them.
OTHER_VOCABULARIES: dict[type[StrEnum], str] = {
    ConditionType: "condition types: Succeeded and Failed are conditions too (kstatus and kubectl wait read them)",
    Reason: "reasons of conditions and events: a Ready reason names the state it tells (Running, Suspended, ...)",
    JobDeploymentStatus: "KubeRay's words for a RayJob's deployment (Initializing, Running, Failed, Suspended)",
    PodPhase: "Kubernetes' words for a Pod's phase (Pending, Running, Succeeded, Failed)",
    DeliveryState: "a notice's delivery state (Pending, Failed)",
}
PHASE_WORDS = frozenset(p.value for p in Phase)


def _member_definitions(tree: ast.Module, path: Path) -> set[int]:
    """The ids of the string constants that define members of an `OTHER_VOCABULARIES` enum in `path`."""
    classes = {kind.__name__ for kind in OTHER_VOCABULARIES if Path(inspect.getfile(kind)) == path}
    return {
        id(statement.value)
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name in classes
        for statement in node.body
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
    }


def phase_literals(root: Path = SOURCE) -> list[str]:
    """`path:line: 'word'` for each string constant equal to a phase outside the contract and the other
    vocabularies' definitions."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(CONTRACT) or path == CONTRACT.with_suffix(".py"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        allowed = _member_definitions(tree, path)
        found += [
            f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in PHASE_WORDS and id(node) not in allowed
        ]
    return found


def test_no_phase_is_spelled_as_a_string_outside_the_contract() -> None:
    assert phase_literals() == [], "compare with `Phase` members and predicates (`rocmtrain.status.phase.phase_of`)"


def test_the_census_finds_a_phase_compared_as_a_string_or_defined_in_an_enum_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "reader.py").write_text('def running(status):\n    return status.get("phase") == "Running"\n')
    (tmp_path / "words.py").write_text('import enum\n\n\nclass Mine(enum.StrEnum):\n    FAILED = "Failed"\n')
    assert phase_literals(tmp_path) == [
        f"{tmp_path.name}/reader.py:2: 'Running'",
        f"{tmp_path.name}/words.py:5: 'Failed'",
    ]

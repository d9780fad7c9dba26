"""The CRD stays backward compatible with the objects an earlier operator version wrote (`recorded/`).

Pure, against the current CRD's schema (`rocmtrain.api.crd`):
- every recorded job, spec and status, is still accepted, strictly: a field the schema no longer names (which the
  API server would prune without a word), a type narrowed or a field newly required is an error;
- the current defaults give each job as applied the same spec as the API server stored then: a default changed,
  or a new defaulted field (which would change the meaning of jobs written before it), is an error, unless
  `NEW_DEFAULTS` names it with the reason it keeps old jobs' meaning;
- the operator still reads each recorded job (`validate_job`, as the reconciler does).
Each check is shown to fail on a breaking change of the schema (`BREAKING`). The CRD's CEL rules are the API
server's to check: test_upgrade.py creates the recorded objects through it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from rocmtrain.api import crd
from rocmtrain.api.validate import validate_job
from rocmtrain_testworld.rayjob_schema import strict, violations
from upgrade.fixtures import CASES, NAMESPACE, RECORDED, recorded

# Spec paths whose schema default was added or removed after the fixtures were recorded, each with why it keeps old
# jobs' meaning.
NEW_DEFAULTS: dict[str, str] = {
    "spec.resources.sharedMemory": (
        "the schema's 16Gi moved into the renderer (the smaller of 16Gi and half of memoryPerWorker); a stored job "
        "keeps the 16Gi the API server wrote into it"
    ),
}


def job_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema as a strict JSON Schema (metadata is the API server's own)."""
    strict_schema: dict[str, Any] = strict(copy.deepcopy(schema))
    strict_schema["properties"]["metadata"] = {"type": "object"}
    return strict_schema


def refusals(schema: dict[str, Any], job: dict[str, Any]) -> list[str]:
    """Every way `job` breaks `schema`, as `path: message` lines."""
    return violations(job_schema(schema), job)


def defaulted(node: dict[str, Any], value: Any) -> Any:
    """`value` with the structural schema `node`'s defaults applied, top down, as the API server does."""
    if isinstance(value, dict) and "properties" in node:
        value = {
            **{key: copy.deepcopy(sub["default"]) for key, sub in node["properties"].items() if "default" in sub},
            **value,
        }
        return {key: defaulted(node["properties"].get(key, {}), item) for key, item in value.items()}
    if isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        return {key: defaulted(node["additionalProperties"], item) for key, item in value.items()}
    if isinstance(value, list) and "items" in node:
        return [defaulted(node["items"], item) for item in value]
    return value


def differences(now: Any, then: Any, path: str = "spec") -> list[str]:
    """The paths where `now` and `then` differ: a value changed, or a field in one only."""
    if isinstance(now, dict) and isinstance(then, dict):
        return [found for key in sorted(now.keys() | then.keys()) for found in _key_differences(now, then, key, path)]
    if isinstance(now, list) and isinstance(then, list) and len(now) == len(then):
        pairs = enumerate(zip(now, then, strict=True))
        return [found for i, (a, b) in pairs for found in differences(a, b, f"{path}[{i}]")]
    return [] if now == then else [f"{path}: {then!r} then, {now!r} now"]


def _key_differences(now: dict[str, Any], then: dict[str, Any], key: str, path: str) -> list[str]:
    if key not in then:
        return [f"{path}.{key}: new default {now[key]!r}"]
    if key not in now:
        return [f"{path}.{key}: {then[key]!r} then, no default now"]
    return differences(now[key], then[key], f"{path}.{key}")


def changed_defaults(schema: dict[str, Any], case: dict[str, Any]) -> list[str]:
    """Where the current defaults of the job as applied differ from the spec the API server stored then."""
    spec = defaulted(schema["properties"]["spec"], case["applied"]["spec"])
    return [found for found in differences(spec, case["job"]["spec"]) if found.split(":")[0] not in NEW_DEFAULTS]


SCHEMA = crd.openapi_schema()


def test_every_case_is_recorded_in_its_namespace() -> None:
    assert sorted(path.stem for path in RECORDED.glob("*.yaml")) == sorted(CASES)
    phases = {recorded(case)["job"]["status"]["phase"] for case in CASES}
    assert phases == {"Running", "Queued", "Succeeded"}
    assert {recorded(case)["job"]["metadata"]["namespace"] for case in CASES} == {NAMESPACE}


@pytest.mark.parametrize("case", CASES)
def test_every_recorded_field_is_still_accepted(case: str) -> None:
    assert refusals(SCHEMA, recorded(case)["job"]) == []


@pytest.mark.parametrize("case", CASES)
def test_defaults_keep_their_meaning(case: str) -> None:
    assert changed_defaults(SCHEMA, recorded(case)) == []


@pytest.mark.parametrize("case", CASES)
def test_the_operator_still_reads_each_recorded_job(case: str) -> None:
    job = recorded(case)["job"]
    document = {key: job[key] for key in ("apiVersion", "kind", "metadata", "spec")}
    valid, errors = validate_job(document, context="cluster")
    assert valid is not None and errors == []


def _spec(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    node: dict[str, Any] = schema["properties"]["spec"]
    for name in path:
        node = node["properties"][name]
    return node


def _drop_keep_last(schema: dict[str, Any]) -> None:
    del _spec(schema, "checkpoint")["properties"]["keepLast"]


def _drop_progress(schema: dict[str, Any]) -> None:
    del schema["properties"]["status"]["properties"]["progress"]


def _require_new_field(schema: dict[str, Any]) -> None:
    _spec(schema, "training")["properties"]["optimizer2"] = {"type": "string"}
    _spec(schema, "training").setdefault("required", []).append("optimizer2")


def _narrow_workers(schema: dict[str, Any]) -> None:
    _spec(schema, "resources", "workers")["type"] = "string"


def _change_keep_last_default(schema: dict[str, Any]) -> None:
    _spec(schema, "checkpoint", "keepLast")["default"] = 3


def _add_default(schema: dict[str, Any]) -> None:
    _spec(schema, "checkpoint")["properties"]["compress"] = {"type": "boolean", "default": True}


# Breaking changes of the CRD, each with the check that must catch it (and the first line it must report).
BREAKING: dict[str, tuple[Callable[[dict[str, Any]], None], Callable[[dict[str, Any], dict[str, Any]], list[str]]]] = {
    "a spec field removed": (_drop_keep_last, lambda schema, case: refusals(schema, case["job"])),
    "a status field removed": (_drop_progress, lambda schema, case: refusals(schema, case["job"])),
    "a new required field": (_require_new_field, lambda schema, case: refusals(schema, case["job"])),
    "a type narrowed": (_narrow_workers, lambda schema, case: refusals(schema, case["job"])),
    "a default changed": (_change_keep_last_default, changed_defaults),
    "a new default": (_add_default, changed_defaults),
}
EXPECTED = {
    "a spec field removed": "spec.checkpoint: Additional properties are not allowed ('keepLast' was unexpected)",
    "a status field removed": "status: Additional properties are not allowed ('progress' was unexpected)",
    "a new required field": "spec.training: 'optimizer2' is a required property",
    "a type narrowed": "spec.resources.workers: 2 is not of type 'string'",
    "a default changed": "spec.checkpoint.keepLast: 2 then, 3 now",
    "a new default": "spec.checkpoint.compress: new default True",
}


@pytest.mark.parametrize("change", BREAKING)
def test_a_breaking_change_of_the_crd_is_caught(change: str) -> None:
    mutate, check = BREAKING[change]
    schema = copy.deepcopy(SCHEMA)
    mutate(schema)
    found = {line for case in CASES for line in check(schema, recorded(case))}
    assert EXPECTED[change] in found, sorted(found)

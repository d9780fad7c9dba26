"""What the operator may change in a RayJob that exists (`rocmtrain.status.rayjob_update`); pure.

A running RayJob keeps its Ray cluster and entrypoint: only `suspend` and the lifecycle fields are
patched, and a fixed field whose render changed (a newer operator version) is reported, never written.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rocmtrain.api.validate import validate_job
from rocmtrain.render import render_rayjob
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS
from rocmtrain.status.rayjob_update import FIXED_FIELDS, deferred_message, holds, rayjob_update
from unit.samples import example, full_job, minimal_job

JOBS = {
    "full": full_job,
    "minimal": minimal_job,
    "cluster-mi300x": lambda: example("cluster-mi300x.yaml"),
    "kueue": lambda: example("kueue.yaml"),
    "llama-70b-fsdp": lambda: example("cluster-llama-70b-lora-fsdp-mi300x.yaml"),
}


def rendered_spec(case: str) -> dict[str, Any]:
    job, errors = validate_job(JOBS[case](), context="cluster")
    assert job is not None, errors
    return render_rayjob(job)["spec"]


def as_admitted(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` as the API server and Kueue leave it: a defaulted port protocol, an admitted flavor's node selector
    and toleration on every Ray pod template."""
    live = copy.deepcopy(spec)
    cluster = live["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])):
        pod = template["spec"]
        pod.setdefault("nodeSelector", {})["cloud.example/flavor"] = "mi300x"
        pod["tolerations"] = [*pod.get("tolerations", []), {"key": "reserved", "operator": "Exists"}]
        for container in pod["containers"]:
            for port in container.get("ports", []):
                port.setdefault("protocol", "TCP")
    return live


@pytest.mark.parametrize("case", JOBS)
def test_a_rayjob_in_step_needs_nothing_whatever_kueue_and_the_api_server_added(case: str) -> None:
    spec = rendered_spec(case)
    assert rayjob_update(spec, spec, queued=False).patch == {}
    update = rayjob_update(spec, as_admitted(spec), queued=case == "kueue")
    assert (update.patch, update.deferred) == ({}, ())


@pytest.mark.parametrize("case", JOBS)
def test_every_rendered_rayjob_field_is_either_mutable_or_fixed(case: str) -> None:
    """A field a new render adds must be classified: patched after creation (mutable) or never (fixed)."""
    assert set(rendered_spec(case)) <= set(MUTABLE_RAYJOB_DEFAULTS) | set(FIXED_FIELDS)
    assert not set(MUTABLE_RAYJOB_DEFAULTS) & set(FIXED_FIELDS)


def _older(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` as an earlier operator version could have written it: another image, one env var fewer, another
    entrypoint, and a suspend and TTL the job has changed since."""
    live = copy.deepcopy(spec)
    head = live["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["image"] = "ghcr.io/rocm-train-operator/training:0.0.9"
    head["env"] = head["env"][:-1]
    live["entrypoint"] = "python -m rocmtrain_train.old_driver"
    live["suspend"] = not spec["suspend"]
    live["ttlSecondsAfterFinished"] = 7
    return live


@pytest.mark.parametrize("queued", [False, True])
def test_a_render_change_is_deferred_never_patched(queued: bool) -> None:
    spec = rendered_spec("full")
    update = rayjob_update(spec, _older(spec), queued=queued)
    assert update.deferred == ("entrypoint", "rayClusterSpec")
    mutable = {"ttlSecondsAfterFinished": spec["ttlSecondsAfterFinished"]}
    assert update.patch == (mutable if queued else {**mutable, "suspend": spec["suspend"]})
    assert not set(update.patch) & set(FIXED_FIELDS)


@pytest.mark.parametrize("field", FIXED_FIELDS)
def test_each_fixed_field_is_compared(field: str) -> None:
    spec = rendered_spec("cluster-mi300x")
    live = {**spec, field: {"changed": True}}
    assert rayjob_update(spec, live, queued=False) == type(rayjob_update(spec, spec, queued=False))({}, (field,))
    dropped = {key: value for key, value in spec.items() if key != field}
    assert rayjob_update(spec, dropped, queued=False).deferred == ((field,) if field in spec else ())


def test_holds_compares_maps_key_by_key_and_lists_item_by_item() -> None:
    assert holds({"a": 1, "b": 2}, {"a": 1}) and not holds({"a": 1}, {"a": 1, "b": 2})
    assert holds([{"x": 1, "y": 2}, 3], [{"x": 1}]) and not holds([{"x": 2}], [{"x": 1}])
    assert not holds([1], [1, 2]) and not holds({"a": [1]}, {"a": {"0": 1}}) and not holds(None, 0)


def test_the_event_names_the_fields_and_when_they_apply() -> None:
    assert deferred_message("bert", ("entrypoint", "rayClusterSpec")) == (
        "this operator version renders RayJob bert differently (spec.entrypoint, spec.rayClusterSpec); the RayJob "
        "that exists keeps what it was created with, and the change applies to the job's next RayJob"
    )

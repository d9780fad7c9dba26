"""What the operator may change in a RayJob that exists (`rocmtrain.render.rayjob_update`); pure.

A running RayJob keeps its Ray cluster and entrypoint: only `suspend` and the lifecycle fields are
patched, and a fixed field whose render changed (a newer operator version) is reported, never written,
until the RayJob is between runs (suspended by its job): then the patch turns each changed fixed field
into the current render exactly.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fakes import merge_patch as apply_patch
from rocmtrain.api.kuberay import JobDeploymentStatus
from rocmtrain.api.models import MUTABLE_FIELDS, RocmTrainingJob
from rocmtrain.api.validate import validate_job
from rocmtrain.render import render_rayjob
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS, mutable_rayjob_fields
from rocmtrain.render.rayjob_update import (
    FIXED_FIELDS,
    applied_message,
    between_runs,
    deferred_message,
    holds,
    merge_patch,
    mutable_patch,
    rayjob_update,
)
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


@pytest.mark.parametrize("case", JOBS)
def test_between_runs_the_patch_turns_the_older_render_into_the_current_one(case: str) -> None:
    spec = rendered_spec(case)
    older = _older(spec)
    older["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["dropped"] = {"by": "the new render"}
    update = rayjob_update(spec, older, queued=False, between=True)
    assert (update.applied, update.deferred) == (("entrypoint", "rayClusterSpec"), ())
    patched = apply_patch(older, update.patch)
    assert {key: patched.get(key) for key in FIXED_FIELDS} == {key: spec.get(key) for key in FIXED_FIELDS}
    assert update.patch["suspend"] == spec["suspend"]  # the mutable fields as ever
    assert update.patch["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["dropped"] is None
    # In step, between runs or not: nothing to write.
    assert rayjob_update(spec, spec, queued=False, between=True) == rayjob_update(spec, spec, queued=False)


def test_merge_patch_is_the_difference_rfc_7386_applies() -> None:
    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": True}
    new = {"a": 1, "b": {"c": [1], "e": {"f": 0}}}
    assert merge_patch(old, new) == {"gone": None, "b": {"c": [1], "d": None, "e": {"f": 0}}}
    assert apply_patch(old, merge_patch(old, new)) == new
    assert merge_patch(None, new) == new and merge_patch(old, old) == {}


@pytest.mark.parametrize(
    ("status", "between"),
    [
        ({}, False),  # made, not started
        ({"jobDeploymentStatus": JobDeploymentStatus.INITIALIZING}, False),
        ({"jobDeploymentStatus": JobDeploymentStatus.RUNNING}, False),
        ({"jobDeploymentStatus": JobDeploymentStatus.SUSPENDING}, False),  # its Ray cluster is still going
        ({"jobDeploymentStatus": JobDeploymentStatus.SUSPENDED}, True),
        # KubeRay makes the retry's cluster within milliseconds of deleting the failed one: no time to write.
        ({"jobDeploymentStatus": JobDeploymentStatus.RETRYING, "failed": 1}, False),
        ({"jobDeploymentStatus": JobDeploymentStatus.NEW, "failed": 1}, False),
        ({"jobDeploymentStatus": JobDeploymentStatus.COMPLETE, "succeeded": 1}, False),
        ({"jobDeploymentStatus": JobDeploymentStatus.FAILED, "failed": 2}, False),
    ],
)
def test_a_rayjob_is_between_runs_while_its_job_has_it_suspended(status: dict[str, Any], between: bool) -> None:
    assert between_runs({"status": status}, queued=False) is between
    assert between_runs({"status": status}, queued=True) is False  # Kueue keeps a queued RayJob's pod templates


def test_the_events_name_the_fields_and_when_they_apply() -> None:
    fields = ("entrypoint", "rayClusterSpec")
    assert deferred_message("bert", fields, queued=False) == (
        "this operator version renders RayJob bert differently (spec.entrypoint, spec.rayClusterSpec); the RayJob "
        "keeps what it was created with while it runs, and the change applies to the job's next RayJob, or the run "
        "after the job is suspended and resumed"
    )
    assert deferred_message("bert", fields, queued=True).endswith(
        "the change applies to the job's next RayJob (Kueue keeps this one's pod templates)"
    )
    assert applied_message("bert", fields) == (
        "RayJob bert is suspended: the Ray cluster and submission of its next run use this operator version's "
        "render (spec.entrypoint, spec.rayClusterSpec)"
    )


def test_mutable_patch_carries_only_suspend_and_lifecycle():
    rendered = {"suspend": True, "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 60, "entrypoint": "x"}
    live = {"suspend": False, "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 0, "entrypoint": "y"}
    assert mutable_patch(rendered, live, queued=False) == {"suspend": True, "ttlSecondsAfterFinished": 60}
    # Kueue owns `suspend` of a queued RayJob.
    assert mutable_patch(rendered, live, queued=True) == {"ttlSecondsAfterFinished": 60}
    # KubeRay's defaults (ttl 0) count as equal to an unset field: no patch loop.
    defaulted = {"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 0}
    assert mutable_patch({"shutdownAfterJobFinishes": True}, defaulted, queued=False) == {}


def test_the_rayjob_fields_that_follow_the_job_are_those_of_its_mutable_fields():
    """Every RayJob field `mutable_patch` carries over comes from `MUTABLE_FIELDS`, and has KubeRay's default."""
    manifest = full_job()
    assert set(MUTABLE_FIELDS) == {"suspend", "lifecycle"}
    job = RocmTrainingJob.model_validate(manifest)
    assert set(mutable_rayjob_fields(job)) == set(MUTABLE_RAYJOB_DEFAULTS)  # the full job sets a TTL
    changed = RocmTrainingJob.model_validate(
        {**manifest, "spec": {**manifest["spec"], "suspend": True, "lifecycle": {"shutdownAfterJobFinishes": True}}}
    )
    assert mutable_patch(mutable_rayjob_fields(changed), mutable_rayjob_fields(job), queued=False) == {
        "suspend": True,
        "ttlSecondsAfterFinished": 0,
    }

"""What the operator may change in a RayJob that exists: the pure decision behind every RayJob update.

A RayJob's spec has two kinds of fields:

- the mutable ones (`MUTABLE_RAYJOB_DEFAULTS`: `suspend`, `shutdownAfterJobFinishes`,
  `ttlSecondsAfterFinished`), which follow the job's `spec.suspend` and `spec.lifecycle`
  after creation (and `suspend` is Kueue's once the RayJob is queued);
- the fixed ones (`FIXED_FIELDS`: the Ray cluster, the entrypoint, the submitter, the retries
  and the deadline), which KubeRay reads when it makes a run's Ray cluster and submitter. A
  running job keeps the cluster and the command it started with, whatever a newer operator
  version would render.

`rayjob_update` compares the RayJob the operator renders now with the live one and returns
the merge patch of the mutable fields, and of the fixed fields whose render changed only while
the RayJob is between runs (`between_runs`: suspended by its job, so that it has no Ray cluster
and KubeRay makes the next one from its spec when the job resumes); at any other time those are
deferred. The reconciler writes such a patch only onto the RayJob as it read it (a
resourceVersion precondition), and says what it did in a `RenderChangeApplied` or
`RenderChangeDeferred` event. A deferred change applies to the job's next RayJob (one deleted
behind the operator's back and made again, or the job created again to resume from its
checkpoints), or when the job is suspended and resumed.

KubeRay's own retries (`backoffLimit`) are not between runs here: KubeRay deletes the failed
run's Ray cluster (`Retrying`) and makes the next one from the RayJob's spec within the same few
reconciles, milliseconds apart, so a write in between would land at random, before or after the
next cluster is made. A RayJob in a Kueue queue is never between runs either: Kueue adds its
flavors' node selectors and tolerations to an admitted RayJob's pod templates and keeps the
Workload in step with them.

A fixed field counts as changed when a value the render sets is not what the live RayJob
holds. What the live RayJob holds beyond the render does not count: the API server's defaults,
and what Kueue adds to an admitted RayJob's pod templates (its flavors' node selectors and
tolerations, appended to the lists). No I/O: plain mappings in, plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.kuberay import JobDeploymentStatus
from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS

# The RayJob spec fields written at creation; on a RayJob that exists, only while it is between runs.
FIXED_FIELDS = (
    "entrypoint",
    "rayClusterSpec",
    "submissionMode",
    "submitterPodTemplate",
    "submitterConfig",
    "backoffLimit",
    "activeDeadlineSeconds",
)
DEFERRED_REASON = "RenderChangeDeferred"
APPLIED_REASON = "RenderChangeApplied"


@dataclass(frozen=True)
class RayJobUpdate:
    """`patch`: the RayJob spec merge patch ({} when in step); `deferred`: the fixed fields whose render changed,
    kept; `applied`: those the patch writes (the RayJob is between runs)."""

    patch: dict[str, Any]
    deferred: tuple[str, ...]
    applied: tuple[str, ...] = ()


def between_runs(rayjob: Mapping[str, Any], *, queued: bool) -> bool:
    """Whether the RayJob has no Ray cluster and KubeRay makes its next one from its spec only once its job
    resumes: suspended by the job, outside a Kueue queue (see the module docstring)."""
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus")
    return not queued and deployment == JobDeploymentStatus.SUSPENDED


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: maps key by key (null removes a key), any
    other value replaced whole."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = merge_patch(old.get(key), value)
    return patch


def mutable_patch(rendered: Mapping[str, Any], live: Mapping[str, Any], *, queued: bool) -> dict[str, Any]:
    """The RayJob spec merge patch that carries the job's mutable fields over; {} when in step.

    `rendered` and `live` are RayJob specs; a field either leaves unset counts as KubeRay's
    default. `suspend` is Kueue's once the job is queued, so it is left alone then.
    """
    patch = {}
    for key, default in MUTABLE_RAYJOB_DEFAULTS.items():
        if queued and key == "suspend":
            continue
        want = rendered.get(key, default)
        if live.get(key, default) != want:
            patch[key] = want
    return patch


def holds(live: Any, rendered: Any) -> bool:
    """Whether `live` holds every value of `rendered`: maps key by key, lists item by item (`live` may have more
    items after them, as Kueue appends), other values equal."""
    if isinstance(rendered, Mapping):
        return isinstance(live, Mapping) and all(key in live and holds(live[key], rendered[key]) for key in rendered)
    if isinstance(rendered, list):
        return isinstance(live, list) and len(live) >= len(rendered) and all(map(holds, live, rendered))
    return bool(live == rendered)


def changed_fixed_fields(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> tuple[str, ...]:
    """The fixed fields of the RayJob spec `rendered` whose values the live spec does not hold."""
    return tuple(
        key for key in FIXED_FIELDS if (key in rendered or key in live) and not holds(live.get(key), rendered.get(key))
    )


def rayjob_update(
    rendered: Mapping[str, Any], live: Mapping[str, Any], *, queued: bool, between: bool = False
) -> RayJobUpdate:
    """The update of a live RayJob spec towards the rendered one: the mutable fields, and the changed fixed fields
    too when the RayJob is `between` runs (`between_runs`; see the module)."""
    patch = mutable_patch(rendered, live, queued=queued)
    changed = changed_fixed_fields(rendered, live)
    if not between:
        return RayJobUpdate(patch, changed)
    fixed = {key: merge_patch(live.get(key), rendered.get(key)) for key in changed}
    return RayJobUpdate({**patch, **fixed}, (), changed)


def _listed(fields: tuple[str, ...]) -> str:
    return ", ".join(f"spec.{key}" for key in fields)


def deferred_message(rayjob: str, fields: tuple[str, ...], *, queued: bool) -> str:
    """The `RenderChangeDeferred` event's message."""
    when = (
        "the job's next RayJob (Kueue keeps this one's pod templates)"
        if queued
        else "the job's next RayJob, or the run after the job is suspended and resumed"
    )
    return (
        f"this operator version renders RayJob {rayjob} differently ({_listed(fields)}); the RayJob keeps what "
        f"it was created with while it runs, and the change applies to {when}"
    )


def applied_message(rayjob: str, fields: tuple[str, ...]) -> str:
    """The `RenderChangeApplied` event's message."""
    return (
        f"RayJob {rayjob} is suspended: the Ray cluster and submission of its next run use this operator "
        f"version's render ({_listed(fields)})"
    )

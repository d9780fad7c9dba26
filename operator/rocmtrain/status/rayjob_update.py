"""What the operator may change in a RayJob that exists: the pure decision behind every RayJob update.

A RayJob's spec has two kinds of fields:

- the mutable ones (`MUTABLE_RAYJOB_DEFAULTS`: `suspend`, `shutdownAfterJobFinishes`,
  `ttlSecondsAfterFinished`), which follow the job's `spec.suspend` and `spec.lifecycle`
  after creation (and `suspend` is Kueue's once the RayJob is queued);
- the fixed ones (`FIXED_FIELDS`: the Ray cluster, the entrypoint, the submitter, the retries
  and the deadline), written once, when the RayJob is created. A running job keeps the cluster
  and the command it started with, whatever a newer operator version would render.

`rayjob_update` compares the RayJob the operator renders now with the live one and returns
the merge patch of the mutable fields and the fixed fields whose render changed. Those are
never patched: they apply to the job's next RayJob (one deleted behind the operator's back and
made again, or the job created again to resume from its checkpoints), and the reconciler says
so in a `RenderChangeDeferred` event.

A fixed field counts as changed when a value the render sets is not what the live RayJob
holds. What the live RayJob holds beyond the render does not count: the API server's defaults,
and what Kueue adds to an admitted RayJob's pod templates (its flavors' node selectors and
tolerations, appended to the lists). No I/O: plain mappings in, plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rocmtrain.render.rayjob import MUTABLE_RAYJOB_DEFAULTS

# The RayJob spec fields written only at creation; never patched on a RayJob that exists.
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


@dataclass(frozen=True)
class RayJobUpdate:
    """`patch`: the RayJob spec merge patch ({} when in step); `deferred`: the fixed fields whose render changed."""

    patch: dict[str, Any]
    deferred: tuple[str, ...]


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


def rayjob_update(rendered: Mapping[str, Any], live: Mapping[str, Any], *, queued: bool) -> RayJobUpdate:
    """The update of a live RayJob spec towards the rendered one: the mutable fields only (see the module)."""
    return RayJobUpdate(mutable_patch(rendered, live, queued=queued), changed_fixed_fields(rendered, live))


def deferred_message(rayjob: str, fields: tuple[str, ...]) -> str:
    """The `RenderChangeDeferred` event's message."""
    listed = ", ".join(f"spec.{key}" for key in fields)
    return (
        f"this operator version renders RayJob {rayjob} differently ({listed}); the RayJob that exists keeps "
        "what it was created with, and the change applies to the job's next RayJob"
    )

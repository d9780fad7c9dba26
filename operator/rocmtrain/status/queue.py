"""When a queued job will start (pure): its place in its ClusterQueue, and when enough AMD GPUs are free for it.

Kueue says why a Workload waits, not until when; the operator knows what Kueue does not:
when each running job expects to end (the ETA its driver reports with its progress).
`estimate` simulates one ClusterQueue's GPU quota from the GPUs free now, the Workloads
holding the rest with their ends, and the Workloads ahead with their GPUs:

- each holder gives its GPUs back at its end, earliest first (an end already past: now);
- the Workloads ahead start in Kueue's order (priority, then creation: StrictFIFO) as
  soon as enough GPUs are free, and keep them (their own ends are not known yet);
- the job starts when enough GPUs are free after them.

Where the inputs are missing it says "unknown" and why, instead of guessing: a holder
without an ETA (a job still starting, a workload of another kind, GPUs the ClusterQueue
reports held by workloads the operator does not see) keeps its GPUs, so a job that needs
them gets no time; nor does a job whose ClusterQueue's quota cannot be read. The estimate
counts the ClusterQueue's own nominal quota: GPUs its cohort lends it can start a job
earlier (the basis says so where the ClusterQueue has a cohort), and a BestEffortFIFO
queue may start a smaller job out of order.

`estimates` applies it to every waiting Workload the operator watches, grouped by ClusterQueue.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocmtrain.api.contract import GPU_RESOURCE
from rocmtrain.api.models import QUEUE_BASIS_LIMIT, QueueEstimate
from rocmtrain.api.names import rayjob_name_of
from rocmtrain.api.quantity import AMD_DEVICE_PREFIX, device_count
from rocmtrain.api.timestamps import parse_time, rfc3339
from rocmtrain.status.kueue import finished, holds_quota
from rocmtrain.status.messages import bounded
from rocmtrain.status.phase import HOLDING_PHASES

Key = tuple[str, str]  # (namespace, RayJob name), as the Workload watch groups its views
# Holders named in an "unknown" basis; the rest are counted.
NAMED_HOLDERS = 3
_LATEST = dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Quota:
    """A ClusterQueue's AMD GPUs: its nominal quota and what its Workloads reserve now (None: not known),
    and its cohort, whose lending the estimate does not count."""

    cluster_queue: str
    gpus: int | None
    reserved: int | None = None
    cohort: str | None = None


@dataclass(frozen=True)
class Holder:
    """A Workload holding GPUs of the ClusterQueue, and when it is expected to end (None: not known)."""

    name: str
    gpus: int
    ends: dt.datetime | None


@dataclass(frozen=True)
class Waiting:
    """A Workload waiting in the ClusterQueue."""

    key: Key
    gpus: int
    priority: int = 0
    created: dt.datetime | None = None


@dataclass(frozen=True)
class Known:
    """What the operator knows of the job a Workload was made for: its name, and when it expects to end."""

    name: str
    ends: dt.datetime | None


def expected_end(status: Mapping[str, Any]) -> dt.datetime | None:
    """When a job that holds its GPUs (Initializing or Running) expects to end: its last progress report's
    time plus the ETA it reported."""
    progress = status.get("progress") or {}
    eta, reported = progress.get("etaSeconds"), parse_time(status.get("lastProgressTime"))
    if status.get("phase") not in HOLDING_PHASES or not isinstance(eta, int | float) or reported is None:
        return None
    return reported + dt.timedelta(seconds=eta)


def cluster_queue_quota(cluster_queue: Mapping[str, Any]) -> Quota:
    """The AMD GPU quota of a ClusterQueue (summed over its flavors, partitions counted as GPUs) and what is
    reserved of it now."""
    name = (cluster_queue.get("metadata") or {}).get("name", "")
    spec, status = cluster_queue.get("spec") or {}, cluster_queue.get("status") or {}
    nominal = [
        device_count(resource.get("nominalQuota"))
        for group in spec.get("resourceGroups") or []
        for flavor in group.get("flavors") or []
        for resource in flavor.get("resources") or []
        if str(resource.get("name")).startswith(AMD_DEVICE_PREFIX)
    ]
    # Reserved counts Workloads holding quota before their admission checks pass; older Kueue reports usage only.
    reservation = status.get("flavorsReservation", status.get("flavorsUsage"))
    reserved = (
        sum(
            device_count(resource.get("total"))
            for flavor in reservation
            for resource in flavor.get("resources") or []
            if str(resource.get("name")).startswith(AMD_DEVICE_PREFIX)
        )
        if isinstance(reservation, list)
        else None
    )
    cohort = spec.get("cohortName") or spec.get("cohort")  # v1beta2 names it cohortName
    return Quota(name, sum(nominal) if nominal else None, reserved, cohort)


def kueue_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Waiting Workloads in Kueue's order: higher priority first, then the older."""
    return sorted(waiting, key=lambda w: (-w.priority, w.created or _LATEST, w.key))


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _unknown(position: int | None, reason: str) -> dict[str, Any]:
    return QueueEstimate(position=position, basis=bounded(f"unknown: {reason}", QUEUE_BASIS_LIMIT)).dump()


def _why_stuck(holders: Sequence[Holder], ahead: int) -> str:
    """Why the GPUs a job needs never come free in the simulation: holders without an ETA (the first few by
    name, with their GPUs), else the jobs ahead, whose ends are not known before they start."""
    stuck = [f"{h.name} ({_plural(h.gpus, 'GPU', 'GPUs')})" for h in holders if h.ends is None and h.gpus]
    if not stuck:
        return f"the GPUs it needs go to the {_plural(ahead, 'job', 'jobs')} ahead first, whose ends are not known yet"
    more = len(stuck) - NAMED_HOLDERS
    named = ", ".join(stuck[:NAMED_HOLDERS]) + (f" and {more} more" if more > 0 else "")
    return f"the GPUs it waits for are held without an ETA by {named}"


def estimate(
    quota: Quota, holders: Sequence[Holder], ahead: Sequence[Waiting], gpus: int, now: dt.datetime
) -> dict[str, Any]:
    """`status.queue` (wire form) of a job needing `gpus` behind the Workloads `ahead` (see the module doc)."""
    position, queue = len(ahead) + 1, quota.cluster_queue
    if quota.gpus is None:
        return _unknown(position, f"ClusterQueue {queue} has no {GPU_RESOURCE} quota the operator can read")
    if gpus > quota.gpus:
        return _unknown(position, f"the job needs {gpus} GPUs, more than ClusterQueue {queue}'s quota of {quota.gpus}")
    held = sum(h.gpus for h in holders)
    unseen = (quota.reserved if quota.reserved is not None else held) - held
    everyone = [*holders, Holder("workloads the operator does not follow", unseen, None)] if unseen > 0 else holders
    free = quota.gpus - held - max(unseen, 0)
    releases = sorted((h for h in everyone if h.ends is not None and h.gpus), key=lambda h: h.ends or now)
    released, start = 0, now
    for need in [w.gpus for w in ahead if w.gpus <= quota.gpus] + [gpus]:  # a Workload too large never starts
        while free < need:
            if released == len(releases):
                return _unknown(position, _why_stuck(everyone, len(ahead)))
            holder = releases[released]
            free, start, released = free + holder.gpus, max(start, holder.ends or now), released + 1
        free -= need
    basis = [
        _plural(released, "running job's ETA", "running jobs' ETAs") if released else "GPUs free now",
        _plural(len(ahead), "job ahead", "jobs ahead"),
        f"ClusterQueue {queue}'s quota of {quota.gpus} GPUs",
    ]
    if quota.cohort:
        basis.append(f"not counting what cohort {quota.cohort} may lend")
    return QueueEstimate(
        position=position, expected_start_time=rfc3339(start), basis=bounded(", ".join(basis), QUEUE_BASIS_LIMIT)
    ).dump()


def known_jobs(jobs: Iterable[Mapping[str, Any]]) -> dict[Key, Known]:
    """The operator's jobs (their views) by their RayJob's key, each with when it expects to end."""
    return {
        (job["metadata"]["namespace"], rayjob_name_of(job["metadata"]["name"])): Known(
            job["metadata"]["name"], expected_end(job.get("status") or {})
        )
        for job in jobs
    }


def waiting_local_queues(workloads: Iterable[Mapping[str, Any]]) -> set[Key]:
    """(namespace, LocalQueue) of every Workload waiting for quota: the LocalQueues whose ClusterQueue to read."""
    return {
        (view["metadata"]["namespace"], view["queueName"])
        for view in workloads
        if view.get("queueName") and not view.get("clusterQueue") and not finished(view)
    }


def estimates(
    workloads: Iterable[Mapping[str, Any]],
    cluster_queue_of: Mapping[Key, str],
    quotas: Mapping[str, Quota],
    known: Mapping[Key, Known],
    now: dt.datetime,
) -> dict[Key, dict[str, Any]]:
    """`status.queue` of every waiting Workload, by its RayJob's key.

    `workloads`: the Workload views (`rocmtrain.status.kueue.workload_view`); `cluster_queue_of`: the
    ClusterQueue of each (namespace, LocalQueue) that could be read; `quotas`: the quota of each
    ClusterQueue read; `known`: the operator's jobs by their RayJob's key.
    """
    holders: dict[str, list[Holder]] = defaultdict(list)
    waiting: dict[str, list[Waiting]] = defaultdict(list)
    result: dict[Key, dict[str, Any]] = {}
    for view in workloads:
        if finished(view):
            continue
        namespace, owner = view["metadata"]["namespace"], view["metadata"]["owner"]["name"]
        key = (namespace, owner)
        if holds_quota(view):
            job = known.get(key)
            name = f"{namespace}/{job.name if job is not None else owner}"
            holders[view["clusterQueue"]].append(Holder(name, view["gpus"], job.ends if job is not None else None))
        elif not view.get("clusterQueue"):
            local_queue = view.get("queueName") or ""
            queue = cluster_queue_of.get((namespace, local_queue))
            if queue is None:
                result[key] = _unknown(None, f"LocalQueue {namespace}/{local_queue} or its ClusterQueue cannot be read")
                continue
            created = parse_time(view["metadata"].get("creationTimestamp"))
            waiting[queue].append(Waiting(key, view["gpus"], view.get("priority") or 0, created))
    for queue, members in waiting.items():
        quota = quotas.get(queue, Quota(queue, None))
        ordered = kueue_order(members)
        for index, member in enumerate(ordered):
            result[member.key] = estimate(quota, holders[queue], ordered[:index], member.gpus, now)
    return result

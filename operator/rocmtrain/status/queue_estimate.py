"""When a queued job will start (pure): its place in its ClusterQueue, and when enough AMD GPUs are free for it.

Kueue says why a Workload waits, not until when; the operator knows what Kueue does not:
when each running job expects to end (the ETA its driver reports with its progress).
`estimate` simulates one ClusterQueue's GPU quota from the GPUs free now, the Workloads
holding the rest with their ends, and the Workloads ahead with their GPUs:

- each holder gives its GPUs back at its end, earliest first (an end already past: now);
- the Workloads ahead start in Kueue's order (priority, then creation: StrictFIFO) as
  soon as enough GPUs are free, and keep them (their own ends are not known yet);
- the job starts when enough GPUs are free after them.

In a cohort it simulates, as Kueue shares quota, every ClusterQueue of the cohort that has
one of the job's ClusterQueue's GPU flavors (the others can neither lend to it nor borrow
from it): each keeps what its lendingLimit leaves it (all, without a cohort) and lends the
rest of its unused nominal quota; the job's ClusterQueue may borrow up to its borrowingLimit
(none: all the cohort lends). Their holders give GPUs back at their ends too, and their
Workloads ahead of the job in Kueue's order (priority, then creation) compete for them,
each ClusterQueue's in its own order. It approximates (early or late by what it leaves out):
GPUs are summed over flavors (a job is taken to fit the sum of a ClusterQueue's flavors, and
a cohort member sharing one flavor is counted whole); Workloads behind the job in other
ClusterQueues that fit earlier, preemption, and hierarchical cohorts (a Cohort object's own
quota, its parent cohorts) are not counted.

Where the inputs are missing it says "unknown" and why, instead of guessing: a holder
without an ETA (a job still starting, a workload of another kind, GPUs a ClusterQueue
reports held by workloads the operator does not see) keeps its GPUs, so a job that needs
them gets no time; nor does a job whose ClusterQueue's quota cannot be read, or whose
cohort's ClusterQueues cannot be listed. A BestEffortFIFO queue may start a smaller job out
of order.

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
from rocmtrain.status.messages import bounded
from rocmtrain.status.phase import phase_of
from rocmtrain.status.workload import finished, holds_quota

Key = tuple[str, str]  # (namespace, RayJob name), as the Workload watch groups its views
# Holders named in an "unknown" basis; the rest are counted.
NAMED_HOLDERS = 3
_LATEST = dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Quota:
    """A ClusterQueue's AMD GPUs: its nominal quota and what its Workloads reserve now (None: not known), its
    cohort, how many it may borrow from the cohort (None: no limit) and lend it (None: all its nominal quota),
    and its GPU (flavor, resource) pairs, which it shares with the cohort."""

    cluster_queue: str
    gpus: int | None
    reserved: int | None = None
    cohort: str | None = None
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    flavors: frozenset[tuple[str, str]] = frozenset()

    @property
    def lendable(self) -> int:
        """What of its nominal quota it lends its cohort when unused."""
        nominal = self.gpus or 0
        return nominal if self.lending_limit is None else min(nominal, self.lending_limit)

    @property
    def guaranteed(self) -> int:
        """What of its nominal quota it keeps for itself (beyond its lendingLimit)."""
        return (self.gpus or 0) - self.lendable


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
    phase = phase_of(status)
    if phase is None or not phase.holds_gpus or not isinstance(eta, int | float) or reported is None:
        return None
    return reported + dt.timedelta(seconds=eta)


def cluster_queue_quota(cluster_queue: Mapping[str, Any]) -> Quota:
    """The AMD GPU quota of a ClusterQueue (summed over its flavors, partitions counted as GPUs), its limits
    of borrowing and lending (summed: one resource without a borrowingLimit makes borrowing unlimited) and
    what is reserved of it now."""
    name = (cluster_queue.get("metadata") or {}).get("name", "")
    spec, status = cluster_queue.get("spec") or {}, cluster_queue.get("status") or {}
    gpu_resources = [
        (flavor.get("name", ""), resource)
        for group in spec.get("resourceGroups") or []
        for flavor in group.get("flavors") or []
        for resource in flavor.get("resources") or []
        if str(resource.get("name")).startswith(AMD_DEVICE_PREFIX)
    ]
    resources = [resource for _, resource in gpu_resources]
    nominal = [device_count(resource.get("nominalQuota")) for resource in resources]
    borrowing = [resource.get("borrowingLimit") for resource in resources]
    lending = [
        min(quota, device_count(limit)) if (limit := resource.get("lendingLimit")) is not None else quota
        for resource, quota in zip(resources, nominal, strict=True)
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
    return Quota(
        name,
        sum(nominal) if nominal else None,
        reserved,
        cohort,
        sum(device_count(limit) for limit in borrowing) if borrowing and None not in borrowing else None,
        sum(lending) if any("lendingLimit" in resource for resource in resources) else None,
        frozenset((flavor, str(resource["name"])) for flavor, resource in gpu_resources),
    )


def _order(waiting: Waiting) -> tuple[int, dt.datetime, Key]:
    return -waiting.priority, waiting.created or _LATEST, waiting.key


def kueue_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Waiting Workloads in Kueue's order: higher priority first, then the older."""
    return sorted(waiting, key=_order)


@dataclass(frozen=True)
class Member:
    """A ClusterQueue of the job's cohort (sharing a GPU flavor with the job's): its quota, the Workloads
    holding its GPUs, and its Workloads waiting ahead of the job in Kueue's order."""

    quota: Quota
    holders: Sequence[Holder]
    ahead: Sequence[Waiting]


class _Pool:
    """The GPUs of a cohort's ClusterQueues (the job's first) as Kueue counts them: each uses its guaranteed
    quota, then what the cohort lends, within its borrowingLimit."""

    def __init__(self, quotas: Sequence[Quota], usage: Sequence[int]) -> None:
        self.quotas, self.usage = quotas, list(usage)

    def _pooled(self, index: int) -> int:
        """What ClusterQueue `index` uses beyond its guaranteed quota: from the cohort's pool of lendable GPUs
        (its own included)."""
        return max(0, self.usage[index] - self.quotas[index].guaranteed)

    def available(self, index: int) -> int:
        """The GPUs ClusterQueue `index` can use now."""
        quota = self.quotas[index]
        lent = sum(q.lendable for q in self.quotas) - sum(self._pooled(i) for i in range(len(self.quotas)))
        if quota.borrowing_limit is not None:
            lent = min(lent, quota.lendable - self._pooled(index) + quota.borrowing_limit)
        return max(0, quota.guaranteed - self.usage[index]) + lent

    def largest(self, index: int) -> int:
        """The most GPUs ClusterQueue `index` can ever use (the cohort idle)."""
        return _Pool(self.quotas, [0] * len(self.quotas)).available(index)


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


def _admit(pool: _Pool, pending: list[tuple[int, int, bool]]) -> bool:
    """One round of admissions, in Kueue's order: each pending (ClusterQueue, GPUs, is the job) Workload that
    fits starts, and keeps its GPUs; one that does not blocks those behind it in its ClusterQueue. True when
    the job (last) fits."""
    blocked: set[int] = set()
    for item in list(pending):
        index, need, job = item
        if index in blocked or need > pool.available(index):
            blocked.add(index)
        elif job:
            return True
        else:
            pool.usage[index] += need
            pending.remove(item)
    return False


def _cohort_basis(quota: Quota, cohort: Sequence[Member]) -> str:
    """Which ClusterQueues of the cohort were counted, and what each lends."""
    limit = "without limit" if quota.borrowing_limit is None else f"up to {quota.borrowing_limit}"
    lenders = ", ".join(f"{m.quota.cluster_queue} lends {m.quota.lendable}" for m in cohort)
    return f"borrowing {limit} from cohort {quota.cohort}" + (
        f": {lenders}" if lenders else ", where no other ClusterQueue has its GPU flavors"
    )


def estimate(
    quota: Quota,
    holders: Sequence[Holder],
    ahead: Sequence[Waiting],
    gpus: int,
    now: dt.datetime,
    cohort: Sequence[Member] = (),
) -> dict[str, Any]:
    """`status.queue` (wire form) of a job needing `gpus` behind the Workloads `ahead` of its ClusterQueue,
    and in `cohort`, the other ClusterQueues of its cohort (see the module doc)."""
    position, queue = len(ahead) + 1, quota.cluster_queue
    if quota.gpus is None:
        return _unknown(position, f"ClusterQueue {queue} has no {GPU_RESOURCE} quota the operator can read")
    members = [Member(quota, holders, ahead), *cohort]
    everyone: list[list[Holder]] = []
    for index, member in enumerate(members):
        held = sum(h.gpus for h in member.holders)
        unseen = (member.quota.reserved if member.quota.reserved is not None else held) - held
        name = "workloads the operator does not follow" + (f" in {member.quota.cluster_queue}" if index else "")
        everyone.append([*member.holders, Holder(name, unseen, None)] if unseen > 0 else list(member.holders))
    pool = _Pool([m.quota for m in members], [sum(h.gpus for h in held) for held in everyone])
    if gpus > (largest := pool.largest(0)):
        lent = f" and the {largest - quota.gpus} GPUs cohort {quota.cohort} may lend it" if quota.cohort else ""
        return _unknown(
            position, f"the job needs {gpus} GPUs, more than ClusterQueue {queue}'s quota of {quota.gpus}{lent}"
        )
    member_of = {w.key: index for index, member in enumerate(members) for w in member.ahead}
    # The Workloads ahead in Kueue's order (one too large for its ClusterQueue never starts), then the job.
    order = kueue_order(w for member in members for w in member.ahead)
    pending = [(member_of[w.key], w.gpus, False) for w in order if w.gpus <= pool.largest(member_of[w.key])]
    pending.append((0, gpus, True))
    others = sum(len(member.ahead) for member in cohort)
    releases = sorted(
        ((index, h) for index, held in enumerate(everyone) for h in held if h.ends is not None and h.gpus),
        key=lambda release: release[1].ends or now,
    )
    released, start = 0, now
    while not _admit(pool, pending):
        if released == len(releases):
            return _unknown(position, _why_stuck([h for held in everyone for h in held], len(ahead) + others))
        index, holder = releases[released]
        pool.usage[index] -= holder.gpus
        start, released = max(start, holder.ends or now), released + 1
    basis = [
        _plural(released, "running job's ETA", "running jobs' ETAs") if released else "GPUs free now",
        _plural(len(ahead), "job ahead", "jobs ahead")
        + (f" (and {others} in cohort {quota.cohort})" if others else ""),
        f"ClusterQueue {queue}'s quota of {quota.gpus} GPUs",
    ]
    if quota.cohort:
        basis.append(_cohort_basis(quota, cohort))
    return QueueEstimate(
        position=position, expected_start_time=rfc3339(start), basis=bounded(", ".join(basis), QUEUE_BASIS_LIMIT)
    ).dump()


def _ahead_of(job: Waiting, waiting: Iterable[Waiting]) -> list[Waiting]:
    """The Workloads of `waiting` that Kueue takes before `job`."""
    return [w for w in waiting if _order(w) < _order(job)]


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
    *,
    listed: bool,
) -> dict[Key, dict[str, Any]]:
    """`status.queue` of every waiting Workload, by its RayJob's key.

    `workloads`: the Workload views (`rocmtrain.status.workload.workload_view`); `cluster_queue_of`: the
    ClusterQueue of each (namespace, LocalQueue) that could be read; `quotas`: the quota of each
    ClusterQueue read; `listed`: whether those are every ClusterQueue (listed), so that each cohort's
    ClusterQueues are known; `known`: the operator's jobs by their RayJob's key.
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
        if quota.cohort and quota.gpus is not None and not listed:
            reason = f"the ClusterQueues of cohort {quota.cohort} cannot be listed"
            result.update((member.key, _unknown(index + 1, reason)) for index, member in enumerate(ordered))
            continue
        cohort = [
            other
            for other in quotas.values()
            if quota.cohort and other.cohort == quota.cohort and other.cluster_queue != queue
            if other.flavors & quota.flavors
        ]
        for index, member in enumerate(ordered):
            shares = [
                Member(
                    other, holders.get(other.cluster_queue, []), _ahead_of(member, waiting.get(other.cluster_queue, []))
                )
                for other in cohort
            ]
            result[member.key] = estimate(quota, holders.get(queue, []), ordered[:index], member.gpus, now, shares)
    return result

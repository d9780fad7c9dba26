"""TEST-ONLY: a pod's status as a kubelet writes it, from what the runtime knows (pure).

Phase (as the kubelet's getPhase): Pending until the init containers have
succeeded and every container has started; Running while a container runs or
will be restarted; Succeeded when all ended with 0 and none will restart;
Failed when all ended, one of them not with 0, and none will restart.
Conditions: PodReadyToStartContainers, Initialized, ContainersReady, Ready and
the scheduler's PodScheduled; a condition's lastTransitionTime moves only when
its status does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TERMINAL = ("Succeeded", "Failed")


def stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerState:
    """What the runtime knows about one container, across its restarts."""

    name: str
    image: str
    init: bool = False
    state: str = "waiting"  # waiting, running, terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    container_id: str = ""
    restart_count: int = 0
    ready: bool = False
    last_terminated: dict[str, Any] | None = None
    will_restart: bool = False  # ended, and the restart policy starts it again

    def status(self) -> dict[str, Any]:
        if self.state == "running":
            assert self.started_at is not None
            state: dict[str, Any] = {"running": {"startedAt": stamp(self.started_at)}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated()}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.state == "running",
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out

    def terminated(self) -> dict[str, Any]:
        assert self.exit_code is not None and self.finished_at is not None
        out: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": "Completed" if self.exit_code == 0 else "Error",
            "startedAt": stamp(self.started_at or self.finished_at),
            "finishedAt": stamp(self.finished_at),
            "containerID": self.container_id,
        }
        if self.message:
            out["message"] = self.message
        return out

    @property
    def succeeded(self) -> bool:
        return self.state == "terminated" and self.exit_code == 0


@dataclass
class PodState:
    """The runtime's view of one pod."""

    host_ip: str
    pod_ip: str | None = None
    started_at: float | None = None
    sandbox_ready: bool = False
    init: list[ContainerState] = field(default_factory=list)
    containers: list[ContainerState] = field(default_factory=list)
    failed_init: bool = False  # an init container failed and will not be restarted
    stopping: bool = False


def phase(pod: PodState) -> str:
    if pod.failed_init:
        return "Failed"
    if any(not c.succeeded for c in pod.init):
        return "Pending"
    states = pod.containers
    if any(c.state == "waiting" and not c.restart_count and not c.will_restart for c in states):
        return "Pending"
    if any(c.state == "running" or c.will_restart for c in states):
        return "Running"
    if pod.stopping and any(c.state != "terminated" for c in states):
        return "Running"
    return "Succeeded" if all(c.succeeded for c in states) else "Failed"


def _condition(
    previous: Sequence[Mapping[str, Any]], kind: str, ok: bool, now: float, reason: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == kind), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    out: dict[str, Any] = {"type": kind, "status": status, "lastTransitionTime": since or stamp(now)}
    if reason and not ok:
        out["reason"] = reason
    return out


def pod_status(pod: PodState, previous: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The whole status to write (``previous``: the status the API server has now)."""
    conditions = previous.get("conditions") or []
    current = phase(pod)
    initialized = all(c.succeeded for c in pod.init)
    ready = current == "Running" and all(c.ready for c in pod.containers)
    not_ready = "PodCompleted" if current in TERMINAL else "ContainersNotReady"
    made = [
        _condition(conditions, "PodReadyToStartContainers", pod.sandbox_ready and current not in TERMINAL, now),
        _condition(
            conditions,
            "Initialized",
            initialized,
            now,
            "PodCompleted" if current in TERMINAL else "ContainersNotInitialized",
        ),
        _condition(conditions, "Ready", ready, now, not_ready),
        _condition(conditions, "ContainersReady", ready, now, not_ready),
    ]
    made += [dict(c) for c in conditions if c.get("type") == "PodScheduled"]
    status: dict[str, Any] = {
        "phase": current,
        "conditions": made,
        "hostIP": pod.host_ip,
        "hostIPs": [{"ip": pod.host_ip}],
        "initContainerStatuses": [c.status() for c in pod.init] or None,
        "containerStatuses": [c.status() for c in pod.containers],
    }
    if pod.pod_ip:
        status.update(podIP=pod.pod_ip, podIPs=[{"ip": pod.pod_ip}])
    if pod.started_at is not None:
        status["startTime"] = stamp(pod.started_at)
    return status

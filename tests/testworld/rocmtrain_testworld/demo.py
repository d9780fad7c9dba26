"""`make demo`: the quick start as a cluster job on the local world, followed to its end.

Brings the world up if it is not (`make cluster-up`: the control plane,
KubeRay, the process runtime and the operator), and its operator if none runs
(one `make run-operator` runs in the foreground is used as it is), then applies
examples/quickstart.yaml as a cluster job: the same model, data and
hyper-parameters, its data copied to an absolute folder that a
PersistentVolume holds (`.cluster/volumes/demo/`), its checkpoints and model
saved there, in the `default` namespace (whose pods the process runtime
runs, as those of every namespace a person creates).

As it follows the job it prints its phase, progress and metrics whenever they
change, each new condition (type, status, reason, message) and each Warning
event of the job and its Ray objects and pods. It exits 0 once the job has
Succeeded, 1 if it failed, and 1 when the job makes no progress (no new phase,
progress, metrics or condition) for `ROCMTRAIN_DEMO_STALL_SECONDS` seconds
(default 300): then it says why, with the last condition and Warning, and where
the logs of the job's pods are (the world's state folder, `logs/pods/`). The
world stays up: look around with the kubeconfig it prints, stop it with
`make cluster-down`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from rocmtrain.api.manifests import load_documents
from rocmtrain_testworld import kubecluster, rocmtrain_operator
from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.jobs import run_folder
from rocmtrain_testworld.paths import KUBECONFIG_FILE, REPO_ROOT, STATE_DIR, VOLUMES_DIR

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
NAMESPACE = "default"
CLAIM = "demo-storage"
JOBS = f"/apis/rocmtrain.dev/v1alpha1/namespaces/{NAMESPACE}/rocmtrainingjobs"
TIMEOUT_SECONDS = 1800
STALL_ENV = "ROCMTRAIN_DEMO_STALL_SECONDS"
STALL_SECONDS = 300.0
POD_LOGS = STATE_DIR / "logs" / "pods"  # <namespace>/<pod>/<container>.log, as the process runtime writes them
DEMO_DIR = VOLUMES_DIR / "demo"  # removed by `make cluster-down`


def cluster_job(folder: Path, namespace: str = NAMESPACE, claim: str = CLAIM) -> dict[str, Any]:
    """The quick start with its `./` data copied into ``folder`` and its storage on ``claim``, mounted there."""
    (job,) = load_documents(QUICKSTART.read_text())
    data = job["spec"]["data"]
    for part in ("train", "eval"):
        source = QUICKSTART.parent / data[part]["uri"]
        shutil.copy(source, folder / source.name)
        data[part]["uri"] = str(folder / source.name)
    job["metadata"]["namespace"] = namespace
    job["spec"]["checkpoint"] = {"storagePath": str(folder / "runs")}
    job["spec"]["volumes"] = [{"name": "storage", "persistentVolumeClaim": {"claimName": claim}}]
    job["spec"]["volumeMounts"] = [{"name": "storage", "mountPath": str(folder)}]
    return job


def storage(cluster: KubeCluster, folder: Path) -> None:
    """A PersistentVolume at ``folder`` and the claim on it (made again for a clean run)."""
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": CLAIM}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NAMESPACE}}
    for obj in (pvc, pv):
        cluster.delete(obj)
        cluster.wait_for(lambda o=obj: _absent(cluster, o), 60, f"the old {obj['kind']} to go")
    spec = {"accessModes": ["ReadWriteMany"], "storageClassName": ""}
    cluster.create(
        {**pv, "spec": {**spec, "capacity": {"storage": "1Gi"}, "hostPath": {"path": str(folder), "type": "Directory"}}}
    )
    cluster.create({**pvc, "spec": {**spec, "volumeName": CLAIM, "resources": {"requests": {"storage": "1Gi"}}}})


def _absent(cluster: KubeCluster, obj: dict[str, Any]) -> bool:
    try:
        cluster.request("GET", cluster.path_for(obj))
    except ApiException as exc:
        return exc.status == 404
    return False


def _line(status: Mapping[str, Any]) -> str:
    progress, metrics = status.get("progress") or {}, status.get("metrics") or {}
    parts = [f"{status.get('phase', '-'):<12}"]
    if progress:
        parts.append(
            f"step {progress.get('step', 0)}/{progress.get('totalSteps', '?')} ({progress.get('percent', 0):.0f}%)"
        )
    for key, label in (("trainLoss", "loss"), ("evalAccuracy", "eval accuracy"), ("samplesPerSecond", "samples/s")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.3g}")
    return "  ".join(parts)


def _condition(c: Mapping[str, Any]) -> str:
    line = f"condition {c.get('type')}={c.get('status')} {c.get('reason', '')}"
    return f"{line}: {c['message']}" if c.get("message") else line


def _event(e: Mapping[str, Any]) -> str:
    involved = e.get("involvedObject") or {}
    return f"warning {involved.get('kind')}/{involved.get('name')} {e.get('reason')}: {e.get('message', '')}"


@dataclass
class Follower:
    """What following a job prints, from each status read and the Warning events seen so far, and when it
    gives up: after ``stall_seconds`` without progress (a new phase, progress, metrics or condition type,
    status or reason; a condition whose message alone changes is printed but is no progress).
    """

    stall_seconds: float
    began: float
    progressed: float = field(init=False)
    last_line: str = ""
    conditions: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # type -> (status, reason, message)
    events: set[str] = field(default_factory=set)  # uids of the Warning events printed
    last_condition: str = ""
    last_warning: str = ""

    def __post_init__(self) -> None:
        self.progressed = self.began

    def observe(self, now: float, status: Mapping[str, Any], warnings: Iterable[Mapping[str, Any]]) -> list[str]:
        """The lines to print for this read (each prefixed with the seconds since the start)."""
        out = []
        if (line := _line(status)) != self.last_line:
            out.append(line)
            self.last_line, self.progressed = line, now
        for c in status.get("conditions") or []:
            seen = self.conditions.get(c["type"])
            now_seen = (c.get("status"), c.get("reason"), c.get("message"))
            if seen == now_seen:
                continue
            if seen is None or seen[:2] != now_seen[:2]:
                self.progressed = now
            self.conditions[c["type"]] = now_seen
            self.last_condition = _condition(c)
            out.append(self.last_condition)
        for e in warnings:
            if (uid := e["metadata"]["uid"]) not in self.events:
                self.events.add(uid)
                self.last_warning = _event(e)
                out.append(self.last_warning)
        return [f"{now - self.began:6.1f}s  {line}" for line in out]

    def stalled(self, now: float) -> str | None:
        """Why following should stop (no progress for too long), or None."""
        if now - self.progressed < self.stall_seconds:
            return None
        why = [f"no progress for {now - self.progressed:.0f}s ({STALL_ENV}={self.stall_seconds:g}): {self.last_line}"]
        why += [f"  last {line}" for line in (self.last_condition, self.last_warning) if line]
        return "\n".join(why)


def stall_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """The time without progress after which the demo stops (``ROCMTRAIN_DEMO_STALL_SECONDS``)."""
    return float(environ.get(STALL_ENV) or STALL_SECONDS)


def _warnings(cluster: KubeCluster, name: str) -> list[dict[str, Any]]:
    """The Warning events of the job and of what it made (its RayJob, RayCluster, pods: named after it)."""
    query = {"fieldSelector": "type=Warning"}
    found = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events", query=query)["items"]
    ours = [e for e in found if (e.get("involvedObject") or {}).get("name", "").startswith(name)]
    return sorted(ours, key=lambda e: int(e["metadata"]["resourceVersion"]))


def pod_logs(cluster: KubeCluster, name: str) -> list[str]:
    """Each pod of the job (named after it) with its state and the folder of its containers' logs."""
    pods = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    out = []
    for pod in pods:
        if not (pod_name := pod["metadata"]["name"]).startswith(f"{name}-"):
            continue
        status = pod.get("status") or {}
        waiting = [
            s["state"]["waiting"].get("reason", "")
            for s in status.get("containerStatuses") or []
            if "waiting" in (s.get("state") or {})
        ]
        out.append(
            f"  {pod_name} ({', '.join([status.get('phase', '?'), *waiting])}): {POD_LOGS / NAMESPACE / pod_name}/"
        )
    return out


class Stalled(Exception):
    """The job made no progress for the stall time (the message says why)."""


def follow(cluster: KubeCluster, name: str, stall: float) -> dict[str, Any]:
    """Print what changes of the job (see Follower) until it ends; its final status. Stalled when it makes
    no progress for ``stall`` seconds, TimeoutError after TIMEOUT_SECONDS."""
    follower = Follower(stall, time.monotonic())
    while time.monotonic() - follower.began < TIMEOUT_SECONDS:
        status = cluster.request("GET", f"{JOBS}/{name}").get("status") or {}
        for line in follower.observe(time.monotonic(), status, _warnings(cluster, name)):
            print(line, flush=True)
        if status.get("phase") in ("Succeeded", "Failed"):
            return status
        if why := follower.stalled(time.monotonic()):
            raise Stalled("\n".join([why, "the job's pods and their logs:", *pod_logs(cluster, name)]))
        time.sleep(1)
    raise TimeoutError(f"job {name} did not end within {TIMEOUT_SECONDS}s")


def main() -> int:
    kubecluster.up()  # the world and its operator, where either is not running yet
    if not kubecluster.running(rocmtrain_operator.NAME):
        print("error: the world runs no operator (no process runtime here: it needs root)", file=sys.stderr)
        return 1
    cluster = KubeCluster(KUBECONFIG_FILE)
    folder = DEMO_DIR
    (previous,) = load_documents(QUICKSTART.read_text())
    name = previous["metadata"]["name"]
    previous["metadata"]["namespace"] = NAMESPACE
    cluster.delete(previous)  # a clean run: no job, checkpoints or model of an earlier demo
    cluster.wait_for(lambda: _absent(cluster, previous), 120, f"the previous {name} job to go")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    job = cluster_job(folder)
    storage(cluster, folder)
    (folder / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    print(f"applying {folder / 'job.yaml'} (examples/quickstart.yaml as a cluster job):\n")
    print(yaml.safe_dump(job, sort_keys=False))
    applied = time.monotonic()
    cluster.create(job)
    try:
        status = follow(cluster, name, stall_seconds())
    except Stalled as stalled:
        print(f"\n{name}: stopped following it: {stalled}", file=sys.stderr)
        print(f"the world stays up: export KUBECONFIG={KUBECONFIG_FILE}; stop it with `make cluster-down`")
        return 1
    seconds = time.monotonic() - applied
    print(f"\n{name}: {status['phase']} {seconds:.0f}s after it was applied")
    for key, value in (status.get("metrics") or {}).items():
        print(f"  {key:<24} {value:.4g}" if isinstance(value, float) else f"  {key:<24} {value}")
    failed = next((c for c in status.get("conditions", []) if c["type"] == "Failed"), None)
    if failed:
        print(f"  why: {failed['message'].splitlines()[0]}")
    model = run_folder(folder, NAMESPACE, name) / "model"
    print(f"\nmodel: {model}\nthe world stays up: export KUBECONFIG={KUBECONFIG_FILE}")
    print("stop it with `make cluster-down`")
    return 0 if status["phase"] == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())

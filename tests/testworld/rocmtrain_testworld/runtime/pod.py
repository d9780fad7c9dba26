"""TEST-ONLY: one pod of the process runtime, from its start to its end, in a thread of its own.

Like a kubelet's pod worker: give the pod its network namespace and address,
write its volumes, run its init containers one after another, then its
containers; restart them by the pod's restartPolicy (with the kubelet's
back-off); run readiness and liveness probes (exec inside them, httpGet to their address); write the pod's
status whenever it changes; and on deletion stop every process (SIGTERM, then
SIGKILL after the grace period) and finalize the pod (delete it with grace 0),
which garbage collection, Jobs and KubeRay wait for.

Each container's output goes to `<logs>/<namespace>/<pod>/<container>.log`.
The thread that starts a container lives until it ends (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from rocmtrain_testworld.processes import log_tail
from rocmtrain_testworld.runtime import podspec
from rocmtrain_testworld.runtime.container import Layout, Running, argv_for, probe
from rocmtrain_testworld.runtime.network import PodNetwork
from rocmtrain_testworld.runtime.podspec import ConfigError, Probe
from rocmtrain_testworld.runtime.podstatus import ContainerState, PodState, phase, pod_status
from rocmtrain_testworld.runtime.volumes import Missing, Volumes, write_whole

if TYPE_CHECKING:
    from rocmtrain_testworld.runtime.kubelet import Kubelet

log = logging.getLogger(__name__)

TICK_SECONDS = 0.2
BACKOFF_SECONDS = 10.0  # the kubelet's crash-loop back-off: 10 s, doubling, at most 5 minutes
BACKOFF_MAX_SECONDS = 300.0
RETRY_SECONDS = 2.0  # a volume or variable whose source is missing is tried again after this
TERMINATION_MESSAGE_LINES = 80


@dataclass
class Probing:
    """One probe of one container: when it is due, its streaks, and the run in flight."""

    probe: Probe
    due: float
    successes: int = 0
    failures: int = 0
    running: Future[bool] | None = None


@dataclass
class Slot:
    """One container of the pod: its spec, status and current process."""

    spec: dict[str, Any]
    state: ContainerState
    run: Running | None = None
    env: dict[str, str] = field(default_factory=dict)
    backoff: float = BACKOFF_SECONDS
    restart_at: float = 0.0
    readiness: Probing | None = None
    liveness: Probing | None = None


class PodWorker(threading.Thread):
    """Runs one pod (see the module docstring)."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod {meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.pod = pod
        self.uid: str = meta["uid"]
        self.key = f"{meta['namespace']}/{meta['name']}"
        self.folder = kubelet.pods_dir / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"
        self.logs = kubelet.logs_dir / meta["namespace"] / meta["name"]
        self.state = PodState(host_ip=kubelet.network.host_address)
        self.hostname = (pod["spec"].get("hostname") or meta["name"])[:63]
        self.network: PodNetwork | None = None
        self.volumes: Volumes | None = None
        self._stopping = threading.Event()
        self._grace = 0.0
        self._gone = False  # the pod object is gone: nothing to finalize or write
        self._written: dict[str, Any] | None = None
        self._probes = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"probe {self.key}")
        spec = pod["spec"]
        self.init = [self._slot(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [self._slot(c, init=False) for c in spec["containers"]]
        self.state.init = [s.state for s in self.init]
        self.state.containers = [s.state for s in self.containers]

    @staticmethod
    def _slot(spec: dict[str, Any], *, init: bool) -> Slot:
        state = ContainerState(spec["name"], spec.get("image", ""), init=init)
        if not init:
            state.reason = "PodInitializing"
        return Slot(spec, state)

    # ---- called from the kubelet's thread ------------------------------------------------

    def update(self, pod: dict[str, Any]) -> None:
        """A newer version of the pod object; its deletion starts the stop."""
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self._stopping.is_set():
            self.stop(podspec.grace_seconds(pod))

    def stop(self, grace: float, *, gone: bool = False) -> None:
        self._grace = grace
        self._gone = self._gone or gone
        self._stopping.set()

    @property
    def ready(self) -> bool:
        return phase(self.state) == "Running" and all(s.state.ready for s in self.containers)

    @property
    def running(self) -> bool:
        return self.network is not None and phase(self.state) not in ("Succeeded", "Failed")

    # ---- the pod's thread ------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self._setup() and self._prepare_volumes() and self._run_init():
                self._start_all()
                self._supervise()
            self._shut_down()
        except Exception as exc:
            log.exception("pod %s: the runtime failed", self.key)
            self._kill_all()
            self._waiting_all("RunContainerError", f"the process runtime failed: {exc!r}")
        finally:
            self._probes.shutdown(wait=False, cancel_futures=True)
            self._release()
            if self._stopping.is_set() and not self._gone:
                self._finalize()
            self.kubelet.forget(self.uid)

    def _setup(self) -> bool:
        """The pod's folder, network namespace, address and hosts file; the first status."""
        if self._stopping.is_set():
            return False
        (self.folder / "home").mkdir(parents=True, exist_ok=True)
        (self.folder / "ray").mkdir(parents=True, exist_ok=True)
        # The stand-in image's login profile: the checkout's Python first (KubeRay runs `bash -l`).
        (self.folder / "home" / ".profile").write_text(f'export PATH="{self.kubelet.python_bin}:$PATH"\n')
        self.network = self.kubelet.network.add_pod()
        self.kubelet.names.add_view(self.folder / "hosts", {self.hostname: self.network.address})
        self.state.pod_ip = self.network.address
        self.state.started_at = time.time()
        self.state.sandbox_ready = True
        record = {"netns": self.network.netns, "address": self.network.address, "netnsInode": self.network.inode}
        write_whole(self.folder / "pod.json", json.dumps(record).encode())  # read by pod_records at any time
        self.volumes = Volumes(self.kubelet.api, self.pod, self.folder, self.kubelet.allocatable)
        self._write_status()
        return True

    def _prepare_volumes(self) -> bool:
        assert self.volumes is not None
        while not self._stopping.is_set():
            try:
                self.volumes.prepare()
                return True
            except (Missing, ConfigError) as exc:
                self._waiting_all("ContainerCreating", f"MountVolume.SetUp failed: {exc}")
                self.kubelet.event(self.pod, "Warning", "FailedMount", f"MountVolume.SetUp failed: {exc}")
            self._stopping.wait(RETRY_SECONDS)
        return False

    def _waiting_all(self, reason: str, message: str) -> None:
        for slot in [*self.init, *self.containers]:
            if slot.state.state == "waiting":
                slot.state.reason, slot.state.message = reason, message
        self._write_status()

    def _run_init(self) -> bool:
        """Each init container to its successful end; False when the pod stops or fails first."""
        restart = self.pod["spec"].get("restartPolicy", "Always")
        for slot in self.init:
            while not self._stopping.is_set():
                if slot.run is None and time.monotonic() >= slot.restart_at:
                    self._start(slot)
                if slot.run is not None and slot.run.poll() is not None:
                    self._ended(slot)
                    if slot.state.succeeded:
                        break
                    if restart == "Never":
                        self.state.failed_init = True
                        self._write_status()
                        return False
                    self._schedule_restart(slot)
                self._write_status()
                self._stopping.wait(TICK_SECONDS)
            if self._stopping.is_set():
                return False
        for slot in self.containers:
            slot.state.reason = "ContainerCreating"
        return True

    def _start_all(self) -> None:
        for slot in self.containers:
            self._start(slot)
        self._write_status()

    def _start(self, slot: Slot) -> None:
        """Start the container (or leave it waiting with the kubelet's reason for what is missing)."""
        assert self.network is not None and self.volumes is not None
        kubelet = self.kubelet
        spec = slot.spec
        try:
            base = podspec.image_env(str(kubelet.python_bin), str(self.folder / "home"))
            slot.env = podspec.container_env(
                self._pod_with_status(),
                spec,
                base,
                lookup=self.volumes.objects.key,
                keys=self.volumes.objects.keys,
                allocatable=kubelet.allocatable,
            )
            layout = Layout(
                netns=self.network.netns,
                hostname=self.hostname,
                hosts=self.folder / "hosts",
                resolv_conf=kubelet.names.resolv_conf,
                ray_tmp=self.folder / "ray" / spec["name"],
                overlays=self.folder / "overlays" / spec["name"],
                forbidden=kubelet.forbidden,
                image=kubelet.image,
            )
            layout.ray_tmp.mkdir(parents=True, exist_ok=True)
            argv = argv_for(
                layout,
                self.volumes.mounts(spec),
                podspec.command_line(spec, slot.env),
                workdir=spec.get("workingDir") or str(self.folder / "home"),
                capabilities=podspec.capabilities(spec),
                no_new_privileges=podspec.no_new_privileges(spec),
            )
            ports = {port["name"]: int(port["containerPort"]) for port in spec.get("ports") or () if "name" in port}
            slot.readiness = self._probing(spec.get("readinessProbe"), ports)
            slot.liveness = self._probing(spec.get("livenessProbe"), ports)
        except (Missing, ConfigError) as exc:
            slot.state.state, slot.state.reason, slot.state.message = "waiting", "CreateContainerConfigError", str(exc)
            slot.restart_at = time.monotonic() + RETRY_SECONDS
            self.kubelet.event(self.pod, "Warning", "Failed", f"Error: {exc}")
            return
        slot.run = Running.start(spec["name"], argv, slot.env, self.logs / f"{spec['name']}.log")
        state = slot.state
        state.state, state.reason, state.message = "running", "", ""
        state.started_at, state.finished_at, state.exit_code = slot.run.started, None, None
        state.container_id = f"process://{self.uid[:8]}-{spec['name']}-{state.restart_count}"
        state.ready = slot.readiness is None and not state.init
        state.will_restart = False
        self.kubelet.event(self.pod, "Normal", "Started", f"Started container {spec['name']}")

    def _pod_with_status(self) -> dict[str, Any]:
        """The pod as the downward API reads it (with the addresses this runtime gave it)."""
        status = {**(self.pod.get("status") or {}), "podIP": self.state.pod_ip, "hostIP": self.state.host_ip}
        status["podIPs"] = [{"ip": self.state.pod_ip}]
        status["hostIPs"] = [{"ip": self.state.host_ip}]
        return {**self.pod, "status": status}

    def _probing(self, spec: dict[str, Any] | None, ports: Mapping[str, int]) -> Probing | None:
        found = Probe.of(spec, ports)
        return Probing(found, time.monotonic() + found.initial_delay) if found else None

    def _ended(self, slot: Slot) -> None:
        """Record a container's end (its exit code, and its log's tail when it failed and asks for that)."""
        assert slot.run is not None
        code = slot.run.poll()
        state = slot.state
        state.state, state.exit_code, state.finished_at, state.ready = "terminated", code, slot.run.finished, False
        state.message = ""
        if code and slot.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            state.message = log_tail(self.logs / f"{slot.spec['name']}.log", TERMINATION_MESSAGE_LINES)[-4096:]
        if slot.run.finished and slot.run.finished - slot.run.started > 600:
            slot.backoff = BACKOFF_SECONDS  # ran long enough: the kubelet forgets earlier crashes
        slot.run = None

    def _schedule_restart(self, slot: Slot) -> None:
        state = slot.state
        state.last_terminated = state.terminated()
        state.state, state.reason = "waiting", "CrashLoopBackOff"
        state.message = f"back-off {slot.backoff:.0f}s restarting failed container={state.name} pod={self.key}"
        state.will_restart = True
        state.restart_count += 1
        slot.restart_at = time.monotonic() + slot.backoff
        slot.backoff = min(2 * slot.backoff, BACKOFF_MAX_SECONDS)

    def _supervise(self) -> None:
        """Restarts, probes and token renewals until the pod ends or is stopped."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        while not self._stopping.is_set():
            now = time.monotonic()
            for slot in self.containers:
                if slot.run is not None and slot.run.poll() is not None:
                    self._ended(slot)
                    if policy == "Always" or (policy == "OnFailure" and not slot.state.succeeded):
                        self._schedule_restart(slot)
                elif slot.run is None and slot.state.state == "waiting" and now >= slot.restart_at:
                    self._start(slot)
                if slot.run is not None:
                    self._probe(slot, now)
            if phase(self.state) in ("Succeeded", "Failed"):
                self._write_status()
                return
            assert self.volumes is not None
            self.volumes.refresh()
            self._write_status()
            self._stopping.wait(TICK_SECONDS)

    def _probe(self, slot: Slot, now: float) -> None:
        assert slot.run is not None
        for kind in ("readiness", "liveness"):
            probing: Probing | None = getattr(slot, kind)
            if probing is None:
                continue
            if probing.running is not None and probing.running.done():
                self._probed(slot, kind, probing, probing.running.result())
                probing.running = None
            if probing.running is None and now >= probing.due:
                probing.due = now + probing.probe.period
                probing.running = self._probes.submit(probe, slot.run, probing.probe, slot.env, self.state.pod_ip)

    def _probed(self, slot: Slot, kind: str, probing: Probing, passed: bool) -> None:
        if passed:
            probing.successes, probing.failures = probing.successes + 1, 0
        else:
            probing.successes, probing.failures = 0, probing.failures + 1
        if kind == "readiness":
            if passed and probing.successes >= probing.probe.success_threshold:
                slot.state.ready = True
            elif not passed and (probing.failures >= probing.probe.failure_threshold or not slot.state.ready):
                slot.state.ready = False
        elif not passed and probing.failures >= probing.probe.failure_threshold and slot.run is not None:
            self.kubelet.event(
                self.pod, "Normal", "Killing", f"Container {slot.state.name} failed liveness probe, will be restarted"
            )
            slot.run.stop(podspec.grace_seconds(self.pod))

    # ---- the end ---------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """Stop what runs: together, SIGTERM first, SIGKILL after the grace period."""
        running = [s for s in [*self.init, *self.containers] if s.run is not None and s.run.poll() is None]
        if running:
            self.kubelet.event(self.pod, "Normal", "Killing", f"Stopping containers {[s.state.name for s in running]}")
        for slot in running:
            assert slot.run is not None
            slot.run.terminate()
        deadline = time.monotonic() + self._grace
        for slot in running:
            assert slot.run is not None
            slot.run.stop(max(0.0, deadline - time.monotonic()))
        self.state.stopping = True
        for slot in [*self.init, *self.containers]:
            if slot.run is not None:
                self._ended(slot)
            slot.state.will_restart = False
        self._write_status()
        self._free_network()
        if not self._stopping.is_set():  # ended by itself: its status stays until the pod is deleted
            self._stopping.wait()

    def _kill_all(self) -> None:
        for slot in [*self.init, *self.containers]:
            if slot.run is not None:
                slot.run.kill()

    def _free_network(self) -> None:
        """Delete the pod's network namespace, killing whatever is left in it."""
        if self.network is not None:
            self.kubelet.network.remove_pod(self.network)
            self.network = None

    def _release(self) -> None:
        """Free the network and the pod's folder; the logs stay."""
        self._free_network()
        self.kubelet.names.remove_view(self.folder / "hosts")
        shutil.rmtree(self.folder, ignore_errors=True)

    def _finalize(self) -> None:
        """Delete the pod for good (grace 0), as a kubelet does once its containers are gone."""
        meta = self.pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            self.kubelet.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s: finalizing failed: %s", self.key, exc)

    def _write_status(self) -> None:
        if self._gone:
            return
        status = pod_status(self.state, self.pod.get("status") or {}, time.time())
        if status == self._written:
            return
        meta = self.pod["metadata"]
        try:
            self.pod = self.kubelet.api.request(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                body={"metadata": {"uid": self.uid}, "status": status},
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                self.stop(0, gone=True)
                return
            log.warning("pod %s: status write failed: %s", self.key, exc)
            return
        self._written = status

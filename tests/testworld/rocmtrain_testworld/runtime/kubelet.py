"""TEST-ONLY: the process runtime's node agent: its nodes, the pods bound to them, and the names.

- registers the process nodes and keeps them Ready (status and Lease every
  `HEARTBEAT_SECONDS`), as a kubelet does;
- lists and watches every pod, and runs (in a `PodWorker` each) exactly those
  bound to its nodes; a deleted pod is stopped and finalized;
- keeps the names in step with Services: `<svc>.<ns>.svc.cluster.local` (and the
  shorter `<svc>.<ns>.svc`, `<svc>.<ns>`) resolve to the addresses of the
  selected pods that this runtime runs (ready ones, or all with
  publishNotReadyAddresses: as a headless Service's DNS answers), and to the
  addresses on the pod network of its EndpointSlices: every one of a Service
  without a selector, and of a selector Service those that the endpointslice
  controller does not manage (`endpointslice.kubernetes.io/managed-by`), as real
  Kubernetes keeps such slices beside its own. That is how a process outside
  the pods, such as the operator's progress endpoint, is given a name
  (`runtime.expose_host_endpoints`), also that of a Helm release's Service,
  whose selected pod runs on a kwok node. The names reach KubeRay and Kueue
  through the world's name sandbox and every pod through its hosts file. No Service gets a
  virtual IP: nothing routes one here, so a client uses the pods' own ports.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.nodes import ProcessNode, heartbeat, register_process
from rocmtrain_testworld.runtime import ENDPOINTSLICE_CONTROLLER, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from rocmtrain_testworld.runtime.network import Network
from rocmtrain_testworld.runtime.pod import PodWorker
from rocmtrain_testworld.runtime.podspec import CLUSTER_DOMAIN
from rocmtrain_testworld.sandbox import LoopbackNames

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0
NAMES_SECONDS = 1.0
WATCH_SECONDS = 300
COMPONENT = "process-runtime"


def service_names(name: str, namespace: str) -> list[str]:
    return [f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}", f"{name}.{namespace}.svc", f"{name}.{namespace}"]


class Kubelet:
    """See the module docstring."""

    def __init__(
        self,
        api: KubeCluster,
        folder: Path,
        logs: Path,
        nodes: list[str],
        names: LoopbackNames,
        network: Network,
        python_bin: Path,
        image: Path,
    ) -> None:
        """``folder``: the pods' folders; ``logs``: their containers' logs; ``python_bin`` and the checkout
        ``image``: what stands in for the image."""
        self.api = api
        self.pods_dir = folder / "pods"
        self.logs_dir = logs
        # No overlay may cover these (see container.mount_script): the runtime's own files and the image.
        self.forbidden = tuple(str(p.resolve()) for p in (folder, logs, names.hosts.parent, python_bin.parent))
        self.names = names
        self.network = network
        self.python_bin = python_bin
        self.image = (str(image.resolve()), str(python_bin.parent.resolve()))
        self.nodes = [ProcessNode(name, network.host_address) for name in nodes]
        self.allocatable = self.nodes[0].resources
        self._node_names = {n.name for n in self.nodes}
        self._workers: dict[str, PodWorker] = {}
        self._started: set[str] = set()  # uids given a worker once: a pod is never run twice
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        for node in self.nodes:
            register_process(self.api, node)
        for target, name in ((self._heartbeats, "heartbeats"), (self._watch, "pod watch"), (self._sync_names, "names")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self, grace: float = 5.0) -> None:
        """Stop every pod (SIGTERM, SIGKILL after ``grace``) without writing to the API, then the threads."""
        self._stopping.set()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.stop(grace, gone=True)
        for worker in workers:
            worker.join(grace + 30)

    # ---- pods ----------------------------------------------------------------------------

    def forget(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)

    def _observe(self, kind: str, pod: dict[str, Any]) -> None:
        """One pod event (or a listed pod, as MODIFIED)."""
        if (pod.get("spec") or {}).get("nodeName") not in self._node_names or self._stopping.is_set():
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is None and kind != "DELETED" and uid not in self._started:
                if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
                    "Succeeded",
                    "Failed",
                ):
                    worker = None  # never started here, or ended before this runtime started
                else:
                    worker = self._workers[uid] = PodWorker(self, pod)
                    self._started.add(uid)
                    worker.start()
                    return
        if worker is None:
            if kind != "DELETED" and pod["metadata"].get("deletionTimestamp"):
                self._finalize_unknown(pod)
            return
        if kind == "DELETED":
            worker.stop(0, gone=True)
        else:
            worker.update(pod)

    def _finalize_unknown(self, pod: dict[str, Any]) -> None:
        """A pod on our node that nothing runs: delete it for good, as the kubelet would."""
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(ApiException):
            self.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)

    def _watch(self) -> None:
        core = k8s.CoreV1Api(self.api.api_client())
        while not self._stopping.is_set():
            try:
                listed = self.api.request("GET", "/api/v1/pods")
                seen = set()
                for pod in listed["items"]:
                    seen.add(pod["metadata"]["uid"])
                    self._observe("MODIFIED", pod)
                with self._lock:
                    vanished = [w for uid, w in self._workers.items() if uid not in seen]
                for worker in vanished:
                    worker.stop(0, gone=True)
                version = listed["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    core.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=False,
                )
                for event in stream:
                    if self._stopping.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._observe(event["type"], event["raw_object"])
            except Exception as exc:  # a dropped connection, 410 Gone: list again
                if not self._stopping.is_set():
                    log.info("pod watch restarts: %s", exc)
                    time.sleep(1)

    # ---- nodes ---------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self._stopping.wait(HEARTBEAT_SECONDS):
            for node in self.nodes:
                try:
                    heartbeat(self.api, node)
                except Exception as exc:
                    log.warning("heartbeat of %s failed: %s", node.name, exc)

    # ---- names ---------------------------------------------------------------------------

    def _sync_names(self) -> None:
        while not self._stopping.is_set():
            try:
                self.names.replace(self.service_addresses())
            except Exception as exc:
                log.warning("names not updated: %s", exc)
            self._stopping.wait(NAMES_SECONDS)

    def service_addresses(self) -> dict[str, list[str]]:
        """Name -> addresses of every Service that has some here (see the module docstring)."""
        with self._lock:
            pods = [(w.pod, w.state.pod_ip, w.ready) for w in self._workers.values() if w.running]
        services = self.api.request("GET", "/api/v1/services")["items"]
        slices = self.api.request("GET", "/apis/discovery.k8s.io/v1/endpointslices")["items"]
        subnet = self.network.subnet
        found: dict[str, list[str]] = {}
        for service in services:
            meta, spec = service["metadata"], service.get("spec") or {}
            selector: Mapping[str, str] = spec.get("selector") or {}
            addresses = [
                ip
                for pod, ip, ready in pods
                if selector
                and ip
                and pod["metadata"]["namespace"] == meta["namespace"]
                and all((pod["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                and (ready or spec.get("publishNotReadyAddresses"))
            ]
            # A selector Service's own slices (the endpointslice controller's) would list those pods again;
            # any other slice of it adds addresses, as every slice of a Service without a selector does.
            addresses += [
                address
                for piece in slices
                if piece["metadata"]["namespace"] == meta["namespace"]
                and (labels := piece["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == meta["name"]
                and not (selector and labels.get(MANAGED_BY_LABEL) == ENDPOINTSLICE_CONTROLLER)
                for endpoint in piece.get("endpoints") or []
                if (endpoint.get("conditions") or {}).get("ready", True)
                for address in endpoint.get("addresses") or []
                if subnet is not None and _in(address, subnet)
            ]
            for name in service_names(meta["name"], meta["namespace"]) if addresses else ():
                found[name] = sorted(set(addresses))
        return found

    # ---- events --------------------------------------------------------------------------

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Post an event on the pod, as the kubelet does (best effort)."""
        meta = pod["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT, "host": (pod.get("spec") or {}).get("nodeName", "")},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiException):
            self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)


def _in(address: str, subnet: Any) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address) in subnet
    except ValueError:
        return False

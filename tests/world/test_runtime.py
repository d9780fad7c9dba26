"""The process runtime (TEST-ONLY, runtime/): pods of a served namespace really run, as a kubelet runs them.

Each test fails without the behaviour it names: commands with the pod's
environment and volumes, exit codes in the status, honest readiness, restarts,
deletion down to the last process, and Service names that resolve to pod addresses (and to this
machine's, through an EndpointSlice, also beside a Service's selector).
"""

from __future__ import annotations

import base64
import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rocmtrain_testworld import runtime
from rocmtrain_testworld.paths import REPO_ROOT
from rocmtrain_testworld.runtime.container import processes_in
from rocmtrain_testworld.world import Scope, World

pytestmark = pytest.mark.cluster


@pytest.fixture
def runs_pods(world: World) -> None:
    if world.runtime is None:
        reason = f"no process runtime here: {runtime.network.available()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def ns(runs_pods: None, scope: Scope) -> str:
    return scope.namespace("rt", processes=True)


def pod(name: str, namespace: str, script: str, **spec: Any) -> dict[str, Any]:
    """A pod whose container runs ``script`` with the stand-in image's Python (PID 1 of its container,
    where SIGTERM without a handler does nothing: a short grace period ends it quickly)."""
    container = {"name": "main", "image": "example.com/any:1", "command": ["python", "-c", textwrap.dedent(script)]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 2, **spec},
    }


def get(world: World, namespace: str, name: str) -> dict[str, Any]:
    return world.cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")


def ended(world: World, namespace: str, name: str) -> dict[str, Any]:
    return world.cluster.wait_for(
        lambda: (
            get(world, namespace, name)["status"].get("phase") in ("Succeeded", "Failed")
            and get(world, namespace, name)
        ),
        90,
        f"pod {name} to end",
    )


def output(world: World, namespace: str, name: str, container: str = "main") -> str:
    return (world.workdir / "logs" / "pods" / namespace / name / f"{container}.log").read_text()


def test_a_pod_runs_with_its_environment_volumes_and_address(world: World, ns: str) -> None:
    cluster = world.cluster
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": ns},
            "data": {"greeting": "hello"},
        }
    )
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sec", "namespace": ns},
            "data": {"password": base64.b64encode(b"s3cret").decode()},
        }
    )
    script = """
        import json, os, socket, pathlib
        out = {
            "env": {k: os.environ.get(k) for k in ("POD_IP", "POD_NAME", "APP", "CPU", "GREETING", "EXPANDED", "HOME")},
            "hostname": socket.gethostname(),
            "own": socket.gethostbyname(socket.gethostname()),
            "secret": pathlib.Path("/etc/sec/password").read_text(),
            "token": pathlib.Path("/var/run/secrets/test/token").read_text(),
            "shm": os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize,
            "pid": os.getpid(),
            # Its working folder by its path (as multiprocessing's spawn finds it) and a /tmp of its own.
            "cwd": os.path.isdir(os.getcwd()),
            "tmp": sorted(os.listdir("/tmp")),
        }
        try:
            socket.create_connection(("1.1.1.1", 80), timeout=3)
            out["outside"] = "reached"
        except OSError as exc:
            out["outside"] = type(exc).__name__
        print("RESULT " + json.dumps(out))
    """
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
        {"name": "EXPANDED", "value": "$(GREETING) from $(POD_NAME)"},
    ]
    mounts = [
        {"name": "sec", "mountPath": "/etc/sec", "readOnly": True},
        {"name": "token", "mountPath": "/var/run/secrets/test", "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes = [
        {"name": "sec", "secret": {"secretName": "sec"}},
        {
            "name": "token",
            "projected": {"sources": [{"serviceAccountToken": {"audience": "test.example", "path": "token"}}]},
        },
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "tmp", "emptyDir": {}},  # as the operator's Ray pods have (a read-only root elsewhere)
    ]
    resources = {"limits": {"cpu": "2", "memory": "256Mi"}}
    cluster.create(
        pod("env", ns, script, container={"env": env, "volumeMounts": mounts, "resources": resources}, volumes=volumes)
    )

    done = ended(world, ns, "env")
    assert done["spec"]["nodeName"] in runtime.PROCESS_NODES  # the namespace's annotations sent it there
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    line = next(line for line in output(world, ns, "env").splitlines() if line.startswith("RESULT "))
    found = json.loads(line.removeprefix("RESULT "))
    address = done["status"]["podIP"]
    assert address != runtime.info(world.workdir)["hostAddress"] and not address.startswith("127.")
    assert found["env"]["POD_IP"] == address and found["own"] == address, "the pod's own address, by its hostname"
    assert found["hostname"] == "env" and found["env"]["APP"] == "env" and found["env"]["CPU"] == "2"
    assert found["env"]["EXPANDED"] == "hello from env"
    assert found["secret"] == "s3cret"
    assert found["shm"] == 64 << 20 and found["pid"] == 1, (
        "a /dev/shm of its own size; the command is PID 1 of its own namespace"
    )
    # A checkout under /tmp (the stand-in image) is bound back at its path, over the pod's /tmp.
    image = REPO_ROOT.resolve()
    image_in_tmp = {image.relative_to("/tmp").parts[0]} if image.is_relative_to("/tmp") else set()
    assert found["cwd"] and set(found["tmp"]) <= {"ray"} | image_in_tmp, "a /tmp of its own hides nothing the pod needs"
    assert found["outside"] != "reached", "nothing beyond this machine is reachable from a pod"
    # The token is the pod's own: bound to it, with the audience the pod asked for.
    review = cluster.request(
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": found["token"], "audiences": ["test.example"]},
        },
    )["status"]
    assert review["authenticated"] and review["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["env"]


@pytest.mark.usefixtures("runs_pods")
def test_every_namespace_runs_its_pods_here_apart_from_those_annotated_for_kwok(world: World, scope: Scope) -> None:
    person = scope.namespace("person", processes=None)  # as `kubectl create namespace` makes it
    fake = scope.namespace("fake")  # a test's kwok namespace
    for namespace in (person, fake):
        world.cluster.create(pod("where", namespace, "print('ran here')"))

    done = ended(world, person, "where")
    assert done["spec"]["nodeName"] in runtime.PROCESS_NODES
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert "ran here" in output(world, person, "where")
    bound = world.cluster.wait_for(
        lambda: get(world, fake, "where")["spec"].get("nodeName"), 60, "the kwok namespace's pod to be bound"
    )
    assert bound in world.nodes
    assert bound not in runtime.PROCESS_NODES


def test_exit_codes_restarts_and_the_log_tail_of_a_failure(world: World, ns: str, tmp_path: Path) -> None:
    cluster = world.cluster
    cluster.create(
        pod(
            "fails",
            ns,
            "import sys; print('bad input'); sys.exit(3)",
            container={"terminationMessagePolicy": "FallbackToLogsOnError"},
        )
    )
    counter = tmp_path / "attempts"
    flaky = f"""
        import pathlib, sys
        p = pathlib.Path({str(counter)!r})
        n = int(p.read_text()) if p.exists() else 0
        p.write_text(str(n + 1))
        sys.exit(0 if n else 1)
    """
    cluster.create(pod("flaky", ns, flaky, restartPolicy="OnFailure"))
    failed = ended(world, ns, "fails")
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert failed["status"]["phase"] == "Failed" and terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert "bad input" in terminated["message"]
    # OnFailure: restarted after the kubelet's back-off (10 s), then it succeeds.
    recovered = ended(world, ns, "flaky")
    assert recovered["status"]["phase"] == "Succeeded"
    status = recovered["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 1


def test_readiness_is_the_probes_and_deletion_ends_every_process(world: World, ns: str, tmp_path: Path) -> None:
    cluster = world.cluster
    flag = tmp_path / "ready"
    # A server that forks a child which ignores SIGTERM: only SIGKILL after the grace period ends it.
    script = f"""
        import os, pathlib, signal, time
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True: time.sleep(1)
        time.sleep(2)
        pathlib.Path({str(flag)!r}).write_text("yes")
        while True: time.sleep(1)
    """
    probe = {"exec": {"command": ["cat", str(flag)]}, "periodSeconds": 1}
    cluster.create(pod("server", ns, script, terminationGracePeriodSeconds=3, container={"readinessProbe": probe}))

    def ready() -> bool:
        conditions = {c["type"]: c["status"] for c in get(world, ns, "server")["status"].get("conditions", [])}
        return conditions.get("Ready") == "True"

    running = world.cluster.wait_for(
        lambda: get(world, ns, "server")["status"].get("phase") == "Running", 60, "Running"
    )
    assert running and not flag.exists() and not ready(), "not Ready before the probe passes"
    world.cluster.wait_for(ready, 30, "the readiness probe to pass")
    record = runtime.pod_records(world.workdir)[f"{ns}/server"]
    namespace = f"net:[{record['netnsInode']}]"
    assert len(processes_in(namespace, "net")) >= 2

    cluster.delete(get(world, ns, "server"))
    world.cluster.wait_for(
        lambda: not cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"], 30, "the pod to be finalized"
    )
    assert processes_in(namespace, "net") == [], "no process of the pod is left"


def test_an_http_readiness_probe_asks_the_pods_address_on_a_named_port(world: World, ns: str, tmp_path: Path) -> None:
    """KubeRay v1.6 probes Ray pods with httpGet (the Ray agent's health path): the runtime asks the pod's address,
    as the kubelet does, and 200 to 399 pass."""
    flag = tmp_path / "healthy"
    script = f"""
        import http.server, pathlib
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/healthz" and pathlib.Path({str(flag)!r}).exists()
                self.send_response(200 if ok else 503)
                self.end_headers()
        http.server.HTTPServer(("0.0.0.0", 8081), Health).serve_forever()
    """
    probe = {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 1}
    container = {"ports": [{"name": "health", "containerPort": 8081}], "readinessProbe": probe}
    world.cluster.create(pod("web", ns, script, container=container))

    def ready() -> bool:
        conditions = {c["type"]: c["status"] for c in get(world, ns, "web")["status"].get("conditions", [])}
        return conditions.get("Ready") == "True"

    world.cluster.wait_for(lambda: get(world, ns, "web")["status"].get("phase") == "Running", 60, "Running")
    time.sleep(3)  # three probes answered 503
    assert not ready()
    flag.write_text("yes")
    world.cluster.wait_for(ready, 30, "the httpGet probe to pass")


def test_service_names_resolve_to_pods_and_to_this_machine(world: World, ns: str) -> None:
    cluster = world.cluster
    cluster.create(
        pod(
            "web",
            ns,
            "import http.server as h; h.HTTPServer(('0.0.0.0', 8000), h.SimpleHTTPRequestHandler).serve_forever()",
        )
    )
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "web"},
                "ports": [{"port": 8000}],
            },
        }
    )
    host = runtime.info(world.workdir)["hostAddress"]
    runtime.expose_host_service(cluster, ns, "outside", host, 1)
    # A Service with a selector whose pod runs elsewhere (a Helm release's, on a kwok node): this machine's
    # EndpointSlice beside it adds its address; one the endpointslice controller would keep adds nothing.
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "chart", "namespace": ns},
            "spec": {"selector": {"app": "on-kwok"}, "ports": [{"port": 443}]},
        }
    )
    runtime.expose_host_endpoints(cluster, ns, "chart", host, 1)
    controllers = host.rsplit(".", 1)[0] + ".250"  # on the pod network, no pod's
    cluster.create(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "chart-controllers",
                "namespace": ns,
                "labels": {
                    runtime.SERVICE_NAME_LABEL: "chart",
                    runtime.MANAGED_BY_LABEL: runtime.ENDPOINTSLICE_CONTROLLER,
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [controllers], "conditions": {"ready": True}}],
            "ports": [{"port": 1, "protocol": "TCP"}],
        }
    )
    client = f"""
        import socket, time, urllib.request
        for _ in range(60):
            try:
                urllib.request.urlopen("http://web.{ns}.svc.cluster.local:8000/", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        else:
            raise SystemExit("web never answered")
        print("OUTSIDE " + socket.gethostbyname("outside.{ns}.svc"))
        chart = [line.split()[0] for line in open("/etc/hosts") if line.split()[1:] == ["chart.{ns}.svc"]]
        print("CHART " + " ".join(chart))
    """
    cluster.create(pod("client", ns, client))
    done = ended(world, ns, "client")
    assert done["status"]["phase"] == "Succeeded", output(world, ns, "client")
    assert f"OUTSIDE {host}" in output(world, ns, "client")
    assert f"CHART {host}\n" in output(world, ns, "client")

"""Ray pods that cannot run, explained on the job (the world: real kube-scheduler and KubeRay, kwok pods).

A Ray pod can be stuck four ways; each raises `RayPodsUnavailable` with a reason and
the scheduler's or the kubelet's own words, posts one event, and clears when the cause
goes away. The scheduler's verdicts are its own; the kubelet's states and messages are
played by kwok (rocmtrain_testworld/kwok_behaviours.yaml): there are no containers here.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from operator_testkit import SMALL, WORLD_TIMEOUT, Api, Operator, wait_until

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain_testworld import kuberay, kwok, runtime
from rocmtrain_testworld.nodes import MI300X_LABELS, PRODUCT_LABEL
from rocmtrain_testworld.world import Scope, World

pytestmark = pytest.mark.cluster

CONDITION = ConditionType.RAY_PODS_UNAVAILABLE
MI300X = MI300X_LABELS[PRODUCT_LABEL]


def pods_condition(api: Api, ns: str, name: str) -> dict[str, Any]:
    return api.condition(ns, name, CONDITION)


def wait_condition(api: Api, ns: str, name: str, state: str, reason: str) -> dict[str, Any]:
    def check(_: dict[str, Any]) -> bool:
        found = pods_condition(api, ns, name)
        return found.get("status") == state and found.get("reason") == reason

    api.wait_status(ns, name, f"{CONDITION}={state} ({reason})", check)
    return pods_condition(api, ns, name)


def warnings(api: Api, ns: str, name: str) -> list[tuple[str, str]]:
    return [(reason, message) for kind, reason, message in api.event_messages(ns, name) if kind == "Warning"]


def worker(api: Api, ns: str, name: str) -> dict[str, Any]:
    (pod,) = kuberay.ray_pods(api.kube, ns, api.status(ns, name)["rayClusterName"], "worker")
    return pod


def test_a_worker_the_scheduler_cannot_place_is_explained_until_it_runs(world: World, world_api: Api, world_ns: str):
    """The issue's case: another workload holds the GPUs, one worker stays Pending."""
    api, ns = world_api, world_ns
    gpus = {"limits": {"amd.com/gpu": "8", "cpu": "1", "memory": "1Gi"}}
    blocker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holds-8-gpus", "namespace": ns},
        "spec": {
            "nodeSelector": {PRODUCT_LABEL: MI300X},
            "containers": [{"name": "main", "image": "rocm/pytorch:latest", "resources": gpus}],
        },
    }
    api.kube.create(blocker)
    wait_until(
        lambda: api.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/holds-8-gpus")["spec"].get("nodeName"),
        timeout=WORLD_TIMEOUT,
        what="the blocker scheduled",
    )
    two_nodes = {"workers": 2, "gpusPerWorker": 8, "gpu": {"productName": MI300X}}
    api.create_job(ns, "bert", timeout=WORLD_TIMEOUT, resources=two_nodes)

    stuck = wait_condition(api, ns, "bert", "True", "Unschedulable")
    pending = [
        p for p in kuberay.ray_pods(api.kube, ns, api.status(ns, "bert")["rayClusterName"], "worker")
        if not p["spec"].get("nodeName")
    ]  # fmt: skip
    (pod,) = pending
    scheduler = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
    assert stuck["message"] == f"pod {pod['metadata']['name']}: {scheduler}"
    # The scheduler weighed every node of the world: the kwok GPU nodes, and the process runtime's where it runs.
    nodes = len(world.nodes)
    assert scheduler.startswith(f"0/{nodes} nodes are available:") and "Insufficient amd.com/gpu" in scheduler
    assert api.status(ns, "bert")["workersReady"] == 1
    assert "(1/2 workers ready)" in api.condition(ns, "bert", ConditionType.READY)["message"]

    api.kube.delete(blocker)
    wait_condition(api, ns, "bert", "False", Reason.RAY_PODS_AVAILABLE)
    api.wait_status(ns, "bert", "both workers ready", lambda s: s.get("workersReady") == 2)
    assert warnings(api, ns, "bert") == [("Unschedulable", stuck["message"])]


def test_image_pull_crash_loop_and_failed_containers_are_explained_and_cleared(
    world: World, world_api: Api, world_ns: str
):
    api, ns = world_api, world_ns
    # The workers' image cannot be pulled from the start (kwok plays the kubelet).
    script = kwok.script(api.kube, ns, "image-pull-error", labels={"ray.io/node-type": "worker"})
    api.create_job(ns, "bert", timeout=WORLD_TIMEOUT, resources=SMALL)
    pulling = wait_condition(api, ns, "bert", "True", "ImagePullBackOff")
    pod = worker(api, ns, "bert")
    name, image = pod["metadata"]["name"], pod["spec"]["containers"][0]["image"]
    assert pulling["message"].startswith(f"pod {name}: container ray-worker ")
    assert image in pulling["message"]
    back_off = f'pod {name}: container ray-worker ImagePullBackOff: Back-off pulling image "{image}"'
    api.wait_status(ns, "bert", "the back-off", lambda _: pods_condition(api, ns, "bert")["message"] == back_off)
    kwok.delete_stage(api.kube, script)
    cases = [
        ("crash-loop", None, "CrashLoopBackOff", f"pod {name}: container ray-worker CrashLoopBackOff: back-off 10s "
         f"restarting failed container=ray-worker pod={name}_{ns}({pod['metadata']['uid']}) (last exit code 1)"),
        ("exit", 137, "ContainerFailed", f"pod {name}: container ray-worker exited with code 137 (Error)"),
    ]  # fmt: skip
    kwok.set_behaviour(api.kube, pod, "running")
    wait_condition(api, ns, "bert", "False", Reason.RAY_PODS_AVAILABLE)
    for behaviour, code, reason, message in cases:
        kwok.set_behaviour(api.kube, pod, behaviour, exit_code=code)
        assert wait_condition(api, ns, "bert", "True", reason)["message"] == message
        kwok.set_behaviour(api.kube, pod, "running")
        wait_condition(api, ns, "bert", "False", Reason.RAY_PODS_AVAILABLE)
    assert api.status(ns, "bert")["workersReady"] == 1
    # One event per cause: the pull error's two kubelet states (ErrImagePull, then ImagePullBackOff) are one cause.
    causes = ["ImagePullBackOff", "CrashLoopBackOff", "ContainerFailed"]
    assert [reason for reason, _ in warnings(api, ns, "bert")] == causes


def test_a_worker_pod_the_api_server_refuses_is_explained_with_its_words(world_api: Api, world_ns: str):
    """A ResourceQuota lets the head in and refuses the worker: no pod exists to show it, KubeRay's
    ReplicaFailure condition (in the RayJob's copy of the RayCluster's status) says why."""
    api, ns = world_api, world_ns
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "one-pod", "namespace": ns},
        "spec": {"hard": {"pods": "1"}},
    }
    api.kube.create(quota)
    api.create_job(ns, "bert", timeout=WORLD_TIMEOUT, resources=SMALL)
    refused = wait_condition(api, ns, "bert", "True", Reason.POD_CREATION_FAILED)
    # "exceeded quota: one-pod", or "status unknown for quota: one-pod" before the controller-manager counted.
    assert refused["message"].startswith("KubeRay cannot create the worker pod: ")
    assert " is forbidden: " in refused["message"] and "quota: one-pod" in refused["message"]
    assert api.phase(ns, "bert") == "Initializing"
    # One event for the cause, though the message changes with each retry's pod name. The operator
    # posts it after it writes the condition.
    posted = wait_until(lambda: warnings(api, ns, "bert"), timeout=WORLD_TIMEOUT, what="the warning event")
    ((reason, message),) = posted
    assert reason == Reason.POD_CREATION_FAILED and "quota: one-pod" in message
    api.kube.delete(quota)
    api.wait_status(ns, "bert", "the worker ready", lambda s: s.get("workersReady") == 1)
    wait_condition(api, ns, "bert", "False", Reason.RAY_PODS_AVAILABLE)
    assert warnings(api, ns, "bert") == posted


def test_a_configmap_the_job_mounts_and_nobody_made_is_named_on_the_job(
    world: World, world_api: Api, world_operator: Operator, scope: Scope
):
    """The issue's case: the job's code ConfigMap was never created, and its pods sat in ContainerCreating.
    Only an event on the pod says why (FailedMount); here the process runtime, the world's TEST-ONLY kubelet of
    its CPU nodes, mounts the volumes and posts it as a kubelet does (kwok's nodes mount nothing)."""
    if world.runtime is None:
        reason = f"no process runtime here: {runtime.network.available()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    api, ns = world_api, scope.namespace("mount", processes=True)
    code = {"volumes": [{"name": "code", "configMap": {"name": "recipe"}}]}
    api.create_job(ns, "blog", timeout=WORLD_TIMEOUT, resources=SMALL, **code,
                   volumeMounts=[{"name": "code", "mountPath": "/code"}])  # fmt: skip
    missing = wait_condition(api, ns, "blog", "True", Reason.FAILED_MOUNT)
    assert missing["message"].startswith("pod") and 'configmap "recipe" not found' in missing["message"], missing
    assert api.phase(ns, "blog") == "Initializing"
    posted = wait_until(lambda: warnings(api, ns, "blog"), timeout=WORLD_TIMEOUT, what="the warning event")
    assert [reason for reason, _ in posted] == [Reason.FAILED_MOUNT]

"""Sharing a GPU pool with real Kueue (the world): the objects of examples/gpu-pool, the operator's jobs.

The pool's flavors, ClusterQueues and priorities are the example's, applied as they are
(`kustomize build examples/gpu-pool`); each test makes its own namespaces with
LocalQueues pointing at the example's ClusterQueues. Kueue decides everything here:
what is admitted, with which flavor, what waits and why, what is preempted. The
job's status must carry Kueue's own words.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from operator_testkit import (
    REPO,
    WORLD_TIMEOUT,
    Api,
    Operator,
    job_manifest,
    kustomize_build,
    submitting,
    wait_until,
)

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.models import DEFAULT_IMAGE
from rocmtrain.api.quantity import parse_quantity
from rocmtrain.api.timestamps import parse_time, rfc3339
from rocmtrain_testworld import kuberay, kueue, kwok
from rocmtrain_testworld.nodes import MI250_LABELS, MI300X_LABELS, PRODUCT_LABEL, FakeNode, register_kwok
from rocmtrain_testworld.world import Scope, World

pytestmark = pytest.mark.cluster

GPU = "amd.com/gpu"
MI250 = MI250_LABELS[PRODUCT_LABEL]
ONE_NODE = {"workers": 1, "gpusPerWorker": 8}  # one MI300X node's GPUs
OTHER_IMAGE = "registry.example.com/team-a/train:1.0"  # allowed until the allow-list tightens
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"


@pytest.fixture(scope="module")
def gpu_pool(world: World) -> Iterator[dict[str, dict[str, Any]]]:
    """The example's flavors, ClusterQueues and priorities in the world (its namespaces and LocalQueues not:
    tests make their own); the example's ClusterQueues by name."""
    pool = kustomize_build(REPO / "examples" / "gpu-pool")
    shared = [obj for obj in pool if obj["kind"] not in ("Namespace", "LocalQueue")]
    for obj in shared:
        world.cluster.apply(obj)
    yield {obj["metadata"]["name"]: obj for obj in shared if obj["kind"] == "ClusterQueue"}
    for obj in reversed(shared):
        world.cluster.delete(obj)


def team_namespace(scope: Scope, cluster_queue: str, queue: str | None = None) -> str:
    """A fresh namespace with a LocalQueue (named `queue`, default: like the ClusterQueue) into `cluster_queue`,
    once no Workload of an earlier test holds quota of the pool any more."""

    def idle(name: str) -> bool:
        status = scope.cluster.request("GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{name}").get("status", {})
        return not status.get("reservingWorkloads") and not status.get("admittedWorkloads")

    scope.cluster.wait_for(lambda: idle("team-a") and idle("team-b"), WORLD_TIMEOUT, "the GPU pool to be idle")
    ns = scope.namespace("pool")
    scope.cluster.apply(kueue.local_queue(ns, queue or cluster_queue, cluster_queue))
    return ns


def gpu_limit(cluster_queue: dict[str, Any], flavor: str) -> int:
    """nominalQuota + borrowingLimit of the GPUs of `flavor` in the ClusterQueue."""
    for group in cluster_queue["spec"]["resourceGroups"]:
        for entry in group["flavors"]:
            for resource in entry["resources"] if entry["name"] == flavor else ():
                if resource["name"] == GPU:
                    return int(resource["nominalQuota"]) + int(resource.get("borrowingLimit", 0))
    raise AssertionError(f"no {GPU} quota for {flavor}")


def workload(api: Api, ns: str, name: str) -> dict[str, Any] | None:
    rayjob = api.rayjob(ns, name)
    found = kueue.workloads(api.kube, ns, rayjob["metadata"]["uid"]) if rayjob else []
    return found[0] if found else None


def kueue_condition(api: Api, ns: str, name: str, kind: str) -> dict[str, Any]:
    conditions = ((workload(api, ns, name) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def admitted_gpus(api: Api, ns: str) -> dict[str, int]:
    """GPUs of the Workloads of `ns` that hold quota right now (reserved and not finished), by flavor."""
    used: dict[str, int] = {}
    for item in api.kube.request("GET", WORKLOADS.format(ns=ns))["items"]:
        status = item.get("status") or {}
        true = {c["type"] for c in status.get("conditions") or [] if c["status"] == "True"}
        if "QuotaReserved" not in true or "Finished" in true:
            continue
        for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
            if GPU in assignment.get("resourceUsage", {}):
                flavor = assignment["flavors"][GPU]
                used[flavor] = used.get(flavor, 0) + int(parse_quantity(assignment["resourceUsage"][GPU]))
    return used


class Sampler(threading.Thread):
    """Samples `measure()` every 0.1 s in the background; `peak` is the largest value seen."""

    def __init__(self, measure: Any) -> None:
        super().__init__(daemon=True)
        self.measure, self.peak, self.samples = measure, 0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, self.measure())
            self.samples += 1
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


def finish(api: Api, ns: str, name: str) -> None:
    """End the job: its submitter pod exits 1, KubeRay fails the submission, the job is over."""
    pod = wait_until(
        lambda: [p for p in kuberay.submitter_pods(api.kube, ns, name) if p["status"].get("phase") == "Running"],
        timeout=WORLD_TIMEOUT,
        what=f"{name}'s submitter running",
    )[0]
    kwok.set_behaviour(api.kube, pod, "exit", exit_code=1)
    api.wait_status(ns, name, "Failed", lambda s: s.get("phase") == "Failed")


def queued(status: dict[str, Any]) -> bool:
    return status.get("phase") == "Queued"


# ---- quota -----------------------------------------------------------------------------------------


def test_jobs_beyond_the_quota_wait_with_kueues_reason_and_start_as_others_finish(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    api = world_api
    ns = team_namespace(scope, "team-a")
    limit = gpu_limit(gpu_pool["team-a"], "mi300x")  # 8 of its own + 8 borrowed from team-b, idle
    sampler = Sampler(lambda: admitted_gpus(api, ns).get("mi300x", 0))
    sampler.start()
    try:
        names = ["one", "two", "three"]
        for name in names:
            api.kube.create(job_manifest(name, ns, resources=ONE_NODE, scheduling={"queueName": "team-a"}))

        def two_started() -> list[str] | None:
            done = [name for name in names if submitting(api.status(ns, name))]
            return done if len(done) == 2 else None

        started = wait_until(two_started, timeout=WORLD_TIMEOUT, what="two jobs admitted and started")
        (waiting,) = set(names) - set(started)
        api.wait_status(ns, waiting, "Queued", queued)
        # Kueue's own reason, word for word: what is missing, in which flavor.
        reserved = wait_until(
            lambda: kueue_condition(api, ns, waiting, "QuotaReserved").get("message"),
            timeout=WORLD_TIMEOUT,
            what="Kueue",
        )
        assert f"insufficient unused quota for {GPU} in flavor mi300x, 8 more needed" in reserved, reserved
        expected = f"waiting in Kueue queue team-a: {reserved}"
        for kind in ("Admitted", "Ready"):
            wait_until(
                lambda k=kind: api.condition(ns, waiting, k).get("message") == expected,
                timeout=WORLD_TIMEOUT,
                what=f"{kind} message",
            )
            assert api.condition(ns, waiting, kind)["reason"] == Reason.QUEUED_BY_KUEUE
        assert api.rayjob(ns, waiting)["spec"]["suspend"] is True

        finish(api, ns, started[0])
        api.wait_status(ns, waiting, "admitted and started as the other finished", submitting)
        admitted = api.condition(ns, waiting, ConditionType.ADMITTED)
        assert admitted["status"] == "True"
        assert admitted["message"] == f"admitted by Kueue queue team-a (ClusterQueue team-a, {GPU} flavor mi300x)"
        wait_until(
            lambda: ("Normal", "Admitted") in api.events(ns, waiting), timeout=WORLD_TIMEOUT, what="the Admitted event"
        )
    finally:
        sampler.stop()
    assert sampler.samples > 10
    assert sampler.peak == limit, f"admitted {sampler.peak} GPUs, quota {limit}"  # used up, never exceeded


# ---- queue estimates ---------------------------------------------------------------------------------

SOLO_QUEUE = "solo"  # no cohort: no quota lent or borrowed


def solo_cluster_queue(gpus: int) -> dict[str, Any]:
    """A ClusterQueue of `gpus` MI300X GPUs (and CPUs and memory) in no cohort, strict FIFO."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": SOLO_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "StrictFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "any-node",
                            "resources": [
                                {"name": "cpu", "nominalQuota": 128},
                                {"name": "memory", "nominalQuota": "1Ti"},
                            ],
                        }
                    ],
                },
                {
                    "coveredResources": [GPU],
                    "flavors": [{"name": "mi300x", "resources": [{"name": GPU, "nominalQuota": gpus}]}],
                },
            ],
        },
    }


def report_eta(api: Api, ns: str, name: str, eta_seconds: float) -> dt.datetime:
    """Write a progress report into the job's status as the progress endpoint writes it; the report's time."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    progress = {"epoch": 0.5, "step": 50, "totalSteps": 100, "percent": 50.0, "etaSeconds": eta_seconds}
    api.kube.request(
        "PATCH",
        f"/apis/rocmtrain.dev/v1alpha1/namespaces/{ns}/rocmtrainingjobs/{name}/status",
        body={"status": {"progress": progress, "lastProgressTime": rfc3339(now)}},
        content_type="application/merge-patch+json",
    )
    return now


def test_a_queued_job_is_told_when_it_will_start_from_the_running_jobs_etas(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    """Two jobs hold the queue's 16 GPUs and report ETAs of 10 s and 15 min; a third waits for 8. Its
    expected start is the first job's end, and it starts then (the first job is ended at its ETA)."""
    api = world_api
    world.cluster.apply(solo_cluster_queue(16))
    try:
        ns = team_namespace(scope, SOLO_QUEUE, "gpus")
        queue = {"queueName": "gpus"}
        for name in ("soon", "late"):
            api.kube.create(job_manifest(name, ns, resources=ONE_NODE, scheduling=queue))
        for name in ("soon", "late"):
            api.wait_status(ns, name, "admitted and started", submitting)
        soon_end = report_eta(api, ns, "soon", 10) + dt.timedelta(seconds=10)
        report_eta(api, ns, "late", 900)
        api.kube.create(job_manifest("waiting", ns, resources=ONE_NODE, scheduling=queue))
        estimate = api.wait_status(
            ns, "waiting", "an expected start", lambda s: queued(s) and (s.get("queue") or {}).get("expectedStartTime")
        )["queue"]
        expected = parse_time(estimate["expectedStartTime"])
        assert expected is not None and abs((expected - soon_end).total_seconds()) <= 1, (estimate, soon_end)
        assert estimate["position"] == 1
        assert "ETA" in estimate["basis"] and SOLO_QUEUE in estimate["basis"], estimate

        time.sleep(max(0.0, (soon_end - dt.datetime.now(dt.UTC)).total_seconds()))
        finish(api, ns, "soon")
        status = api.wait_status(ns, "waiting", "admitted as the first job ended", submitting)
        assert "queue" not in status, "the estimate is removed on admission"
        admitted = parse_time(api.condition(ns, "waiting", ConditionType.ADMITTED)["lastTransitionTime"])
        assert admitted is not None
        error = (admitted - expected).total_seconds()
        # (to the real stdout: the operator's KopfRunner, a click CliRunner, replaces sys.stdout while it runs)
        print(
            f"queue estimate: expected {expected:%H:%M:%S}, admitted {admitted:%H:%M:%S}, error {error:+.0f} s",
            file=sys.__stdout__,
            flush=True,
        )
        assert -1 <= error <= 30, error  # never early; late by the time the end is seen and Kueue takes its turn
    finally:
        world.cluster.delete(solo_cluster_queue(16))


def remove_jobs_then_nodes(world: World, ns: str, jobs: tuple[str, ...], nodes: tuple[FakeNode, ...]) -> None:
    """Delete the jobs of `ns`, wait until their pods are gone, then delete the kwok `nodes` they ran on."""
    for name in jobs:
        world.cluster.delete(job_manifest(name, ns))
    world.cluster.wait_for(
        lambda: not world.cluster.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
        WORLD_TIMEOUT,
        "the jobs' pods to be gone",
    )
    for node in nodes:
        world.cluster.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}})


# ---- GPU partitions ---------------------------------------------------------------------------------

PARTITION_LABEL = "amd.com/compute-memory-partition"
CPX = "amd.com/cpx_nps4"
# Two MI300X nodes split into CPX/NPS4 partitions, the device plugin's mixed naming: 64 amd.com/cpx_nps4 each.
CPX_LABELS = {
    **MI300X_LABELS,
    PARTITION_LABEL: "cpx_nps4",
    "amd.com/gpu.compute-partitioning-mode": "cpx",
    "amd.com/gpu.memory-partitioning-mode": "nps4",
}
CPX_NODES = tuple(FakeNode(f"cpx-{i}", 30 + i, gpus=64, gpu_labels=CPX_LABELS, gpu_resource=CPX) for i in range(2))


def test_partitions_by_their_own_resource_are_placed_counted_as_ray_gpus_and_admitted_by_their_quota(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    """The example pool's small-jobs ClusterQueue: 64 partitions under mixed naming."""
    api = world_api
    register_kwok(world.cluster, CPX_NODES)
    ns = team_namespace(scope, "small-jobs")
    try:
        gpu = {"partition": "cpx_nps4", "resourceName": CPX}
        queue = {"queueName": "small-jobs"}
        api.kube.create(
            job_manifest("cpx", ns, resources={"workers": 4, "gpusPerWorker": 16, "gpu": gpu}, scheduling=queue)
        )
        status = api.wait_status(ns, "cpx", "admitted and started", submitting)
        assert status["gpus"] == 64
        admitted = api.condition(ns, "cpx", ConditionType.ADMITTED)["message"]
        flavor = "mi300x-cpx-nps4-mixed"
        assert admitted == f"admitted by Kueue queue small-jobs (ClusterQueue small-jobs, {CPX} flavor {flavor})"

        def placed() -> list[dict[str, Any]] | None:
            cluster = kuberay.raycluster(api.kube, ns, "cpx")
            pods = kuberay.ray_pods(api.kube, ns, cluster["metadata"]["name"], "worker") if cluster else []
            return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

        workers = wait_until(placed, timeout=WORLD_TIMEOUT, what="the workers placed")
        assert {p["spec"]["nodeName"] for p in workers} <= {n.name for n in CPX_NODES}
        for worker in workers:  # KubeRay's ray start, which counts only limits named ...gpu, got num-gpus from us
            container = worker["spec"]["containers"][0]
            assert (
                container["resources"]["limits"][CPX] == "16" and "amd.com/gpu" not in container["resources"]["limits"]
            )
            assert "--num-gpus=16" in " ".join(container.get("command", []) + container.get("args", [])), container

        api.kube.create(
            job_manifest("more", ns, resources={"workers": 1, "gpusPerWorker": 8, "gpu": gpu}, scheduling=queue)
        )
        api.wait_status(ns, "more", "Queued", queued)
        reason = wait_until(
            lambda: kueue_condition(api, ns, "more", "QuotaReserved").get("message"),
            timeout=WORLD_TIMEOUT,
            what="Kueue",
        )
        assert f"insufficient unused quota for {CPX} in flavor {flavor}, 8 more needed" in reason, reason
    finally:
        remove_jobs_then_nodes(world, ns, ("more", "cpx"), CPX_NODES)


# ---- topology-aware placement ----------------------------------------------------------------------

RACK = "test.rocmtrain.dev/rack"
TAS_POOL = "test.rocmtrain.dev/tas-pool"
TAS_API = "kueue.x-k8s.io/v1beta2"
# Two racks of two 8-GPU nodes each (kwok), in a pool of their own (a flavor on TAS_POOL).
RACK_NODES = tuple(
    FakeNode(f"tas-{rack}-{i}", 20 + 2 * r + i, gpus=8, gpu_labels={**MI300X_LABELS, RACK: rack, TAS_POOL: "yes"})
    for r, rack in enumerate(("r1", "r2"))
    for i in range(2)
)


def topology_pool() -> list[dict[str, Any]]:
    """Kueue's Topology (rack, then node), a flavor of the rack nodes that uses it, and a ClusterQueue of it."""
    quota = [{"name": "cpu", "nominalQuota": 512}, {"name": "memory", "nominalQuota": "8Ti"}]
    return [
        {
            "apiVersion": TAS_API,
            "kind": "Topology",
            "metadata": {"name": "racks"},
            "spec": {"levels": [{"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]},
        },
        {
            "apiVersion": TAS_API,
            "kind": "ResourceFlavor",
            "metadata": {"name": "racked"},
            "spec": {"nodeLabels": {TAS_POOL: "yes"}, "topologyName": "racks"},
        },
        {
            "apiVersion": TAS_API,
            "kind": "ClusterQueue",
            "metadata": {"name": "racked"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [{"name": "racked", "resources": [*quota, {"name": GPU, "nominalQuota": 64}]}],
                    }
                ],
            },
        },
    ]


def test_workers_that_fit_in_one_rack_land_in_one_and_a_job_that_cannot_waits_with_kueues_reason(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    api = world_api
    pool = topology_pool()
    register_kwok(world.cluster, RACK_NODES)
    for obj in pool:
        world.cluster.apply(obj)
    ns = team_namespace(scope, "racked")
    try:
        in_a_rack = {"queueName": "racked", "topology": {"level": RACK, "mode": "required"}}
        # 24 GPUs: the pool's 32 are free, but no rack holds more than 16.
        api.kube.create(job_manifest("too-big", ns, resources={"workers": 3, "gpusPerWorker": 8}, scheduling=in_a_rack))
        api.wait_status(ns, "too-big", "Queued", queued)
        reason = wait_until(
            lambda: kueue_condition(api, ns, "too-big", "QuotaReserved").get("message"),
            timeout=WORLD_TIMEOUT,
            what="Kueue",
        )
        assert "topology" in reason.lower(), reason
        wait_until(
            lambda: (
                api.condition(ns, "too-big", "Admitted").get("message") == f"waiting in Kueue queue racked: {reason}"
            ),
            timeout=WORLD_TIMEOUT,
            what="Kueue's reason in the job's status",
        )

        api.kube.create(job_manifest("fits", ns, resources={"workers": 2, "gpusPerWorker": 8}, scheduling=in_a_rack))

        def placed() -> list[str] | None:
            pods = api.kube.request(
                "GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": "ray.io/node-type=worker"}
            )["items"]
            nodes = [
                p["spec"].get("nodeName")
                for p in pods
                if p["metadata"]["labels"].get("ray.io/cluster", "").startswith("fits")
            ]
            return nodes if len(nodes) == 2 and all(nodes) else None

        nodes = wait_until(placed, timeout=WORLD_TIMEOUT, what="the fitting job's workers placed")
        racks = {node.gpu_labels[RACK] for node in RACK_NODES if node.name in nodes}
        assert len(racks) == 1 and len(set(nodes)) == 2, nodes  # one rack, its two nodes
        pod_sets = (workload(api, ns, "fits") or {})["spec"]["podSets"]
        requests = {s["name"]: (s.get("topologyRequest") or {}).get("required") for s in pod_sets}
        assert [requests[name] for name in requests if name != "submitter"] == [RACK, RACK], requests
    finally:
        remove_jobs_then_nodes(world, ns, ("too-big", "fits"), RACK_NODES)
        for obj in reversed(pool):
            world.cluster.delete(obj)


# ---- flavors -----------------------------------------------------------------------------------------


def test_a_job_that_asks_for_a_gpu_model_gets_that_flavor(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    api = world_api
    ns = team_namespace(scope, "team-a")
    four = {"workers": 1, "gpusPerWorker": 4}
    api.kube.create(
        job_manifest("mi250", ns, resources={**four, "gpu": {"productName": MI250}}, scheduling={"queueName": "team-a"})
    )
    api.kube.create(job_manifest("any", ns, resources=four, scheduling={"queueName": "team-a"}))
    expected = {"mi250": ("mi250", {"gpu-mi250-0"}), "any": ("mi300x", {"gpu-mi300x-0", "gpu-mi300x-1"})}
    for name, (flavor, nodes) in expected.items():
        started = api.wait_status(ns, name, "admitted and started", submitting)
        assert api.condition(ns, name, ConditionType.ADMITTED)["message"].endswith(f"{GPU} flavor {flavor})")
        assignments = workload(api, ns, name)["status"]["admission"]["podSetAssignments"]
        assert [a["flavors"][GPU] for a in assignments if GPU in a["flavors"]] == [flavor]
        (pod,) = kuberay.ray_pods(api.kube, ns, started["rayClusterName"], "worker")
        assert pod["spec"]["nodeName"] in nodes


# ---- preemption ----------------------------------------------------------------------------------------


def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_later(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    api = world_api
    ns = team_namespace(scope, "team-a")
    checkpoint = {"storagePath": "s3://checkpoints/team-a/low", "resume": "auto"}
    low = job_manifest(
        "low",
        ns,
        resources={"workers": 2, "gpusPerWorker": 8},  # all of team-a's reach: 8 + 8 borrowed
        scheduling={"queueName": "team-a", "kueuePriorityClass": "low"},
        checkpoint=checkpoint,
    )
    api.kube.create(low)
    first = api.wait_status(ns, "low", "admitted and started", submitting)["rayClusterName"]

    api.kube.create(
        job_manifest("high", ns, resources=ONE_NODE, scheduling={"queueName": "team-a", "kueuePriorityClass": "high"})
    )
    api.wait_status(ns, "low", "preempted", queued)
    api.wait_status(ns, "high", "admitted and started", submitting)
    preempted = wait_until(
        lambda: kueue_condition(api, ns, "low", "Preempted").get("status") == "True",
        timeout=WORLD_TIMEOUT,
        what="Kueue",
    )
    assert preempted
    kueue_says = kueue_condition(api, ns, "low", "Evicted")["message"]
    assert kueue_says.startswith("Preempted to accommodate a workload") and "prioritization" in kueue_says
    for kind in ("Admitted", "Ready"):
        condition = api.condition(ns, "low", kind)
        assert condition["reason"] == "Preempted" and condition["message"].startswith(kueue_says), condition
    wait_until(
        lambda: any(
            t == "Warning" and r == "Preempted" and kueue_says in m for t, r, m in api.event_messages(ns, "low")
        ),
        timeout=WORLD_TIMEOUT,
        what="the Preempted event",
    )
    # Kueue suspended its RayJob: KubeRay deletes the Ray cluster, freeing the GPUs.
    api.wait_status(ns, "low", "its Ray cluster gone", lambda s: queued(s) and "rayClusterName" not in s)
    wait_until(lambda: not kuberay.ray_pods(api.kube, ns, first), timeout=WORLD_TIMEOUT, what="low's pods gone")

    # The high job ends; Kueue admits the low one again, which starts a new Ray cluster that resumes.
    finish(api, ns, "high")
    again = api.wait_status(ns, "low", "readmitted and started", submitting)
    assert again["rayClusterName"] != first
    assert api.condition(ns, "low", ConditionType.ADMITTED)["status"] == "True"
    (head,) = kuberay.ray_pods(api.kube, ns, again["rayClusterName"], "head")
    env = {e["name"]: e.get("value") for e in head["spec"]["containers"][0]["env"]}
    # The driver of the new Ray cluster reads the same checkpoint settings: it resumes from storagePath.
    assert json.loads(env["ROCMTRAIN_JOB"])["spec"]["checkpoint"].items() >= checkpoint.items()


# ---- refused after admission -------------------------------------------------------------------------------


def test_a_job_refused_after_admission_gives_its_quota_back_to_the_next_in_the_queue(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    """The allow-list tightened under an admitted job (the operator restarted with it): the job's RayJob is
    deleted, and with it Kueue's Workload, so Kueue admits the job waiting behind it (issue 20, finding 4)."""
    api = world_api
    ns = team_namespace(scope, "team-a")
    all_of_team_a = {"workers": 2, "gpusPerWorker": 8}  # 8 of its own + 8 borrowed: nothing left beside it
    queue, limit = {"queueName": "team-a"}, gpu_limit(gpu_pool["team-a"], "mi300x")
    api.kube.create(job_manifest("first", ns, resources=all_of_team_a, scheduling=queue, image=OTHER_IMAGE))
    api.wait_status(ns, "first", "admitted and started", submitting)
    api.kube.create(job_manifest("second", ns, resources=all_of_team_a, scheduling=queue))
    api.wait_status(ns, "second", "Queued behind first", queued)
    assert admitted_gpus(api, ns) == {"mi300x": limit}
    world_operator.stop()
    world_operator.extra_env["ROCMTRAIN_ALLOWED_IMAGES"] = DEFAULT_IMAGE.rsplit("/", 1)[0] + "/"
    try:
        world_operator.start()
        failed = api.wait_status(ns, "first", "refused", lambda s: s.get("phase") == "Failed")
        refusal = api.condition(ns, "first", ConditionType.FAILED)
        assert refusal["reason"] == Reason.NOT_ALLOWED and OTHER_IMAGE in refusal["message"], refusal
        assert failed.get("gpusHeld", 0) == 0
        api.wait_status(ns, "second", "admitted and started in the quota first gave back", submitting)
        assert api.rayjob(ns, "first") is None
        assert admitted_gpus(api, ns) == {"mi300x": limit}, "second's GPUs only: first's Workload went"
    finally:
        world_operator.stop()
        del world_operator.extra_env["ROCMTRAIN_ALLOWED_IMAGES"]
        world_operator.start()


# ---- a namespace's default queue -------------------------------------------------------------------------


def test_kueue_queues_jobs_of_a_namespace_with_a_default_local_queue(
    world: World, scope: Scope, world_api: Api, world_operator: Operator, gpu_pool: dict[str, dict[str, Any]]
):
    """Kueue's webhook gives RayJobs of a namespace with a LocalQueue named `default` that queue and
    suspends them: the rendered RayJob must survive that mutation (its workers' `rayStartParams: {}`),
    and the operator must then leave `suspend` to Kueue although the job names no queue (even when
    it checks every job again, after a restart)."""
    api = world_api
    ns = team_namespace(scope, "team-b", queue="default")
    api.kube.create(job_manifest("big", ns, resources={"workers": 2, "gpusPerWorker": 8}))
    # Admitted first: the operator makes RayJobs in no fixed order, and Kueue admits whichever comes first.
    api.wait_status(ns, "big", "admitted and started", submitting)
    api.kube.create(job_manifest("next", ns, resources=ONE_NODE))
    api.wait_status(ns, "next", "Queued", queued)
    rayjob = api.rayjob(ns, "next")
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    wait_until(
        lambda: "insufficient unused quota" in api.condition(ns, "next", ConditionType.ADMITTED)["message"],
        timeout=WORLD_TIMEOUT,
        what="Kueue's reason in the Admitted condition",
    )
    world_operator.stop()
    world_operator.start()
    api.wait_status(ns, "big", "seen again after the restart", submitting)
    time.sleep(1)
    assert api.rayjob(ns, "next")["spec"]["suspend"] is True and api.phase(ns, "next") == "Queued"
    finish(api, ns, "big")
    api.wait_status(ns, "next", "admitted and started", submitting)

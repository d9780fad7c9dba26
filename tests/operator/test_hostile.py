"""Hostile and unlucky specs against the real control plane: every refusal is a condition and one event.

Real parts: kube-apiserver's admission (a ResourceQuota, a ValidatingAdmissionPolicy), RBAC,
the operator under KopfRunner as its ServiceAccount with its progress endpoint on and the
allow-lists set. Faked, as in the other lean-cluster operator tests: KubeRay's status writes.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from operator_testkit import (
    OPERATOR_NAMESPACE,
    RAYJOBS,
    Api,
    Operator,
    head_container,
    job_manifest,
    not_in,
    wait_until,
)

from rocmtrain import cli
from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import (
    JOB_ENV,
    KUBEFLOW_CA_ENV,
    KUBEFLOW_TOKEN_ENV,
    KUBEFLOW_URL_ENV,
    PROGRESS_TOKEN_ENV,
    PROGRESS_URL_ENV,
    PROGRESS_VOLUME,
)
from rocmtrain.progress import tls
from rocmtrain.render.options import PLACEHOLDER_PROGRESS_URL
from rocmtrain_testworld.kubecluster import KubeCluster, free_port
from unit.test_validate import RESERVED_SPELLINGS

pytestmark = pytest.mark.cluster

ALLOWED_IMAGES = "ghcr.io/rocm-train-operator/"
ALLOWED_PRIORITY_CLASSES = "training"


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path) -> Iterator[Operator]:
    """The operator with its progress endpoint (so it publishes the CA bundle) and allow-lists."""
    port = free_port()
    running = Operator(
        operator_kubeconfig,
        env={
            "ROCMTRAIN_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
            "ROCMTRAIN_PROGRESS_PORT": str(port),
            "ROCMTRAIN_PROGRESS_ADVERTISE_HOST": "localhost",
            "ROCMTRAIN_PROGRESS_ADVERTISE_PORT": str(port),
            "ROCMTRAIN_ALLOWED_IMAGES": ALLOWED_IMAGES,
            "ROCMTRAIN_ALLOWED_PRIORITY_CLASSES": ALLOWED_PRIORITY_CLASSES,
        },
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


def _blocked(api: Api, ns: str, name: str) -> dict:
    return wait_until(
        lambda: (c := api.condition(ns, name, ConditionType.BLOCKED)).get("status") == "True" and c,
        timeout=15,
        what=f"Blocked=True on {name}",
    )


def _count(api: Api, ns: str, name: str, reason: str) -> int:
    return [r for _, r in api.events(ns, name)].count(reason)


def _none_of(resource: str, name: str, ns: str) -> dict:
    """A ResourceQuota that allows no object of `resource` in `ns`."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hard": {f"count/{resource}": "0"}},
    }


def test_a_quota_refusing_the_rayjob_shows_its_message(kube: KubeCluster, api: Api, ns: str):
    quota = _none_of("rayjobs.ray.io", "no-rayjobs", ns)
    kube.create(quota)
    kube.create(job_manifest("quota", ns))
    blocked = _blocked(api, ns, "quota")
    assert blocked["reason"] == Reason.RAYJOB_FORBIDDEN
    # Quota admission refuses with "exceeded quota: no-rayjobs", or "status unknown for quota:
    # no-rayjobs" until the controller-manager has counted: the API server's words either way.
    message = blocked["message"]
    assert message.startswith('the API server refused the RayJob: rayjobs.ray.io "quota" is forbidden: ')
    assert "quota: no-rayjobs" in message
    assert api.phase(ns, "quota") == "Pending" and api.rayjob(ns, "quota") is None
    time.sleep(2.5)  # the job is retried every second meanwhile
    assert _count(api, ns, "quota", Reason.RAYJOB_FORBIDDEN) == 1, "one event, however many retries"
    kube.delete(quota)
    wait_until(lambda: api.rayjob(ns, "quota"), timeout=30, interval=0.2, what="the RayJob once the quota is gone")
    wait_until(
        lambda: api.condition(ns, "quota", ConditionType.BLOCKED).get("reason") == Reason.UNBLOCKED,
        what=Reason.UNBLOCKED,
    )


def test_no_rayjob_before_its_network_policy_which_the_job_owns(kube: KubeCluster, api: Api, ns: str):
    """A quota refusing NetworkPolicies holds the job (no Ray pod may start unprotected); once it goes,
    the policy is made, owned by the job, before the RayJob."""
    quota = _none_of("networkpolicies.networking.k8s.io", "no-policies", ns)
    kube.create(quota)
    kube.create(job_manifest("fenced", ns))
    blocked = _blocked(api, ns, "fenced")
    assert blocked["reason"] == Reason.NETWORK_POLICY_REFUSED
    assert blocked["message"].startswith("the API server refused the job's NetworkPolicy (HTTP 403): ")
    assert "quota: no-policies" in blocked["message"]
    assert api.phase(ns, "fenced") == "Pending" and api.rayjob(ns, "fenced") is None
    kube.delete(quota)
    wait_until(lambda: api.rayjob(ns, "fenced"), timeout=30, interval=0.2, what="the RayJob once the quota is gone")
    policy = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/fenced-ray")
    job = api.job(ns, "fenced")
    assert job is not None
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("RocmTrainingJob", job["metadata"]["uid"], True)
    assert policy["spec"]["podSelector"] == {"matchLabels": {"rocmtrain.dev/job-name": "fenced"}}
    wait_until(lambda: _count(api, ns, "fenced", Reason.NETWORK_POLICY_REFUSED) == 1, what="one refusal event")


def test_with_job_network_policies_off_the_rayjob_comes_without_one(
    kube: KubeCluster, api: Api, ns: str, operator: Operator, operator_kubeconfig: Path
):
    """`ROCMTRAIN_JOB_NETWORK_POLICIES=false` (clusters whose network plugin enforces none): no policy is made,
    so a quota refusing them holds nothing."""
    kube.create(_none_of("networkpolicies.networking.k8s.io", "no-policies", ns))
    operator.stop()
    unfenced = Operator(operator_kubeconfig, env={**operator.extra_env, "ROCMTRAIN_JOB_NETWORK_POLICIES": "false"})
    unfenced.start()
    try:
        kube.create(job_manifest("open", ns))
        wait_until(lambda: api.rayjob(ns, "open"), timeout=30, interval=0.2, what="the RayJob without a policy")
    finally:
        unfenced.stop()
        operator.start()
    policies = kube.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")
    assert policies["items"] == []
    assert api.condition(ns, "open", ConditionType.BLOCKED).get("status") != "True"


def test_render_prints_what_the_operator_applies(
    kube: KubeCluster, api: Api, ns: str, operator: Operator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """`rocmtrain render` of a job with its own code is the RayJob the operator makes of it, field by field, the
    progress variables and volume included, apart from the address of the operator's progress endpoint (a
    placeholder: it exists only on the cluster)."""
    manifest = job_manifest("previewed", ns, code={"command": ["python", "train.py"]})
    kube.create(manifest)
    rayjob = wait_until(lambda: api.rayjob(ns, "previewed"), timeout=30, interval=0.2, what="the RayJob")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    assert cli.main(["render", str(tmp_path / "job.yaml")]) == 0
    endpoint = f"https://localhost:{operator.extra_env['ROCMTRAIN_PROGRESS_ADVERTISE_PORT']}"
    rendered = yaml.safe_load(capsys.readouterr().out.replace(PLACEHOLDER_PROGRESS_URL, endpoint))
    applied = head_container(rayjob["spec"]["rayClusterSpec"])
    (job_var,) = [var for var in applied["env"] if var["name"] == JOB_ENV]
    job_json = json.loads(job_var["value"])
    assert job_json["metadata"].pop("uid") == api.job(ns, "previewed")["metadata"]["uid"]  # the cluster's own
    job_var["value"] = json.dumps(job_json, sort_keys=True, separators=(",", ":"))
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0] = applied
    assert not_in(rendered["spec"], rayjob["spec"]) == [], "render differs from the RayJob the operator applied"
    assert rendered["metadata"]["labels"] == rayjob["metadata"]["labels"]
    head = rendered["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    names = {var["name"] for var in head["containers"][0]["env"]}
    assert names >= {KUBEFLOW_URL_ENV, KUBEFLOW_TOKEN_ENV, KUBEFLOW_CA_ENV, PROGRESS_URL_ENV, PROGRESS_TOKEN_ENV}
    assert PROGRESS_VOLUME in {volume["name"] for volume in head["volumes"]}


def test_an_admission_policy_refusing_the_rayjob_shows_its_message(kube: KubeCluster, api: Api, ns: str):
    name = f"deny-rayjobs-{ns}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": ["ray.io"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["rayjobs"]}
                ]
            },
            "validations": [{"expression": "false", "message": "RayJobs need a team approval here"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    }
    kube.create(policy)
    kube.create(binding)
    try:
        probe = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "probe", "namespace": ns}}

        def enforced() -> bool:
            try:
                kube.create(probe, dry_run=True)
            except ApiException as exc:
                return exc.status == 422 and "team approval" in exc.body
            return False

        wait_until(enforced, timeout=30, interval=0.2, what="the admission policy in force")
        kube.create(job_manifest("policy", ns))
        blocked = _blocked(api, ns, "policy")
        assert blocked["reason"] == Reason.RAYJOB_INVALID and "RayJobs need a team approval here" in blocked["message"]
        wait_until(lambda: _count(api, ns, "policy", Reason.RAYJOB_INVALID) == 1, what="the RayJobInvalid event")
    finally:
        kube.delete(binding)
        kube.delete(policy)


def test_a_rayjob_of_another_name_does_not_drive_the_jobs_status(kube: KubeCluster, api: Api, ns: str):
    kube.create(job_manifest("bert", ns))
    own = wait_until(lambda: api.rayjob(ns, "bert"), timeout=10, what="bert's RayJob")
    wait_until(lambda: api.phase(ns, "bert") == "Pending", what="Pending")
    impostor = copy.deepcopy(own)
    impostor["metadata"] = {
        "name": "impostor",
        "namespace": ns,
        "labels": own["metadata"]["labels"],
        "ownerReferences": own["metadata"]["ownerReferences"],  # names bert as its controller
    }
    kube.create(impostor)
    failed = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "failed": 1}
    api.fake_kuberay(ns, "impostor", failed)
    api.fake_kuberay(ns, "bert", {"jobDeploymentStatus": "Initializing", "rayClusterName": "bert-a1b2c"})
    wait_until(lambda: api.phase(ns, "bert") == "Initializing", what="bert follows its own RayJob")
    time.sleep(1.5)
    assert api.phase(ns, "bert") == "Initializing", "the impostor's failure is not bert's"
    assert api.job(ns, "bert")["status"]["rayClusterName"] == "bert-a1b2c"


def test_every_spelling_of_a_reserved_mount_path_is_refused(kube: KubeCluster, api: Api, ns: str):
    names = {f"path-{i:02d}": path for i, path in enumerate(RESERVED_SPELLINGS)}
    for name, path in names.items():
        spec = {
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "volumeMounts": [{"name": "scratch", "mountPath": path}],
        }
        kube.create(job_manifest(name, ns, **spec))  # the API server's schema accepts every one of them
    for name, path in names.items():
        wait_until(lambda name=name: api.phase(ns, name) == "Failed", timeout=15, what=f"{path} refused")
        ready = api.condition(ns, name, ConditionType.READY)
        assert ready["reason"] == Reason.INVALID_SPEC and "spec.volumeMounts[0].mountPath" in ready["message"], path
        assert "reserved" in ready["message"] and api.rayjob(ns, name) is None, path


def test_images_and_priority_classes_outside_the_allow_lists_are_refused(kube: KubeCluster, api: Api, ns: str):
    kube.create(job_manifest("miner", ns, image="docker.io/evil/miner:1"))
    kube.create(job_manifest("urgent", ns, scheduling={"priorityClassName": "system-cluster-critical"}))
    kube.create(job_manifest("fine", ns, scheduling={"priorityClassName": ALLOWED_PRIORITY_CLASSES}))
    for name, words in (
        ("miner", "spec.image: docker.io/evil/miner:1 is not from an allowed registry"),
        ("urgent", "spec.scheduling.priorityClassName: system-cluster-critical is not an allowed"),
    ):
        wait_until(lambda name=name: api.phase(ns, name) == "Failed", timeout=15, what=f"{name} refused")
        failed = api.condition(ns, name, ConditionType.FAILED)
        assert failed["reason"] == Reason.NOT_ALLOWED and words in failed["message"], failed
        assert api.rayjob(ns, name) is None
        wait_until(lambda name=name: ("Warning", "Failed") in api.events(ns, name), what=f"{name}'s Failed event")
    wait_until(lambda: api.rayjob(ns, "fine"), timeout=10, what="the allowed job's RayJob")  # fmt: skip


def test_a_ca_configmap_of_someone_else_is_left_alone(kube: KubeCluster, api: Api, ns: str):
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": tls.CA_CONFIGMAP, "namespace": ns, "labels": {"team": "platform"}},
        "data": {"ca.crt": "their own bundle"},
    }
    kube.create(theirs)
    kube.create(job_manifest("ca", ns))
    blocked = _blocked(api, ns, "ca")
    assert blocked["reason"] == Reason.PROGRESS_CA_CONFLICT and "is not the operator's" in blocked["message"]
    assert api.rayjob(ns, "ca") is None, "no head pod may mount a bundle the operator did not write"
    configmap = kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{tls.CA_CONFIGMAP}")
    assert configmap["data"] == theirs["data"] and configmap["metadata"]["labels"] == {"team": "platform"}
    kube.delete(theirs)
    wait_until(lambda: api.rayjob(ns, "ca"), timeout=15, interval=0.2, what="the RayJob once the name is free")
    configmap = kube.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{tls.CA_CONFIGMAP}")
    assert tls.is_operators(configmap["metadata"]["labels"]) and configmap["data"]["ca.crt"].startswith("-----BEGIN")
    rayjobs = kube.request("GET", RAYJOBS.format(ns=ns))["items"]
    assert [r["metadata"]["name"] for r in rayjobs] == ["ca"]


def test_a_job_refused_after_it_started_is_stopped_and_one_that_ended_is_left_as_it_was(
    kube: KubeCluster, api: Api, ns: str, operator: Operator
):
    """The allow-list tightened under running jobs (the operator restarted with it, as an upgrade that adds
    a rule would): the running job's RayJob is deleted, so its Ray cluster, GPUs and quota go, and it fails
    with the reason; a job that had already succeeded keeps its phase and its RayJob."""
    for name in ("running", "done"):
        kube.create(job_manifest(name, ns))
        wait_until(lambda name=name: api.rayjob(ns, name), timeout=15, what=f"{name}'s RayJob")
    api.fake_kuberay(ns, "running", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    api.fake_kuberay(ns, "done", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "succeeded": 1})
    wait_until(lambda: api.phase(ns, "done") == "Succeeded", timeout=15, what="done to succeed")
    wait_until(lambda: api.phase(ns, "running") in ("Initializing", "Running"), timeout=15, what="running to start")
    operator.stop()
    operator.extra_env["ROCMTRAIN_ALLOWED_IMAGES"] = "registry.example.com/approved/"
    try:
        operator.start()
        wait_until(lambda: api.phase(ns, "running") == "Failed", timeout=20, what="running refused")
        failed = api.condition(ns, "running", ConditionType.FAILED)
        assert failed["reason"] == Reason.NOT_ALLOWED and "is not from an allowed registry" in failed["message"]
        wait_until(lambda: api.rayjob(ns, "running") is None, timeout=15, what="running's RayJob deleted")
        assert api.status(ns, "running").get("gpusHeld", 0) == 0
        time.sleep(2)  # a sync of "done" under the new list has had its chance
        assert api.phase(ns, "done") == "Succeeded" and api.rayjob(ns, "done") is not None
    finally:
        operator.stop()
        operator.extra_env["ROCMTRAIN_ALLOWED_IMAGES"] = ALLOWED_IMAGES
        operator.start()


def test_a_large_job_is_validated_and_rendered_off_the_event_loop(api: Api, ns: str, monkeypatch: pytest.MonkeyPatch):
    """Validating and rendering, a reconcile's CPU work, run in a thread for every job, so that however large a
    tenant makes one (here 22 env values of 4,096 characters) the event loop that the watches, the progress
    endpoint and /healthz share never waits on them (the RayJob's path, refresh, reuses the generation's reading)."""
    from rocmtrain.controller import reconciler

    ran: list[tuple[str, bool]] = []

    def spied(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                ran.append((name, True))
            except RuntimeError:  # no loop runs in this thread
                ran.append((name, False))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(reconciler, "validate_job", spied("validate", reconciler.validate_job))
    monkeypatch.setattr(reconciler, "render_rayjob", spied("render", reconciler.render_rayjob))
    env = [{"name": f"LARGE_{i:02d}", "value": "x" * 4096} for i in range(22)]
    api.create_job(ns, "large", env=env)
    ready = {"readyWorkerReplicas": 2, "desiredWorkerReplicas": 2, "state": "ready"}
    api.fake_kuberay(ns, "large", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterStatus": ready})
    wait_until(lambda: api.phase(ns, "large") == "Running", timeout=15, what="large to run")
    assert {name for name, _ in ran} == {"validate", "render"}, ran
    assert [name for name, on_loop in ran if on_loop] == [], "none of them on the event loop"

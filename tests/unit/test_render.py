"""The RayJob renderer: structure, determinism, and KubeRay's real RayJob schemas (v1.5.1 and v1.7.0).

Every rendered RayJob is checked against the CRDs KubeRay ships, of the version the world runs and of the
newest (see rocmtrain_testworld/rayjob_schema.py); no KubeRay controller runs here.
"""

from __future__ import annotations

import json
import shlex
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from rocmtrain.api.contract import KUBERAY_VERSION, RAY_VERSION
from rocmtrain.api.models import MUTABLE_FIELDS, RocmTrainingJob
from rocmtrain.api.names import rayjob_name
from rocmtrain.api.quantity import parse_quantity, whole_cpus
from rocmtrain.api.validate import validate_job
from rocmtrain.render import ENTRYPOINT, RenderOptions, render_network_policy, render_rayjob, render_rayjob_yaml
from rocmtrain_testworld import rayjob_schema
from unit.samples import example, full_job, minimal_job

OPTIONS = RenderOptions(
    progress_base_url="https://rocmtrain-operator.rocmtrain-system.svc:8443",
    progress_ca_configmap="rocmtrain-progress-ca",
    gpu_device_groups=(44, 110),
)


def job_of(manifest: dict[str, Any]) -> RocmTrainingJob:
    job, errors = validate_job(manifest)
    assert not errors, errors
    assert job is not None
    return job


def head_pod(rayjob: dict[str, Any]) -> dict[str, Any]:
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]


def worker_group(rayjob: dict[str, Any]) -> dict[str, Any]:
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group


def pods(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "head": head_pod(rayjob),
        "worker": worker_group(rayjob)["template"],
        "submitter": rayjob["spec"]["submitterPodTemplate"],
    }


def env_of(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["spec"]["containers"][0]["env"]


def env_value(template: dict[str, Any], name: str) -> str:
    (value,) = [var["value"] for var in env_of(template) if var["name"] == name]
    return value


@pytest.fixture
def full() -> RocmTrainingJob:
    return job_of(full_job())


CASES = {
    "full": (full_job, None),
    "full-with-options": (full_job, OPTIONS),
    "minimal": (minimal_job, None),
    "minimal-with-options": (minimal_job, RenderOptions(progress_base_url="https://op.example:443")),
    "cluster-mi300x": (lambda: example("cluster-mi300x.yaml"), OPTIONS),
    "kueue": (lambda: example("kueue.yaml"), None),
}


@pytest.mark.parametrize("case", CASES)
def test_rendered_rayjob_matches_kuberay_schema(case: str) -> None:
    manifest, options = CASES[case]
    rayjob = render_rayjob(job_of(manifest()), options=options)
    assert rayjob_schema.schema_errors(rayjob) == []


def test_schema_check_catches_typos_and_wrong_types(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full)
    head_pod(rayjob)["spec"]["containers"][0]["volumeMount"] = []
    worker_group(rayjob)["replicas"] = "3"
    errors = rayjob_schema.schema_errors(rayjob)
    assert len(errors) == 2 * len(rayjob_schema.VERSIONS)
    for version in rayjob_schema.VERSIONS:
        assert any(e.startswith(f"{version}: ") and "'volumeMount' was unexpected" in e for e in errors)
        assert f"{version}: spec.rayClusterSpec.workerGroupSpecs.0.replicas: '3' is not of type 'integer'" in errors


def test_the_three_kuberay_schemas_are_checked_and_each_is_its_versions(full: RocmTrainingJob) -> None:
    """A field only newer versions know is refused by v1.5.1's schema alone; the world's is the one build.sh builds;
    the vendored CRD is upstream's, unedited."""
    assert rayjob_schema.VERSIONS == (KUBERAY_VERSION, "v1.6.2", "v1.7.0")
    build = Path(rayjob_schema.__file__).with_name("build.sh").read_text()
    assert f"\nKUBERAY_VERSION={rayjob_schema.WORLD}\n" in build
    rayjob = render_rayjob(full)
    rayjob["spec"]["preRunningDeadlineSeconds"] = 600
    assert rayjob_schema.schema_errors(rayjob) == [
        f"{KUBERAY_VERSION}: spec: Additional properties are not allowed ('preRunningDeadlineSeconds' was unexpected)"
    ]
    named, actual = rayjob_schema.upstream_blob("v1.7.0")
    assert named == actual == "c7d3f081af8cf08c256a8c33a0c3b6ea28b816a0"


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(item) for item in value]
    return value


def test_rendering_is_deterministic() -> None:
    first = render_rayjob_yaml(job_of(full_job()), options=OPTIONS)
    assert render_rayjob_yaml(job_of(full_job()), options=OPTIONS) == first
    assert render_rayjob_yaml(job_of(_reordered(full_job())), options=OPTIONS) == first
    assert first.index("apiVersion:") < first.index("kind:") < first.index("metadata:")


def test_versions_entrypoint_and_submission(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full)
    assert (KUBERAY_VERSION, RAY_VERSION) == ("v1.5.1", "2.60.0")
    assert rayjob["apiVersion"] == "ray.io/v1"
    assert rayjob["kind"] == "RayJob"
    assert rayjob["metadata"]["name"] == rayjob_name(full) == "sample"
    assert rayjob["metadata"]["namespace"] == "ml"
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == "2.60.0"
    assert rayjob["spec"]["entrypoint"] == ENTRYPOINT
    assert shlex.split(rayjob["spec"]["entrypoint"]) == ["python", "-m", "rocmtrain_train"]
    assert rayjob["spec"]["submissionMode"] == "K8sJobMode"
    submitter = rayjob["spec"]["submitterPodTemplate"]["spec"]
    assert submitter["restartPolicy"] == "Never"
    assert [c["name"] for c in submitter["containers"]] == ["ray-job-submitter"]
    assert submitter["containers"][0]["image"] == full.spec.image
    # KubeRay's default, written down; the operator's ROCMTRAIN_SUBMITTER_RETRIES changes it.
    assert rayjob["spec"]["submitterConfig"] == {"backoffLimit": 2}
    once = render_rayjob(full, options=RenderOptions(submitter_retries=0))
    assert once["spec"]["submitterConfig"] == {"backoffLimit": 0}


def test_no_container_has_a_command(full: RocmTrainingJob) -> None:
    for template in pods(render_rayjob(full, options=OPTIONS)).values():
        for container in template["spec"]["containers"]:
            assert "command" not in container
            assert "args" not in container


def test_head_group_runs_the_driver_and_no_training(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"] == {"num-cpus": "0"}
    container = head["template"]["spec"]["containers"][0]
    assert container["name"] == "ray-head"
    assert container["resources"] == {
        "limits": {"cpu": "3", "memory": "12Gi"},
        "requests": {"cpu": "3", "memory": "12Gi"},
    }
    assert "affinity" not in head["template"]["spec"]


def test_worker_group_is_fixed_size_with_amd_gpus(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full)
    group = worker_group(rayjob)
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    assert group["groupName"] == "gpu"
    # KubeRay derives --num-gpus from any limit ending in "gpu", so no rayStartParams are needed; the
    # empty map is there for Kueue's webhook (tests/operator/test_kueue.py shows why).
    assert group["rayStartParams"] == {}
    amounts = {"cpu": "12500m", "memory": "96Gi", "amd.com/gpu": "2"}
    assert group["template"]["spec"]["containers"][0]["resources"] == {"limits": amounts, "requests": amounts}


def test_cpu_job_requests_no_gpus_and_gets_no_gpu_settings() -> None:
    manifest = minimal_job()
    manifest["spec"]["resources"] = {"gpusPerWorker": 0, "cpusPerWorker": "4"}
    rayjob = render_rayjob(job_of(manifest), options=OPTIONS)
    group = worker_group(rayjob)
    assert group["groupName"] == "cpu"
    assert "amd.com/gpu" not in group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert [var["name"] for var in env_of(group["template"])] == ["HOME", "OMP_NUM_THREADS"]
    assert "supplementalGroups" not in group["template"]["spec"]["securityContext"]


def test_gpu_model_selection_becomes_required_node_affinity(full: RocmTrainingJob) -> None:
    spec = worker_group(render_rayjob(full))["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI300X_OAM"]},
                {"key": "amd.com/gpu.family", "operator": "In", "values": ["AI"]},
                {"key": "amd.com/gpu.vram", "operator": "In", "values": ["192G"]},
            ]
        }
    ]
    partial = full_job()
    partial["spec"]["resources"]["gpu"] = {"vram": "192G"}
    spec = worker_group(render_rayjob(job_of(partial)))["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "amd.com/gpu.vram", "operator": "In", "values": ["192G"]}]}]
    assert "affinity" not in worker_group(render_rayjob(job_of(minimal_job())))["template"]["spec"]


RCCL_NETWORK_ENV = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX")


def test_network_gives_workers_rdma_the_secondary_network_and_rccl_settings() -> None:
    manifest = full_job()
    manifest["spec"]["resources"]["network"] = {
        "rdmaResource": "rdma/rdma_shared_device_a",
        "rdmaPerWorker": 2,
        "networks": ["net-ops/roce-a@net1", "roce-b"],
        "ibHca": ["mlx5_0", "mlx5_1:1"],
        "socketInterface": "net1",
        "gidIndex": 3,
    }
    rayjob = render_rayjob(job_of(manifest))
    worker = worker_group(rayjob)["template"]
    resources = worker["spec"]["containers"][0]["resources"]
    assert resources["limits"]["rdma/rdma_shared_device_a"] == resources["requests"]["rdma/rdma_shared_device_a"] == "2"
    assert resources["limits"]["amd.com/gpu"] == "2"
    assert worker["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "net-ops/roce-a@net1,roce-b"}
    assert env_value(worker, "NCCL_IB_HCA") == "mlx5_0,mlx5_1:1"
    assert env_value(worker, "NCCL_SOCKET_IFNAME") == "net1"
    assert env_value(worker, "NCCL_IB_GID_INDEX") == "3"
    # The head trains nothing: no RDMA, no secondary network, no RCCL settings.
    head = head_pod(rayjob)
    assert "annotations" not in head["metadata"]
    assert not [v for v in env_of(head) if v["name"] in RCCL_NETWORK_ENV]
    assert "rdma/rdma_shared_device_a" not in head["spec"]["containers"][0]["resources"]["limits"]
    plain = worker_group(render_rayjob(job_of(full_job())))["template"]
    assert "annotations" not in plain["metadata"]
    assert not [v for v in env_of(plain) if v["name"] in RCCL_NETWORK_ENV]


def test_worker_env_order_defaults_and_user_overrides(full: RocmTrainingJob) -> None:
    worker = worker_group(render_rayjob(full, options=OPTIONS))["template"]
    assert env_of(worker) == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "OMP_NUM_THREADS", "value": "12"},
        {"name": "HSA_FORCE_FINE_GRAIN_PCIE", "value": "1"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
    ]


def test_head_env_carries_the_job_and_the_progress_endpoint(full: RocmTrainingJob) -> None:
    head = head_pod(render_rayjob(full, options=OPTIONS))
    names = [var["name"] for var in env_of(head)]
    assert names == [
        "HOME",
        "OMP_NUM_THREADS",
        "HF_HUB_OFFLINE",
        "NCCL_DEBUG",
        "AWS_SECRET_ACCESS_KEY",
        "ROCMTRAIN_JOB",
        "ROCMTRAIN_PROGRESS_URL",
        "ROCMTRAIN_PROGRESS_TOKEN",
        "ROCMTRAIN_PROGRESS_CA",
    ]
    assert env_value(head, "OMP_NUM_THREADS") == "3"
    assert env_value(head, "ROCMTRAIN_PROGRESS_URL") == (
        "https://rocmtrain-operator.rocmtrain-system.svc:8443/v1/namespaces/ml/rocmtrainingjobs/sample/progress"
    )
    assert env_value(head, "ROCMTRAIN_PROGRESS_TOKEN") == "/var/run/secrets/rocmtrain.dev/progress/token"
    assert env_value(head, "ROCMTRAIN_PROGRESS_CA") == "/var/run/secrets/rocmtrain.dev/progress/ca.crt"
    worker = worker_group(render_rayjob(full, options=OPTIONS))["template"]
    assert not [var for var in env_of(worker) if var["name"].startswith("ROCMTRAIN_")]


def test_job_configuration_round_trips_through_the_training_parser(full: RocmTrainingJob) -> None:
    head = head_pod(render_rayjob(full))
    parsed = RocmTrainingJob.model_validate_json(env_value(head, "ROCMTRAIN_JOB"))
    assert parsed.metadata.name == "sample"
    assert parsed.metadata.namespace == "ml"
    assert parsed.metadata.uid == full.metadata.uid
    expected = {k: v for k, v in full.spec.dump().items() if k not in MUTABLE_FIELDS}
    assert {k: v for k, v in parsed.spec.dump().items() if k not in MUTABLE_FIELDS} == expected
    document = json.loads(env_value(head, "ROCMTRAIN_JOB"))
    assert set(document) == {"apiVersion", "kind", "metadata", "spec"}
    assert not set(MUTABLE_FIELDS) & set(document["spec"])


def test_mutable_fields_leave_the_ray_cluster_unchanged() -> None:
    before = render_rayjob(job_of(full_job()))
    changed = full_job()
    changed["spec"]["suspend"] = True
    changed["spec"]["lifecycle"] = {"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 60}
    after = render_rayjob(job_of(changed))
    assert after["spec"]["rayClusterSpec"] == before["spec"]["rayClusterSpec"]
    assert (after["spec"]["suspend"], after["spec"]["ttlSecondsAfterFinished"]) == (True, 60)


def test_shared_memory_is_an_in_memory_volume(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full)
    sizes = {}
    for role in ("head", "worker"):
        spec = pods(rayjob)[role]["spec"]
        (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        sizes[role] = shm["emptyDir"]["sizeLimit"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    # The head trains nothing: its /dev/shm is capped at its own memory.
    assert sizes == {"worker": "24Gi", "head": "12Gi"}


@pytest.mark.parametrize(
    ("memory", "shared", "worker_shm"),
    [("2Gi", None, "1Gi"), ("3G", None, "1500M"), ("64Gi", None, "16Gi"), ("2Gi", "2Gi", "2Gi")],
)
def test_shared_memory_defaults_to_half_the_memory_at_most_16gi(memory: str, shared: str | None, worker_shm: str):
    """Unset, it never refuses its own job (a 2Gi CPU worker on a workstation gets 1Gi); a set value is kept."""
    manifest = minimal_job()
    manifest["spec"]["resources"] = {"memoryPerWorker": memory} | ({"sharedMemory": shared} if shared else {})
    valid, errors = validate_job(manifest, context="cluster")
    assert valid is not None, errors
    spec = pods(render_rayjob(valid))["worker"]["spec"]
    assert [v["emptyDir"]["sizeLimit"] for v in spec["volumes"] if v["name"] == "dshm"] == [worker_shm]


def test_user_volumes_and_mounts_reach_head_and_workers(full: RocmTrainingJob) -> None:
    for role in ("head", "worker"):
        spec = pods(render_rayjob(full))[role]["spec"]
        assert spec["volumes"][2:] == [
            {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints", "readOnly": False}},
        ]
        assert spec["containers"][0]["volumeMounts"][2:] == [
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "ckpt", "mountPath": "/checkpoints", "readOnly": False},
        ]


def test_progress_credentials_are_a_projected_volume_on_the_head_only(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full, options=OPTIONS)
    head = head_pod(rayjob)["spec"]
    (volume,) = [v for v in head["volumes"] if v["name"] == "rocmtrain-progress"]
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "rocmtrain.dev/progress", "expirationSeconds": 3600, "path": "token"}},
        {"configMap": {"name": "rocmtrain-progress-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]
    assert {
        "name": "rocmtrain-progress",
        "mountPath": "/var/run/secrets/rocmtrain.dev/progress",
        "readOnly": True,
    } in head["containers"][0]["volumeMounts"]
    worker = worker_group(rayjob)["template"]["spec"]
    assert "rocmtrain-progress" not in [v["name"] for v in worker["volumes"]]

    without_ca = head_pod(render_rayjob(full, options=RenderOptions(progress_base_url="https://op:8443")))
    (volume,) = [v for v in without_ca["spec"]["volumes"] if v["name"] == "rocmtrain-progress"]
    assert [list(source) for source in volume["projected"]["sources"]] == [["serviceAccountToken"]]
    assert "ROCMTRAIN_PROGRESS_CA" not in [var["name"] for var in env_of(without_ca)]

    plain = head_pod(render_rayjob(full))
    assert "rocmtrain-progress" not in [v["name"] for v in plain["spec"]["volumes"]]
    assert [var["name"] for var in env_of(plain) if var["name"].startswith("ROCMTRAIN_")] == ["ROCMTRAIN_JOB"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"progress_base_url": "http://op:8080"},
        {"progress_base_url": "https://op:8443/path"},
        {"progress_base_url": "https://op\n:8443"},
        {"progress_ca_configmap": "ca"},
        {"progress_base_url": "https://op", "progress_ca_configmap": "Bad_Name"},
        {"progress_ca_key": "a/b"},
        {"progress_token_audience": "two words"},
        {"gpu_device_groups": (-1,)},
        {"submitter_retries": -1},
        {"submitter_retries": 21},
    ],
)
def test_render_options_refuse_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RenderOptions(**kwargs)


def test_every_pod_is_hardened_and_scheduled_alike(full: RocmTrainingJob) -> None:
    for role, template in pods(render_rayjob(full, options=OPTIONS)).items():
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] != 0
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert context.get("supplementalGroups") == ([44, 110] if role == "worker" else None)
        for container in spec["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
                "runAsNonRoot": True,
            }
            assert container["resources"]["limits"] == container["resources"]["requests"]
            assert container["imagePullPolicy"] == "IfNotPresent"
        assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": "zone-a"}
        assert spec["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert spec["priorityClassName"] == "training"
        assert spec["imagePullSecrets"] == [{"name": "registry"}]


def test_read_only_containers_write_to_tmp_and_home_there(full: RocmTrainingJob) -> None:
    """Ray's session directory (/tmp/ray) and HOME's caches (Hugging Face, MIOpen) need a writable /tmp."""
    for role, template in pods(render_rayjob(full, options=OPTIONS)).items():
        spec = template["spec"]
        assert {"name": "rocmtrain-tmp", "emptyDir": {}} in spec["volumes"], role
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert {"name": "rocmtrain-tmp", "mountPath": "/tmp"} in container["volumeMounts"], role
            assert {"name": "HOME", "value": "/tmp"} in container["env"], role


def test_minimal_job_leaves_optional_pod_fields_out() -> None:
    rayjob = render_rayjob(job_of(minimal_job()))
    for template in pods(rayjob).values():
        for field in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets", "affinity"):
            assert field not in template["spec"]
    assert "ttlSecondsAfterFinished" not in rayjob["spec"]
    assert "activeDeadlineSeconds" not in rayjob["spec"]
    assert rayjob["spec"]["backoffLimit"] == 0
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    assert rayjob["spec"]["suspend"] is False


def test_lifecycle_and_fault_tolerance(full: RocmTrainingJob) -> None:
    spec = render_rayjob(full)["spec"]
    assert spec["backoffLimit"] == 2
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["ttlSecondsAfterFinished"] == 300
    assert spec["shutdownAfterJobFinishes"] is True
    keep = full_job()
    keep["spec"]["lifecycle"] = {"shutdownAfterJobFinishes": False}
    assert render_rayjob(job_of(keep))["spec"]["shutdownAfterJobFinishes"] is False


def test_labels_link_every_object_back_to_the_job(full: RocmTrainingJob) -> None:
    rayjob = render_rayjob(full)
    expected = {
        "rocmtrain.dev/job-name": "sample",
        "app.kubernetes.io/managed-by": "rocm-train-operator",
        "app.kubernetes.io/name": "rocmtrain",
    }
    assert rayjob["metadata"]["labels"] == expected
    for template in pods(rayjob).values():
        assert template["metadata"]["labels"] == expected


def test_ray_token_auth_is_on_and_its_variables_are_not_the_users(full: RocmTrainingJob) -> None:
    cluster = render_rayjob(full)["spec"]["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}
    # KubeRay gives the token to every Ray container from its own Secret; nothing rendered names it.
    for template in pods(render_rayjob(full, options=OPTIONS)).values():
        assert not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} & {var["name"] for var in env_of(template)}
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        manifest = full_job()
        manifest["spec"]["env"] = [{"name": name, "value": "disabled"}]
        _, errors = validate_job(manifest)
        assert [e.path for e in errors] == ["spec.env[0].name"], errors


def test_network_policy_admits_only_the_jobs_pods_but_to_the_dashboard(full: RocmTrainingJob) -> None:
    policy = render_network_policy(full)
    labels = render_rayjob(full)["metadata"]["labels"]
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    assert policy["metadata"] == {"name": "sample-ray", "namespace": "ml", "labels": labels}
    own = {"matchLabels": {"rocmtrain.dev/job-name": "sample"}}
    # Selects every pod the RayJob makes (head, workers, submitter: they carry the job's labels).
    for template in pods(render_rayjob(full)).values():
        assert own["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert policy["spec"] == {
        "podSelector": own,
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": own}]},
            {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 8265}]},
        ],
    }


def test_queued_job_gets_kueue_labels_and_is_created_suspended() -> None:
    rayjob = render_rayjob(job_of(example("kueue.yaml")))
    labels = rayjob["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    assert rayjob["spec"]["suspend"] is True
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    for template in pods(rayjob).values():
        assert not [key for key in template["metadata"]["labels"] if key.startswith("kueue.x-k8s.io/")]
    unqueued = render_rayjob(job_of(full_job()))
    assert not [key for key in unqueued["metadata"]["labels"] if key.startswith("kueue.x-k8s.io/")]
    assert unqueued["spec"]["suspend"] is False


@pytest.mark.parametrize(
    ("mode", "annotation"),
    [
        ("required", "kueue.x-k8s.io/podset-required-topology"),
        ("preferred", "kueue.x-k8s.io/podset-preferred-topology"),
    ],
)
def test_topology_is_kueues_annotation_on_the_head_and_worker_pod_sets(mode: str, annotation: str) -> None:
    manifest = example("kueue.yaml")
    manifest["spec"]["scheduling"]["topology"] = {"level": "cloud.provider.com/topology-rack", "mode": mode}
    rayjob = render_rayjob(job_of(manifest))
    assert rayjob_schema.schema_errors(rayjob) == []
    templates = pods(rayjob)
    for role in ("head", "worker"):
        assert templates[role]["metadata"]["annotations"] == {annotation: "cloud.provider.com/topology-rack"}
    assert "annotations" not in templates["submitter"]["metadata"]
    unplaced = pods(render_rayjob(job_of(example("kueue.yaml"))))
    assert not any("annotations" in template["metadata"] for template in unplaced.values())


@pytest.mark.parametrize(
    ("gpu", "resource", "start_params"),
    [
        ({"partition": "cpx_nps4"}, "amd.com/gpu", {}),  # single naming: KubeRay counts amd.com/gpu itself
        ({"partition": "cpx_nps4", "resourceName": "amd.com/cpx_nps4"}, "amd.com/cpx_nps4", {"num-gpus": "2"}),
    ],
)
def test_a_partitioned_job_lands_on_its_partition_and_ray_counts_its_gpus(
    gpu: dict[str, str], resource: str, start_params: dict[str, str]
) -> None:
    manifest = full_job()
    manifest["spec"]["resources"].update({"gpusPerWorker": 2, "gpu": gpu})
    rayjob = render_rayjob(job_of(manifest))
    assert rayjob_schema.schema_errors(rayjob) == []
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["rayStartParams"] == start_params
    worker = group["template"]["spec"]["containers"][0]["resources"]
    assert worker["limits"][resource] == worker["requests"][resource] == "2"
    assert "amd.com/gpu" not in worker["limits"] or resource == "amd.com/gpu"
    (term,) = group["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "amd.com/compute-memory-partition", "operator": "In", "values": ["cpx_nps4"]} in term[
        "matchExpressions"
    ]


def test_user_suspend_suspends_the_rayjob() -> None:
    manifest = full_job()
    manifest["spec"]["suspend"] = True
    assert render_rayjob(job_of(manifest))["spec"]["suspend"] is True


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("2", "2"), ("1.5", "1.5"), ("16Gi", str(16 * 2**30)), ("1k", "1000"), (".5M", "500000")],
)
def test_quantities(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", ["", "1.5.2", "-1", "1e3", "12 Gi", "1Gb"])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize(("text", "threads"), [("250m", 1), ("1", 1), ("12500m", 12), ("64", 64)])
def test_threads_per_cpu_quantity(text: str, threads: int) -> None:
    assert whole_cpus(text) == threads

"""The cluster admin's allow-lists for images and priority classes, size limits and protected namespaces (pure)."""

from __future__ import annotations

import pytest

from rocmtrain.admission.policy import Policy, image_allowed, normalize_image
from rocmtrain.api.contract import KUEUE_QUEUE_LABEL
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.render import render_rayjob
from unit.edits import put
from unit.samples import full_job


@pytest.mark.parametrize(
    ("reference", "normal"),
    [
        ("ubuntu", "docker.io/library/ubuntu"),
        ("ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
        ("rocm/pytorch:latest", "docker.io/rocm/pytorch:latest"),
        ("ghcr.io/acme/train:1", "ghcr.io/acme/train:1"),
        ("registry:5000/ml/train", "registry:5000/ml/train"),
        ("localhost/train", "localhost/train"),
    ],
)
def test_references_name_their_registry(reference: str, normal: str):
    assert normalize_image(reference) == normal


@pytest.mark.parametrize(
    ("image", "prefixes", "allowed"),
    [
        ("anything/at:all", (), True),
        ("ghcr.io/acme/train:1", ("ghcr.io/acme",), True),
        ("ghcr.io/acme/train:1", ("ghcr.io/acme/",), True),
        ("ghcr.io/acme:1", ("ghcr.io/acme",), True),
        ("ghcr.io/acme@sha256:abc", ("ghcr.io/acme",), True),
        ("ghcr.io/acme-evil/train:1", ("ghcr.io/acme",), False),
        ("ghcr.io/acmetrain:1", ("ghcr.io/acme",), False),
        ("ghcr.io/other/train:1", ("ghcr.io/acme", "registry.local"), False),
        ("registry.local/x", ("ghcr.io/acme", "registry.local"), True),
        ("rocm/pytorch:latest", ("docker.io/rocm",), True),
        ("ubuntu", ("docker.io/library/",), True),
        ("ubuntu", ("docker.io/rocm",), False),
        ("docker.io/rocm/pytorch", ("rocm/pytorch",), True),
        ("evil.io/ghcr.io/acme/x", ("ghcr.io/acme",), False),
    ],
)
def test_images_must_lie_under_an_allowed_prefix(image: str, prefixes: tuple[str, ...], allowed: bool):
    assert image_allowed(image, prefixes) is allowed


def _job(**edits: object) -> RocmTrainingJob:
    manifest = full_job()
    for path, value in edits.items():
        put(path.replace("__", "."), value)(manifest)
    return RocmTrainingJob.model_validate(manifest)


def test_everything_is_allowed_without_lists():
    assert Policy().check(_job(spec__scheduling__kueuePriorityClass="high").spec, "ml") == []


def test_each_list_refuses_at_its_field():
    policy = Policy(images=("ghcr.io/acme",), priority_classes=("training",), kueue_priority_classes=("low",))
    spec = _job(
        spec__image="docker.io/evil/miner:1",
        spec__scheduling__priorityClassName="system-cluster-critical",
        spec__scheduling__kueuePriorityClass="high",
    ).spec
    errors = {e.path: e.message for e in policy.check(spec, "ml")}
    assert errors == {
        "spec.image": "docker.io/evil/miner:1 is not from an allowed registry (ghcr.io/acme)",
        "spec.scheduling.priorityClassName": "system-cluster-critical is not an allowed priority class (training)",
        "spec.scheduling.kueuePriorityClass": "high is not an allowed priority class (low)",
    }
    fine = _job(spec__image="ghcr.io/acme/train:2", spec__scheduling__priorityClassName="training").spec
    assert policy.check(fine, "ml") == []


def test_no_job_runs_in_a_protected_namespace():
    spec = _job().spec
    policy = Policy(protected_namespaces=("kube-system", "rocm-train-system"))
    for namespace in ("kube-system", "rocm-train-system"):
        ((error),) = policy.check(spec, namespace)
        assert (error.path, error.message) == (
            "metadata.namespace",
            f"no job may run in the protected namespace {namespace}",
        )
    assert policy.check(spec, "ml") == [] and Policy(protected_namespaces=()).check(spec, "kube-system") == []


def test_a_job_larger_than_the_limits_is_refused_at_its_fields():
    search = {"searchSpace": {"epochs": [1, 2]}, "numTrials": 64, "maxConcurrentTrials": 64}
    huge = _job(spec__resources__workers=1024, spec__resources__gpusPerWorker=8, spec__tuning=search).spec
    errors = {e.path: e.message for e in Policy().check(huge, "ml")}
    assert errors == {
        "spec.resources.workers": "65536 worker pods (workers × trials at once) is over the limit of 1024",
        "spec.resources.gpusPerWorker": "524288 GPUs in all is over the limit of 4096",
    }
    at_limit = _job(spec__resources__workers=4, spec__resources__gpusPerWorker=2).spec
    assert Policy(max_worker_pods=4, max_gpus=8).check(at_limit, "ml") == []
    assert [e.path for e in Policy(max_worker_pods=3, max_gpus=7).check(at_limit, "ml")] == [
        "spec.resources.workers",
        "spec.resources.gpusPerWorker",
    ]


def test_nfs_servers_and_csi_drivers_outside_their_allow_lists_are_refused_at_their_fields():
    volumes = [
        {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
        {"name": "mine", "nfs": {"server": "10.0.0.66", "path": "/exports"}},
        {"name": "fuse", "csi": {"driver": "evil.csi.example.com"}},
    ]
    spec = _job(spec__volumes=volumes).spec
    assert Policy().check(spec, "ml") == [], "the defaults are open"
    policy = Policy(nfs_servers=("nfs.storage.local",), csi_drivers=("s3.csi.aws.com",))
    errors = {e.path: e.message for e in policy.check(spec, "ml")}
    assert errors == {
        "spec.volumes[2].nfs.server": "10.0.0.66 is not an allowed NFS server (nfs.storage.local)",
        "spec.volumes[3].csi.driver": "evil.csi.example.com is not an allowed CSI driver (s3.csi.aws.com)",
    }
    volumes[2]["nfs"]["server"], volumes[3]["csi"]["driver"] = "nfs.storage.local", "s3.csi.aws.com"
    assert policy.check(_job(spec__volumes=volumes).spec, "ml") == []


# (queueName, lifecycle.shutdownAfterJobFinishes, suspend) -> the queue under the default `team`
QUEUES = [
    ("own", True, False, "own"),
    (None, True, False, "team"),
    (None, False, False, None),  # Kueue requires shutdownAfterJobFinishes: the default takes it not
    (None, True, True, None),  # Kueue owns a queued job's suspend: nor a suspended one
]


@pytest.mark.parametrize(("named", "shutdown", "suspend", "queue"), QUEUES)
def test_the_default_queue_takes_every_job_that_names_none_and_can_be_queued(
    named: str | None, shutdown: bool, suspend: bool, queue: str | None
):
    edits: dict[str, object] = {"spec__lifecycle": {"shutdownAfterJobFinishes": shutdown}, "spec__suspend": suspend}
    if named:
        edits["spec__scheduling__queueName"] = named
    job = _job(**edits)
    policy = Policy(default_queue="team")
    assert policy.queue_for(job.spec) == queue
    assert policy.with_defaults(job).spec.scheduling.queue_name == queue
    assert policy.check(job.spec, "ml") == [], "a default never refuses a job"
    assert Policy().queue_for(job.spec) == named and Policy().with_defaults(job) is job


@pytest.mark.parametrize(("named", "shutdown", "suspend", "queue"), QUEUES)
def test_a_required_queue_refuses_every_job_left_without_one(
    named: str | None, shutdown: bool, suspend: bool, queue: str | None
):
    edits: dict[str, object] = {"spec__lifecycle": {"shutdownAfterJobFinishes": shutdown}, "spec__suspend": suspend}
    if named:
        edits["spec__scheduling__queueName"] = named
    spec = _job(**edits).spec
    alone = Policy(require_queue=True).check(spec, "ml")
    assert [(e.path, e.message) for e in alone] == (
        []
        if named
        else [
            (
                "spec.scheduling.queueName",
                "this cluster runs every job in a Kueue queue (ROCMTRAIN_REQUIRE_QUEUE): name a LocalQueue",
            )
        ]
    )
    with_default = Policy(require_queue=True, default_queue="team").check(spec, "ml")
    if queue is not None:
        assert with_default == []
    else:
        (error,) = with_default
        why = "suspended job" if suspend else "job that keeps its Ray cluster"
        assert error.path == "spec.scheduling.queueName" and f"the default queue team takes no {why}" in error.message


def test_a_job_in_the_default_queue_renders_as_a_queued_job():
    rayjob = render_rayjob(Policy(default_queue="team").with_defaults(_job()))
    assert rayjob["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team"
    assert rayjob["spec"]["suspend"] is True, "created suspended, for Kueue to admit"

"""The operator's views of its objects (`rocmtrain.status.objects`): the GPUs a job requests, what a RayJob's
view keeps, and which RayJob is a job's own; pure."""

from __future__ import annotations

from rocmtrain.status.objects import (
    INDEX_SPEC_LIMIT,
    PARTIAL_SPEC,
    controller_ref,
    index_view,
    is_jobs_rayjob,
    job_view,
    rayjob_view,
    requested_gpus,
)
from unit.samples import full_job


def test_requested_gpus_is_the_spec_s_total_even_for_partly_defaulted_resources():
    job = job_view({"spec": {"resources": {"gpusPerWorker": 4}}})  # workers defaults to 1, as the API server sets
    assert requested_gpus(job) == 4
    assert requested_gpus(job_view(full_job())) == 6
    assert requested_gpus(job_view({"spec": {"resources": {"workers": "many"}}})) == 0


def test_rayjob_view_keeps_status_and_status_write_times_only():
    body = {
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": "u",
            "ownerReferences": [{"kind": "RocmTrainingJob", "name": "j", "uid": "owner", "controller": True}],
            "managedFields": [
                {
                    "manager": "kuberay-operator",
                    "subresource": "status",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsV1": {},
                },
                {"manager": "rocm-train-operator", "time": "2025-01-01T00:00:00Z", "fieldsV1": {}},
            ],
        },
        "spec": {"suspend": True, "rayClusterSpec": {"huge": "templates"}},
        "status": {"jobDeploymentStatus": "Running"},
    }
    view = rayjob_view(body)
    assert view["spec"] == {"suspend": True}
    assert view["metadata"]["managedFields"] == [{"subresource": "status", "time": "2026-01-01T00:00:00Z"}]
    assert view["status"] == {"jobDeploymentStatus": "Running"}
    assert controller_ref(view)["uid"] == "owner"
    assert controller_ref({"metadata": {"ownerReferences": [{"kind": "Other", "controller": True}]}}) == {}


def test_only_the_rayjob_of_the_jobs_name_drives_its_status():
    job = {"metadata": {"name": "bert", "namespace": "a", "uid": "u1"}}
    owner = {"kind": "RocmTrainingJob", "name": "bert", "uid": "u1", "controller": True}
    own = {"metadata": {"namespace": "a", "name": "bert", "uid": "bert", "ownerReferences": [owner]}}
    assert is_jobs_rayjob(job, own)
    impostor = {**own, "metadata": {**own["metadata"], "name": "impostor"}}
    assert not is_jobs_rayjob(job, impostor), "a controller reference anyone may write is not enough"
    elsewhere = {**own, "metadata": {**own["metadata"], "namespace": "b"}}
    assert not is_jobs_rayjob(job, elsewhere)
    other_uid = {**job, "metadata": {**job["metadata"], "uid": "u2"}}
    assert not is_jobs_rayjob(other_uid, own), "a new job of the same name"


def _refused(job: dict, reason: str, observed: int) -> dict:
    ready = {"type": "Ready", "status": "False", "reason": reason, "message": "invalid spec: ..."}
    return {**job, "status": {"phase": "Failed", "observedGeneration": observed, "conditions": [ready]}}


def test_the_index_keeps_a_refused_or_oversized_spec_as_its_metrics_and_notifier_read_it():
    """The job index holds no spec larger than validation accepts, and none its status refuses (a 1.5 MB job
    the API server stores would otherwise stay in memory whole): only its resources and receivers."""
    job = full_job()
    job["metadata"]["generation"] = 2
    job["spec"]["notifications"] = [{"url": "https://hooks.example.com/ml"}]
    kept = index_view(job)
    assert kept["spec"] == job["spec"] and PARTIAL_SPEC not in kept and kept["gpus"] == 6

    oversized = {**job, "spec": {**job["spec"], "env": [{"name": f"V{i}", "value": "x" * 4096} for i in range(24)]}}
    for view in (
        index_view(oversized),
        index_view(_refused(job, "InvalidSpec", 2)),
        index_view(_refused(job, "NotAllowed", 2)),
    ):
        assert view[PARTIAL_SPEC] is True and view["gpus"] == 6
        assert view["spec"] == {"resources": job["spec"]["resources"], "notifications": job["spec"]["notifications"]}
        assert view["metadata"] == job_view(job)["metadata"]

    # Refused for an older generation, or failed for another reason: the spec may be read again.
    assert PARTIAL_SPEC not in index_view(_refused(job, "InvalidSpec", 1))
    assert PARTIAL_SPEC not in index_view(_refused(job, "DeadlineExceeded", 2))
    # The bound is validation's: a spec of exactly INDEX_SPEC_LIMIT bytes is kept.
    edge = {**job, "spec": {"env": [{"name": "V", "value": ""}]}}
    edge["spec"]["env"][0]["value"] = "x" * (INDEX_SPEC_LIMIT - len('{"env":[{"name":"V","value":""}]}'))
    assert PARTIAL_SPEC not in index_view(edge)
    edge["spec"]["env"][0]["value"] += "é"
    assert index_view(edge)[PARTIAL_SPEC] is True

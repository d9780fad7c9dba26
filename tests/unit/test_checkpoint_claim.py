"""Which claim holds a job's checkpoints, and when the operator warns that not every Ray pod may mount it
(`rocmtrain.admission.checkpoint_claim`)."""

from __future__ import annotations

from typing import Any

import pytest

from rocmtrain.admission.checkpoint_claim import checkpoint_claim, unshared_claim_warning
from rocmtrain.api.models import RocmTrainingJob
from unit.samples import full_job, minimal_job


def _job(**spec: Any) -> RocmTrainingJob:
    body = full_job()  # checkpoints at /checkpoints/sample, on claim `checkpoints`; 3 workers
    body["spec"].update(spec)
    return RocmTrainingJob.model_validate(body)


def _claim(spec: list[str], status: list[str] | None = None) -> dict[str, Any]:
    claim: dict[str, Any] = {"metadata": {"name": "checkpoints"}, "spec": {"accessModes": spec}}
    if status is not None:
        claim["status"] = {"phase": "Bound", "accessModes": status}
    return claim


def test_the_claim_is_the_one_mounted_deepest_under_the_checkpoint_path():
    assert checkpoint_claim(_job()) == "checkpoints"
    nested = _job(
        volumes=[
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "checkpoints"}},
            {"name": "team", "persistentVolumeClaim": {"claimName": "team-runs"}},
        ],
        volumeMounts=[
            {"name": "ckpt", "mountPath": "/checkpoints"},
            {"name": "team", "mountPath": "/checkpoints/sample"},
        ],
    )
    assert checkpoint_claim(nested) == "team-runs"


@pytest.mark.parametrize(
    "spec",
    [
        {"checkpoint": {"storagePath": "s3://bucket/runs"}},
        {
            "volumes": [{"name": "ckpt", "nfs": {"server": "nfs.local", "path": "/exports"}}],
            "volumeMounts": [{"name": "ckpt", "mountPath": "/checkpoints"}],
        },
    ],
    ids=["object-storage", "nfs"],
)
def test_checkpoints_off_a_claim_name_none(spec: dict[str, Any]):
    assert checkpoint_claim(_job(**spec)) is None
    assert checkpoint_claim(RocmTrainingJob.model_validate(minimal_job())) is None


def test_a_claim_that_is_not_read_write_many_is_warned_with_its_modes_and_the_fix():
    message = unshared_claim_warning(_job(), _claim(["ReadWriteOnce"]))
    assert message is not None
    for words in (
        "/checkpoints/sample lie on PersistentVolumeClaim checkpoints",
        "access modes ReadWriteOnce, not ReadWriteMany (ReadWriteOnce: mounted read-write on one node at a time)",
        "this job's 4 Ray pods (the head and 3 workers) may run on several nodes",
        "a ReadWriteMany claim",
        "s3://",
    ):
        assert words in message, message
    once_pod = unshared_claim_warning(_job(), _claim(["ReadWriteOncePod"]))
    assert once_pod is not None and "ReadWriteOncePod: mounted by one pod at a time" in once_pod


@pytest.mark.parametrize(
    ("spec", "status"),
    [
        (["ReadWriteMany"], None),  # not bound yet: the modes it asks for
        (["ReadWriteOnce"], ["ReadWriteOnce", "ReadWriteMany"]),  # bound: its volume's modes
        ([], None),  # no modes: nothing to say
    ],
)
def test_a_read_write_many_volume_or_unknown_modes_give_no_warning(spec: list[str], status: list[str] | None):
    assert unshared_claim_warning(_job(), _claim(spec, status)) is None


def test_the_bound_volumes_modes_win_over_those_the_claim_asks_for():
    message = unshared_claim_warning(_job(), _claim(["ReadWriteMany"], ["ReadOnlyMany"]))
    assert message is not None and "access modes ReadOnlyMany, not ReadWriteMany (ReadOnlyMany: read-only)" in message

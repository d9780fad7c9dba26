"""The pool's rules on the real control plane: checkpoints only where every pod sees the same bytes (and a warning
for a claim that is not ReadWriteMany), the Kueue queue required (with a default), the NFS allow-list.

Real parts: kube-apiserver (the CRD's schema accepts each of these jobs: the operator refuses them), RBAC, the
operator under KopfRunner as its ServiceAccount with the pool's settings. No KubeRay or Kueue is needed: each job
is refused before any RayJob, or its RayJob is read as made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_testkit import Api, Operator, job_manifest, wait_until

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.contract import KUEUE_QUEUE_LABEL
from rocmtrain.api.models import Phase
from rocmtrain_testworld.kubecluster import KubeCluster

pytestmark = pytest.mark.cluster

QUEUE = "team"
NFS_SERVER = "nfs.storage.local"


@pytest.fixture(scope="module")
def operator(operator_kubeconfig: Path) -> Iterator[Operator]:
    """The operator of a shared pool: every job in a queue (`team` unless it names one), one NFS server."""
    running = Operator(
        operator_kubeconfig,
        env={
            "ROCMTRAIN_REQUIRE_QUEUE": "true",
            "ROCMTRAIN_DEFAULT_QUEUE": QUEUE,
            "ROCMTRAIN_ALLOWED_NFS_SERVERS": NFS_SERVER,
        },
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


def _on(source: dict[str, object]) -> dict[str, object]:
    """Spec fields putting the checkpoints on a volume of `source` at /ckpt."""
    return {
        "volumes": [{"name": "ckpt", **source}],
        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
        "checkpoint": {"storagePath": "/ckpt/runs"},
    }


def _refused(api: Api, ns: str, name: str, reason: str, words: str) -> None:
    wait_until(lambda: api.phase(ns, name) == Phase.FAILED, timeout=15, what=f"{name} refused")
    failed = api.condition(ns, name, ConditionType.FAILED)
    assert failed["reason"] == reason and words in failed["message"], failed
    assert api.rayjob(ns, name) is None, f"{name}: no RayJob"


def test_checkpoints_on_a_volume_not_every_pod_shares_are_refused(kube: KubeCluster, api: Api, ns: str):
    kube.create(job_manifest("scratch", ns, **_on({"emptyDir": {}})))
    kube.create(job_manifest("foreign", ns, **_on({"nfs": {"server": "10.0.0.66", "path": "/exports"}})))
    kube.create(job_manifest("shared", ns, **_on({"nfs": {"server": NFS_SERVER, "path": "/exports"}})))
    _refused(api, ns, "scratch", Reason.INVALID_SPEC, "spec.checkpoint.storagePath: /ckpt/runs lies on volume ckpt")
    _refused(api, ns, "foreign", Reason.NOT_ALLOWED, "spec.volumes[0].nfs.server: 10.0.0.66 is not an allowed")
    wait_until(lambda: api.rayjob(ns, "shared"), timeout=10, what="the RayJob of the job on the allowed NFS server")


def test_every_job_runs_in_a_queue_the_default_one_where_it_names_none(kube: KubeCluster, api: Api, ns: str):
    kube.create(job_manifest("named", ns, scheduling={"queueName": "research"}))
    kube.create(job_manifest("unnamed", ns))
    # Kueue queues no job that keeps its Ray cluster: the default takes it not, and the requirement refuses it.
    kube.create(job_manifest("kept", ns, lifecycle={"shutdownAfterJobFinishes": False}))
    _refused(api, ns, "kept", Reason.NOT_ALLOWED, f"the default queue {QUEUE} takes no job that keeps its Ray")
    for name, queue in (("named", "research"), ("unnamed", QUEUE)):
        rayjob = wait_until(lambda name=name: api.rayjob(ns, name), timeout=10, what=f"{name}'s RayJob")
        assert rayjob["metadata"]["labels"][KUEUE_QUEUE_LABEL] == queue
        assert rayjob["spec"]["suspend"] is True, "created suspended, for Kueue to admit"


def _claim(name: str, mode: str) -> dict[str, object]:
    """A PersistentVolumeClaim asking for `mode` (left unbound: no volume is needed for its access modes)."""
    spec = {"accessModes": [mode], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def test_checkpoints_on_a_claim_that_is_not_read_write_many_are_warned_about(kube: KubeCluster, api: Api, ns: str):
    """The operator reads the claim (RBAC: `get` on persistentvolumeclaims) before it makes the RayJob: once the
    RayJob exists, the warning has been posted or never will be for that generation."""
    kube.create(_claim("node-local", "ReadWriteOnce"), ns)
    kube.create(_claim("shared", "ReadWriteMany"), ns)
    for claim in ("node-local", "shared", "not-yet-made"):
        kube.create(job_manifest(claim, ns, **_on({"persistentVolumeClaim": {"claimName": claim}})))
    for claim in ("node-local", "shared", "not-yet-made"):
        wait_until(lambda claim=claim: api.rayjob(ns, claim), timeout=10, what=f"the RayJob of the job on {claim}")
    reason = Reason.CHECKPOINT_CLAIM_NOT_SHARED
    (warning,) = [(kind, message) for kind, why, message in api.event_messages(ns, "node-local") if why == reason]
    assert warning[0] == "Warning" and "PersistentVolumeClaim node-local, access modes ReadWriteOnce" in warning[1]
    for quiet in ("shared", "not-yet-made"):
        assert reason not in [why for _, why in api.events(ns, quiet)], quiet

"""Names of the RayJob and of the objects KubeRay derives from it.

KubeRay v1.5.1 names the RayCluster `<rayjob>-<5 random>` (GenerateRayClusterName),
its head Services `<rayjob>-head-svc` and `<cluster>-head-svc` (GenerateHeadServiceName),
the head pod `<cluster>-head-<5>` and worker pods `<cluster>-<group>-worker-<5>`
(PodName, which silently cuts prefixes longer than 50 characters), and the
submitter Kubernetes Job `<rayjob>`. `rocmtrain.api.validate` checks every one of
them, so no name is cut or rejected after the job was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.patterns import DNS_1035_LABEL, DNS_LABEL

# KubeRay's random suffix (rand.String(5)), spelled with a valid character.
_RANDOM = "x" * 5
# utils.MaxRayJobNameLength and utils.MaxRayClusterNameLength in KubeRay v1.5.1.
MAX_RAYJOB_NAME = 47
MAX_RAYCLUSTER_NAME = 53
MAX_LABEL = 63


@dataclass(frozen=True)
class DerivedName:
    """One name KubeRay or Kubernetes derives from the job name, and the rule it must meet."""

    what: str
    name: str
    pattern: str
    max_length: int


def rayjob_name(job: RocmTrainingJob) -> str:
    """The RayJob's name: the job's own name."""
    return rayjob_name_of(job.metadata.name)


def rayjob_name_of(job_name: str) -> str:
    """The name of the RayJob of the job called `job_name`."""
    return job_name


def network_policy_name(job: RocmTrainingJob) -> str:
    """The NetworkPolicy around the job's Ray pods (`rocmtrain.render.network_policy`)."""
    return f"{job.metadata.name}-ray"


def worker_group_name(job: RocmTrainingJob) -> str:
    """The Ray worker group: `gpu` or `cpu`, short so worker pod names are never cut."""
    return "gpu" if job.spec.resources.gpus_per_worker else "cpu"


def derived_names(name: str, group: str) -> list[DerivedName]:
    """Every name derived from a RayJob called `name` with worker group `group`."""
    cluster = f"{name}-{_RANDOM}"
    return [
        DerivedName("RayJob", name, DNS_1035_LABEL, MAX_RAYJOB_NAME),
        DerivedName("RayCluster", cluster, DNS_1035_LABEL, MAX_RAYCLUSTER_NAME),
        DerivedName("RayJob head Service", f"{name}-head-svc", DNS_1035_LABEL, MAX_LABEL),
        DerivedName("RayCluster head Service", f"{cluster}-head-svc", DNS_1035_LABEL, MAX_LABEL),
        DerivedName("head pod", f"{cluster}-head-{_RANDOM}", DNS_LABEL, MAX_LABEL),
        DerivedName("worker pod", f"{cluster}-{group}-worker-{_RANDOM}", DNS_LABEL, MAX_LABEL),
        DerivedName("submitter Job", name, DNS_LABEL, MAX_LABEL),
    ]

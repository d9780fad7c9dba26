"""The RayJob for a RocmTrainingJob: a pure, deterministic function of the job and the operator's options.

Design choices (KubeRay v1.5.1, Ray 2.60.0):
- submissionMode K8sJobMode: KubeRay runs `ray job submit` in a Kubernetes Job that
  retries a failed submission without submitting twice, follows the driver's logs
  (`kubectl logs job/<name>`), and keeps working while the operator restarts. Its pod
  template is ours, so it runs with the same restricted security context.
- The driver runs on the head (Ray's job supervisor places an entrypoint without
  resource requests there), which is why `ROCMTRAIN_JOB` is set on the head only.
- A job's own code (spec.code) is the entrypoint instead: its command line with every
  argument quoted (`rocmtrain.api.code.entrypoint`), as it passes through two shells.
- Head `num-cpus: "0"`: no Ray Train worker or data task lands on the head; Ray
  Train's controller asks for 0 CPUs and is pinned to the driver's node, so it fits.
- GPUs: KubeRay turns any limit whose name ends in "gpu" (utils.IsGPUResourceKey), so
  `amd.com/gpu`, into `--num-gpus`, and CPU and memory limits into `--num-cpus` and
  `--memory`; a partition's resource under the device plugin's mixed naming
  (`amd.com/cpx_nps4`) does not end so, and the workers then get `num-gpus` explicitly;
  otherwise they need no rayStartParams, but get an empty map: Kueue's
  webhook, when it mutates a RayJob (suspending it, or naming a namespace's default
  LocalQueue), writes `rayStartParams: null` where the field is absent, which the
  CRD refuses.
- `authOptions: {mode: token}`: KubeRay makes a random token in a Secret named after the
  RayCluster and gives it (RAY_AUTH_MODE, RAY_AUTH_TOKEN) to the head, the workers and the
  submitter; Ray then refuses every dashboard, job-API and RPC request without it, so
  nobody outside the job can submit code to its cluster (the NetworkPolicy of
  `rocmtrain.render.network_policy` also keeps them from Ray's ports). Users cannot set either
  variable (`rocmtrain.api.validate`).
- One worker group with replicas = minReplicas = maxReplicas and the autoscaler off:
  data-parallel training wants a fixed world size, and Kueue requires it.
- Queued jobs (spec.scheduling.queueName) get Kueue's labels and are created
  suspended; Kueue unsuspends the RayJob on admission and owns `spec.suspend` from
  then on, so the operator must not re-apply that field on a queued RayJob.
- `spec.scheduling.topology` becomes Kueue's pod-set topology annotation (required or
  preferred, naming the level's node label) on the head's and the workers' pod templates,
  the pod sets Kueue's RayJob integration makes of them; the submitter's pod set, one
  small pod without GPUs, is left to place freely.
- The submitter Job (K8sJobMode) is retried `options.submitter_retries` times
  (`submitterConfig.backoffLimit`, KubeRay's own default 2 unless the operator is
  told otherwise): KubeRay's submitter first asks `ray job status`, so a retried
  submitter follows the same Ray job instead of submitting it again; the RayJob
  fails with SubmissionFailed (and `jobRetries` starts a new Ray cluster) only after them.
"""

from __future__ import annotations

from typing import Any

import yaml

from rocmtrain.api import names
from rocmtrain.api.code import entrypoint
from rocmtrain.api.contract import (
    DRIVER_MODULE,
    JOB_NAME_LABEL,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOPOLOGY_ANNOTATIONS,
    MANAGED_LABELS,
    RAY_VERSION,
    RAYJOB_API_VERSION,
    RAYJOB_KIND,
)
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.render import pod
from rocmtrain.render.options import RenderOptions

# The driver's command line: a constant; the job reaches it through ROCMTRAIN_JOB only.
ENTRYPOINT = f"python -m {DRIVER_MODULE}"
SUBMISSION_MODE = "K8sJobMode"
# KubeRay's value of each RayJob spec field that follows the job after creation (see
# `mutable_rayjob_fields`) where the field is unset: unset and default are the same state.
MUTABLE_RAYJOB_DEFAULTS = {"suspend": False, "shutdownAfterJobFinishes": False, "ttlSecondsAfterFinished": 0}


def job_labels(job: RocmTrainingJob) -> dict[str, str]:
    """Labels linking an object back to its job (on the RayJob and every pod template)."""
    return {JOB_NAME_LABEL: job.metadata.name, **MANAGED_LABELS}


def rayjob_labels(job: RocmTrainingJob) -> dict[str, str]:
    """The RayJob's labels: the job labels plus Kueue's when the job is queued."""
    labels = job_labels(job)
    scheduling = job.spec.scheduling
    if scheduling.queue_name:
        labels[KUEUE_QUEUE_LABEL] = scheduling.queue_name
    if scheduling.kueue_priority_class:
        labels[KUEUE_PRIORITY_LABEL] = scheduling.kueue_priority_class
    return labels


def mutable_rayjob_fields(job: RocmTrainingJob) -> dict[str, Any]:
    """The RayJob spec fields that follow the job's `MUTABLE_FIELDS` after creation (unset ones left out).

    The RayJob names them as the job does: `suspend` (true as well while Kueue holds a
    queued job) and the fields of `spec.lifecycle`.
    """
    spec = job.spec
    return {"suspend": spec.suspend or spec.scheduling.queue_name is not None, **spec.lifecycle.dump()}


def topology_annotations(job: RocmTrainingJob) -> dict[str, str]:
    """Kueue's pod-set topology annotation for `spec.scheduling.topology` ({} without it)."""
    topology = job.spec.scheduling.topology
    return {KUEUE_TOPOLOGY_ANNOTATIONS[topology.mode]: topology.level} if topology is not None else {}


def _placed(template: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    """`template` with `annotations` added to its metadata (when there are any)."""
    if annotations:
        metadata = template["metadata"]
        metadata["annotations"] = {**metadata.get("annotations", {}), **annotations}
    return template


def worker_start_params(job: RocmTrainingJob) -> dict[str, str]:
    """`ray start` options of the workers: `num-gpus` where KubeRay would not count the GPUs (a partition's
    resource under mixed naming: KubeRay counts only limits whose name ends in `gpu`)."""
    res = job.spec.resources
    if res.gpus_per_worker and not res.gpu_resource.endswith("gpu"):
        return {"num-gpus": str(res.gpus_per_worker)}
    return {}


def ray_cluster_spec(job: RocmTrainingJob, options: RenderOptions) -> dict[str, Any]:
    """One head group and one fixed-size worker group: the job's workers for every trial that runs at once."""
    labels = job_labels(job)
    workers = job.spec.worker_pods
    topology = topology_annotations(job)
    return {
        "rayVersion": RAY_VERSION,
        "authOptions": {"mode": "token"},
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},
            "template": _placed(pod.head_template(job, options, labels), topology),
        },
        "workerGroupSpecs": [
            {
                "groupName": names.worker_group_name(job),
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": worker_start_params(job),
                "template": _placed(pod.worker_template(job, options, labels), topology),
            }
        ],
    }


def render_rayjob(job: RocmTrainingJob, *, options: RenderOptions | None = None) -> dict[str, Any]:
    """The RayJob for `job` (which `rocmtrain.api.validate.validate_job` accepted)."""
    options = options or RenderOptions()
    spec = job.spec
    rayjob_spec: dict[str, Any] = {
        "entrypoint": entrypoint(spec.code) if spec.code is not None else ENTRYPOINT,
        "submissionMode": SUBMISSION_MODE,
        "submitterPodTemplate": pod.submitter_template(job, job_labels(job)),
        "submitterConfig": {"backoffLimit": options.submitter_retries},
        "backoffLimit": spec.fault_tolerance.job_retries,
        "rayClusterSpec": ray_cluster_spec(job, options),
        **mutable_rayjob_fields(job),
    }
    if spec.fault_tolerance.active_deadline_seconds is not None:
        rayjob_spec["activeDeadlineSeconds"] = spec.fault_tolerance.active_deadline_seconds
    return {
        "apiVersion": RAYJOB_API_VERSION,
        "kind": RAYJOB_KIND,
        "metadata": {
            "name": names.rayjob_name(job),
            "namespace": job.metadata.namespace,
            "labels": rayjob_labels(job),
        },
        "spec": rayjob_spec,
    }


def dump_yaml(obj: Any) -> str:
    """Stable YAML: sorted keys, block style, no line wrapping."""
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, allow_unicode=True, width=1 << 20)


def render_rayjob_yaml(job: RocmTrainingJob, *, options: RenderOptions | None = None) -> str:
    """The RayJob as YAML; the same job always gives byte-identical text."""
    return dump_yaml(render_rayjob(job, options=options))

"""The NetworkPolicy around a job's Ray cluster: only the job's own pods reach its Ray ports.

Ray's ports (GCS, raylets, object managers, workers, metrics, the client server)
take commands from anyone who can reach them, so the head, the workers and the
submitter (every pod with the job's label) admit each other only. The one
exception is the dashboard's port, where KubeRay's operator, in a namespace of its
own, polls the job: it is open to every namespace and guarded by the cluster's Ray
token (`authOptions: {mode: token}`, see `rocmtrain.render.rayjob`), which only
the job's pods and KubeRay hold. Egress stays open (object stores, the model hub,
the progress endpoint). NetworkPolicies add up, so a platform team admits its
Prometheus to Ray's metrics port with a policy of its own.
"""

from __future__ import annotations

from typing import Any

from rocmtrain.api import names
from rocmtrain.api.contract import JOB_NAME_LABEL, NETWORK_POLICY_API_VERSION, RAY_DASHBOARD_PORT
from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.render.rayjob import job_labels


def render_network_policy(job: RocmTrainingJob) -> dict[str, Any]:
    """The job's NetworkPolicy: ingress to its pods from its own pods, and to the dashboard from anywhere."""
    own_pods = {"matchLabels": {JOB_NAME_LABEL: job.metadata.name}}
    return {
        "apiVersion": NETWORK_POLICY_API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.network_policy_name(job),
            "namespace": job.metadata.namespace,
            "labels": job_labels(job),
        },
        "spec": {
            "podSelector": own_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": own_pods}]},
                {
                    "from": [{"namespaceSelector": {}}],
                    "ports": [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}],
                },
            ],
        },
    }

"""The operator's configuration from its environment (`rocmtrain.controller.settings`): defaults, overrides,
what is refused."""

from __future__ import annotations

import dataclasses

import pytest

from rocmtrain.admission.policy import Policy
from rocmtrain.api.errors import ConfigError
from rocmtrain.controller.settings import OperatorConfig


def test_config_defaults_and_overrides():
    default = OperatorConfig.from_env({})
    assert (default.namespaces, default.metrics_port, default.health_port) == ((), 8080, 8081)
    assert default.stall_seconds == 900 and default.stall_check_seconds == 60
    assert default.queue_estimate_seconds == 15
    assert OperatorConfig.from_env({"ROCMTRAIN_QUEUE_ESTIMATE_SECONDS": "2"}).queue_estimate_seconds == 2
    # Plain HTTP without authentication: loopback only, unless the Deployment says otherwise.
    assert default.liveness_endpoint == "http://127.0.0.1:8081/healthz" and default.metrics_host == "127.0.0.1"
    assert not default.metrics_secure, "no progress endpoint, no certificate: plain HTTP on loopback"
    assert default.policy == Policy() and default.api_timeout_seconds == 15
    assert default.job_network_policies
    assert not OperatorConfig.from_env({"ROCMTRAIN_JOB_NETWORK_POLICIES": "false"}).job_network_policies
    custom = OperatorConfig.from_env(
        {"ROCMTRAIN_NAMESPACES": "team-a, team-b", "ROCMTRAIN_STALL_SECONDS": "8", "ROCMTRAIN_HEALTH_PORT": "0"}
    )
    assert custom.namespaces == ("team-a", "team-b")
    assert custom.stall_check_seconds == 2 and custom.liveness_endpoint is None
    assert default.pricing is None and default.metrics_max_jobs == 500
    priced = OperatorConfig.from_env({"ROCMTRAIN_GPU_PRICES": "default=2.5", "ROCMTRAIN_COST_CURRENCY": "EUR"})
    assert priced.pricing is not None and (priced.pricing.default, priced.pricing.currency) == (2.5, "EUR")
    pod = OperatorConfig.from_env(
        {
            "ROCMTRAIN_OPERATOR_NAMESPACE": "rocm-train-system",
            "ROCMTRAIN_METRICS_HOST": "0.0.0.0",  # noqa: S104 - what a Deployment sets
            "ROCMTRAIN_HEALTH_HOST": "::",
            "ROCMTRAIN_API_TIMEOUT_SECONDS": "5",
            "ROCMTRAIN_ALLOWED_IMAGES": "ghcr.io/acme/, registry.local:5000/ml",
            "ROCMTRAIN_ALLOWED_PRIORITY_CLASSES": "training",
            "ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES": "low,high",
        }
    )
    assert pod.metrics_host == "0.0.0.0" and pod.metrics_secure  # noqa: S104 - HTTPS, scrapes authenticated
    assert pod.liveness_endpoint == "http://[::]:8081/healthz"
    assert pod.api_timeout_seconds == 5 and pod.reconcile_deadline == 20
    allowed = Policy(("ghcr.io/acme/", "registry.local:5000/ml"), ("training",), ("low", "high"))
    assert pod.policy == dataclasses.replace(allowed, protected_namespaces=("kube-system", "rocm-train-system"))
    assert default.render_options.submitter_retries == 2
    # The progress endpoint (TLS, authenticated) listens on every address unless told where.
    progress = {"ROCMTRAIN_OPERATOR_NAMESPACE": "rocm-train-system"}
    assert OperatorConfig.from_env(progress).progress.host == "0.0.0.0"  # noqa: S104
    assert OperatorConfig.from_env({**progress, "ROCMTRAIN_PROGRESS_HOST": "10.0.0.7"}).progress.host == "10.0.0.7"
    with pytest.raises(ValueError, match="ROCMTRAIN_PROGRESS_HOST must be an IP address"):
        OperatorConfig.from_env({**progress, "ROCMTRAIN_PROGRESS_HOST": "all"})
    assert OperatorConfig.from_env({"ROCMTRAIN_SUBMITTER_RETRIES": "0"}).render_options.submitter_retries == 0
    # The operator's own namespace is protected beside kube-system, unless the admin says otherwise.
    assert OperatorConfig.from_env(progress).policy.protected_namespaces == ("kube-system", "rocm-train-system")
    assert OperatorConfig.from_env({"ROCMTRAIN_PROTECTED_NAMESPACES": "-"}).policy.protected_namespaces == ()
    limits = {
        "ROCMTRAIN_PROTECTED_NAMESPACES": "infra",
        "ROCMTRAIN_MAX_WORKER_PODS": "8",
        "ROCMTRAIN_MAX_JOB_GPUS": "64",
    }
    assert OperatorConfig.from_env(limits).policy == Policy(
        max_worker_pods=8, max_gpus=64, protected_namespaces=("infra",)
    )
    pool = {
        "ROCMTRAIN_ALLOWED_NFS_SERVERS": "nfs.storage.local, 10.0.0.5",
        "ROCMTRAIN_ALLOWED_CSI_DRIVERS": "s3.csi.aws.com",
        "ROCMTRAIN_DEFAULT_QUEUE": "team",
        "ROCMTRAIN_REQUIRE_QUEUE": "true",
    }
    assert OperatorConfig.from_env(pool).policy == Policy(
        nfs_servers=("nfs.storage.local", "10.0.0.5"),
        csi_drivers=("s3.csi.aws.com",),
        default_queue="team",
        require_queue=True,
    )
    assert (default.policy.default_queue, default.policy.require_queue) == (None, False), "open by default"


def test_metrics_are_https_where_the_progress_endpoint_runs_and_plain_http_only_on_loopback():
    cluster = {"ROCMTRAIN_OPERATOR_NAMESPACE": "ops", "ROCMTRAIN_METRICS_HOST": "0.0.0.0"}  # noqa: S104
    assert OperatorConfig.from_env(cluster).metrics_secure
    local = {
        "ROCMTRAIN_OPERATOR_NAMESPACE": "ops",
        "ROCMTRAIN_METRICS_SECURE": "false",
        "ROCMTRAIN_METRICS_HOST": "::1",
    }
    assert not OperatorConfig.from_env(local).metrics_secure
    off = OperatorConfig.from_env({"ROCMTRAIN_METRICS_PORT": "0", "ROCMTRAIN_METRICS_HOST": "0.0.0.0"})  # noqa: S104
    assert off.metrics_port == 0 and not off.metrics_secure, "nothing served, nothing to refuse"


@pytest.mark.parametrize(
    "env",
    [
        {"ROCMTRAIN_NAMESPACES": "Team_A"},
        {"ROCMTRAIN_METRICS_PORT": "70000"},
        {"ROCMTRAIN_STALL_SECONDS": "0"},
        {"ROCMTRAIN_QUEUE_ESTIMATE_SECONDS": "0"},
        {"ROCMTRAIN_RETRY_SECONDS": "soon"},
        {"ROCMTRAIN_METRICS_MAX_JOBS": "-1"},
        {"ROCMTRAIN_GPU_PRICES": "AMD_Instinct_MI300X_OAM=cheap"},
        {"ROCMTRAIN_GPU_PRICES": "default=2", "ROCMTRAIN_COST_CURRENCY": "euro"},
        {"ROCMTRAIN_METRICS_HOST": "all"},
        {"ROCMTRAIN_METRICS_SECURE": "yes"},
        # Plain HTTP off loopback (by default without the progress endpoint, or asked for), and HTTPS without
        # the progress endpoint's certificate.
        {"ROCMTRAIN_METRICS_HOST": "0.0.0.0"},  # noqa: S104
        {
            "ROCMTRAIN_METRICS_HOST": "10.0.0.7",
            "ROCMTRAIN_OPERATOR_NAMESPACE": "ops",
            "ROCMTRAIN_METRICS_SECURE": "false",
        },
        {"ROCMTRAIN_METRICS_SECURE": "true"},
        {"ROCMTRAIN_METRICS_SECURE": "true", "ROCMTRAIN_OPERATOR_NAMESPACE": "ops", "ROCMTRAIN_PROGRESS_PORT": "0"},
        {"ROCMTRAIN_API_TIMEOUT_SECONDS": "0"},
        {"ROCMTRAIN_ALLOWED_IMAGES": "ghcr.io/acme evil"},
        {"ROCMTRAIN_ALLOWED_PRIORITY_CLASSES": "Training"},
        {"ROCMTRAIN_SUBMITTER_RETRIES": "21"},
        {"ROCMTRAIN_MAX_WORKER_PODS": "0"},
        {"ROCMTRAIN_MAX_JOB_GPUS": "many"},
        {"ROCMTRAIN_PROTECTED_NAMESPACES": "Kube_System"},
        {"ROCMTRAIN_JOB_NETWORK_POLICIES": "off"},
        {"ROCMTRAIN_ALLOWED_NFS_SERVERS": "nfs:2049"},
        {"ROCMTRAIN_ALLOWED_CSI_DRIVERS": "S3.CSI"},
        {"ROCMTRAIN_DEFAULT_QUEUE": "Team_A"},
        {"ROCMTRAIN_DEFAULT_QUEUE": "q" * 64},
        {"ROCMTRAIN_REQUIRE_QUEUE": "yes"},
    ],
)
def test_config_refuses_bad_values(env):
    with pytest.raises(ConfigError):
        OperatorConfig.from_env(env)


def test_notification_receiver_networks_are_read_and_a_bad_one_named() -> None:
    default = OperatorConfig.from_env({}).receivers
    assert [str(n) for n in default.cluster] == ["10.96.0.0/12", "10.244.0.0/16"] and default.allowed == ()
    env = {"ROCMTRAIN_NOTIFY_ALLOWED_CIDRS": "10.20.0.0/16, fd00::/8", "ROCMTRAIN_CLUSTER_CIDRS": "100.96.0.0/12"}
    rules = OperatorConfig.from_env(env).receivers
    assert [str(n) for n in (*rules.allowed, *rules.cluster)] == ["10.20.0.0/16", "fd00::/8", "100.96.0.0/12"]
    with pytest.raises(ConfigError, match=r"ROCMTRAIN_NOTIFY_ALLOWED_CIDRS: 'hooks.example.com' is not a CIDR"):
        OperatorConfig.from_env({"ROCMTRAIN_NOTIFY_ALLOWED_CIDRS": "hooks.example.com"})

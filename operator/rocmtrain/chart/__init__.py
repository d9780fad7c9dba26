"""The Helm chart manifests/helm/rocm-train-operator, generated from the kustomize sources under manifests/.

`make manifests` writes it (`python -m rocmtrain.chart`); tests/operator/test_helm.py fails when the
committed chart differs from what this makes, and when `helm template` differs from `kustomize build`.
What kustomize installs has one source, manifests/; the chart adds only its values and their defaults,
which are the base's own (the image tag of its kustomization, the Deployment's resources and settings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rocmtrain.chart import templates
from rocmtrain.chart.emit import dump

CHART_DIR = Path("manifests/helm/rocm-train-operator")
CHART_VERSION = "0.1.0"
IMAGE = "ghcr.io/rocm-train-operator/operator"
HEADER = "# Generated from manifests/{source} by `make manifests` (python -m rocmtrain.chart). Do not edit.\n"
DASHBOARD_FILE = "rocmtrain-dashboard.json"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _pairs(kustomization: Mapping[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for entry in kustomization.get("labels") or []:
        labels.update(entry["pairs"])
    return labels


def _component_patch(component: Mapping[str, Any], kind: str) -> Any:
    """The value of the first JSON patch a component makes on its target of ``kind``."""
    (patch,) = [p for p in component["patches"] if p.get("target", {}).get("kind") == kind]
    return yaml.safe_load(patch["patch"])[0]["value"]


def values(manifests: Path) -> str:
    """values.yaml: every value with its default (the base's), commented."""
    kustomization = yaml.safe_load((manifests / "kustomization.yaml").read_text())
    (image,) = [i for i in kustomization["images"] if i["name"] == IMAGE]
    (deployment,) = _docs(manifests / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    stall = next(e["value"] for e in container["env"] if e["name"] == templates.STALL_VARIABLE)
    indented = "".join(f"  {line}\n" for line in dump(container["resources"]).splitlines())
    return f"""\
# Values of the rocm-train-operator chart. With these defaults the chart installs what
# `kubectl apply -k manifests/` does (docs/operations/install.md); the defaults are the base's own.
image:
  repository: {image["name"]}
  tag: {json.dumps(image["newTag"])}
  pullPolicy: {container["imagePullPolicy"]}

# The operator's namespace is the release's: `helm install -n rocm-train-system --create-namespace`
# (Helm keeps the release's record there, so it exists before the chart's objects). true: the chart
# makes it too, labelled for the restricted Pod Security Standard as manifests/ does, for a
# `helm template` that is applied by other means (Argo CD renders charts so).
namespace:
  create: false

# Empty: the operator watches every namespace (its namespaced rules bound cluster-wide). Listed: it
# watches these only (ROCMTRAIN_NAMESPACES), with a RoleBinding in each and no cluster-wide binding of
# those rules, as the manifests/namespaced component; restart it after reinstalling the CRD.
watchNamespaces: []

resources:
{indented}
# A Running job without progress for this long gets Stalled=True (ROCMTRAIN_STALL_SECONDS).
stallSeconds: {stall}

# What jobs may ask for (docs/operations/configuration.md). Empty or null: the operator's default.
policy:
  allowedImages: []                # image prefixes jobs may use (ROCMTRAIN_ALLOWED_IMAGES)
  allowedPriorityClasses: []       # ROCMTRAIN_ALLOWED_PRIORITY_CLASSES
  allowedKueuePriorityClasses: []  # ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES
  protectedNamespaces: []          # no jobs here (ROCMTRAIN_PROTECTED_NAMESPACES; default kube-system, the operator's)
  maxWorkerPods: null              # most worker pods of one job (ROCMTRAIN_MAX_WORKER_PODS; default 1024)
  maxJobGpus: null                 # most AMD GPUs of one job (ROCMTRAIN_MAX_JOB_GPUS; default 4096)
  allowedNfsServers: []            # NFS servers volumes may name (ROCMTRAIN_ALLOWED_NFS_SERVERS)
  allowedCsiDrivers: []            # CSI drivers inline volumes may use (ROCMTRAIN_ALLOWED_CSI_DRIVERS)
  defaultQueue: null               # Kueue LocalQueue of jobs naming none (ROCMTRAIN_DEFAULT_QUEUE)
  requireQueue: false              # true: refuse jobs left without a queue (ROCMTRAIN_REQUIRE_QUEUE)

# Where notifications may go (docs/operations/security.md). Empty: the operator's default.
notifications:
  allowedCidrs: []                 # receiver networks allowed though not public (ROCMTRAIN_NOTIFY_ALLOWED_CIDRS)
  clusterCidrs: []                 # the cluster's service and pod networks (ROCMTRAIN_CLUSTER_CIDRS)

# Any other setting of docs/operations/configuration.md, as container env entries (valueFrom too).
extraEnv: []

podAnnotations: {{}}

# true: cert-manager issues the operator's serving certificate (the manifests/cert-manager component):
# a self-signed root, a CA Issuer and the Certificate; the operator only reads the Secret.
certManager:
  enabled: false

# The NetworkPolicy around the operator pod (manifests/networkpolicy.yaml); egress: true adds where the
# operator may connect (the manifests/egress component), with a rule to notifications.allowedCidrs.
networkPolicy:
  enabled: true
  egress: false

# manifests/monitoring (needs the Prometheus Operator for the first two; the dashboard ConfigMap
# carries the label Grafana's sidecar loads). Prometheus' ServiceAccount needs `get` on /metrics:
# bind the ClusterRole <release>-metrics-reader to it.
monitoring:
  serviceMonitor: false
  prometheusRule: false
  dashboard: false
"""


def chart_yaml(manifests: Path) -> str:
    kustomization = yaml.safe_load((manifests / "kustomization.yaml").read_text())
    (image,) = [i for i in kustomization["images"] if i["name"] == IMAGE]
    return dump(
        {
            "apiVersion": "v2",
            "name": "rocm-train-operator",
            "description": "Distributed Transformer fine-tuning on AMD GPUs: the RocmTrainingJob operator",
            "type": "application",
            "version": CHART_VERSION,
            "appVersion": str(image["newTag"]),
            "kubeVersion": ">=1.30.0-0",
        }
    )


def chart_files(root: Path) -> dict[str, str]:
    """Every file of the chart (its path in the chart -> its text), from the checkout at ``root``."""
    manifests = root / "manifests"
    base = yaml.safe_load((manifests / "kustomization.yaml").read_text())
    labels = _pairs(base)
    cert_manager = yaml.safe_load((manifests / "cert-manager" / "kustomization.yaml").read_text())
    monitoring = yaml.safe_load((manifests / "monitoring" / "kustomization.yaml").read_text())
    mon_labels = _pairs(monitoring)
    (generator,) = monitoring["configMapGenerator"]

    def header(source: str, text: str) -> str:
        return HEADER.format(source=source) + text

    files = {
        "Chart.yaml": header("kustomization.yaml", chart_yaml(manifests)),
        "values.yaml": header("kustomization.yaml and deployment.yaml", values(manifests)),
        "templates/namespace.yaml": header(
            "namespace.yaml",
            templates.wrapped(".Values.namespace.create", templates.plain(_docs(manifests / "namespace.yaml"), labels)),
        ),
        "templates/rbac.yaml": header(
            "rbac.yaml and namespaced/",
            templates.rbac(_docs(manifests / "rbac.yaml"), labels, _component_patch(cert_manager, "Role")),
        ),
        "templates/deployment.yaml": header(
            "deployment.yaml", templates.deployment(_docs(manifests / "deployment.yaml")[0], labels)
        ),
        "templates/service.yaml": header("service.yaml", templates.plain(_docs(manifests / "service.yaml"), labels)),
        "templates/networkpolicy.yaml": header(
            "networkpolicy.yaml",
            templates.wrapped(
                ".Values.networkPolicy.enabled", templates.plain(_docs(manifests / "networkpolicy.yaml"), labels)
            ),
        ),
        "templates/networkpolicy-egress.yaml": header(
            "egress/networkpolicy-egress.yaml",
            templates.wrapped(
                ".Values.networkPolicy.egress",
                templates.egress_policy(_docs(manifests / "egress" / "networkpolicy-egress.yaml")[0], labels),
            ),
        ),
        "templates/certificates.yaml": header(
            "cert-manager/certificates.yaml",
            templates.wrapped(
                ".Values.certManager.enabled",
                templates.certificates(_docs(manifests / "cert-manager" / "certificates.yaml"), labels),
            ),
        ),
        "templates/servicemonitor.yaml": header(
            "monitoring/servicemonitor.yaml",
            templates.wrapped(
                ".Values.monitoring.serviceMonitor",
                templates.plain(_docs(manifests / "monitoring" / "servicemonitor.yaml"), mon_labels),
            ),
        ),
        "templates/prometheusrule.yaml": header(
            "monitoring/prometheusrule.yaml",
            templates.wrapped(
                ".Values.monitoring.prometheusRule",
                templates.plain(_docs(manifests / "monitoring" / "prometheusrule.yaml"), mon_labels),
            ),
        ),
        "templates/dashboard.yaml": header(
            "monitoring/kustomization.yaml",
            templates.wrapped(
                ".Values.monitoring.dashboard",
                templates.dashboard(
                    generator["name"], DASHBOARD_FILE, {**generator["options"]["labels"], **mon_labels}
                ),
            ),
        ),
        f"files/{DASHBOARD_FILE}": (manifests / "monitoring" / DASHBOARD_FILE).read_text(),
    }
    # Helm installs crds/ before the templates, never upgrades or deletes them; labelled as manifests/ labels them.
    for crd in sorted((root / "crds").glob("*.yaml")):
        (obj,) = _docs(crd)
        obj["metadata"]["labels"] = {**(obj["metadata"].get("labels") or {}), **labels}
        files[f"crds/{crd.name}"] = f"# Generated from crds/{crd.name} by `make manifests`. Do not edit.\n" + dump(obj)
    return files


def write(root: Path) -> list[Path]:
    """Write the chart under ``root``, removing files it no longer has; the paths written."""
    folder = root / CHART_DIR
    wanted = chart_files(root)
    for path in sorted(folder.rglob("*")) if folder.exists() else []:
        if path.is_file() and str(path.relative_to(folder)) not in wanted:
            path.unlink()
    written = []
    for name, text in wanted.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written

"""The chart's templates, made from the kustomize sources under manifests/ (see rocmtrain.chart).

Each source file becomes one template with what kustomize does to it (the `namespace:` and `labels:`
of its kustomization) done by Helm instead, and with the chart's values where the components and
overlays of manifests/ change it: the image, resources and settings of the Deployment, the watched
namespaces (`namespaced`), cert-manager (`cert-manager`), the NetworkPolicy, monitoring.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rocmtrain.chart.emit import RELEASE_NAME, RELEASE_NAMESPACE, Block, Fill, Inline, hole, template, wrapped

# Cluster-scoped names follow the release, so that two releases (two teams' namespaced operators) do not
# collide; the release rocm-train-operator keeps the names kustomize gives.
BASE_NAME = "rocm-train-operator"
CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
# Settings of values.yaml `policy` -> the operator's variables (docs/operations/configuration.md).
POLICY_LISTS = {
    "allowedImages": "ROCMTRAIN_ALLOWED_IMAGES",
    "allowedPriorityClasses": "ROCMTRAIN_ALLOWED_PRIORITY_CLASSES",
    "allowedKueuePriorityClasses": "ROCMTRAIN_ALLOWED_KUEUE_PRIORITY_CLASSES",
    "protectedNamespaces": "ROCMTRAIN_PROTECTED_NAMESPACES",
    "allowedNfsServers": "ROCMTRAIN_ALLOWED_NFS_SERVERS",
    "allowedCsiDrivers": "ROCMTRAIN_ALLOWED_CSI_DRIVERS",
}
POLICY_VALUES = {
    "maxWorkerPods": "ROCMTRAIN_MAX_WORKER_PODS",
    "maxJobGpus": "ROCMTRAIN_MAX_JOB_GPUS",
    "defaultQueue": "ROCMTRAIN_DEFAULT_QUEUE",
    "requireQueue": "ROCMTRAIN_REQUIRE_QUEUE",
}
# Settings of values.yaml `notifications` -> the operator's variables.
NOTIFICATION_LISTS = {
    "allowedCidrs": "ROCMTRAIN_NOTIFY_ALLOWED_CIDRS",
    "clusterCidrs": "ROCMTRAIN_CLUSTER_CIDRS",
}
STALL_VARIABLE = "ROCMTRAIN_STALL_SECONDS"


def _release_name(name: str) -> str:
    return RELEASE_NAME + name.removeprefix(BASE_NAME) if name.startswith(BASE_NAME) else name


def kustomized(obj: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """``obj`` with what the kustomization does (its labels; the release's namespace in place of its
    `namespace:`), and the release's name in its cluster-scoped RBAC names."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    kind = out["kind"]
    if kind not in CLUSTER_KINDS:
        meta["namespace"] = RELEASE_NAMESPACE
    if kind == "Namespace":  # kustomize's `namespace:` renames it too
        meta["name"] = RELEASE_NAMESPACE
    if kind in ("ClusterRole", "ClusterRoleBinding"):
        meta["name"] = _release_name(meta["name"])
    if kind in ("ClusterRoleBinding", "RoleBinding"):
        for subject in out.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = RELEASE_NAMESPACE
        if out["roleRef"]["kind"] == "ClusterRole":
            out["roleRef"]["name"] = _release_name(out["roleRef"]["name"])
    return out


_LIST = '{{ join "," . | quote }}'
_ONE = "{{ . | quote }}"


def _variable(value: str, variable: str, code: str) -> list[str]:
    """An env entry of ``variable`` where value ``value`` is set (``code`` prints it)."""
    return [f"{{{{- with .Values.{value} }}}}", f"- name: {variable}", f"  value: {code}", "{{- end }}"]


def _env_lines(indent: str, _key: str) -> list[str]:
    """The settings of values.yaml, appended to the container's env in the order the components add theirs."""
    code = [line for value, variable in POLICY_LISTS.items() for line in _variable(f"policy.{value}", variable, _LIST)]
    code += [line for value, variable in POLICY_VALUES.items() for line in _variable(f"policy.{value}", variable, _ONE)]
    code += [
        line
        for value, variable in NOTIFICATION_LISTS.items()
        for line in _variable(f"notifications.{value}", variable, _LIST)
    ]
    code += _variable("watchNamespaces", "ROCMTRAIN_NAMESPACES", _LIST)
    code += [
        "{{- if .Values.certManager.enabled }}",
        "- name: ROCMTRAIN_PROGRESS_MANAGE_TLS",
        '  value: "false"',
        "{{- end }}",
        "{{- with .Values.extraEnv }}",
        f"{{{{- toYaml . | nindent {len(indent)} }}}}",
        "{{- end }}",
    ]
    return [indent + line for line in code]


def _values_block(path: str) -> Block:
    def lines(indent: str, key: str) -> list[str]:
        return [f"{indent}{key.rstrip()}", f"{indent}  {{{{- toYaml .Values.{path} | nindent {len(indent) + 2} }}}}"]

    return Block(lines)


def _pod_annotations(indent: str, _key: str) -> list[str]:
    return [
        f"{indent}{{{{- with .Values.podAnnotations }}}}",
        f"{indent}annotations:",
        f"{indent}  {{{{- toYaml . | nindent {len(indent) + 2} }}}}",
        f"{indent}{{{{- end }}}}",
    ]


def deployment(obj: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """The operator's Deployment: image, pull policy, resources, settings, pod annotations from values."""
    out = kustomized(obj, labels)
    pod = out["spec"]["template"]
    pod["metadata"][hole("pod_annotations")] = None
    (container,) = pod["spec"]["containers"]
    container["image"] = hole("image")
    container["imagePullPolicy"] = hole("pull_policy")
    container["resources"] = hole("resources")
    for entry in container["env"]:
        if entry["name"] == STALL_VARIABLE:
            entry["value"] = hole("stall")
    container["env"].append(hole("env"))
    fills: dict[str, Fill] = {
        "image": Inline('"{{ .Values.image.repository }}:{{ .Values.image.tag }}"'),
        "pull_policy": Inline("{{ .Values.image.pullPolicy }}"),
        "stall": Inline("{{ .Values.stallSeconds | quote }}"),
        "resources": _values_block("resources"),
        "env": Block(_env_lines),
        "pod_annotations": Block(_pod_annotations),
    }
    return template(out, fills)


def _role_bindings(labels: Mapping[str, str]) -> list[str]:
    """One RoleBinding of the namespaced ClusterRole per watched namespace (the `namespaced` component's)."""
    return [
        "{{- range .Values.watchNamespaces }}",
        "---",
        "apiVersion: rbac.authorization.k8s.io/v1",
        "kind: RoleBinding",
        "metadata:",
        f"  name: {BASE_NAME}",
        "  namespace: {{ . }}",
        "  labels:",
        *[f"    {key}: {value}" for key, value in labels.items()],
        "roleRef:",
        "  apiGroup: rbac.authorization.k8s.io",
        "  kind: ClusterRole",
        "  name: {{ $.Release.Name }}",
        "subjects:",
        "  - kind: ServiceAccount",
        f"    name: {BASE_NAME}",
        "    namespace: {{ $.Release.Namespace }}",
        "{{- end }}",
    ]


def rbac(objs: Sequence[Mapping[str, Any]], labels: Mapping[str, str], narrowed_rules: list[Any]) -> str:
    """The ServiceAccount and roles; the namespaced rules bound cluster-wide, or per watched namespace;
    the TLS Secret's Role narrowed to `get` with cert-manager (``narrowed_rules``, the component's)."""
    parts = []
    for obj in objs:
        out = kustomized(obj, labels)
        fills: dict[str, Fill] = {}
        if obj["kind"] == "Role" and obj["metadata"]["name"] == f"{BASE_NAME}-progress-tls":
            out["rules"] = hole("rules")
            fills["rules"] = Block(_narrowed(obj["rules"], narrowed_rules))
        text = template(out, fills)
        if obj["kind"] == "ClusterRoleBinding" and obj["roleRef"]["name"] == BASE_NAME:
            text = wrapped("not .Values.watchNamespaces", text)
        parts.append(text)
    return "---\n".join(parts) + "\n".join(_role_bindings(labels)) + "\n"


def _narrowed(own: list[Any], narrowed: list[Any]) -> Callable[[str, str], list[str]]:
    """The Role's rules, or with cert-manager the component's narrowed ones."""

    def lines(indent: str, key: str) -> list[str]:
        def rules(value: list[Any]) -> list[str]:
            return [f"{indent}  {line}" for line in template(value, {}).splitlines()]

        return [
            f"{indent}{{{{- if .Values.certManager.enabled }}}}",
            f"{indent}{key.rstrip()}",
            *rules(narrowed),
            f"{indent}{{{{- else }}}}",
            f"{indent}{key.rstrip()}",
            *rules(own),
            f"{indent}{{{{- end }}}}",
        ]

    return lines


def _allowed_receivers(indent: str, _key: str) -> list[str]:
    """An egress rule to the receiver networks the admin allows (notifications.allowedCidrs), if any."""
    code = [
        "{{- with .Values.notifications.allowedCidrs }}",
        "- to:",
        "  {{- range . }}",
        "  - ipBlock:",
        "      cidr: {{ . }}",
        "  {{- end }}",
        "{{- end }}",
    ]
    return [indent + line for line in code]


def egress_policy(obj: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    """The operator's egress NetworkPolicy (the `egress` component's), with a rule to the receiver networks
    the admin allows, which the component leaves to an overlay's patch."""
    out = kustomized(obj, labels)
    out["spec"]["egress"].append(hole("allowed"))
    return template(out, {"allowed": Block(_allowed_receivers)})


def plain(objs: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    """Objects as kustomize makes them, nothing from values."""
    return "---\n".join(template(kustomized(obj, labels), {}) for obj in objs)


def certificates(objs: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    """cert-manager's Issuers and Certificates (the `cert-manager` component's), their DNS names in
    the release's namespace (what the component's `replacements` do)."""
    parts = []
    for obj in objs:
        out = kustomized(obj, labels)
        spec = out["spec"]
        if "dnsNames" in spec:
            spec["dnsNames"] = [name.replace(".NAMESPACE", f".{RELEASE_NAMESPACE}") for name in spec["dnsNames"]]
        parts.append(template(out, {}))
    return "---\n".join(parts)


def dashboard(name: str, file: str, labels: Mapping[str, str]) -> str:
    """The dashboard ConfigMap (monitoring's configMapGenerator), its JSON read from the chart's files/."""
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": dict(labels)},
        "data": {file: hole("json")},
    }
    fills: dict[str, Fill] = {"json": Inline(f'{{{{ .Files.Get "files/{file}" | toJson }}}}')}
    return template(kustomized(obj, {}), fills)

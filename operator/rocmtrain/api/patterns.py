"""The API's string patterns, and their plain-language descriptions for error messages and the field reference.

Each pattern is written in the common subset of Python `re` and Go RE2, because
the same pattern is checked by pydantic here and by the API server through the
generated CRD. `rocmtrain.api.types` turns them into constrained string types.
"""

from __future__ import annotations

import re

from rocmtrain.api.contract import HUB_SCHEME, OBJECT_STORE_SCHEMES, RELATIVE_PREFIX

# RFC 1123 label (container, volume, port names) and subdomain (object names).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# RFC 1035 label (service names; KubeRay requires it of RayJob and RayCluster names).
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes resource quantity, e.g. 500m, 16Gi, 1.5.
QUANTITY = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# Label/annotation key with optional DNS prefix, and label value.
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# A label key's prefix is at most 253 characters: LABEL_KEY cannot count it, so a key must match both.
LABEL_KEY_PREFIX_BOUND = r"^([^/]{1,253}/)?[^/]*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Environment variable name as Kubernetes accepts it (C identifier subset).
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Container image reference: registry/repo[:tag][@digest], no whitespace.
IMAGE = r"^[a-z0-9]+([._/:@-][A-Za-z0-9_.-]+)*$"
# Location of a model or data set: an absolute path, an object-store URI,
# a hub reference, or a `./` path relative to the job file (local runs only;
# `rocmtrain.api.validate` rejects it for cluster jobs). No whitespace, quotes,
# shell metacharacters, or `..`.
# An object-store URI names its bucket (or container) first: `s3:///x` has none, and `s3:/` is no URI.
_PATH_PREFIXES = ("/", RELATIVE_PREFIX, HUB_SCHEME)
_LOCATION_CHARS = "[A-Za-z0-9._~%+=,@/-]"
LOCATION = (
    "^((" + "|".join(re.escape(prefix) for prefix in _PATH_PREFIXES) + f"){_LOCATION_CHARS}+"
    "|(" + "|".join(re.escape(scheme) for scheme in OBJECT_STORE_SCHEMES) + f")[A-Za-z0-9]{_LOCATION_CHARS}*"
    r"|[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?)$"
)
# A `..` path segment anywhere (rejected: no escaping a mount).
TRAVERSAL = r"(^|/)[.][.](/|$)"
# Absolute path inside a container.
ABS_PATH = r"^/[A-Za-z0-9._~%+=,@/-]*$"
# ISO 4217 currency code.
CURRENCY = r"^[A-Z]{3}$"
# A field name in a data record.
FIELD_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
# A module of a model that a LoRA adapter targets (a name or dotted path), or `all-linear`.
MODULE_NAME = r"^([A-Za-z_][A-Za-z0-9_.]{0,127}|all-linear)$"
# A key inside a Secret or ConfigMap.
CONFIG_KEY = r"^[-._A-Za-z0-9]+$"
# A relative path below a volume root.
REL_PATH = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
# A filesystem type (ext4, xfs).
FS_TYPE = r"^[a-z0-9]+$"
# Free text that is only ever data (an env value, an argument of spec.code): no NUL.
TEXT = r"^[^\x00]*$"
# A Python module path (`python -m team.train`): dotted identifiers.
PYTHON_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*$"
# A variable of a Jinja template (a chat template's option, such as enable_thinking): a Python identifier.
TEMPLATE_VARIABLE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
# A metric's name in status.metrics.custom (as training code logs it: `grad_norm`, `eval/bleu`).
METRIC_NAME = r"^[A-Za-z_][A-Za-z0-9_./-]*$"

# An AMD GPU partition as the node labeller names it: compute (spx, dpx, qpx, cpx) _ memory (nps1, nps2, nps4).
GPU_PARTITION = r"^(spx|dpx|qpx|cpx)_nps(1|2|4)$"
# An extended resource of the AMD device plugin: amd.com/gpu, or a partition's name with `mixed` naming.
AMD_RESOURCE = r"^amd\.com/[a-z0-9]+([_.-][a-z0-9]+)*$"
# An extended resource: a DNS-subdomain prefix, '/', and a name (`rdma/rdma_shared_device_a`).
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
# A Multus secondary network, `[namespace/]name[@interface]`, as `k8s.v1.cni.cncf.io/networks` lists them.
NETWORK_ATTACHMENT = (
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?(@[A-Za-z0-9_.-]{1,15})?$"
)
# An InfiniBand/RoCE HCA as RCCL's NCCL_IB_HCA names it, with an optional port (`mlx5_0`, `bnxt_re0:1`).
HCA_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(:[0-9]{1,3})?$"
# A Linux network interface name (at most 15 characters).
INTERFACE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$"
# A network of RCCL as its log names it: IB, Socket, or a net plugin's name (`AWS Libfabric`).
RCCL_NETWORK = r"^[A-Za-z0-9][A-Za-z0-9 _.+-]{0,63}$"
# A receiver of a job's notifications as its status names it: `spec.notifications[i]`, or the operator's `default`.
NOTIFICATION_TARGET = r"^(default|spec\.notifications\[[0-9]\])$"
# A notification's delivery id (its X-Rocmtrain-Delivery header): 32 lowercase hex digits.
DELIVERY_ID = r"^[0-9a-f]{32}$"

PATTERN_DESCRIPTIONS = {
    NOTIFICATION_TARGET: "spec.notifications[i] or default",
    DELIVERY_ID: "32 lowercase hexadecimal digits",
    EXTENDED_RESOURCE: "an extended resource name: a DNS prefix, '/', then a name (rdma/rdma_shared_device_a)",
    NETWORK_ATTACHMENT: "a secondary network: [namespace/]name[@interface], lowercase DNS names",
    HCA_NAME: "an HCA name such as mlx5_0, optionally with a port (mlx5_0:1)",
    INTERFACE_NAME: "a network interface name: up to 15 letters, digits, '_', '.' or '-'",
    RCCL_NETWORK: "an RCCL network name: up to 64 letters, digits, spaces, '_', '.', '+' or '-'",
    DNS_LABEL: "a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
    DNS_1035_LABEL: "a DNS-1035 label: lowercase letters, digits and '-', starting with a letter",
    DNS_SUBDOMAIN: "a DNS-1123 subdomain: lowercase DNS labels joined by '.'",
    QUANTITY: "a resource quantity such as 500m, 2, 1.5 or 16Gi",
    LABEL_KEY: (
        "a label key: an optional DNS prefix of at most 253 characters and '/', then up to 63 letters, digits, "
        "'-', '_' or '.'"
    ),
    LABEL_VALUE: "a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
    ENV_NAME: "an environment variable name: letters, digits and '_', not starting with a digit",
    IMAGE: "a container image reference such as registry.example.com/team/image:tag",
    LOCATION: (
        "an absolute path, an object-store URI that names its bucket or container (s3://bucket/path; "
        f"{', '.join(OBJECT_STORE_SCHEMES)}), a hub id "
        f"(org/name or {HUB_SCHEME}...), or (rocmtrain run only) a {RELATIVE_PREFIX}relative path; "
        "no whitespace, quotes or shell metacharacters"
    ),
    ABS_PATH: "an absolute path of letters, digits and ._~%+=,@/- only",
    FIELD_NAME: "a record field name: letters, digits, '_', '.' or '-', starting with a letter or '_'",
    MODULE_NAME: "a module name such as q_proj or model.layers.0.mlp (letters, digits, '_' and '.'), or all-linear",
    CONFIG_KEY: "a Secret or ConfigMap key: letters, digits, '-', '_' or '.'",
    REL_PATH: "a relative path of letters, digits, '.', '_' and '-' segments",
    FS_TYPE: "a filesystem type of lowercase letters and digits, such as ext4 or xfs",
    TEXT: "text without NUL characters",
    PYTHON_MODULE: "a Python module path: identifiers joined by '.', such as team.train",
    TEMPLATE_VARIABLE: "a template variable name: up to 64 letters, digits and '_', not starting with a digit",
    METRIC_NAME: "a metric name: letters, digits, '_', '.', '/' or '-', starting with a letter or '_'",
    CURRENCY: "an ISO 4217 currency code such as USD or EUR",
    GPU_PARTITION: "an AMD GPU partition: spx, dpx, qpx or cpx, '_', then nps1, nps2 or nps4 (such as cpx_nps4)",
    AMD_RESOURCE: "an AMD device plugin resource such as amd.com/gpu or amd.com/cpx_nps4",
}


def describe_pattern(pattern: str) -> str:
    """The description of a pattern, or the pattern itself when it has none."""
    return PATTERN_DESCRIPTIONS.get(pattern, f"matching {pattern}")

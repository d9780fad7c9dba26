"""Constrained string types shared by the API models.

Each pattern is written in the common subset of Python `re` and Go RE2, because
the same pattern is checked by pydantic here and by the API server through the
generated CRD.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

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
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Environment variable name as Kubernetes accepts it (C identifier subset).
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Container image reference: registry/repo[:tag][@digest], no whitespace.
IMAGE = r"^[a-z0-9]+([._/:@-][A-Za-z0-9_.-]+)*$"
# Location of a model or data set: an absolute path, an object-store URI,
# a hub reference, or a `./` path relative to the job file (local runs only;
# `rocmtrain.validate` rejects it for cluster jobs). No whitespace, quotes,
# shell metacharacters, or `..`.
LOCATION = (
    r"^((/|\./|s3://|gs://|gcs://|abfs://|az://|hf://)[A-Za-z0-9._~%+=,@/-]+"
    r"|[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?)$"
)
# A `..` path segment anywhere (rejected: no escaping a mount).
TRAVERSAL = r"(^|/)[.][.](/|$)"
# Absolute path inside a container.
ABS_PATH = r"^/[A-Za-z0-9._~%+=,@/-]*$"
# A field name in a data record.
FIELD_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"


def _no_traversal(value: str) -> str:
    if re.search(TRAVERSAL, value):
        raise ValueError("must not contain '..' path segments")
    return value


_NO_TRAVERSAL = (
    AfterValidator(_no_traversal),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"!self.matches('{TRAVERSAL}')", "message": "must not contain '..' path segments"}
            ]
        }
    ),
)

DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]
DnsSubdomain = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=253)]
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY, max_length=32)]
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY, max_length=317)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE, max_length=63)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME, max_length=128)]
Image = Annotated[str, StringConstraints(pattern=IMAGE, max_length=512)]
Location = Annotated[str, StringConstraints(pattern=LOCATION, max_length=1024), *_NO_TRAVERSAL]
AbsPath = Annotated[str, StringConstraints(pattern=ABS_PATH, max_length=1024), *_NO_TRAVERSAL]
FieldName = Annotated[str, StringConstraints(pattern=FIELD_NAME, max_length=128)]
# Free text that is only ever data (an env value): bounded, no NUL.
Text = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00]*$")]
# A key inside a Secret or ConfigMap.
CONFIG_KEY = r"^[-._A-Za-z0-9]+$"
# A relative path below a volume root.
REL_PATH = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
ConfigKey = Annotated[str, StringConstraints(pattern=CONFIG_KEY, max_length=253)]
RelPath = Annotated[str, StringConstraints(pattern=REL_PATH, max_length=1024), *_NO_TRAVERSAL]

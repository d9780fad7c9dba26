"""Constrained string types of the API models, built from the patterns in `rocmtrain.api.patterns`."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

from rocmtrain.api.patterns import (
    ABS_PATH,
    AMD_RESOURCE,
    CONFIG_KEY,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    FIELD_NAME,
    GPU_PARTITION,
    IMAGE,
    LABEL_KEY,
    LABEL_KEY_PREFIX_BOUND,
    LABEL_VALUE,
    LOCATION,
    METRIC_NAME,
    MODULE_NAME,
    PYTHON_MODULE,
    QUANTITY,
    REL_PATH,
    TEXT,
    TRAVERSAL,
)


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

PREFIX_TOO_LONG = "a label key's prefix is at most 253 characters"


def _prefix_bounded(value: str) -> str:
    if not re.match(LABEL_KEY_PREFIX_BOUND, value):
        raise ValueError(PREFIX_TOO_LONG)
    return value


_PREFIX_BOUND = (
    AfterValidator(_prefix_bounded),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"self.matches(r'{LABEL_KEY_PREFIX_BOUND}')", "message": PREFIX_TOO_LONG}
            ]
        }
    ),
)

DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]
DnsSubdomain = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=253)]
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY, max_length=32)]
LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY, max_length=317), *_PREFIX_BOUND]
# An object name that is also written as a label value (Kueue's queue-name and priority-class labels).
LabelledName = Annotated[str, StringConstraints(pattern=DNS_SUBDOMAIN, max_length=63)]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE, max_length=63)]
GpuPartition = Annotated[str, StringConstraints(pattern=GPU_PARTITION, max_length=8)]
AmdResourceName = Annotated[str, StringConstraints(pattern=AMD_RESOURCE, max_length=71)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME, max_length=128)]
Image = Annotated[str, StringConstraints(pattern=IMAGE, max_length=512)]
Location = Annotated[str, StringConstraints(pattern=LOCATION, max_length=1024), *_NO_TRAVERSAL]
AbsPath = Annotated[str, StringConstraints(pattern=ABS_PATH, max_length=1024), *_NO_TRAVERSAL]
FieldName = Annotated[str, StringConstraints(pattern=FIELD_NAME, max_length=128)]
ModuleName = Annotated[str, StringConstraints(pattern=MODULE_NAME, max_length=128)]
# Free text that is only ever data (an env value, an argument of spec.code): bounded, no NUL.
Text = Annotated[str, Field(max_length=4096, pattern=TEXT)]
PythonModule = Annotated[str, StringConstraints(pattern=PYTHON_MODULE, max_length=256)]
MetricName = Annotated[str, StringConstraints(pattern=METRIC_NAME, max_length=64)]
# A key inside a Secret or ConfigMap, and a relative path below a volume root.
ConfigKey = Annotated[str, StringConstraints(pattern=CONFIG_KEY, max_length=253)]
RelPath = Annotated[str, StringConstraints(pattern=REL_PATH, max_length=1024), *_NO_TRAVERSAL]

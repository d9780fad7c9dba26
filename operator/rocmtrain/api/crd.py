"""Generate the RocmTrainingJob CustomResourceDefinition from the pydantic models.

`python -m rocmtrain.api.crd crds/` (or `make crds`) writes the CRD; a test fails
when the committed file differs from what this module generates.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from rocmtrain.api import models
from rocmtrain.api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from rocmtrain.api.patterns import DNS_1035_LABEL, LABEL_KEY, LABEL_KEY_PREFIX_BOUND, describe_pattern

CRD_FILE = f"{GROUP}_{PLURAL}.yaml"

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {
        "name": "Workers",
        "type": "integer",
        "jsonPath": ".spec.resources.workers",
        "description": "Worker pods requested.",
    },
    {
        "name": "Ready",
        "type": "integer",
        "jsonPath": ".status.workersReady",
        "description": "Worker pods ready.",
        "priority": 1,
    },
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus", "description": "AMD GPUs requested in total."},
    {
        "name": "Progress",
        "type": "number",
        "jsonPath": ".status.progress.percent",
        "description": "Training progress in percent.",
    },
    {"name": "Loss", "type": "number", "jsonPath": ".status.metrics.trainLoss", "description": "Latest training loss."},
    {
        "name": "Accuracy",
        "type": "number",
        "jsonPath": ".status.metrics.evalAccuracy",
        "description": "Latest evaluation accuracy (classification).",
    },
    {
        "name": "Perplexity",
        "type": "number",
        "jsonPath": ".status.metrics.evalPerplexity",
        "description": "Latest evaluation perplexity (causal-lm).",
    },
    {
        "name": "Eval-Loss",
        "type": "number",
        "jsonPath": ".status.metrics.evalLoss",
        "description": "Latest evaluation loss (the primary metric of regression).",
        "priority": 1,
    },
    {
        "name": "Best",
        "type": "number",
        "jsonPath": ".status.tuning.bestMetric",
        "description": "Best trial's metric so far (hyper-parameter search).",
    },
    {
        "name": "ETA",
        "type": "number",
        "jsonPath": ".status.progress.etaSeconds",
        "description": "Estimated seconds until training ends.",
    },
    {
        "name": "Expected-Start",
        "type": "string",
        "jsonPath": ".status.queue.expectedStartTime",
        "description": "While Queued: when the job is expected to start (RFC 3339), from the running jobs' ETAs.",
    },
    {
        "name": "GPU-Seconds",
        "type": "number",
        "jsonPath": ".status.gpuSeconds",
        "description": "AMD GPU-seconds held so far.",
        "priority": 1,
    },
    {
        "name": "Cost",
        "type": "number",
        "jsonPath": ".status.cost.amount",
        "description": "What the GPU-seconds cost, in status.cost.currency (ROCMTRAIN_COST_CURRENCY).",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "propertyNames"}
# Marks a node that came from `X | None`: absent means unset, so it gets no default.
_NULLABLE = "x-rocmtrain-nullable"


def _referred(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The definition a `$ref` node names; an enum's without its docstring, which describes the type, not the field."""
    target: dict[str, Any] = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return {k: v for k, v in target.items() if k != "description"} if "enum" in target else target


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if "$ref" in schema:
        target, rest = _referred(schema, defs), {k: v for k, v in schema.items() if k != "$ref"}
        # An enum's keys follow the field's, as a Literal's do (the CRD stays as it was before StrEnums).
        return _structural({**rest, **target} if "enum" in target else {**target, **rest}, defs)
    if "anyOf" in schema:
        options = [_referred(o, defs) if "$ref" in o else o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unsupported union in schema: {schema}")
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
        if schema.get("default") is not None:
            rest["default"] = schema["default"]
        return {**_structural({**options[0], **rest}, defs), _NULLABLE: True}

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _structural(value, defs)
        elif key == "patternProperties":
            ((pattern, sub),) = value.items()
            out["additionalProperties"] = _structural(sub, defs)
            out.setdefault("x-kubernetes-validations", []).append(_key_rule(pattern))
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        elif key == "x-kubernetes-validations":
            out.setdefault(key, []).extend(value)
        elif key != "$defs":
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    _default_groups(out)
    return out


def _key_rule(pattern: str) -> dict[str, str]:
    """CEL: every key of a map matches `pattern` (a label key's prefix also within its bound)."""
    if pattern == LABEL_KEY:
        return {
            "rule": f"self.all(k, k.matches(r'{pattern}') && k.matches(r'{LABEL_KEY_PREFIX_BOUND}'))",
            "message": "keys must be label keys: [prefix/]name, the prefix at most 253 characters",
        }
    return {"rule": f"self.all(k, k.matches(r'{pattern}'))", "message": f"keys must be {describe_pattern(pattern)}"}


def _default_groups(node: dict[str, Any]) -> None:
    """Default optional nested groups to {} / [] so the API server fills in their defaults."""
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        if sub.pop(_NULLABLE, False) or name in required or "default" in sub:
            continue
        if sub.get("type") == "array":
            sub["default"] = []
        elif sub.get("type") == "object" and ("additionalProperties" in sub or not sub.get("required")):
            sub["default"] = {}


def _unchanged(field: str, always_set: bool) -> str:
    """CEL: `field` is as it was (a field that may be absent: absent in both, or equal)."""
    if always_set:
        return f"self.{field} == oldSelf.{field}"
    return f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"


def _immutability_rules() -> list[dict[str, Any]]:
    fields = models.RocmTrainingJobSpec.model_fields
    mutable = ", ".join(f"spec.{f}" for f in models.MUTABLE_FIELDS)
    return [
        {
            "rule": _unchanged(str(info.alias), info.is_required() or info.get_default() is not None),
            "message": f"spec.{info.alias} is immutable; only {mutable} may change after creation",
            "fieldPath": f".{info.alias}",
        }
        for name, info in fields.items()
        if info.alias not in models.MUTABLE_FIELDS
    ]


def openapi_schema() -> dict[str, Any]:
    """The CRD's openAPIV3Schema, derived from the models."""
    spec = models.RocmTrainingJobSpec.model_json_schema(by_alias=True)
    status = models.RocmTrainingJobStatus.model_json_schema(by_alias=True)
    spec_schema = _structural(spec, spec.get("$defs", {}))
    spec_schema["x-kubernetes-validations"] = spec_schema.get("x-kubernetes-validations", []) + _immutability_rules()
    return {
        "type": "object",
        "description": "A distributed Transformer fine-tuning job on AMD GPUs, run by Ray Train on KubeRay.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version: " + API_VERSION + "."},
            "kind": {"type": "string", "description": "Kind: " + KIND + "."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            # A job the operator has not seen yet reads as generation 0 observed, so GitOps health
            # checks (kstatus, Argo CD) wait for the operator instead of calling it current.
            "status": {**_structural(status, status.get("$defs", {})), "default": {"observedGeneration": 0}},
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {models.MAX_NAME_LENGTH}",
                "message": (
                    f"metadata.name must be at most {models.MAX_NAME_LENGTH} characters, "
                    "so the names of the Ray cluster, pods and services derived from it stay valid"
                ),
            },
            {
                "rule": f"self.metadata.name.matches('{DNS_1035_LABEL}')",
                "message": (
                    "metadata.name must start with a letter and hold only lowercase letters, digits and '-' "
                    "(KubeRay requires DNS-1035 names for the RayJob and its Ray cluster)"
                ),
            },
        ],
    }


def custom_resource_definition() -> dict[str, Any]:
    """The complete CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": KIND + "List",
                "plural": PLURAL,
                "singular": models.SINGULAR,
                "shortNames": models.SHORT_NAMES,
                "categories": models.CATEGORIES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as YAML text, exactly as committed under crds/."""
    header = "# Generated from operator/rocmtrain/api/models/ by `make crds`. Do not edit.\n"
    return header + yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    """Write the CRD into the folder given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "crds")
    out.mkdir(parents=True, exist_ok=True)
    (out / CRD_FILE).write_text(render_crd_yaml())
    print(out / CRD_FILE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""KubeRay's RayJob CRD schema (v1.5.1) as a strict JSON Schema, for checking rendered RayJobs.

The CRD comes from `.cluster/bin/crds/ray.io_rayjobs.yaml` (written by build.sh)
or else from the ray-operator Go module, fetched through the Go module proxy into
the module cache. Its OpenAPI schema is made strict the
way the API server treats it: unknown fields, which the API server would prune
without a word, are errors here.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from rocmtrain.api.contract import KUBERAY_VERSION
from rocmtrain_testworld.paths import KUBERAY_CRDS_DIR

MODULE = "github.com/ray-project/kuberay/ray-operator"
CRD_FILE = "ray.io_rayjobs.yaml"
# Pruning keeps these metadata fields of a RayJob; anything else is a typo.
_OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def crd_path() -> Path:
    """The RayJob CRD file: the test cluster's copy, or the Go module's."""
    built = KUBERAY_CRDS_DIR / CRD_FILE
    if built.is_file():
        return built
    with tempfile.TemporaryDirectory() as outside_any_module:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{MODULE}@{KUBERAY_VERSION}"],
            cwd=outside_any_module,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"cannot fetch {MODULE}@{KUBERAY_VERSION}: {result.stdout}{result.stderr}")
    return Path(json.loads(result.stdout)["Dir"]) / "config" / "crd" / "bases" / CRD_FILE


def _strict(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes dialect) -> JSON Schema, refusing fields the schema does not name."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if out.pop("x-kubernetes-int-or-string", False) and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


@functools.cache
def rayjob_schema() -> dict[str, Any]:
    """The strict JSON Schema of a RayJob (`ray.io/v1`)."""
    crd = yaml.safe_load(crd_path().read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = _OBJECT_META
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


def schema_errors(rayjob: dict[str, Any]) -> list[str]:
    """Every way `rayjob` breaks KubeRay's RayJob schema, as `path: message` lines."""
    validator = jsonschema.Draft7Validator(rayjob_schema())
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(rayjob), key=lambda e: list(map(str, e.absolute_path)))
    ]

"""KubeRay's RayJob CRD schemas as strict JSON Schemas, for checking rendered RayJobs.

Three KubeRay versions are checked (`VERSIONS`):
- v1.5.1, the renderer's (`rocmtrain.api.contract.KUBERAY_VERSION`), the oldest supported: its CRD comes from
  the ray-operator Go module, fetched through the Go module proxy into the module cache;
- v1.6.2, the one the test world runs (`WORLD`, build.sh's `KUBERAY_VERSION`): the newest the Go module proxy
  serves; its CRD comes from `.cluster/bin/crds/ray.io_rayjobs.yaml` (written by build.sh), or else from its
  Go module;
- v1.7.0, the newest: the Go module proxy does not serve it, so its CRD is vendored, byte for byte below a
  header naming its source commit, in `kuberay_crds/ray.io_rayjobs-v1.7.0.yaml.gz` (`upstream_blob` checks it).

Each OpenAPI schema is made strict the way the API server treats it: unknown fields, which the API server
would prune without a word, are errors here.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
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
WORLD = "v1.6.2"
NEWEST = "v1.7.0"
# The KubeRay versions every rendered RayJob must be valid for: the renderer's (the oldest supported), the one the
# world runs, and the newest.
VERSIONS = (KUBERAY_VERSION, WORLD, NEWEST)
VENDORED = {NEWEST: Path(__file__).with_name("kuberay_crds") / f"ray.io_rayjobs-{NEWEST}.yaml.gz"}
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


def crd_path(version: str) -> Path:
    """The RayJob CRD file of KubeRay `version`: the test world's copy (`WORLD`), or the Go module's."""
    built = KUBERAY_CRDS_DIR / CRD_FILE
    if version == WORLD and built.is_file():
        return built
    with tempfile.TemporaryDirectory() as outside_any_module:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
            cwd=outside_any_module,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"cannot fetch {MODULE}@{version}: {result.stdout}{result.stderr}")
    return Path(json.loads(result.stdout)["Dir"]) / "config" / "crd" / "bases" / CRD_FILE


def strict(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes dialect) -> JSON Schema, refusing fields the schema does not name."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if out.pop("x-kubernetes-int-or-string", False) and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        # OpenAPI 3.0's flag on the limit; JSON Schema's is the number.
        if isinstance(out.get(bound), bool) and out.pop(bound) and limit in out:
            out[bound] = out.pop(limit)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def crd_text(version: str = KUBERAY_VERSION) -> str:
    """The RayJob CRD of KubeRay `version` (one of `VERSIONS`), as YAML text."""
    if version in VENDORED:
        return gzip.decompress(VENDORED[version].read_bytes()).decode()
    return crd_path(version).read_text()


def upstream_blob(version: str) -> tuple[str, str]:
    """(the git blob id its header names, the git blob id of the text below the header) of a vendored CRD."""
    text = crd_text(version)
    header = [line for line in text.splitlines() if line.startswith("#") and "git blob" in line]
    named = header[0].rsplit("git blob ", 1)[1].rstrip(".") if header else ""
    body = text.split("\n---\n", 1)[1] if "\n---\n" in text else ""
    data = ("---\n" + body).encode()
    return named, hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()  # git's object id


@functools.cache
def rayjob_schema(version: str = KUBERAY_VERSION) -> dict[str, Any]:
    """The strict JSON Schema of a RayJob (`ray.io/v1`) of KubeRay `version`."""
    crd = yaml.safe_load(crd_text(version))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = _OBJECT_META
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


def violations(schema: dict[str, Any], document: Any) -> list[str]:
    """Every way `document` breaks the JSON Schema `schema` (a `strict` one), as `path: message` lines by path."""
    found = jsonschema.Draft7Validator(schema).iter_errors(document)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in sorted(found, key=lambda e: list(map(str, e.absolute_path)))
    ]


def schema_errors(rayjob: dict[str, Any], versions: tuple[str, ...] = VERSIONS) -> list[str]:
    """Every way `rayjob` breaks the RayJob schema of each KubeRay version, as `version: path: message` lines."""
    return [f"{version}: {line}" for version in versions for line in violations(rayjob_schema(version), rayjob)]

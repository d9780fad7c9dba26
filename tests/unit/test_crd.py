"""The generated CustomResourceDefinition: current, structural, documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmtrain.api import crd, models

COMMITTED = Path(__file__).resolve().parents[2] / "crds" / crd.CRD_FILE


def _nodes(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every schema node below `node` with its path (properties, list items, map values)."""
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += _nodes(sub, f"{path}.{name}")
    if "items" in node:
        found += _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += _nodes(node["additionalProperties"], f"{path}{{}}")
    return found


def _version() -> dict[str, Any]:
    (version,) = crd.custom_resource_definition()["spec"]["versions"]
    return version


def test_committed_crd_is_current() -> None:
    assert COMMITTED.read_text() == crd.render_crd_yaml(), "crds/ is stale: run `make crds`"


def test_every_property_has_a_description() -> None:
    # The API server allows nothing but `type` on metadata; kubectl explain documents it.
    missing = [
        f"{path}.{name}"
        for path, node in _nodes(crd.openapi_schema(), "")
        for name, sub in node.get("properties", {}).items()
        if not sub.get("description") and f"{path}.{name}" != ".metadata"
    ]
    assert missing == []


def test_schema_is_structural() -> None:
    untyped = [path for path, node in _nodes(crd.openapi_schema(), "") if "type" not in node]
    assert untyped == []
    for path, node in _nodes(crd.openapi_schema(), ""):
        for banned in ("anyOf", "oneOf", "allOf", "$ref", "title"):
            assert banned not in node, f"{path} has {banned}"
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["rule"]
            assert rule["message"], f"{path}: {rule['rule']} has no message"


def test_names_scope_and_status_subresource() -> None:
    spec = crd.custom_resource_definition()["spec"]
    assert spec["group"] == "rocmtrain.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "RocmTrainingJob"
    assert spec["names"]["shortNames"] == ["rtj"]
    assert "rocmtrain" in spec["names"]["categories"]
    version = _version()
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns_point_at_real_fields() -> None:
    columns = _version()["additionalPrinterColumns"]
    assert {"Phase", "Workers", "GPUs", "Progress", "Age"} <= {c["name"] for c in columns}
    known = {path for path, _ in _nodes(crd.openapi_schema(), "")} | {".metadata.creationTimestamp"}
    for column in columns:
        assert column["jsonPath"] in known, column


def test_defaults_are_valid_jobs() -> None:
    spec = crd.openapi_schema()["properties"]["spec"]
    defaults = {name: sub["default"] for name, sub in spec["properties"].items() if "default" in sub}
    assert {"training", "resources", "scheduling", "image", "suspend"} <= set(defaults)
    job = {"model": {"source": "org/m", "numLabels": 2}, "data": {"train": {"uri": "/d"}}, **defaults}
    assert models.RocmTrainingJobSpec.model_validate(job) == models.RocmTrainingJobSpec.model_validate(
        {"model": job["model"], "data": job["data"]}
    )

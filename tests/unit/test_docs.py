"""The README's field reference: generated from the CRD, current, complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmtrain import docs
from rocmtrain.api import crd
from rocmtrain.api.patterns import PATTERN_DESCRIPTIONS

README = Path(__file__).resolve().parents[2] / "README.md"


def _fields(node: dict[str, Any], path: str) -> list[str]:
    found = [path]
    holder, prefix = (node["items"], path + "[]") if node.get("type") == "array" else (node, path)
    for name, sub in holder.get("properties", {}).items():
        found += _fields(sub, f"{prefix}.{name}")
    return found


def test_readme_reference_is_current() -> None:
    text = README.read_text()
    assert docs.BEGIN in text
    assert docs.END in text
    assert docs.update(text) == text, "the README field reference is stale: run `make docs`"


def test_every_spec_and_status_field_has_a_row() -> None:
    reference = docs.field_reference()
    schema = crd.openapi_schema()
    fields = _fields(schema["properties"]["spec"], "spec") + _fields(schema["properties"]["status"], "status")
    rows = [line.split(" | ")[0].removeprefix("| ") for line in reference.splitlines() if line.startswith("| `")]
    assert rows == ["`metadata.name`"] + [f"`{field}`" for field in fields]


def test_every_pattern_has_a_plain_description() -> None:
    patterns = {
        node["pattern"]
        for node in _walk(crd.openapi_schema())
        if isinstance(node, dict) and isinstance(node.get("pattern"), str)
    }
    assert patterns
    assert patterns <= set(PATTERN_DESCRIPTIONS)


def _walk(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [node, *(found for value in node.values() for found in _walk(value))]
    if isinstance(node, list):
        return [found for value in node for found in _walk(value)]
    return []


def test_constraints_and_cel_messages_land_on_their_fields() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in docs.field_reference().splitlines() if "| `" in line}
    assert "≥ 1; ≤ 1024" in rows["spec.resources.workers"]
    assert "> 0; ≤ 1" in rows["spec.training.learningRate"]
    assert "immutable" in rows["spec.model"]
    assert "immutable" not in rows["spec.suspend"]
    assert "requires gpusPerWorker > 0" in rows["spec.resources.gpu"]
    assert "either value or valueFrom" in rows["spec.env"]
    assert "keys: a label key" in rows["spec.scheduling.nodeSelector"]
    assert '| `"bf16"` |' in rows["spec.training.precision"]
    assert "map[string]string" in rows["spec.scheduling.nodeSelector"]
    assert "[]object" in rows["spec.env"]


def test_update_replaces_only_between_markers(tmp_path: Path) -> None:
    stale = f"# Title\n\nIntro.\n\n{docs.BEGIN}\nold table\n{docs.END}\n\nMore.\n"
    updated = docs.update(stale)
    assert updated.startswith("# Title\n\nIntro.\n\n" + docs.BEGIN)
    assert updated.endswith(docs.END + "\n\nMore.\n")
    assert "old table" not in updated
    assert docs.update(updated) == updated
    assert docs.update("# Title\n") == "# Title\n\n" + docs.field_reference() + "\n"


def test_main_writes_and_checks(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    assert docs.main([str(readme), "--check"]) == 1
    assert not readme.exists()
    assert docs.main([str(readme)]) == 0
    assert readme.read_text().startswith("# rocm-train-operator\n\n" + docs.BEGIN)
    assert docs.main([str(readme), "--check"]) == 0

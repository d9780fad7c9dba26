"""The generated docs: the field reference (from the CRD: current, complete) and the pure modules (from pyproject)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from rocmtrain import api, render
from rocmtrain.api import crd
from rocmtrain.api.patterns import PATTERN_DESCRIPTIONS
from rocmtrain.cli import docs

ROOT = Path(__file__).resolve().parents[2]
REFERENCE, MODULES, METRICS, _PLAN = docs.BLOCKS
STRICT = """
[[tool.mypy.overrides]]
module = ["pyarrow.*"]
ignore_missing_imports = true

[[tool.mypy.overrides]]
module = {modules}
disallow_untyped_defs = true
"""


def _fields(node: dict[str, Any], path: str) -> list[str]:
    found = [path]
    holder, prefix = (node["items"], path + "[]") if node.get("type") == "array" else (node, path)
    for name, sub in holder.get("properties", {}).items():
        found += _fields(sub, f"{prefix}.{name}")
    return found


def _entries(reference: str) -> dict[str, str]:
    """Each field's entry (its list item and the description under it), by its path, in order."""
    entries: dict[str, str] = {}
    for line in reference.splitlines():
        if line.startswith("- **`"):
            path = line.removeprefix("- **`").partition("`**")[0]
            entries[path] = line
        elif line.startswith("  ") and entries:
            entries[path] += "\n" + line
    return entries


def _generated(page: str, block: docs.Block) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    return text[text.index(block.begin) : text.index(block.end)]


@pytest.mark.parametrize("block", docs.BLOCKS, ids=lambda block: block.path)
def test_generated_docs_are_current(block: docs.Block) -> None:
    text = (ROOT / block.path).read_text(encoding="utf-8")
    assert block.begin in text
    assert block.end in text
    assert docs.update(text, block, ROOT) == text, f"{block.path} is stale: run `make docs`"


def test_every_spec_and_status_field_has_an_entry() -> None:
    schema = crd.openapi_schema()
    fields = _fields(schema["properties"]["spec"], "spec") + _fields(schema["properties"]["status"], "status")
    assert list(_entries(docs.field_reference())) == ["metadata.name", *fields]


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
    entries = _entries(docs.field_reference())
    assert "≥ 1; ≤ 1024" in entries["spec.resources.workers"]
    assert "> 0; ≤ 1" in entries["spec.training.learningRate"]
    assert "immutable" in entries["spec.model"]
    assert "immutable" not in entries["spec.suspend"]
    assert "requires gpusPerWorker > 0" in entries["spec.resources.gpu"]
    assert "either value or valueFrom" in entries["spec.env"]
    assert "keys: a label key" in entries["spec.scheduling.nodeSelector"]
    assert 'default `"bf16"`' in entries["spec.training.precision"]
    assert "(map[string]string" in entries["spec.scheduling.nodeSelector"]
    assert "([]object" in entries["spec.env"]
    assert entries["spec.model"].endswith(
        "\n  Pretrained model and task; required unless code is set, and then passed to it as ROCMTRAIN_MODEL."
    )


def test_update_replaces_only_between_markers() -> None:
    stale = f"# Title\n\nIntro.\n\n{REFERENCE.begin}\nold list\n{REFERENCE.end}\n\nMore.\n"
    updated = docs.update(stale, REFERENCE, ROOT)
    assert updated.startswith("# Title\n\nIntro.\n\n" + REFERENCE.begin)
    assert updated.endswith(REFERENCE.end + "\n\nMore.\n")
    assert "old list" not in updated
    assert docs.update(updated, REFERENCE, ROOT) == updated
    assert docs.update("# Title\n", REFERENCE, ROOT) == "# Title\n\n" + REFERENCE.text(ROOT) + "\n"
    assert docs.update("", REFERENCE, ROOT) == REFERENCE.text(ROOT) + "\n"


def test_main_writes_and_checks(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(STRICT.format(modules='["rocmtrain.render.*", "rocmtrain.api"]'))
    assert docs.main(["--root", str(tmp_path), "--check"]) == 1
    assert not (tmp_path / "docs").exists()
    assert docs.main(["--root", str(tmp_path)]) == 0
    for block in docs.BLOCKS:
        assert (tmp_path / block.path).read_text() == block.text(tmp_path) + "\n"
    assert docs.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / "pyproject.toml").write_text(STRICT.format(modules='["rocmtrain.render.*"]'))
    assert docs.main(["--root", str(tmp_path), "--check"]) == 1


def test_the_pure_modules_are_the_strict_mypy_list(tmp_path: Path) -> None:
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    (strict,) = [section for section in overrides if section.get("disallow_any_generics")]
    assert docs.pure_modules(ROOT / "pyproject.toml") == strict["module"]
    listed = [line.split("`")[1] for line in _generated(MODULES.path, MODULES).splitlines() if line.startswith("- `")]
    assert listed == strict["module"]
    (tmp_path / "pyproject.toml").write_text(STRICT.format(modules='"rocmtrain.render.*"'))
    assert docs.pure_modules(tmp_path / "pyproject.toml") == ["rocmtrain.render.*"]


def test_each_pure_module_is_listed_with_its_docstring(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(STRICT.format(modules='["rocmtrain.render.*", "rocmtrain.api"]'))
    summaries = [(module.__doc__ or "").strip().splitlines()[0] for module in (render, api)]
    assert summaries[0] and summaries[1]
    expected = f"- `rocmtrain.render.*`: {summaries[0]}\n- `rocmtrain.api`: {summaries[1]}"
    assert docs.pure_module_list(tmp_path) == expected


def test_the_metric_table_shows_every_metric_as_the_displays_label_it() -> None:
    from rocmtrain.api.models import CUSTOM_METRICS, Metrics, metric_rows

    table = _generated(METRICS.path, METRICS)
    rows = [line for line in table.splitlines() if line.startswith("| `")][1:]  # after the heading row
    assert len(rows) == len(Metrics.model_fields) - 1 == len(metric_rows())
    assert CUSTOM_METRICS in Metrics.model_fields, "the one field without a row: the list of the others"
    for line, row in zip(rows, metric_rows(), strict=True):
        assert line.startswith(f"| `{row.key}` | {row.heading} |")

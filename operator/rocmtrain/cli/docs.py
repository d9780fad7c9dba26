"""The generated parts of the docs: the custom-resource field reference, the list of pure modules, the metric
table and the memory plan the language-model guide quotes.

`python -m rocmtrain.cli.docs` (`make docs`) rewrites, in the checkout it runs in (`--root`), the part
of each page between its markers: docs/reference/custom-resource.md from the CRD schema,
docs/design/boundaries.md from the strict mypy section of pyproject.toml, docs/reference/status.md from
the metrics' display metadata, docs/guides/language-models.md from `rocmtrain plan` of an example.
`--check` only reports whether they are current.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmtrain.api import crd
from rocmtrain.api.models import metric_rows
from rocmtrain.api.patterns import describe_pattern

# A map's key rule (rocmtrain.api.crd): the key pattern, then the bound on a label key's prefix.
_KEY_RULE = re.compile(r"^self\.all\(k, k\.matches\(r'(.*?)'\)(?: && k\.matches\(r'[^']*'\))?\)$")
_IMMUTABLE_RULE = re.compile(r"^self\.(\w+) == oldSelf\.\1$")
Notes = dict[str, list[str]]


@dataclass(frozen=True)
class Block:
    """A generated part of one Markdown page, between two markers; `render` makes it from the checkout's root."""

    name: str
    path: str
    source: str
    render: Callable[[Path], str]

    @property
    def begin(self) -> str:
        return f"<!-- BEGIN {self.name} -->"

    @property
    def end(self) -> str:
        return f"<!-- END {self.name} -->"

    def text(self, root: Path) -> str:
        """The block, markers included."""
        note = f"<!-- Generated from {self.source} by `python -m rocmtrain.cli.docs` (`make docs`); do not edit. -->"
        return f"{self.begin}\n{note}\n\n{self.render(root)}\n\n{self.end}"


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type", "object")
    if kind == "array":
        return "[]" + _type(node["items"])
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return "map[string]" + _type(node["additionalProperties"])
    return kind


def _rule_notes(node: dict[str, Any], owner: str, base: str, notes: Notes) -> None:
    """File each CEL rule of `node` under the field it blames: `base` + its fieldPath, else `owner`."""
    for rule in node.get("x-kubernetes-validations", []):
        target = base + rule["fieldPath"] if "fieldPath" in rule else owner
        if key_pattern := _KEY_RULE.match(rule["rule"]):
            notes[target].append("keys: " + describe_pattern(key_pattern.group(1)))
        elif _IMMUTABLE_RULE.match(rule["rule"]):
            notes[target].append("immutable")
        else:
            notes[target].append(rule["message"])


def _constraints(node: dict[str, Any], required: bool, notes: list[str]) -> list[str]:
    out = ["required"] if required else []
    if "enum" in node:
        out.append("one of " + ", ".join(f"`{value}`" for value in node["enum"]))
    if "minimum" in node:
        out.append(f"{'>' if node.get('exclusiveMinimum') else '≥'} {node['minimum']}")
    if "maximum" in node:
        out.append(f"{'<' if node.get('exclusiveMaximum') else '≤'} {node['maximum']}")
    if "maxLength" in node:
        out.append(f"at most {node['maxLength']} characters")
    if "maxItems" in node:
        out.append(f"at most {node['maxItems']} items")
    if "maxProperties" in node:
        out.append(f"at most {node['maxProperties']} fields")
    if "pattern" in node:
        out.append(describe_pattern(node["pattern"]))
    if keys := node.get("x-kubernetes-list-map-keys"):
        out.append("unique " + ", ".join(keys))
    if node.get("x-kubernetes-preserve-unknown-fields"):
        out.append("plus the fields of its source")
    return out + notes


def _entry(path: str, kind: str, default: Any, constraints: list[str], description: str) -> str:
    """One field as a list item: name, type, default and constraints, then its description."""
    facts = [kind]
    if default is not None and default not in ({}, []):
        facts.append(f"default `{json.dumps(default)}`")
    facts += constraints
    head = f"- **`{path}`** ({'; '.join(facts)})"
    description = description.replace("\n", " ").strip()
    return f"{head}:\n  {description}" if description else head


def _entries(node: dict[str, Any], path: str, required: bool, notes: Notes) -> list[str]:
    """The entry of `node` and of every field below it (list items as `path[].field`)."""
    item = node["items"] if node.get("type") == "array" else None
    _rule_notes(node, path, path, notes)
    if item is not None:
        _rule_notes(item, path, path + "[]", notes)
        constraints = _constraints(node, required, []) + _constraints(item, False, notes[path])
    else:
        constraints = _constraints(node, required, notes[path])
    entries = [_entry(path, _type(node), node.get("default"), constraints, node.get("description", ""))]
    holder, prefix = (item, path + "[]") if item is not None else (node, path)
    needed = set(holder.get("required", []))
    for name, child in holder.get("properties", {}).items():
        entries += _entries(child, f"{prefix}.{name}", name in needed, notes)
    return entries


def field_reference() -> str:
    """Every metadata, spec and status field of the CRD, as a list per section."""
    schema = crd.openapi_schema()
    notes: Notes = defaultdict(list)
    name_rules = [rule["message"] for rule in schema["x-kubernetes-validations"] if "metadata.name" in rule["rule"]]
    sections = [f"### metadata\n\n{_entry('metadata.name', 'string', None, ['required', *name_rules], 'Job name.')}"]
    for section in ("spec", "status"):
        entries = _entries(schema["properties"][section], section, section in schema["required"], notes)
        sections.append(f"### {section}\n\n" + "\n".join(entries))
    return "\n\n".join(sections)


def pure_modules(pyproject: Path) -> list[str]:
    """The `module` list of the strict section of mypy's overrides: the pure modules, the single list."""
    overrides = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["mypy"]["overrides"]
    (strict,) = [section for section in overrides if section.get("disallow_untyped_defs")]
    modules = strict["module"]
    return [modules] if isinstance(modules, str) else list(modules)


def pure_module_list(root: Path) -> str:
    """The pure modules as a Markdown list, each with the first line of its docstring."""
    lines = []
    for name in pure_modules(root / "pyproject.toml"):
        summary = (inspect.getdoc(importlib.import_module(name.removesuffix(".*"))) or "").partition("\n")[0]
        lines.append(f"- `{name}`: {summary}" if summary else f"- `{name}`")
    return "\n".join(lines)


def metric_table(_root: Path) -> str:
    """The metric display table (`metric_rows`), as `rocmtrain status` and the run summary label each metric."""
    lines = ["| `status.metrics` key | shown as | meaning |", "|---|---|---|"]
    lines += [f"| `{row.key}` | {row.heading} | {row.description} |" for row in metric_rows()]
    return "\n".join(lines)


# The plan the language-model guide quotes: the 70B LoRA example, from Llama 3.1 70B's published config.json.
PLAN_EXAMPLE = ("examples/cluster-llama-70b-lora-fsdp-mi300x.yaml", "examples/models/llama-3.1-70b/config.json")


def example_plan(root: Path) -> str:
    """`rocmtrain plan` of the 70B LoRA example, as the command prints it."""
    from rocmtrain import cli

    job, config = PLAN_EXAMPLE
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main(["plan", str(root / job), "--config", str(root / config)])
    return f"```console\n$ rocmtrain plan {job} --config {config}\n{printed.getvalue()}```"


BLOCKS = (
    Block("FIELD REFERENCE", "docs/reference/custom-resource.md", "the CRD", lambda _root: field_reference()),
    Block("PURE MODULES", "docs/design/boundaries.md", "pyproject.toml's strict mypy section", pure_module_list),
    Block("METRICS", "docs/reference/status.md", "the Metrics model's display metadata", metric_table),
    Block("MEMORY PLAN", "docs/guides/language-models.md", f"`rocmtrain plan` of {PLAN_EXAMPLE[0]}", example_plan),
)


def update(text: str, block: Block, root: Path) -> str:
    """`text` with `block` replaced between its markers (or appended, with them, when missing)."""
    generated = block.text(root)
    if block.begin in text and block.end in text:
        start, end = text.index(block.begin), text.index(block.end) + len(block.end)
        return text[:start] + generated + text[end:]
    if not text.strip():
        return generated + "\n"
    return text.rstrip("\n") + "\n\n" + generated + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) every generated block of the docs."""
    parser = argparse.ArgumentParser(prog="python -m rocmtrain.cli.docs", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path(), help="the checkout (default: the current folder)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is not current; change nothing")
    args = parser.parse_args(argv)
    stale = []
    for block in BLOCKS:
        page = args.root / block.path
        current = page.read_text(encoding="utf-8") if page.exists() else ""
        wanted = update(current, block, args.root)
        if wanted == current:
            continue
        stale.append(block.path)
        if not args.check:
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(wanted, encoding="utf-8")
    if args.check and stale:
        print(f"stale generated docs: {', '.join(stale)}; run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

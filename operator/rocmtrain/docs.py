"""The README's field reference: a Markdown table of every spec and status field, from the CRD schema.

`python -m rocmtrain.docs README.md` (`make docs`) rewrites the part of README.md
between the markers; `--check` only reports whether it is current.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from rocmtrain.api import crd
from rocmtrain.api.patterns import describe_pattern

BEGIN = "<!-- BEGIN FIELD REFERENCE -->"
END = "<!-- END FIELD REFERENCE -->"
_KEY_RULE = re.compile(r"^self\.all\(k, k\.matches\(r'(.*)'\)\)$")
_IMMUTABLE_RULE = re.compile(r"^self\.(\w+) == oldSelf\.\1$")
Notes = dict[str, list[str]]


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
    if "pattern" in node:
        out.append(describe_pattern(node["pattern"]))
    if keys := node.get("x-kubernetes-list-map-keys"):
        out.append("unique " + ", ".join(keys))
    if node.get("x-kubernetes-preserve-unknown-fields"):
        out.append("plus the fields of its source")
    return out + notes


def _default(node: dict[str, Any]) -> str:
    if "default" not in node or node["default"] in ({}, []):
        return ""
    return f"`{json.dumps(node['default'])}`"


def _rows(node: dict[str, Any], path: str, required: bool, notes: Notes) -> list[list[str]]:
    """The row of `node` and of every field below it (list items as `path[].field`)."""
    item = node["items"] if node.get("type") == "array" else None
    _rule_notes(node, path, path, notes)
    if item is not None:
        _rule_notes(item, path, path + "[]", notes)
        constraints = _constraints(node, required, []) + _constraints(item, False, notes[path])
    else:
        constraints = _constraints(node, required, notes[path])
    rows = [[f"`{path}`", _type(node), _default(node), "; ".join(constraints), node.get("description", "")]]
    holder, prefix = (item, path + "[]") if item is not None else (node, path)
    needed = set(holder.get("required", []))
    for name, child in holder.get("properties", {}).items():
        rows += _rows(child, f"{prefix}.{name}", name in needed, notes)
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[list[str]]) -> str:
    lines = ["| Field | Type | Default | Constraints | Description |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def field_reference() -> str:
    """The Markdown block, markers included."""
    schema = crd.openapi_schema()
    notes: Notes = defaultdict(list)
    name_rules = [rule["message"] for rule in schema["x-kubernetes-validations"] if "metadata.name" in rule["rule"]]
    name_row = ["`metadata.name`", "string", "", "; ".join(["required", *name_rules]), "Job name."]
    sections = [f"### metadata\n\n{_table([name_row])}"]
    for section in ("spec", "status"):
        rows = _rows(schema["properties"][section], section, section in schema["required"], notes)
        sections.append(f"### {section}\n\n{_table(rows)}")
    body = "\n\n".join(sections)
    generated = "<!-- Generated from the CRD by `python -m rocmtrain.docs README.md` (`make docs`); do not edit. -->"
    return f"{BEGIN}\n{generated}\n\n{body}\n\n{END}"


def update(text: str) -> str:
    """`text` with its field reference replaced (or appended, with the markers, when missing)."""
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        return text[:start] + field_reference() + text[end:]
    return text.rstrip("\n") + "\n\n" + field_reference() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, verify) the field reference in a Markdown file."""
    parser = argparse.ArgumentParser(prog="python -m rocmtrain.docs", description=__doc__)
    parser.add_argument("readme", type=Path, help="the Markdown file, usually README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not current; change nothing")
    args = parser.parse_args(argv)
    current = args.readme.read_text(encoding="utf-8") if args.readme.exists() else "# rocm-train-operator\n"
    wanted = update(current)
    if args.check:
        if wanted != current:
            print(f"{args.readme}: the field reference is stale; run `make docs`", file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Helm template text from plain objects: YAML with holes that become template code.

An object is dumped as YAML; a string value ``hole(name)`` in it marks where template code goes.
A hole that is a whole line's value (``key: <hole>`` or ``- <hole>``) is replaced by the lines its
``Block`` writes at that line's indentation; a hole inside a value (``Inline``) is replaced in place.
Every ``{{`` of the objects' own text (the alerts' ``{{ $labels.x }}``) is escaped first, so that
Helm prints it as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

_HOLE = "__helm_hole_{}__"
_HOLE_RE = re.compile(r"__helm_hole_([a-z0-9_]+)__")
_LINE_RE = re.compile(r"^(?P<indent> *)(?:- )?(?P<key>[^:\s][^:]*: )?__helm_hole_(?P<name>[a-z0-9_]+)__(?:: null)?$")


def hole(name: str) -> str:
    """The marker of hole ``name`` (lower case, digits and underscores)."""
    return _HOLE.format(name)


@dataclass(frozen=True)
class Inline:
    """Template code in place of the marker (``{{ .Values.image.tag }}``)."""

    code: str


@dataclass(frozen=True)
class Block:
    """Template lines in place of the marker's line: ``lines(indent, key)``, where ``indent`` is the
    line's indentation and ``key`` its ``key: `` (empty for a list item or a map key)."""

    lines: Callable[[str, str], list[str]]


Fill = Inline | Block


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as they are written by hand."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def escape(text: str) -> str:
    """``text`` as Helm prints it literally: every ``{{`` through a template string."""
    return text.replace("{{", '{{ "{{" }}')


def dump(obj: Any) -> str:
    """``obj`` as YAML (keys in their order, no line wrapping)."""
    return str(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True))


# Holes any object may have: the release's name and namespace.
RELEASE_NAME = hole("release_name")
RELEASE_NAMESPACE = hole("release_namespace")
_RELEASE: dict[str, Fill] = {
    "release_name": Inline("{{ .Release.Name }}"),
    "release_namespace": Inline("{{ .Release.Namespace }}"),
}


def template(obj: Any, fills: Mapping[str, Fill]) -> str:
    """The template of ``obj``: its YAML, escaped, with each hole filled (the release's holes, and
    ``fills``, each of which must be used)."""
    own = set(fills)
    fills = {**_RELEASE, **fills}
    out: list[str] = []
    used: set[str] = set()
    for line in escape(dump(obj)).splitlines():
        whole = _LINE_RE.match(line)
        if whole and isinstance(fills.get(whole["name"]), Block):
            fill = fills[whole["name"]]
            assert isinstance(fill, Block)
            used.add(whole["name"])
            out.extend(fill.lines(whole["indent"], whole["key"] or ""))
            continue

        def inline(match: re.Match[str]) -> str:
            fill = fills.get(match[1])
            if not isinstance(fill, Inline):
                raise KeyError(f"hole {match[1]!r} has no inline fill")
            used.add(match[1])
            return fill.code

        out.append(_HOLE_RE.sub(inline, line))
    if missing := own - used:
        raise KeyError(f"holes not found: {sorted(missing)}")
    return "\n".join(out) + "\n"


def wrapped(condition: str, text: str) -> str:
    """``text`` rendered only where ``condition`` (template code) holds."""
    return f"{{{{- if {condition} }}}}\n{text}{{{{- end }}}}\n"

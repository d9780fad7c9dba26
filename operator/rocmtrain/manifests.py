"""Reading job manifests: YAML documents resolved as kubectl resolves them."""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-4` as a number (PyYAML needs a dot; kubectl does not)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def load_documents(text: str) -> list[Any]:
    """Every non-empty document of a (multi-document) YAML text."""
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]

"""The Go-built tools of build.sh (kustomize, promtool, kstatus, helm): where they are, or why not.

A missing tool skips the test that needs it, and fails it under CI (`CI` set), where
`make test` builds every tool first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocmtrain_testworld.paths import BIN_DIR


def go_tool(name: str) -> Path:
    """The path of tool `name` in the cluster binaries folder; skips (fails under CI) when it is not built."""
    binary = BIN_DIR / name
    if not binary.is_file():
        message = f"no {name} in {BIN_DIR}; run `make cluster-binaries`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary

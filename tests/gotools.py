"""Go for the tests: the tools tests/cluster/build.sh builds (kustomize, promtool, kstatus), and Go modules' files.

A missing tool skips the test that needs it, and fails it under CI (`CI` set), where
`make test` builds every tool first. Modules come through the Go module proxy into the
module cache, once.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from cluster.kubecluster import BIN_DIR


def go_tool(name: str) -> Path:
    """The path of tool `name` in the cluster binaries folder; skips (fails under CI) when it is not built."""
    binary = BIN_DIR / name
    if not binary.is_file():
        message = f"no {name} in {BIN_DIR}; run `make cluster-binaries`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def module_dir(module: str, version: str) -> Path:
    """The folder of Go module `module@version` in the module cache (downloaded on first use)."""
    with tempfile.TemporaryDirectory() as outside_any_module:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            cwd=outside_any_module,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"cannot fetch {module}@{version}: {result.stdout}{result.stderr}")
    return Path(json.loads(result.stdout)["Dir"])

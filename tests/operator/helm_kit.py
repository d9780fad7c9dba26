"""Helm and kustomize for the chart's tests: renders as objects (Helm itself: rocmtrain_testworld.helm)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from operator_testkit import REPO, kustomize_build

from rocmtrain.api.manifests import load_documents
from rocmtrain_testworld.helm import CHART, helm


def sets(values: Mapping[str, str]) -> list[str]:
    """``--set key=value`` for each of ``values``."""
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def template(home: Path, namespace: str, values: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """`helm template rocm-train-operator <chart> --include-crds` in ``namespace``, as objects."""
    args = ["template", "rocm-train-operator", str(CHART), "--namespace", namespace, "--include-crds"]
    return load_documents(helm([*args, *sets(values or {})], home))


def overlay(
    folder: Path,
    *,
    namespace: str | None = None,
    components: Sequence[str] = (),
    resources: Sequence[str] = (),
    extra: str = "",
) -> list[dict[str, Any]]:
    """`kustomize build` of an overlay of manifests/ (in ``namespace``, if given) with ``components``
    (folders of manifests/), more ``resources`` (files of ``folder``) and ``extra`` kustomization lines,
    labelled as the base is."""
    manifests = REPO / "manifests"
    lines = [
        f"resources: [{', '.join([os.path.relpath(manifests, folder), *resources])}]",
        "labels: [{pairs: {app.kubernetes.io/part-of: rocm-train-operator}}]",
    ]
    if namespace is not None:
        lines.append(f"namespace: {namespace}")
    if components:
        lines.append(f"components: [{', '.join(os.path.relpath(manifests / c, folder) for c in components)}]")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text("\n".join(lines) + "\n" + extra)
    return kustomize_build(folder)


def keyed(objs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name), each once."""
    found = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}
    assert len(found) == len(objs), "an object is rendered twice"
    return found

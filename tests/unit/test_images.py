"""The Dockerfiles, the manifests, the renderer, pyproject and the lock agree on users, versions and tags."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rocmtrain.api.contract import RAY_VERSION, RUN_AS_GROUP, RUN_AS_USER
from rocmtrain.api.models import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _user(dockerfile: str) -> str:
    (user,) = re.findall(r"^USER (\S+)$", (ROOT / dockerfile).read_text(), flags=re.MULTILINE)
    return user


def test_training_pods_run_as_the_image_user() -> None:
    assert _user("training_image/Dockerfile") == str(RUN_AS_USER)
    assert f"--gid {RUN_AS_GROUP}" in (ROOT / "training_image/Dockerfile").read_text()


def test_operator_deployment_runs_as_the_image_user() -> None:
    deployment = yaml.safe_load((ROOT / "manifests/deployment.yaml").read_text())
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert _user("operator/Dockerfile") == f"{context['runAsUser']}:{context['runAsGroup']}"


def test_rayjob_ray_version_is_the_pinned_ray() -> None:
    assert f"ray[train,default]=={RAY_VERSION}" in PYPROJECT["project"]["optional-dependencies"]["train"]


def test_default_training_image_is_this_release() -> None:
    assert DEFAULT_IMAGE.endswith(":" + PYPROJECT["project"]["version"])


def test_the_operator_image_installs_the_operator_without_the_training_package() -> None:
    """`rocmtrain run` is the training package's entry point; the operator image copies only operator/."""
    dockerfile = (ROOT / "operator/Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ") and "--from" not in line}
    assert copied == {"pyproject.toml", "operator"}
    assert 'pip install --prefix=/install --constraint constraints.txt ".[operator]"' in dockerfile
    commands = PYPROJECT["project"]["entry-points"]["rocmtrain.commands"]
    training = {name for name, target in commands.items() if target.startswith("rocmtrain_train.")}
    assert training == {"run", "scale"}  # not in this image
    assert {name for name in commands if name not in training} == {"pool", "status", "plot"}  # in it
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"] == ["operator", "training_image"]


# torch, and what only torch requires: the ROCm base image's build, or a local CPU wheel (see constraints.txt).
UNPINNED = {"torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm", "sympy", "networkx"}


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


@pytest.mark.parametrize("requirement", _requirements(), ids=str)
def test_every_dependency_is_locked_within_its_range(requirement: Requirement) -> None:
    name = canonicalize_name(requirement.name)
    pins = _lock()
    if name in UNPINNED:
        assert name not in pins, f"{name} is left to the base image or a local wheel"
        return
    assert name in pins, f"{name} is not in constraints.txt: run `make lock`"
    assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {requirement}"


def test_the_lock_is_used_by_make_install_ci_and_both_images() -> None:
    assert not [name for name in _lock() if name in UNPINNED or name.startswith(("nvidia-", "cuda-"))]
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --constraint constraints.txt -e '.[operator,train,plot,dev]'" in makefile
    assert "make test" in (ROOT / ".ci/run").read_text() and re.search(r"^test: deps\b", makefile, re.MULTILINE)
    assert re.search(r"^deps:\n\t\$\(MAKE\) -j2 lint cluster-binaries$", makefile, re.MULTILINE)
    assert re.search(r"^lint: install$", makefile, re.MULTILINE)
    training = (ROOT / "training_image/Dockerfile").read_text()
    assert "--constraint constraints.txt" in training and "constraints.txt" in training.split("RUN")[0]
    operator = (ROOT / "operator/Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:[\w.-]+@sha256:[0-9a-f]{64}$", operator, re.MULTILINE), "by digest"

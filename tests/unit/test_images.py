"""The Dockerfiles, the manifests, the renderer and pyproject agree on users, versions and tags."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

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
    assert 'pip install --prefix=/install ".[operator]"' in dockerfile
    commands = PYPROJECT["project"]["entry-points"]["rocmtrain.commands"]
    training = {name for name, target in commands.items() if target.startswith("rocmtrain_train.")}
    assert training == {"run", "scale"}  # not in this image
    assert {name for name in commands if name not in training} == {"pool", "status", "plot"}  # in it
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"] == ["operator", "training_image"]

"""The import boundaries of the house, read from the source with `ast` (nothing is imported to check).

- `rocmtrain.api` is the contract: the standard library, pydantic and PyYAML only,
  nothing else of `rocmtrain`, never kopf, kubernetes, torch or ray; the planner (`rocmtrain.plan`)
  adds only the contract;
- the training package (`rocmtrain_train`) imports only the contract and the planner of `rocmtrain`,
  and `rocmtrain` never imports the training package;
- each package's subpackages form layers (`LAYERS`): a module imports only its own subpackage and
  the layers below it, never one beside or above it;
- the pure core, the modules of the strict mypy section of pyproject.toml (its one list), does no
  I/O: no kopf, no Kubernetes client, no HTTP, and imports only the pure core;
- kopf stays in `rocmtrain.controller`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from rocmtrain.api.contract import API_VERSION, DRIVER_MODULE, KIND
from rocmtrain.api.models import RocmTrainingJob

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"rocmtrain": ROOT / "operator" / "rocmtrain", "rocmtrain_train": ROOT / "training_image" / "rocmtrain_train"}
HEAVY = {"kopf", "kubernetes", "kubernetes_asyncio", "torch", "ray", "transformers", "aiohttp"}
# The standard library's network and HTTP clients and servers: I/O a pure module must not do.
NETWORK = {"http", "urllib", "socket", "ssl", "asyncio", "socketserver", "ftplib", "smtplib"}
CONTRACT_THIRD_PARTY = {"pydantic", "pydantic_core", "yaml"}
# What the training package may import of `rocmtrain`, and what imports nothing else of it.
SHARED = ("rocmtrain.api", "rocmtrain.plan")
# Each package's layers, bottom to top: a subpackage (or top-level module) per name.
LAYERS = {
    "rocmtrain": (
        ("api",),
        ("plan",),
        ("render",),
        ("status",),
        ("admission",),
        ("views",),
        ("kube",),
        ("serving",),
        ("metrics",),
        ("progress",),
        ("chart", "cli", "controller", "__init__"),
    ),
    "rocmtrain_train": (
        ("config", "collectives"),
        ("storage",),
        ("data", "model", "checkpoint", "reporting"),
        ("evaluation",),
        ("tasks", "strategy"),
        ("loop",),
        ("trainer",),
        ("search",),
        ("driver",),
        ("cli", "__main__", "sdk", "__init__"),
    ),
}


def pure_modules() -> tuple[str, ...]:
    """The pure core: the modules of the strict `[[tool.mypy.overrides]]` section ("a.*" is a and below)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    strict = [o for o in config["tool"]["mypy"]["overrides"] if o.get("disallow_untyped_defs")]
    assert len(strict) == 1, "one strict mypy section lists the pure modules"
    return tuple(name.removesuffix(".*") for name in strict[0]["module"])


PURE = pure_modules()
IMPORTERS = {"import_module", "__import__"}


def imported(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in `source`, the source of `module`; nested and dynamic ones too.

    `from a import b` counts as importing `a.b` (b may be a submodule); relative imports are resolved.
    """
    package = module.rsplit(".", 1)[0] if not module.endswith("__init__") else module.removesuffix(".__init__")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            stem = ".".join(part for part in (base, node.module or "") if part)
            yield from ((node.lineno, f"{stem}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in IMPORTERS:
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def modules() -> Iterator[tuple[str, Path]]:
    """(dotted name, file) of every module of both packages."""
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            yield ".".join((package, *parts)), path


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer(module: str) -> tuple[str, int]:
    """(the subpackage or top-level module, its layer) of a module of either package."""
    package, _, rest = module.partition(".")
    part = rest.split(".")[0] or "__init__"
    found = [index for index, names in enumerate(LAYERS[package]) if part in names]
    assert found, f"{module}: {package}.{part} is in no layer of LAYERS"
    return part, found[0]


def below(module: str, name: str) -> bool | None:
    """Whether `name` (imported by `module`) is in `module`'s own subpackage or a layer below; None when
    the two are not of the same package."""
    package = module.split(".")[0]
    if name.split(".")[0] != package or "." not in name:
        return None
    (part, level), (target, target_level) = layer(module), layer(name)
    return part == target or target_level < level


def contract_library(top: str) -> bool:
    """Whether the contract and the planner may import the top-level package `top`."""
    return top in sys.stdlib_module_names or top in CONTRACT_THIRD_PARTY


def broken_rules(module: str, source: str) -> list[str]:
    """Every import of `module` (given its source) that crosses a boundary, as `module:line imports name`."""
    found = []
    for line, name in imported(source, module):
        top = name.split(".")[0]
        rules = [
            within(module, "rocmtrain") and top == "rocmtrain_train",
            within(module, "rocmtrain_train") and top == "rocmtrain" and not any(within(name, s) for s in SHARED),
            within(module, "rocmtrain.api") and not (within(name, "rocmtrain.api") or contract_library(top)),
            within(module, "rocmtrain.plan") and not (any(within(name, s) for s in SHARED) or contract_library(top)),
            below(module, name) is False,
            any(within(module, pure) for pure in PURE)
            and (top in HEAVY | NETWORK or (top == "rocmtrain" and not any(within(name, p) for p in PURE))),
            top == "kopf" and not within(module, "rocmtrain.controller"),
        ]
        if any(rules):
            found.append(f"{module}:{line} imports {name}")
    return found


def test_every_import_of_both_packages_stays_inside_its_boundary() -> None:
    broken = [problem for module, path in modules() for problem in broken_rules(module, path.read_text())]
    assert broken == []


def test_every_module_of_both_packages_is_in_one_layer() -> None:
    for package, layers in LAYERS.items():
        named = [name for names in layers for name in names]
        assert len(named) == len(set(named)), f"{package}: a name in two layers"
    assert {module: layer(module)[0] for module, _ in modules()}


def test_the_contract_imports_none_of_the_heavy_libraries() -> None:
    contract = [(m, p) for m, p in modules() if within(m, "rocmtrain.api")]
    assert len(contract) >= 10
    names = {name.split(".")[0] for module, path in contract for _, name in imported(path.read_text(), module)}
    assert not names & HEAVY
    assert names - set(sys.stdlib_module_names) == {"rocmtrain", *CONTRACT_THIRD_PARTY}


def test_the_driver_and_the_trial_actors_leave_the_training_loop_to_the_ranks() -> None:
    """The driver (`python -m rocmtrain_train`) and each Tune trial actor (`search.tune_trials`) pickle the
    ranks' loop by reference and never run it: importing it (transformers, the models) would cost each of
    them seconds of CPU (see `trainer.torch_trainer.import_and_train_rank`)."""
    probe = (
        "import sys, rocmtrain_train.__main__, rocmtrain_train.search.tune_trials\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers' or m.endswith('step_loop')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("rocmtrain_train.loop.step_loop", "from rocmtrain.render import render_rayjob"),
        ("rocmtrain_train.loop.step_loop", "def f():\n    import rocmtrain.controller.handlers"),
        ("rocmtrain_train.loop.step_loop", "from rocmtrain import status"),
        ("rocmtrain_train.loop.step_loop", "import importlib\nimportlib.import_module('rocmtrain.kube.client')"),
        ("rocmtrain.cli", "from rocmtrain_train.driver.train_job import run_local"),
        ("rocmtrain.status.phase", "import rocmtrain_train"),
        ("rocmtrain.api.models.job", "from rocmtrain.render import names"),
        ("rocmtrain.api.models.job", "from ... import status"),
        ("rocmtrain.api.validate", "import torch"),
        ("rocmtrain.api.crd", "from kubernetes_asyncio import client"),
        ("rocmtrain.render.pod", "import aiohttp"),
        ("rocmtrain.status.objects", "from rocmtrain.kube.client import Kube"),
        ("rocmtrain.status.pods", "import urllib.request"),
        ("rocmtrain.views.job", "from rocmtrain.controller import handlers"),
        ("rocmtrain.admission.node_fit", "from rocmtrain.metrics.prometheus import REGISTRY"),
        ("rocmtrain.progress.server", "import kopf"),
        ("rocmtrain.render.pod", "from rocmtrain.status.hold import Hold"),
        ("rocmtrain.plan.fit", "from rocmtrain.render import names"),
        ("rocmtrain.status.phase", "from rocmtrain.admission import node_fit"),
        ("rocmtrain.kube.client", "from rocmtrain.serving.errors import Conflict"),
        ("rocmtrain.metrics.access", "from rocmtrain.progress import auth"),
        ("rocmtrain.cli", "from rocmtrain.controller import settings"),
    ],
)
def test_a_forbidden_import_is_found(module: str, source: str) -> None:
    assert len(broken_rules(module, source)) == 1


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("rocmtrain_train.loop.step_loop", "from rocmtrain.api.models import Metrics\nimport torch, ray"),
        ("rocmtrain.api.models.base", "from rocmtrain.api import contract\nimport pydantic, re"),
        ("rocmtrain.api.validate", "from . import names\nfrom .crd import openapi_schema"),
        (
            "rocmtrain.render.pod",
            "from rocmtrain.render import volumes\nfrom rocmtrain.api.quantity import parse_quantity",
        ),
        ("rocmtrain.controller.handlers", "import kopf\nfrom rocmtrain.status import objects"),
    ],
)
def test_an_allowed_import_passes(module: str, source: str) -> None:
    assert broken_rules(module, source) == []


def test_the_pure_list_names_existing_modules_and_covers_the_status_mapping() -> None:
    names = {name for name, _ in modules()}
    packages = {name.removesuffix(".__init__") for name in names if name.endswith(".__init__")}
    assert [pure for pure in PURE if pure not in names | packages] == []
    assert {"rocmtrain.api", "rocmtrain.render", "rocmtrain.status", "rocmtrain.views"} <= set(PURE)
    assert not any(within(pure, side) for pure in PURE for side in ("rocmtrain.controller", "rocmtrain.kube.client"))


def test_the_contract_s_names_are_the_ones_in_use() -> None:
    assert (SOURCES[DRIVER_MODULE] / "__main__.py").is_file()  # the RayJob's entrypoint runs it
    fields = RocmTrainingJob.model_fields  # Literal types must spell the value out: checked here
    assert get_args(fields["api_version"].annotation) == (API_VERSION,)
    assert get_args(fields["kind"].annotation) == (KIND,)

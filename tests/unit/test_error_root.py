"""One error root: every exception the two packages define derives from `RocmTrainError` (`rocmtrain.api.errors`)."""

from __future__ import annotations

import ast
import builtins
import importlib
from collections.abc import Iterator
from pathlib import Path

from rocmtrain.api import errors
from rocmtrain.api.errors import RocmTrainError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "operator" / "rocmtrain", ROOT / "training_image" / "rocmtrain_train")
BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def _classes() -> Iterator[tuple[str, str, set[str]]]:
    """(module, class, the last part of each base's name) of every module-level class of both packages."""
    for folder in PACKAGES:
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder.parent).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    yield module, node.name, {ast.unparse(base).rpartition(".")[2] for base in node.bases}


def _exception_classes() -> set[tuple[str, str]]:
    """(module, class) of every class that is an exception by its bases: a builtin exception, a library's
    `...Error` or `...Exception`, or a class found so far (until no more are found)."""
    classes = list(_classes())
    names = set(BUILTIN_EXCEPTIONS)
    found: set[tuple[str, str]] = set()
    while True:
        more = {
            (module, name)
            for module, name, bases in classes
            if any(base in names or base.endswith(("Error", "Exception")) for base in bases)
        }
        if more == found:
            return found
        found = more
        names |= {name for _, name in found}


def test_every_exception_of_both_packages_derives_from_the_root() -> None:
    found = _exception_classes()
    assert len(found) > 25, found  # the census holds them all: the progress refusals alone are 13
    for module, name in sorted(found):
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, BaseException), f"{module}.{name} is not an exception"
        assert issubclass(cls, RocmTrainError), f"{module}.{name} does not derive from RocmTrainError"


def test_each_exception_name_is_defined_once() -> None:
    """No twins: one ConfigError, one NotFound, one Conflict."""
    names = [name for _, name in _exception_classes()]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []


def test_the_families_sit_under_the_root_and_config_errors_stay_value_errors() -> None:
    families = (errors.ConfigError, errors.InputError, errors.Conflict, errors.NotFound, errors.ApiError)
    assert all(family.__bases__[0] is RocmTrainError for family in families)
    assert issubclass(errors.ConfigError, ValueError)  # callers catch ValueError around what raises it

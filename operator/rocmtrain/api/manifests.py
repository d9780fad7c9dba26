"""Reading job manifests: YAML documents resolved as kubectl resolves them, then validated.

`read_jobs` is what every command that reads a job file calls (`rocmtrain validate`,
`rocmtrain render`, `rocmtrain run`), so they accept and refuse the same files with
the same messages.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from rocmtrain.api.models import RocmTrainingJob
from rocmtrain.api.validate import Context, validate_job


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


def read_jobs(file: str, context: Context) -> tuple[list[RocmTrainingJob], list[str]]:
    """The valid jobs of a manifest file (`-` reads stdin), and one line per problem found in it.

    Each line names the file (and the document, when there are several) and the field.
    An unreadable file raises OSError.
    """
    text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    try:
        documents = load_documents(text)
    except yaml.YAMLError as exc:
        return [], [f"{file}: invalid YAML: {exc}"]
    if not documents:
        return [], [f"{file}: no job in the file"]
    jobs: list[RocmTrainingJob] = []
    lines: list[str] = []
    for index, document in enumerate(documents, start=1):
        job, errors = validate_job(document, context=context)
        where = file if len(documents) == 1 else f"{file}: document {index}"
        lines += [f"{where}: {error}" for error in errors]
        if job is not None:
            jobs.append(job)
    return jobs, lines

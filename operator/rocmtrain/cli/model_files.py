"""A job's model config.json on this machine, for `rocmtrain plan`: no weights, no hub client, no network.

A local model source (an absolute path, or `./` relative to the job file) has it in its folder; a hub
id has it in the Hugging Face cache where the model was downloaded before (`$HF_HUB_CACHE`, else
`$HF_HOME/hub`, else `~/.cache/huggingface/hub`: `models--org--name/snapshots/<revision>/`, the
revision `refs/main` names). Anything else (an object store, a model never downloaded here) needs
`--config`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rocmtrain.api.contract import HUB_SCHEME, RELATIVE_PREFIX, is_local, is_object_store
from rocmtrain.api.errors import InputError

CONFIG_FILE = "config.json"
# A config.json is a few kilobytes; anything far larger is not one.
MAX_CONFIG_BYTES = 1 << 20


class ModelFileError(InputError):
    """The config.json cannot be found or read."""


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub finds it."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache)
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def cached_config(hub_id: str) -> Path | None:
    """The config.json of a hub model in the local cache (its main revision), if it is there."""
    folder = hub_cache() / f"models--{hub_id.replace('/', '--')}"
    try:
        revision = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return None
    path = folder / "snapshots" / revision / CONFIG_FILE
    return path if path.is_file() else None


def config_path(source: str, job_dir: Path) -> Path:
    """Where the config.json of the model `source` (a job's `spec.model.source`) is on this machine."""
    if is_object_store(source):
        raise ModelFileError(f"{source} is in an object store; pass its config.json with --config")
    if is_local(source):
        folder = job_dir / source.removeprefix(RELATIVE_PREFIX) if source.startswith(RELATIVE_PREFIX) else Path(source)
        return folder / CONFIG_FILE
    hub_id = source.removeprefix(HUB_SCHEME)
    found = cached_config(hub_id)
    if found is None:
        raise ModelFileError(
            f"{hub_id} is not in the Hugging Face cache ({hub_cache()}); pass its config.json with --config"
        )
    return found


def read_config(path: Path) -> dict[str, Any]:
    """A config.json's object."""
    try:
        with path.open("rb") as file:
            text = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ModelFileError(f"{path}: {exc.strerror or exc}") from exc
    if len(text) > MAX_CONFIG_BYTES:
        raise ModelFileError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a model's config.json")
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise ModelFileError(f"{path}: not JSON: {exc}") from exc
    except RecursionError:
        raise ModelFileError(f"{path}: nested too deep to be a model's config.json") from None
    if not isinstance(found, dict):
        raise ModelFileError(f"{path}: not a JSON object")
    return found

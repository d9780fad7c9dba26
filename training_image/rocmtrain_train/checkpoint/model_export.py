"""The final model export: the trained model and tokenizer, where `from_pretrained` loads them.

A LoRA adapter (peft) is exported in peft's format, which `PeftModel.from_pretrained(base, path)`
loads; with `adapter.merge`, `<model>/merged` also holds the base model with the adapter merged
in, which `AutoModelForCausalLM.from_pretrained` loads without peft.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from rocmtrain_train.config import join_location
from rocmtrain_train.storage import filesystem

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MERGED_DIR = "merged"


def merged_location(destination: str) -> str:
    """Where the merged model of an adapter exported to `destination` goes."""
    return join_location(destination, MERGED_DIR)


def is_adapter(model: Any) -> bool:
    """Whether `model` is a peft model (an adapter on a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def save_folder(destination: str, write: Callable[[str], None]) -> None:
    """Let `write` fill a folder that ends up at `destination`: a local folder, or one in an object store."""
    fs, path = filesystem(destination, None)
    if isinstance(fs, pafs.LocalFileSystem):
        write(path)
        return
    with tempfile.TemporaryDirectory() as staging:
        write(staging)
        fs.create_dir(path, recursive=True)
        pafs.copy_files(staging, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def export_model(model: PreTrainedModel, tokenizer: Any, destination: str, *, merge: bool = False) -> None:
    """Save the model (an adapter: the adapter) and tokenizer where `from_pretrained` loads them; with `merge`, an
    adapter's merged model too, at `merged_location` (the adapter is merged into `model` in place)."""

    def write(model: Any) -> Callable[[str], None]:
        def save(path: str) -> None:
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)

        return save

    save_folder(destination, write(model))
    if merge and is_adapter(model):
        save_folder(merged_location(destination), write(model.merge_and_unload()))  # type: ignore[operator]  # peft's

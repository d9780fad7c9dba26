"""The final model export: the trained model and tokenizer, where `from_pretrained` loads them."""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from rocmtrain_train.storage import filesystem

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def export_model(model: PreTrainedModel, tokenizer: Any, destination: str) -> None:
    """Save the model and tokenizer where `from_pretrained` loads them: a local folder or an object store."""
    fs, path = filesystem(destination, None)
    if isinstance(fs, pafs.LocalFileSystem):
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return
    with tempfile.TemporaryDirectory() as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        fs.create_dir(path, recursive=True)
        pafs.copy_files(staging, path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)

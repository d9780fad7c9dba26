"""Locations: local paths, object-store URIs and the Hugging Face hub, as pyarrow filesystems.

Which location is which (`is_local`, `is_object_store`, `is_hub`) and the object-store
schemes are the contract's (`rocmtrain.api.contract`): validation admits exactly the
schemes this module opens.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.fs as pafs

from rocmtrain.api.contract import is_local, is_object_store
from rocmtrain_train.config import ConfigError, resolve_relative

# Returns the filesystem and the path inside it for an object-store URI; tests inject their own.
ObjectStoreFactory = Callable[[str], tuple[pafs.FileSystem, str]]
HubFactory = Callable[[], pafs.FileSystem]


def object_store_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of an object-store URI.

    S3 uses the AWS SDK's own configuration (AWS_REGION, AWS_ENDPOINT_URL, credentials chain)
    instead of `from_uri`, which would look the bucket's region up over the network first.
    """
    try:
        if uri.startswith("s3://"):
            return pafs.S3FileSystem(), uri.removeprefix("s3://")
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot open {uri}: {exc}") from exc


def hub_filesystem() -> pafs.FileSystem:
    """The Hugging Face hub as a pyarrow filesystem (paths like `datasets/org/name/...`)."""
    from huggingface_hub import HfFileSystem

    return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem()))


def filesystem(
    location: str, base_dir: str | None, *, object_store: ObjectStoreFactory = object_store_filesystem
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a local path (absolute or `./`) or an object-store URI."""
    if is_local(location):
        return pafs.LocalFileSystem(), resolve_relative(location, base_dir)
    if is_object_store(location):
        return object_store(location)
    raise ConfigError(f"{location}: expected an absolute path, a ./relative path or an object-store URI")


def describe(fs: pafs.FileSystem, path: str) -> pafs.FileInfo:
    """File info of `path`, with unreadable locations reported as ConfigError."""
    try:
        return fs.get_file_info(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def list_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """The file at `path`, or every file below the folder at `path`, sorted."""
    info = describe(fs, path)
    if info.type == pafs.FileType.NotFound:
        raise ConfigError(f"{path}: no such file or folder")
    if info.type == pafs.FileType.File:
        return [path]
    try:
        found = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    except OSError as exc:
        raise ConfigError(f"cannot list {path}: {exc}") from exc
    return sorted(i.path for i in found if i.type == pafs.FileType.File)

"""Locations: local paths, object-store URIs and the Hugging Face hub, as pyarrow filesystems.

Which location is which (`is_local`, `is_object_store`, `is_hub`) and the object-store
schemes are the contract's (`rocmtrain.api.contract`): validation admits exactly the
schemes this module opens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import pyarrow.fs as pafs

from rocmtrain.api.contract import is_local, is_object_store
from rocmtrain.api.errors import ConfigError
from rocmtrain_train.config import resolve_relative

# Returns the filesystem and the path inside it for an object-store URI; tests inject their own.
ObjectStoreFactory = Callable[[str], tuple[pafs.FileSystem, str]]
HubFactory = Callable[[], pafs.FileSystem]

S3_SCHEME = "s3://"
# The AWS variables whose values never appear in a message (`without_secrets`).
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
SECRET_MASK = "***"  # noqa: S105 - what a secret is replaced by, not one
# How pyarrow quotes the AWS SDK: `AWS Error <CODE> during <operation> operation: <the store's message>`.
AWS_ERROR = "AWS Error "
# Characters of an object store's error quoted in a message.
STORE_ERROR_CHARS = 500
# Where the AWS SDKs and CLI take a custom S3 endpoint from (MinIO, SeaweedFS, Ceph...): the S3-specific
# variable first. pyarrow's S3FileSystem reads neither.
S3_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def s3_endpoint(environ: Mapping[str, str]) -> str | None:
    """The S3 endpoint that `environ` configures, or None for AWS's own."""
    return next((environ[name] for name in S3_ENDPOINT_VARIABLES if environ.get(name)), None)


def without_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with the values of the AWS credential variables (`SECRET_VARIABLES`) masked."""
    env = os.environ if environ is None else environ
    for name in SECRET_VARIABLES:
        if len(value := env.get(name, "").strip()) >= 3:  # shorter ones would mask ordinary words
            text = text.replace(value, SECRET_MASK)
    return text


def store_error(exc: BaseException) -> str:
    """An object store's error in its own words, on one line, short and without secrets: from pyarrow's
    `AWS Error <CODE> ...` on where it quotes the AWS SDK, else the whole message."""
    text = " ".join(str(exc).split())
    text = text[text.find(AWS_ERROR) :] if AWS_ERROR in text else text
    return without_secrets(text)[:STORE_ERROR_CHARS]  # masked before the cut, which could split a secret


def object_store_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of an object-store URI.

    S3 takes its endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (`s3_endpoint`; path-style
    requests then), and the rest from the AWS SDK's own configuration (AWS_REGION, the credentials
    chain), instead of `from_uri`, which would look the bucket's region up on AWS first.
    """
    try:
        if uri.startswith(S3_SCHEME):
            return pafs.S3FileSystem(endpoint_override=s3_endpoint(os.environ)), uri.removeprefix(S3_SCHEME)
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

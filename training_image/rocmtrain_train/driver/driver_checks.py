"""Checks that run on the driver before any worker starts, so that a bad job fails in seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from rocmtrain.api.contract import HUB_SCHEME, is_local, is_object_store
from rocmtrain.api.errors import ConfigError
from rocmtrain.plan.fit import JobPlan, plan_job
from rocmtrain.plan.gpu_memory import GpuMemory, job_gpu_memory
from rocmtrain.plan.model_shapes import ModelConfigError
from rocmtrain_train.config import RunSettings
from rocmtrain_train.data.records import read_table
from rocmtrain_train.model.pretrained import packaged_model, resolve_model
from rocmtrain_train.storage import ObjectStoreFactory, filesystem, object_store_filesystem, store_error
from rocmtrain_train.tasks import task_for

# Records the pre-flight reads of each data source (more where the ranks need more), and tokenises of the
# training data to check that they fit the job (a language model's responses within maxSeqLength).
SAMPLE_RECORDS = 256


def available_gpus() -> int:
    """GPUs this machine has (ROCm's count them through torch.cuda)."""
    import torch

    return torch.cuda.device_count()


def check_gpus(settings: RunSettings, available: int) -> None:
    needed = settings.total_gpus
    if needed > available:
        raise ConfigError(
            f"the job asks for {needed} GPUs ({settings.num_workers} workers x {settings.gpus_per_worker} "
            f"GPUs per worker) but this machine has {available}; use --cpu to train on the CPU"
        )


def check_model(settings: RunSettings) -> Any:
    """The model exists; where it is already local, its config and tokenizer load and fit the job (a model
    type with the task's head, the attention kernels, maxSeqLength within its positions, an adapter's target
    modules). Returns the tokenizer where the model is local, else None."""
    spec = settings.job.spec
    path = resolve_model(spec.model.source, settings.base_dir, download=False)
    return None if path is None else task_for(spec).check_model(path)


def check_data(settings: RunSettings, tokenizer: Any = None) -> None:
    """The data sources are readable, have the fields, valid labels or records, and a record for every rank;
    with the tokenizer, the first training records tokenise into sequences that fit the job.

    Only the first records of each source are read (the ranks read the whole of it, and check the rows they
    train on): enough for every rank and the sample, and the first of every file."""
    spec = settings.job.spec
    train = spec.data.train
    head = max(settings.world_size, SAMPLE_RECORDS)
    table = read_table(train, spec.data, spec.model, settings.base_dir, head=head)
    # The head holds every record where the source has fewer than `head`, so a refusal counts them all.
    usable = min(table.num_rows, train.max_samples or table.num_rows)
    if usable < settings.world_size:
        raise ConfigError(f"{train.uri}: {usable} training records for {settings.world_size} ranks")
    if tokenizer is not None:
        sample = range(min(table.num_rows, train.max_samples or SAMPLE_RECORDS, SAMPLE_RECORDS))
        task_for(spec).encode(tokenizer, table, sample, train.uri, False)
    if spec.data.eval is not None:
        read_table(spec.data.eval, spec.data, spec.model, settings.base_dir, head=SAMPLE_RECORDS)


def check_storage(settings: RunSettings) -> None:
    """A local storage folder can be created and written."""
    if not is_local(settings.storage):
        return
    path = Path(settings.storage)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"checkpoint storage {settings.storage}: {exc.strerror}") from exc
    if not os.access(path, os.W_OK):
        raise ConfigError(f"checkpoint storage {settings.storage} is not writable")


# The object the pre-flight writes and deletes in the run folder, to learn that the storage is writable.
WRITE_CHECK = ".rocmtrain-write-check-"
STORAGE_FIELD = "spec.checkpoint.storagePath"


def _object_store_sources(settings: RunSettings) -> list[tuple[str, str]]:
    """(field, URI) of each object-store location the job reads."""
    spec = settings.job.spec
    sources = [("spec.data.train.uri", spec.data.train.uri), ("spec.model.source", spec.model.source)]
    if spec.data.eval is not None:
        sources.append(("spec.data.eval.uri", spec.data.eval.uri))
    return [(field, uri) for field, uri in sources if is_object_store(uri)]


def _check_bucket(field: str, uri: str, access: str, object_store: ObjectStoreFactory) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of `uri` once its bucket proved to exist and answer with these credentials;
    else ConfigError `<field>: <uri> is not <access>: <why, in the store's words>`."""
    fs, path = object_store(uri)
    bucket = path.split("/", 1)[0]
    try:
        found = fs.get_file_info(bucket).type != pafs.FileType.NotFound
    except OSError as exc:
        raise ConfigError(f"{field}: {uri} is not {access}: {store_error(exc)}") from exc
    if not found:
        raise ConfigError(f"{field}: {uri} is not {access}: bucket {bucket!r} does not exist")
    return fs, path


def check_object_store(settings: RunSettings, object_store: ObjectStoreFactory = object_store_filesystem) -> None:
    """Every object store the job uses answers with the credentials the driver has (AWS_* variables for S3): the
    buckets of its data and model exist and can be read; the run folder can be written (an object is written and
    deleted there, `WRITE_CHECK` and the run id). ConfigError names the field and quotes the store."""
    for field, uri in _object_store_sources(settings):
        _check_bucket(field, uri, "readable", object_store)
    if not is_object_store(settings.run_path):
        return
    fs, path = _check_bucket(STORAGE_FIELD, settings.run_path, "writable", object_store)
    probe = f"{path.rstrip('/')}/{WRITE_CHECK}{settings.run_id}"
    try:
        fs.create_dir(path, recursive=True)  # as Ray Train does: a no-op on S3 but for empty folder markers
        with fs.open_output_stream(probe) as out:
            out.write(b"")
        fs.delete_file(probe)
    except OSError as exc:
        raise ConfigError(f"{STORAGE_FIELD}: {settings.run_path} is not writable: {store_error(exc)}") from exc


def model_config(settings: RunSettings) -> dict[str, Any] | None:
    """The model's config.json, read without its weights (from its folder, object store or the hub's cache, or the
    hub); None where it cannot be read, which `check_model` then reports."""
    source = settings.job.spec.model.source
    try:
        if is_local(source) or is_object_store(source):
            fs, path = filesystem(source, settings.base_dir)
            with fs.open_input_stream(f"{path.rstrip('/')}/config.json") as stream:
                text = stream.read().decode()
        else:
            hub_id = source.removeprefix(HUB_SCHEME)
            folder = packaged_model(hub_id)
            text = (folder / "config.json").read_text() if folder else Path(_hub_config(hub_id)).read_text()
        found = json.loads(text)
    except (OSError, ValueError):  # `check_model` reports a model it cannot find or read
        return None
    return found if isinstance(found, dict) else None


def _hub_config(hub_id: str) -> str:
    """The path of a hub model's config.json: from the cache, else downloaded (HF_HUB_OFFLINE respected)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return hf_hub_download(hub_id, "config.json")
    except HfHubHTTPError as exc:
        raise OSError(str(exc)) from exc


def check_memory(settings: RunSettings, local_gpu: GpuMemory | None = None) -> JobPlan | None:
    """The job's memory plan (`rocmtrain plan`) from the model's config.json, before any weight loads; ConfigError
    with the numbers and the cheapest change that fits where the job's GPUs are too small. GPU jobs only, and only
    those of a model family the plan knows; the GPUs' memory is the job's GPU model's, else `local_gpu`'s."""
    if not settings.use_gpu or (config := model_config(settings)) is None:
        return None
    spec = settings.job.spec
    try:
        planned = plan_job(spec, config, job_gpu_memory(spec) or local_gpu)
    except ModelConfigError:  # a model the plan does not know, or targets `check_model` refuses with the choices
        return None
    if (why := planned.refusal()) is not None:
        raise ConfigError(f"memory plan: {why}")
    return planned


def preflight(
    settings: RunSettings,
    *,
    available_gpus: int | None = None,
    local_gpu: GpuMemory | None = None,
    object_store: ObjectStoreFactory = object_store_filesystem,
) -> JobPlan | None:
    """Raise ConfigError naming the problem if the job cannot run; `available_gpus` is checked when given, and
    `object_store` opens the buckets `check_object_store` asks. Returns the job's memory plan where it has one
    (a GPU job of a model family the plan knows)."""
    if available_gpus is not None:
        check_gpus(settings, available_gpus)
    check_storage(settings)
    check_object_store(settings, object_store)
    planned = check_memory(settings, local_gpu)
    check_data(settings, check_model(settings))
    return planned

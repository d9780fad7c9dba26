"""The driver's logs kept beside the run on object storage: `<run path>/logs/`, as on a volume.

Where the run folder is a local path or a volume, the driver's log folder is `<run path>/logs`
already (`rocmtrain_train.config`). Where it is in an object store, the driver writes its logs to a
local folder (the Ray head's disk) and `keep_logs` copies that folder to `<run path>/logs/` when the
driver ends, trained or failed, so that `metrics.jsonl`, `main.log` and the rank logs written there
can be read from the bucket as from a volume. A store that fails then costs the copy, never the run's
outcome: the driver logs why and goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.fs as pafs

from rocmtrain.api.contract import is_object_store, join_location
from rocmtrain.api.errors import ConfigError
from rocmtrain_train.config import RunSettings
from rocmtrain_train.storage import ObjectStoreFactory, object_store_filesystem, store_error

log = logging.getLogger(__name__)


def keep_logs(settings: RunSettings, object_store: ObjectStoreFactory = object_store_filesystem) -> str | None:
    """Copy the driver's log folder to `<run path>/logs/` when the run folder is in an object store; the URI it
    went to, else None (a local run folder, no logs, or a store that refused them: logged)."""
    folder = Path(settings.log_dir)
    if not is_object_store(settings.run_path) or not folder.is_dir():
        return None
    target = join_location(settings.run_path, "logs")
    try:
        fs, path = object_store(target)
        fs.create_dir(path, recursive=True)
        pafs.copy_files(str(folder), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    except (OSError, ConfigError) as exc:
        log.warning("the logs in %s were not copied to %s: %s", folder, target, store_error(exc))
        return None
    return target

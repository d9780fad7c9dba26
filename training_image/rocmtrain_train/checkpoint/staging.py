"""Local folders in which a rank writes its part of a checkpoint before Ray Train uploads it.

Ray Train deletes such a folder once its upload has succeeded. A folder whose upload failed (the store was
lost), whose rank was killed, or whose report Ray Train skipped after a failure would stay in the temporary
directory for good: a MiniLM checkpoint is 260 MB, a 7B model's tens of GB. So each process stages below a root
of its own, named with the run and the process: a rank removes the roots of processes that have ended when it
starts (a restarted rank, in the same pod or on the same machine), and `rocmtrain run` removes its run's roots
when the run ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "rocmtrain-checkpoints-"

_roots: dict[str, Path] = {}  # run id -> this process's root


def new_folder(run_id: str) -> Path:
    """An empty folder, private to this user, for one checkpoint of run `run_id` by this process."""
    root = _roots.get(run_id)
    if root is None or not root.is_dir():
        root = _roots[run_id] = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{run_id}-{os.getpid()}-"))
    return Path(tempfile.mkdtemp(dir=root))


def _roots_in(parent: Path) -> list[tuple[Path, str, int]]:
    """(root, run id, pid) of this user's staging roots in `parent`."""
    found = []
    for root in parent.glob(f"{PREFIX}*"):
        named = root.name.removeprefix(PREFIX).rpartition("-")[0]  # "<run id>-<pid>", less mkdtemp's suffix
        run_id, _, pid = named.rpartition("-")
        if not run_id or not pid.isdigit() or root.is_symlink() or not root.is_dir():
            continue
        if root.stat().st_uid == os.getuid():
            found.append((root, run_id, int(pid)))
    return found


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_orphans(parent: Path | None = None) -> list[Path]:
    """Remove the staging roots of processes that no longer run; the roots removed."""
    gone = [root for root, _, pid in _roots_in(parent or Path(tempfile.gettempdir())) if not _running(pid)]
    for root in gone:
        shutil.rmtree(root, ignore_errors=True)
    return gone


def remove_run(run_id: str, parent: Path | None = None) -> list[Path]:
    """Remove every staging root of run `run_id` (its ranks have ended); the roots removed."""
    gone = [root for root, found, _ in _roots_in(parent or Path(tempfile.gettempdir())) if found == run_id]
    for root in gone:
        shutil.rmtree(root, ignore_errors=True)
    _roots.pop(run_id, None)
    return gone

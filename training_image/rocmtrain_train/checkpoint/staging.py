"""Local folders in which a rank writes its part of a checkpoint before Ray Train uploads it.

Ray Train deletes such a folder once its upload has succeeded. A folder whose upload failed (the store was
lost), whose rank was killed, or whose report Ray Train skipped after a failure would stay in the temporary
directory for good: a MiniLM checkpoint is 260 MB, a 7B model's tens of GB. So each process stages below a root
of its own, named with the run and the process (its PID namespace and pid): a rank removes the roots of
processes of its PID namespace that have ended when it starts (a restarted rank, in the same pod or on the same
machine), and `rocmtrain run` removes its run's roots when the run ends. Roots of other PID namespaces (another
container sharing the folder) are never judged by a pid this process cannot see.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "rocmtrain-checkpoints-"

_roots: dict[str, Path] = {}  # run id -> this process's root


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux
        return 0


def new_folder(run_id: str) -> Path:
    """An empty folder, private to this user, for one checkpoint of run `run_id` by this process."""
    root = _roots.get(run_id)
    if root is None or not root.is_dir():
        process = f"{_pid_namespace()}.{os.getpid()}"
        root = _roots[run_id] = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{run_id}-{process}-"))
    return Path(tempfile.mkdtemp(dir=root))


def _roots_in(parent: Path) -> list[tuple[Path, str, int | None]]:
    """(root, run id, pid) of this user's staging roots in `parent`; the pid None where it is of another PID
    namespace."""
    found = []
    for root in parent.glob(f"{PREFIX}*"):
        named = root.name.removeprefix(PREFIX).rpartition("-")[0]  # "<run id>-<ns>.<pid>", less mkdtemp's suffix
        run_id, _, process = named.rpartition("-")
        namespace, _, pid = process.partition(".")
        if not run_id or not namespace.isdigit() or not pid.isdigit():
            continue
        try:
            info = root.lstat()  # a link is never followed
        except OSError:  # removed meanwhile, by another rank's sweep
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            found.append((root, run_id, int(pid) if int(namespace) == _pid_namespace() else None))
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
    roots = _roots_in(parent or Path(tempfile.gettempdir()))
    gone = [root for root, _, pid in roots if pid is not None and not _running(pid)]
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

"""The upgrade fixtures (`recorded/`): what an earlier operator version wrote for a running, a queued and a
finished job, recorded by record.py.

Each case is one mapping: `applied` (the job as it was sent), `job` and `rayjob` (as the API server held them,
without the fields it sets on every object and without owner uids).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RECORDED = Path(__file__).resolve().parent / "recorded"
CASES = ("running", "queued", "succeeded")
# The namespace the fixtures were recorded in, and what stands for the job's uid (record.py's).
NAMESPACE = "rocmtrain-upgrade-fixtures"
UID = "RECORDED-JOB-UID"


def recorded(case: str, namespace: str = NAMESPACE, uid: str = UID) -> dict[str, Any]:
    """The recorded `case`, moved to `namespace` (every mention of the recording's namespace: the objects'
    namespace, and the checkpoint paths and the job's configuration that name it), its job's uid `uid`."""
    text = (RECORDED / f"{case}.yaml").read_text().replace(NAMESPACE, namespace).replace(UID, uid)
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded

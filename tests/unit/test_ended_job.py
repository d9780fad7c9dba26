"""What an ended job says (`rocmtrain.status.phase`, `rocmtrain.views.job`): its failure as a person reads it,
once, and no running progress, ETA or stall once it has ended."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rocmtrain.api.condition_reasons import ConditionType, Reason
from rocmtrain.api.timestamps import rfc3339
from rocmtrain.status.messages import CONDITION_MESSAGE_LIMIT, bounded
from rocmtrain.status.phase import OWNED_FIELDS, failure_message, status_patch
from rocmtrain.views.job import job_text
from unit.test_status import RUN, T0, observe, rayjob
from unit.test_tracebacks import STORAGE_ERROR, STORAGE_FAILURE

# KubeRay's message of the failed Ray job: Ray's header, then the log's tail, coloured, with Ray
# Train's worker lines before the driver's traceback (about 1,700 characters in all).
PROGRESS_LINES = "".join(
    f"\x1b[36m(RayTrainWorker pid=2211, ip=10.244.0.7)\x1b[0m {{'loss': {0.5 - n / 100}, 'epoch': {n / 10}}}\n"
    for n in range(12)
)
RAY_MESSAGE = (
    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
    + PROGRESS_LINES
    + STORAGE_FAILURE
)
READABLE = (
    f"{STORAGE_ERROR}\n"
    '  File "/code/transformers_torch_trainer_basic.py", line 98, in <module>\n'
    "    result = trainer.fit()\n"
    "(the Ray job's entrypoint exited with code 1)"
)
PROGRESS = {"epoch": 0.99, "step": 371, "totalSteps": 375, "percent": 99.0, "etaSeconds": 1.0}


def test_a_failed_ray_jobs_message_is_its_error_the_users_frame_and_the_exit_code():
    assert len(RAY_MESSAGE) > 1500
    assert failure_message(RAY_MESSAGE) == READABLE
    quoted = bounded(RAY_MESSAGE, CONDITION_MESSAGE_LIMIT)  # as an earlier status or an event wrote it
    assert "\\x1b[36m" in quoted and failure_message(quoted) == READABLE
    assert failure_message("the RayJob's deadline passed") == "the RayJob's deadline passed"
    assert failure_message("\x1b[31mJob entrypoint command failed with exit code 1\x1b[0m") == (
        "Job entrypoint command failed with exit code 1"
    ), "nothing quoted: Ray's words, without colours"


def failed(current: dict[str, Any], deployment: str = "Failed", job_status: str = "FAILED") -> dict[str, Any]:
    final = rayjob(deployment, job_status, **RUN, reason="AppFailed", message=RAY_MESSAGE, failed=1)
    return observe(current, final, now=T0 + dt.timedelta(seconds=2000))


def stalled_at_99() -> dict[str, Any]:
    """A running job whose last report, 1,000 s ago, said 99% and 1 s to go: Stalled."""
    running = {"phase": "Running", "progress": PROGRESS, "lastProgressTime": rfc3339(T0)}
    status = observe(running, rayjob("Running", "RUNNING", **RUN), now=T0 + dt.timedelta(seconds=1000))
    assert status["conditions"][-1]["type"] == ConditionType.STALLED and status["conditions"][-1]["status"] == "True"
    return {**running, **status}


def test_an_ended_job_keeps_how_far_it_got_without_an_eta():
    before = stalled_at_99()
    for end in (failed(before), failed(before, "Complete", "SUCCEEDED")):
        patch = status_patch(before, end)
        assert patch["progress"] == {**PROGRESS, "etaSeconds": None}, "a merge patch's null takes the ETA off"
        assert set(patch) - set(OWNED_FIELDS) == {"progress"}
        after = {**before, **patch, "progress": {k: v for k, v in PROGRESS.items() if k != "etaSeconds"}}
        assert "progress" not in status_patch(after, compute_status_again(after)), "written once"
    running = observe(stalled_at_99(), rayjob("Running", "RUNNING", **RUN), now=T0 + dt.timedelta(seconds=10))
    assert "progress" not in running, "a running job's progress is the endpoint's alone"


def compute_status_again(current: dict[str, Any]) -> dict[str, Any]:
    return observe(current, None, now=T0 + dt.timedelta(seconds=3000))


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_an_ended_job_is_stalled_only_as_kstatus_reads_a_failure():
    before = stalled_at_99()
    failure = conditions(failed(before))
    assert failure[ConditionType.FAILED]["message"] == READABLE
    assert failure[ConditionType.READY]["message"] == READABLE
    # kstatus (Flux) reads nothing but Stalled=True as Failed: the condition stays, the failure's, not NoProgress.
    stalled = failure[ConditionType.STALLED]
    assert (stalled["status"], stalled["reason"], stalled["message"]) == ("True", "AppFailed", READABLE)
    succeeded = conditions(failed(before, "Complete", "SUCCEEDED"))[ConditionType.STALLED]
    assert (succeeded["status"], succeeded["reason"]) == ("False", Reason.NOT_RUNNING)


def test_status_shows_the_failure_once_and_no_stall_or_eta():
    before = stalled_at_99()
    status = {**before, **failed(before)}  # the ETA as an operator before this one left it
    job = {"metadata": {"namespace": "ml", "name": "blog"}, "spec": {"resources": {"workers": 2}}, "status": status}
    text = job_text(job, [], [], {}, T0 + dt.timedelta(seconds=2100))
    assert text.count(STORAGE_ERROR) == 1 and text.count("exited with code 1") == 1, text
    lines = text.splitlines()
    assert lines[0] == f"ml/blog   Failed   {STORAGE_ERROR}"
    indent = " " * len("ml/blog   Failed   ")
    assert lines[1:4] == [
        f'{indent}  File "/code/transformers_torch_trainer_basic.py", line 98, in <module>',
        f"{indent}    result = trainer.fit()",
        f"{indent}(the Ray job's entrypoint exited with code 1)",
    ]
    progress = next(line for line in lines if line.startswith("progress"))
    assert progress.endswith("99%  step 371/375  epoch 0.99  (ended)"), progress
    rows = {line.split()[0]: line for line in lines if line.split()[:1] in (["Ready"], ["Failed"], ["Stalled"])}
    assert set(rows) == {"Ready", "Failed"} and all(row.endswith("as above") for row in rows.values()), rows
    running = {**job, "status": stalled_at_99()}
    shown = job_text(running, [], [], {}, T0 + dt.timedelta(seconds=1000))
    assert "ETA 1s" in shown and "Stalled" in shown, "a running job's ETA and stall still show"

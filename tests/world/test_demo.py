"""`make demo` following a job: what it prints of each status read, and when it gives up (no cluster).

The statuses are the operator's own, recorded from real runs (tests/operator/gitops/recorded/); the crash loop
is the one a clone under /tmp showed (a Ray head whose mounts failed, exit code 32).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from rocmtrain_testworld import demo

RECORDED = Path(__file__).resolve().parents[1] / "operator" / "gitops" / "recorded"
CRASH_LOOP = {
    "type": "RayPodsUnavailable",
    "status": "True",
    "reason": "CrashLoopBackOff",
    "message": "pod quickstart-abcde-head-x: container ray-head is in CrashLoopBackOff (last exit code 32)",
}
WARNING = {
    "metadata": {"uid": "event-1", "resourceVersion": "7"},
    "involvedObject": {"kind": "Pod", "name": "quickstart-abcde-head-x"},
    "reason": "BackOff",
    "message": "Back-off restarting failed container ray-head",
}


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())["status"]


def crash_looping(message: str = CRASH_LOOP["message"]) -> dict[str, Any]:
    status = copy.deepcopy(recorded("initializing"))
    status["conditions"].append({**CRASH_LOOP, "message": message})
    return status


def printed(lines: list[str]) -> list[str]:
    """The lines without their time prefix."""
    return [line.split("s  ", 1)[1] for line in lines]


def test_each_new_phase_condition_and_warning_is_printed_once() -> None:
    follower = demo.Follower(stall_seconds=60, began=100.0)
    first = printed(follower.observe(101.0, recorded("pending"), []))
    assert first[0].startswith("Pending")
    assert first[1:] == ["condition Ready=False RayJobCreated: waiting for KubeRay to start the RayJob"]
    assert follower.observe(102.0, recorded("pending"), []) == []  # nothing new, nothing printed

    looping = printed(follower.observe(110.0, crash_looping(), [WARNING]))
    assert looping[0].startswith("Initializing")
    assert "condition Ready=False Initializing: starting the Ray cluster (0/2 workers ready)" in looping
    assert f"condition RayPodsUnavailable=True CrashLoopBackOff: {CRASH_LOOP['message']}" in looping
    assert looping[-1] == ("warning Pod/quickstart-abcde-head-x BackOff: Back-off restarting failed container ray-head")
    assert follower.observe(111.0, crash_looping(), [WARNING]) == []  # the same event is not printed again

    running = printed(follower.observe(120.0, recorded("running"), [WARNING]))
    assert running[0] == "Running       step 120/285 (42%)  loss 0.412  eval accuracy 0.91  samples/s 1.52e+03"
    assert printed(follower.observe(130.0, recorded("succeeded"), []))[0].startswith("Succeeded")


def test_it_gives_up_after_the_stall_time_without_progress_and_says_why() -> None:
    follower = demo.Follower(stall_seconds=60, began=0.0)
    follower.observe(1.0, recorded("initializing"), [])
    follower.observe(5.0, crash_looping(), [WARNING])  # a new condition: progress at 5 s
    assert follower.stalled(64.0) is None
    # A message that alone changes (the pod's restarts, say) is printed but is no progress.
    assert printed(follower.observe(30.0, crash_looping("restarted 3 times"), [])) == [
        "condition RayPodsUnavailable=True CrashLoopBackOff: restarted 3 times"
    ]
    why = follower.stalled(65.0)
    assert why is not None
    assert why.startswith(f"no progress for 60s ({demo.STALL_ENV}=60): Initializing")
    assert "last condition RayPodsUnavailable=True CrashLoopBackOff: restarted 3 times" in why
    assert "last warning Pod/quickstart-abcde-head-x BackOff" in why


def test_progress_keeps_it_following() -> None:
    follower = demo.Follower(stall_seconds=60, began=0.0)
    follower.observe(1.0, recorded("running"), [])
    later = copy.deepcopy(recorded("running"))
    later["progress"]["step"] = 121
    follower.observe(50.0, later, [])
    assert follower.stalled(100.0) is None
    assert follower.stalled(110.0) is not None


def test_the_stall_time_comes_from_the_environment_with_a_default() -> None:
    assert demo.stall_seconds({}) == demo.STALL_SECONDS == 300
    assert demo.stall_seconds({demo.STALL_ENV: "45"}) == 45


def test_a_condition_without_a_message_is_printed_without_one() -> None:
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "reason": "Running"}]}
    assert printed(demo.Follower(stall_seconds=60, began=0.0).observe(1.0, status, []))[1:] == [
        "condition Ready=True Running"
    ]

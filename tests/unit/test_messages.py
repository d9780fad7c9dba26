"""Bounds on what the operator writes into status and events: `rocmtrain.status.messages` (pure)."""

from __future__ import annotations

import pytest

from rocmtrain.api.condition_reasons import ConditionType
from rocmtrain.status.messages import CONDITION_MESSAGE_LIMIT, bounded
from unit.test_status import RUN, rayjob, run


@pytest.mark.parametrize(
    "text",
    ["", "plain words", "x" * 1024, "\x1b[31m" * 400, "é" * 2000 + "\x00", "line\n\ttab", "a\x7fb\x85c" * 300],
)
@pytest.mark.parametrize("limit", [1, 16, 1024])
def test_bounded_text_is_never_longer_than_its_limit_and_holds_no_control_characters(text: str, limit: int):
    out = bounded(text, limit)
    assert len(out) <= limit
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0 for c in out)


def test_short_text_is_kept_and_control_characters_are_shown_escaped():
    assert bounded("trial_1\n\tok", 64) == "trial_1\n\tok"
    assert bounded("trial\x1b[2J_1", 64) == "trial\\x1b[2J_1"
    assert bounded("abcdef", 4) == "abc…"


def test_a_failure_message_of_any_size_leaves_the_status_writable():
    # The driver's error line comes first in the Failed condition and again in Ray's own message.
    line = "rocmtrain driver error: " + "bad value " * 2000
    ray_message = f"Job entrypoint command failed with exit code 1, last available logs:\n{line}\n"
    statuses = run([rayjob("Running", "RUNNING", **RUN), rayjob("Failed", "FAILED", **RUN, message=ray_message)])
    final = statuses[-1]
    assert final["phase"] == "Failed"
    for condition in final["conditions"]:
        assert len(condition["message"]) <= CONDITION_MESSAGE_LIMIT
    failed = next(c for c in final["conditions"] if c["type"] == ConditionType.FAILED)
    assert failed["message"].startswith("bad value bad value") and failed["message"].endswith("…")

"""bench/lm_loss_memory.py in its smoke mode: transformers' loss and ours, each in a process of its own, measured and
compared."""

from __future__ import annotations

import lm_loss_memory


def test_the_bench_s_smoke_mode_measures_both_arms_and_they_agree():
    report = lm_loss_memory.smoke()
    assert [a["arm"] for a in report["arms"]] == list(lm_loss_memory.ARMS)
    assert report["agree"], report["differences"]
    assert all(a["peak_bytes"] > 0 for a in report["arms"])

"""The language-model bench (bench/lm_throughput.py) runs: its smoke mode trains every arm, TRL's and ours at each
attention layout, for a few steps on a tiny model, so that a change in the code under it breaks the suite, not the
next benchmark."""

from __future__ import annotations

import math

import pytest
import ray

import lm_throughput
from lm_throughput import ARMS, LmMeasured, LmWorkload, problems, ratios


def measured(real: int, computed: int, *, steps: int = 4, loss: float = 2.0) -> LmMeasured:
    return LmMeasured(
        wall_seconds=10.0,
        eval_seconds=1.0,
        loop_seconds=5.0,
        real_tokens=real,
        computed_tokens=computed,
        steps=steps,
        eval_loss=loss,
        peak_rss_bytes=2**30,
        rank_cpu_seconds=8.0,
    )


def test_the_checks_name_each_run_that_went_wrong():
    work = LmWorkload(
        model="m",
        data="d",
        ranks=2,
        batch_size=4,
        epochs=1,
        learning_rate=1e-3,
        max_length=64,
        records=8,
        data_tokens=200,
    )
    assert work.evened_out == 4 * 64  # one batch of records of at most max_length, from the other rank
    results = {
        "ours-varlen": [measured(200, 200), measured(200, 208)],  # the second computed on padding
        "ours-padded": [measured(200, 260, steps=0)],
        "trl-padded": [measured(200 + work.evened_out, 300), measured(201 + work.evened_out, 300, loss=math.nan)],
        "ours-packing": [measured(199, 210)],
    }
    assert problems(results, work) == [
        "ours-varlen run 2: flat, yet computed on 8 padding tokens",
        "ours-padded run 1: trained 0 steps",
        "trl-padded run 2: eval loss nan",
        f"trl-padded run 2: trained {201 + work.evened_out} real tokens, the data has 200",
        "ours-packing run 1: trained 199 real tokens, the data has 200",
    ]


@pytest.mark.ray
def test_smoke_mode_trains_every_arm_at_its_layout_on_the_datas_tokens(tmp_path):
    assert not ray.is_initialized()
    report = lm_throughput.smoke(tmp_path)

    assert not ray.is_initialized()  # the bench started a Ray of its own for its arms, and stopped it
    assert report.problems == []
    assert list(report.results) == list(ARMS)
    for arm, runs in report.results.items():
        (run,) = runs
        assert run.steps > 0 and math.isfinite(run.eval_loss), arm
        assert run.real_tokens == report.work.data_tokens, arm  # one rank: nothing evened out
        if ARMS[arm].layout == "padded":
            assert run.computed_tokens > run.real_tokens, arm
        if ARMS[arm].layout == "flat":
            assert run.computed_tokens == run.real_tokens, arm
    same = ratios(report.results, same_layout=True)
    assert {key.split(" ")[0] for key in same} == {
        "ours-varlen/trl-padding-free",
        "ours-padded/trl-padded",
        "ours-packing/trl-packing",
    }

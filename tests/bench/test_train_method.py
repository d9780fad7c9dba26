"""The training benchmark's method (pure: no Ray, no model): which seeds the arms train with, and the parity table."""

from __future__ import annotations

import train_throughput as bench


def measured(accuracy: float, seconds: float) -> bench.Measured:
    return bench.Measured(
        wall_seconds=seconds + 1,
        eval_seconds=1,
        loop_seconds=seconds / 2,
        samples=100,
        real_tokens=1000,
        padded_tokens=1250,
        eval_accuracy=accuracy,
    )


def test_every_case_trains_with_the_same_seeds_and_each_run_with_a_new_one():
    """Our loop is deterministic for a seed: with one seed for all runs, its median is one draw of a short run's
    luck (0.385 twice at 384 samples) set against the Trainer's several draws."""
    cases = tuple(bench.case(arm, n) for n in (384, 768) for arm in ("stock", "ours"))
    calls: list[tuple[str, int]] = []

    def measure(name: str, seed: int) -> bench.Measured:
        calls.append((name, seed))
        return measured(accuracy=seed / 100, seconds=10)

    results = bench.interleaved(cases, 3, measure, first_seed=42, log=lambda line: None)
    assert [name for name, _ in calls] == list(cases) * 3  # in turns: a slow spell hits every case alike
    for name in cases:
        assert [seed for case, seed in calls if case == name] == [42, 43, 44]
        assert [m.eval_accuracy for m in results[name]] == [0.42, 0.43, 0.44]


def test_the_parity_table_sets_ours_against_each_arm_at_each_size():
    runs = {
        bench.case("stock", 384): [measured(0.40, 20), measured(0.60, 20), measured(0.45, 30)],
        bench.case("ours", 384): [measured(0.39, 10), measured(0.50, 10), measured(0.55, 10)],
        bench.case("stock", 768): [measured(0.60, 40)] * 3,
        bench.case("ours", 768): [measured(0.70, 50)] * 3,
    }
    summary = {name: bench.medians(found) for name, found in runs.items()}
    rows = bench.parity(summary, ("stock", "ours"), [384, 768])
    assert list(rows) == ["ours vs stock, 384 samples", "ours vs stock, 768 samples"]
    small, large = rows.values()
    assert (small["their_accuracy"], small["our_accuracy"]) == (0.45, 0.50)
    assert round(small["accuracy_difference"], 6) == 0.05
    assert small["samples_per_second_ratio"] == 2.0 and small["loop_samples_per_second_ratio"] == 2.0
    assert round(large["accuracy_difference"], 6) == 0.1 and large["samples_per_second_ratio"] == 0.8
    assert bench.parity(summary, ("stock",), [384]) == {}  # nothing to set ours against
    assert "ours vs stock, 768 samples" in bench.table(rows, bench.PARITY_COLUMNS)

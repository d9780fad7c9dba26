"""The scaling study's report (`rocmtrain scale`): per world size, train and eval seconds, throughput,
speed-up and efficiency against the smallest size (one worker when measured), and accuracy;
as a Markdown table and a PNG chart (matplotlib, the `plot` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DPI = 110


@dataclass(frozen=True)
class SizeResult:
    """What one run of the study measured."""

    workers: int
    train_seconds: float
    eval_seconds: float | None = None
    samples_per_second: float | None = None
    eval_accuracy: float | None = None

    @classmethod
    def from_summary(cls, workers: int, summary: Mapping[str, Any]) -> SizeResult:
        """From `rocmtrain run`'s summary (snake case) or a job's `status.metrics` (camel case)."""

        def get(snake: str, camel: str) -> Any:
            return summary.get(snake, summary.get(camel))

        return cls(
            workers=workers,
            train_seconds=float(get("train_seconds", "trainSeconds")),
            eval_seconds=get("eval_seconds", "evalSeconds"),
            samples_per_second=get("samples_per_second", "samplesPerSecond"),
            eval_accuracy=get("eval_accuracy", "evalAccuracy"),
        )


@dataclass(frozen=True)
class ScalingRow:
    """One size with its speed-up and efficiency against the baseline."""

    result: SizeResult
    speedup: float
    efficiency: float


def scaling_rows(results: Sequence[SizeResult]) -> list[ScalingRow]:
    """The rows in order of size; the baseline is the smallest size measured."""
    ordered = sorted(results, key=lambda r: r.workers)
    base = ordered[0]
    rows = []
    for result in ordered:
        speedup = base.train_seconds / result.train_seconds if result.train_seconds else 0.0
        rows.append(ScalingRow(result, speedup, speedup * base.workers / result.workers))
    return rows


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: Sequence[ScalingRow], title: str) -> str:
    """The rows as a Markdown table under a one-line description."""
    base = rows[0].result.workers
    against = "1 worker" if base == 1 else f"{base} workers (the smallest size measured)"
    lines = [
        f"{title}: speed-up and efficiency of the training time against {against}.",
        "",
        "| workers | train s | eval s | samples/s | speed-up | efficiency | eval accuracy |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.result
        lines.append(
            f"| {r.workers} | {r.train_seconds:.1f} | {_cell(r.eval_seconds, '.1f')} | "
            f"{_cell(r.samples_per_second, '.1f')} | {row.speedup:.2f}x | {row.efficiency:.0%} | "
            f"{_cell(r.eval_accuracy, '.3f')} |"
        )
    return "\n".join(lines) + "\n"


def as_json(rows: Sequence[ScalingRow]) -> list[dict[str, Any]]:
    return [{**asdict(row.result), "speedup": row.speedup, "efficiency": row.efficiency} for row in rows]


def chart(rows: Sequence[ScalingRow], path: Path, title: str) -> None:
    """Train and eval seconds per size, and the speed-up against ideal, with accuracy at each point."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    workers = [row.result.workers for row in rows]
    labels = [str(w) for w in workers]
    base = workers[0]
    figure, (times, speedup) = plt.subplots(1, 2, figsize=(10, 4), dpi=DPI)
    train = [row.result.train_seconds for row in rows]
    evaluation = [row.result.eval_seconds or 0.0 for row in rows]
    times.bar(labels, train, label="train")
    times.bar(labels, evaluation, bottom=train, label="eval")
    for i, (t, e) in enumerate(zip(train, evaluation, strict=True)):
        times.annotate(f"{t:.1f} s", (i, t / 2), ha="center", va="center", color="white", fontsize="small")
        if e:
            times.annotate(f"{e:.1f} s", (i, t + e / 2), ha="center", va="center", fontsize="small")
    times.set(title="Time per run", xlabel="workers", ylabel="seconds")
    times.legend(fontsize="small")
    speedup.plot(workers, [w / base for w in workers], "--", color="grey", label="ideal")
    speedup.plot(workers, [row.speedup for row in rows], "o-", label="measured")
    for row in rows:
        accuracy = row.result.eval_accuracy
        note = f"{row.efficiency:.0%} eff." + (f"\nacc {accuracy:.3f}" if accuracy is not None else "")
        speedup.annotate(
            note, (row.result.workers, row.speedup), textcoords="offset points", xytext=(6, -22), fontsize="small"
        )
    speedup.set(title=f"Speed-up of training time (vs {base})", xlabel="workers", ylabel="speed-up", xticks=workers)
    speedup.set_ylim(0, max(max(workers) / base, max(row.speedup for row in rows)) * 1.15)
    speedup.grid(alpha=0.3)
    speedup.legend(fontsize="small", loc="upper left")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)

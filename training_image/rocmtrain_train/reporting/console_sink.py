"""The console sink: a live progress bar (or one line per report) and the final summary table."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TextIO

from tqdm import tqdm

from rocmtrain.api.models import ProgressReport, metric_rows


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(report: ProgressReport) -> str:
    """The final metrics (of a search: the best trial's) as a two-column table (rows without a value are left out)."""
    p = report.progress
    rows = [("trials" if report.tuning else "steps", f"{_fmt(p.step, 'd')}/{_fmt(p.total_steps, 'd')}")]
    values = ((row, getattr(report.metrics, row.name)) for row in metric_rows())
    rows += [(row.heading, row.text(value)) for row, value in values if value is not None]
    shown = {label for label, _ in rows}
    rows += [  # a job's own code's, but for one a row above shows (Hugging Face's train_loss: the train loss)
        (metric.name, f"{metric.value:g}")
        for metric in report.metrics.custom or []
        if metric.name.replace("_", " ") not in shown
    ]
    width = max(len(label) for label, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    return "\n".join([rule, *(f"{label:<{width}}  {value}" for label, value in rows), rule])


# The bar: tqdm's own remaining-time guess is left out for the driver's ETA, which is in the postfix.
BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


def wants_progress_bar(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """A live bar on an interactive terminal; plain lines in a pipe, a file, CI (`CI` set) or a dumb terminal."""
    ci = environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return stream.isatty() and not ci and environ.get("TERM") != "dumb"


class ConsoleSink:
    """A live progress bar on a terminal (one line per report elsewhere) and a summary table at the end.

    The bar shows the loss, the learning rate, the latest accuracy (a language model's: perplexity and exact
    match), throughput and the ETA."""

    def __init__(
        self, stream: TextIO | None = None, *, progress_bar: bool | None = None, language_model: bool = False
    ) -> None:
        self._stream = stream or sys.stderr
        self._language_model = language_model  # perplexity and exact match in place of accuracy
        self._bar_wanted = wants_progress_bar(self._stream) if progress_bar is None else progress_bar
        self._bar: tqdm | None = None
        self._last_line = ""

    @property
    def draws_bar(self) -> bool:
        """Whether it draws a live bar (rather than a line per report)."""
        return self._bar_wanted

    def emit(self, report: ProgressReport) -> None:
        if report.tuning is not None:
            self._search_line(report)
            return
        p, m = report.progress, report.metrics
        quality = (
            {"ppl": _fmt(m.eval_perplexity, ".3g"), "em": _fmt(m.eval_exact_match, ".3f")}
            if self._language_model
            else {"acc": _fmt(m.eval_accuracy, ".3f")}
        )
        status = {
            "loss": _fmt(m.train_loss, ".4f"),
            "lr": _fmt(m.learning_rate, ".2e"),
            **quality,
            "samples/s": _fmt(m.samples_per_second, ".1f"),
            "eta": "-" if p.eta_seconds is None else tqdm.format_interval(p.eta_seconds),
        }
        if self._bar_wanted:
            if self._bar is None:
                self._bar = tqdm(
                    total=p.total_steps, desc="training", unit="step", file=self._stream, bar_format=BAR_FORMAT
                )
            self._bar.update((p.step or 0) - self._bar.n)
            self._bar.set_postfix(status, refresh=True)
        elif not report.final:
            fields = " ".join(f"{k}={v}" for k, v in status.items())
            steps = f"{_fmt(p.step, 'd')}/{_fmt(p.total_steps, 'd')}"
            print(f"step {steps} epoch {_fmt(p.epoch, '.2f')} {fields}", file=self._stream, flush=True)
        if report.final:
            self.close()
            print(summary_table(report), file=self._stream, flush=True)

    def _search_line(self, report: ProgressReport) -> None:
        """One line per change of a search (trials are too coarse for a progress bar), the table at the end."""
        t = report.tuning
        assert t is not None
        best = f"best {t.metric}={t.best_metric:.4f} (trial {t.best_trial_id})" if t.best_metric is not None else ""
        counts = f"{t.trials_done}/{t.trials_total} done, {t.trials_running} running, {t.trials_pending} pending"
        if (line := f"trials {counts} {best}".rstrip()) != self._last_line:
            self._last_line = line
            print(line, file=self._stream, flush=True)
        if report.final:
            for row in t.trials:
                config = " ".join(f"{k}={v:.3g}" for k, v in row.config.dump().items())
                metric = _fmt(row.metric, ".4f")
                print(
                    f"  {row.id} {row.state:<9} {t.metric}={metric} evaluations={row.iterations} {config}",
                    file=self._stream,
                )
            print(summary_table(report), file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

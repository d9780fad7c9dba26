"""What a local run prints: a live tqdm bar (loss, accuracy, ETA) on a real terminal, plain lines in a pipe or CI.

The terminal is a real pseudo-terminal (os.openpty), so `isatty()` is the operating system's answer.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rocmtrain.api.models import Metrics, Progress, ProgressReport
from rocmtrain.api.models.metrics import CustomMetric
from rocmtrain_train.driver import own_code
from rocmtrain_train.reporting.console_sink import ConsoleSink

TOTAL = 4


def reports() -> Iterator[ProgressReport]:
    for step in range(1, TOTAL + 1):
        final = step == TOTAL
        yield ProgressReport(
            progress=Progress(
                step=step, total_steps=TOTAL, epoch=step / TOTAL, eta_seconds=0.0 if final else 10.0 * (TOTAL - step)
            ),
            metrics=Metrics(train_loss=1.0 / step, eval_accuracy=0.5 + 0.1 * step, samples_per_second=100.0),
            final=final,
        )


def on_a_terminal() -> str:
    """Everything the sink writes to a pseudo-terminal, as the terminal receives it."""
    leader, follower = os.openpty()
    with os.fdopen(follower, "w", encoding="utf-8", closefd=True) as terminal:
        assert terminal.isatty()
        sink = ConsoleSink(terminal)
        for report in reports():
            sink.emit(report)
        sink.close()
        terminal.flush()
        received = b""
        os.set_blocking(leader, False)
        while True:
            try:
                chunk = os.read(leader, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            received += chunk
    os.close(leader)
    return received.decode("utf-8", errors="replace")


@pytest.fixture
def interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


def test_a_terminal_gets_one_live_bar_with_loss_accuracy_and_eta(interactive: None):
    screen = on_a_terminal()
    assert "\r" in screen  # redrawn in place, not a line per report
    assert "training  50%|" in screen and "2/4" in screen
    assert "loss=0.5000" in screen and "acc=0.700" in screen and "eta=00:20" in screen
    assert "step 2/4" not in screen  # no plain progress lines
    assert "train loss" in screen  # the summary table at the end


def test_a_pipe_gets_plain_lines(interactive: None):
    stream = io.StringIO()
    sink = ConsoleSink(stream)
    for report in reports():
        sink.emit(report)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "step 1/4 epoch 0.25 loss=1.0000 lr=- acc=0.600 samples/s=100.0 eta=00:30"
    assert "\r" not in stream.getvalue() and len([line for line in lines if line.startswith("step ")]) == TOTAL - 1


def test_ci_gets_plain_lines_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CI", "true")
    screen = on_a_terminal()
    assert "step 1/4 epoch 0.25" in screen and "%|" not in screen


def test_a_language_model_shows_perplexity_and_exact_match_in_place_of_accuracy():
    stream = io.StringIO()
    sink = ConsoleSink(stream, language_model=True)
    sink.emit(
        ProgressReport(
            progress=Progress(step=1, total_steps=TOTAL, epoch=0.25, eta_seconds=30.0),
            metrics=Metrics(train_loss=2.0, eval_perplexity=7.389, eval_exact_match=0.25, samples_per_second=10.0),
        )
    )
    line = stream.getvalue().splitlines()[0]
    assert line == "step 1/4 epoch 0.25 loss=2.0000 lr=- ppl=7.39 em=0.250 samples/s=10.0 eta=00:30"


def test_a_report_before_the_first_step_shows_dashes_and_a_reported_loss_is_one_row():
    """A Hugging Face Trainer's first report (it began, no step yet), then its last: `train_loss` among its custom
    metrics is the train loss a row shows already."""
    stream = io.StringIO()
    sink = ConsoleSink(stream)
    sink.emit(ProgressReport(progress=Progress(total_steps=135), metrics=Metrics()))
    final = Metrics(
        train_loss=1.0243, custom=[CustomMetric(name="train_loss", value=1.5), CustomMetric(name="x", value=2)]
    )
    sink.emit(ProgressReport(progress=Progress(step=135, total_steps=135), metrics=final, final=True))
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("step -/135 epoch - loss=-")
    assert [line.split()[0] for line in lines[2:-1]] == ["steps", "train", "x"]


def test_the_codes_own_tqdm_bars_are_off_while_the_run_draws_its_bar():
    """`rocmtrain run` of a job's own code: one bar on a terminal. tqdm (4.66 and later) reads TQDM_DISABLE."""
    assert own_code.own_bars_off(True, {}) == {"TQDM_DISABLE": "1"}
    assert own_code.own_bars_off(False, {}) == {} and own_code.own_bars_off(True, {"TQDM_DISABLE": "0"}) == {}
    probe = "from tqdm import tqdm; print(tqdm(range(2)).disable)"
    env = {**os.environ, **own_code.own_bars_off(True, {})}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"

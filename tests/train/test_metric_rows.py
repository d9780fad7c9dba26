"""One metric display table (`rocmtrain.api.models.metrics.metric_rows`), read from the `Metrics` model: every
field has a row, and `rocmtrain status` and the run summary show each metric the same way."""

from __future__ import annotations

import datetime as dt
import re
import typing

from rocmtrain.api.models import CUSTOM_METRICS, Metrics, Progress, ProgressReport, metric_rows
from rocmtrain.views.job import METRICS_WIDTH, job_text
from rocmtrain_train.reporting.console_sink import summary_table

# Every field of its own (`custom` is the list of the others).
FIELDS = {name: info for name, info in Metrics.model_fields.items() if name != CUSTOM_METRICS}


def every_metric() -> Metrics:
    """A value for every field, inside every field's bounds."""
    ints = [name for name, info in FIELDS.items() if int in typing.get_args(info.annotation)]
    at_least_one = {"eval_perplexity"}
    return Metrics(**{name: 123_456_789 if name in ints else 1.5 if name in at_least_one else 0.5 for name in FIELDS})


def test_every_metrics_field_has_one_row_in_field_order():
    rows = metric_rows()
    assert [row.name for row in rows] == list(FIELDS)
    assert [row.key for row in rows] == [info.alias for info in FIELDS.values()]
    assert len({row.heading for row in rows}) == len(rows)  # no two rows read alike
    assert all(row.description == Metrics.model_fields[row.name].description for row in rows)
    shown = {row.name: row.text(getattr(every_metric(), row.name)) for row in rows}
    assert shown["gpu_memory_peak_bytes"] == "123,456,789" and shown["data_wait_fraction"] == "50.0%"
    assert {row.heading for row in rows} >= {"GPU utilisation (%)", "GPU memory peak (bytes)", "samples/s"}


def test_status_and_the_run_summary_show_a_codes_own_metrics_too():
    metrics = Metrics(
        train_loss=0.5, custom=[{"name": "grad_norm", "value": 1.25}, {"name": "eval/bleu", "value": 31.0}]
    )
    job = {"metadata": {"namespace": "ml", "name": "own"}, "status": {"phase": "Running", "metrics": metrics.dump()}}
    status = job_text(job, [], [], {}, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    summary = summary_table(ProgressReport(progress=Progress(step=4, total_steps=4), metrics=metrics, final=True))
    for text in (status, summary):
        assert re.search(r"grad_norm +1\.25", text) and re.search(r"eval/bleu +31\b", text), text


def test_status_and_the_run_summary_show_every_metric_alike():
    metrics = every_metric()
    job = {"metadata": {"namespace": "ml", "name": "bert"}, "status": {"phase": "Succeeded", "metrics": metrics.dump()}}
    status = job_text(job, [], [], {}, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    summary = summary_table(ProgressReport(progress=Progress(step=4, total_steps=4), metrics=metrics, final=True))
    for row in metric_rows():
        value = row.text(getattr(metrics, row.name))
        assert f"{row.heading} {value}" in status
        assert re.search(rf"^{re.escape(row.heading)} +{re.escape(value)}$", summary, re.MULTILINE), row.heading
    section = status[status.index("metrics    ") :].split("\n\n", 1)[0].splitlines()
    assert len(section) > 1 and all(len(line) <= METRICS_WIDTH for line in section)

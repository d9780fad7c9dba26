"""The operator's own metrics (`rocmtrain.metrics.prometheus`): the job collector, where a scrape runs, the
reconcile error count and the event loop's lag."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.metrics import prometheus


def _view(name: str, phase: str | None, gpus: int) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"resources": {"workers": 1, "gpusPerWorker": gpus}},
        "status": {"phase": phase} if phase else {},
        "gpus": gpus,
    }


def test_jobs_collector_counts_phases_and_gpus_of_unfinished_jobs():
    views = [_view("a", "Running", 16), _view("b", "Running", 8), _view("c", "Succeeded", 8), _view("d", None, 4)]
    prometheus.JOBS.source = lambda: views
    try:
        text = generate_latest(prometheus.REGISTRY).decode()
    finally:
        prometheus.JOBS.source = tuple
    assert 'rocmtrain_jobs{phase="Running"} 2.0' in text
    assert 'rocmtrain_jobs{phase="Succeeded"} 1.0' in text
    assert 'rocmtrain_jobs{phase="Unknown"} 1.0' in text
    assert 'rocmtrain_gpus_requested{phase="Running"} 24.0' in text
    assert 'rocmtrain_gpus_requested{phase="Succeeded"}' not in text
    assert 'rocmtrain_job_phase{job_name="c",namespace="ns",phase="Succeeded"} 1.0' in text
    assert 'rocmtrain_job_gpus{job_name="a",namespace="ns"} 16.0' in text
    assert "rocmtrain_job_series_dropped 0.0" in text


async def test_a_scrape_reads_the_job_index_on_the_loop_and_collects_in_a_thread():
    """The index is iterated where the event loop runs (it alone changes it), the series are built elsewhere."""
    import threading

    from prometheus_client.registry import Collector

    loop_thread, read_in, collected_in = threading.current_thread(), [], []

    def source() -> list[dict]:
        read_in.append(threading.current_thread())
        return [_view("a", "Running", 16)]

    class Where(Collector):
        def collect(self):
            collected_in.append(threading.current_thread())
            return iter(())

    where = Where()
    prometheus.REGISTRY.register(where)
    prometheus.JOBS.source = source
    try:
        text = (await prometheus.exposition()).decode()
    finally:
        prometheus.JOBS.source = tuple
        prometheus.REGISTRY.unregister(where)
    assert 'rocmtrain_job_gpus{job_name="a",namespace="ns"} 16.0' in text
    assert read_in == [loop_thread] and collected_in and loop_thread not in collected_in


def test_observe_counts_unexpected_errors_only():
    class Waiting(Exception):
        pass

    def errors() -> float:
        return prometheus.REGISTRY.get_sample_value("rocmtrain_reconcile_errors_total", {"handler": "unit"}) or 0.0

    before = errors()
    with pytest.raises(Waiting), prometheus.observe("unit", expected=(Waiting,)):
        raise Waiting
    with pytest.raises(RuntimeError), prometheus.observe("unit", expected=(Waiting,)):
        raise RuntimeError
    assert errors() == before + 1


async def test_the_loop_lag_probe_sees_how_long_other_work_held_the_loop():
    from types import SimpleNamespace

    from rocmtrain.controller.runtime import probe_loop_lag

    interval = 0.1
    runtime = SimpleNamespace(config=OperatorConfig.from_env({"ROCMTRAIN_LOOP_LAG_PROBE_MS": "100"}))

    def lags(le: str = "+Inf") -> float:
        return prometheus.REGISTRY.get_sample_value("rocmtrain_event_loop_lag_seconds_bucket", {"le": le}) or 0.0

    before = {le: lags(le) for le in ("0.05", "0.25", "+Inf")}
    probe = asyncio.create_task(probe_loop_lag(runtime))  # type: ignore[arg-type] - it reads the config alone
    try:
        await asyncio.sleep(1.5 * interval)  # it samples once, and its next timer is due soon
        time.sleep(2 * interval)  # holding the loop is the point
        await asyncio.sleep(0.01)
    finally:
        probe.cancel()
    seen = {le: lags(le) - before[le] for le in before}
    assert seen["+Inf"] >= 2 and seen["0.05"] <= seen["+Inf"] - 1, "one sample saw the loop held for over 50 ms"
    assert seen["0.25"] == seen["+Inf"], "and none saw longer than it was held"

"""Resource sampling: measured where measurable, omitted (never made up) where not."""

from __future__ import annotations

import json
import threading
import time

import torch

from rocmtrain_train.loop.resource_sampling import ResourceSampler, UtilizationSampler, rocm_smi_utilization


def test_cpu_use_is_measured_and_gpu_fields_are_omitted_without_a_gpu():
    sampler = ResourceSampler(torch.device("cpu"))
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # keep one core busy
        pass
    sample = sampler.sample()
    assert 50 <= sample.cpu_utilization_percent <= 100 * (torch.get_num_threads() + 2)
    assert sample.gpu_memory_peak_bytes is None and sample.gpu_utilization_percent is None
    assert sample.gpu_memory_reserved_bytes is None


class FakeGpu:
    """What is faked: the AMD GPU. Its activity readings, as amdsmi would return them, come from a list."""

    def __init__(self, readings: list[float | None]) -> None:
        self.readings = readings
        self.threads: set[str] = set()
        self.closed = False
        self.done = threading.Event()

    def read(self) -> float | None:
        self.threads.add(threading.current_thread().name)
        if not self.readings:
            self.done.set()
            return None
        return self.readings.pop(0)

    def close(self) -> None:
        self.closed = True


def test_utilisation_is_averaged_over_the_interval_on_a_background_thread():
    gpu = FakeGpu([10.0, 30.0, None, 50.0])
    sampler = UtilizationSampler(gpu.read, period_s=0.001, close=gpu.close)
    assert gpu.done.wait(5)
    assert sampler.take() == 30.0  # the mean of every reading since the start, not the last one
    assert sampler.take() is None  # nothing read since
    sampler.stop()
    assert gpu.closed and gpu.threads == {"rocmtrain-gpu-sampler"}


def test_taking_a_sample_never_waits_for_the_gpu_tool():
    slow = threading.Event()

    def read() -> float:
        slow.wait(5)  # a hung rocm-smi
        return 99.0

    sampler = ResourceSampler(torch.device("cpu"), UtilizationSampler(read, period_s=0.001))
    started = time.perf_counter()
    assert sampler.sample().gpu_utilization_percent is None
    assert time.perf_counter() - started < 0.5
    slow.set()
    sampler.close()


def test_gpu_use_from_rocm_smi_output():
    """What is faked: the AMD GPUs. The input has the shape of `rocm-smi --showuse --showbus --json`."""
    output = json.dumps(
        {
            "card0": {"GPU use (%)": "12", "PCI Bus": "0000:C1:00.0"},
            "card1": {"GPU use (%)": "97", "PCI Bus": "0000:C6:00.0"},
            "system": {"Driver version": "6.10.5"},
        }
    )
    assert rocm_smi_utilization(output, "0000:c6:00") == 97.0
    assert rocm_smi_utilization(output, "0000:c1:00") == 12.0
    assert rocm_smi_utilization(output, "0000:0a:00") is None
    assert rocm_smi_utilization("not json", "0000:c1:00") is None

"""Resource sampling: measured where measurable, omitted (never made up) where not."""

from __future__ import annotations

import json
import time

import torch

from rocmtrain_train.metrics import ResourceSampler, rocm_smi_utilization


def test_cpu_use_is_measured_and_gpu_fields_are_omitted_without_a_gpu():
    sampler = ResourceSampler(torch.device("cpu"))
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # keep one core busy
        pass
    sample = sampler.sample()
    assert 50 <= sample.cpu_utilization_percent <= 100 * (torch.get_num_threads() + 2)
    assert sample.gpu_memory_peak_bytes is None and sample.gpu_utilization_percent is None


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

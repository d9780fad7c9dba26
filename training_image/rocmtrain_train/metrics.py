"""Resource sampling on a worker: CPU use of the process, GPU memory peak, GPU utilisation.

GPU utilisation comes from amdsmi (the ROCm SMI Python library) or the `rocm-smi` tool, matched to
this worker's GPU by PCI bus id; where neither is present the value is None and the field is omitted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass

import torch


def _bus_id(device: torch.device) -> str | None:
    props = torch.cuda.get_device_properties(device)
    domain, bus, dev = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    if bus is None:
        return None
    return f"{domain or 0:04x}:{bus:02x}:{dev or 0:02x}"


def _amdsmi_utilization(bus_id: str) -> float | None:
    try:
        import amdsmi
    except ImportError:
        return None
    try:
        amdsmi.amdsmi_init()
        try:
            for handle in amdsmi.amdsmi_get_processor_handles():
                if amdsmi.amdsmi_get_gpu_device_bdf(handle).lower().startswith(bus_id):
                    return float(amdsmi.amdsmi_get_gpu_activity(handle)["gfx_activity"])
        finally:
            amdsmi.amdsmi_shut_down()
    except (amdsmi.AmdSmiException, KeyError, TypeError, ValueError):
        return None
    return None


def rocm_smi_utilization(output: str, bus_id: str) -> float | None:
    """GPU use in percent of the card with `bus_id`, from `rocm-smi --showuse --showbus --json` output."""
    try:
        cards = json.loads(output)
    except ValueError:
        return None
    for card in cards.values() if isinstance(cards, dict) else ():
        if isinstance(card, dict) and str(card.get("PCI Bus", "")).lower().startswith(bus_id):
            try:
                return float(card["GPU use (%)"])
            except (KeyError, ValueError):
                return None
    return None


def _rocm_smi_utilization(bus_id: str) -> float | None:
    tool = shutil.which("rocm-smi")
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, "--showuse", "--showbus", "--json"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rocm_smi_utilization(done.stdout, bus_id) if done.returncode == 0 else None


@dataclass(frozen=True)
class ResourceSample:
    """A worker's resource use since the previous sample; GPU fields are None where not measurable."""

    cpu_utilization_percent: float  # of one core
    gpu_memory_peak_bytes: int | None = None
    gpu_utilization_percent: float | None = None


class ResourceSampler:
    """Samples the resources of one worker process between successive calls of `sample`."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._on_gpu = device.type == "cuda"
        self._amd = self._on_gpu and torch.version.hip is not None
        self._bus_id = _bus_id(device) if self._amd else None
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def sample(self) -> ResourceSample:
        """CPU use since the last sample, GPU memory peak and utilisation where measurable."""
        wall, cpu = time.perf_counter(), time.process_time()
        cpu_percent = 100.0 * (cpu - self._cpu) / max(wall - self._wall, 1e-9)
        self._wall, self._cpu = wall, cpu
        memory = int(torch.cuda.max_memory_allocated(self._device)) if self._on_gpu else None
        utilization = None
        if self._bus_id is not None:
            utilization = _amdsmi_utilization(self._bus_id)
            if utilization is None:
                utilization = _rocm_smi_utilization(self._bus_id)
        return ResourceSample(cpu_percent, memory, utilization)

"""Resource sampling on a worker: CPU use of the process, GPU memory and GPU utilisation per interval.

GPU utilisation is read by a background thread (`UtilizationSampler`) every `SAMPLE_PERIOD_S`
seconds and averaged over each report interval, never in the training thread's report path. It
comes from amdsmi (the ROCm SMI Python library, opened once per worker) or, where amdsmi is
missing, from the `rocm-smi` tool, matched to this rank's GPU by PCI bus id; where neither is
present the value is None and the field is omitted. GPU memory is the allocator's peak (allocated
and reserved) since the previous sample: the peaks are reset at every sample.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SAMPLE_PERIOD_S = 1.0
# rocm-smi is a Python program of its own: started at most this often.
ROCM_SMI_PERIOD_S = 5.0
ROCM_SMI_TIMEOUT_S = 5.0

Reader = Callable[[], float | None]


def _bus_id(device: torch.device) -> str | None:
    props = torch.cuda.get_device_properties(device)
    domain, bus, dev = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    if bus is None:
        return None
    return f"{domain or 0:04x}:{bus:02x}:{dev or 0:02x}"


class AmdSmiReader:
    """Reads one GPU's activity through amdsmi, initialised once; `close` shuts amdsmi down."""

    def __init__(self, amdsmi: Any, bus_id: str) -> None:
        self._amdsmi = amdsmi
        amdsmi.amdsmi_init()
        self._handle = next(
            (
                h
                for h in amdsmi.amdsmi_get_processor_handles()
                if amdsmi.amdsmi_get_gpu_device_bdf(h).lower().startswith(bus_id)
            ),
            None,
        )

    def __call__(self) -> float | None:
        if self._handle is None:
            return None
        try:
            return float(self._amdsmi.amdsmi_get_gpu_activity(self._handle)["gfx_activity"])
        except (self._amdsmi.AmdSmiException, KeyError, TypeError, ValueError):
            return None

    def close(self) -> None:
        self._amdsmi.amdsmi_shut_down()


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


def rocm_smi_reader(tool: str, bus_id: str) -> Reader:
    def read() -> float | None:
        try:
            done = subprocess.run(
                [tool, "--showuse", "--showbus", "--json"],
                capture_output=True,
                text=True,
                timeout=ROCM_SMI_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return rocm_smi_utilization(done.stdout, bus_id) if done.returncode == 0 else None

    return read


class UtilizationSampler:
    """Calls `read` every `period_s` seconds on a background thread; `take` returns the mean since the last take."""

    def __init__(self, read: Reader, period_s: float, close: Callable[[], None] | None = None) -> None:
        self._read = read
        self._period_s = period_s
        self._close = close
        self._lock = threading.Lock()
        self._sum = 0.0
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rocmtrain-gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                value = self._read()
                if value is not None:
                    with self._lock:
                        self._sum += value
                        self._count += 1
                self._stop.wait(self._period_s)
        finally:
            if self._close is not None:
                self._close()

    def take(self) -> float | None:
        """The mean of the readings since the previous take; None without any."""
        with self._lock:
            mean = self._sum / self._count if self._count else None
            self._sum, self._count = 0.0, 0
        return mean

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def utilization_sampler(device: torch.device) -> UtilizationSampler | None:
    """The sampler of this rank's AMD GPU, or None where utilisation cannot be read (no AMD GPU, no tool)."""
    if device.type != "cuda" or torch.version.hip is None or (bus_id := _bus_id(device)) is None:
        return None
    try:
        import amdsmi
    except ImportError:
        amdsmi = None
    if amdsmi is not None:
        try:
            reader = AmdSmiReader(amdsmi, bus_id)
        except amdsmi.AmdSmiException:
            reader = None
        if reader is not None:
            return UtilizationSampler(reader, SAMPLE_PERIOD_S, reader.close)
    tool = shutil.which("rocm-smi")
    return UtilizationSampler(rocm_smi_reader(tool, bus_id), ROCM_SMI_PERIOD_S) if tool else None


@dataclass(frozen=True)
class ResourceSample:
    """A rank's resource use since the previous sample; GPU fields are None where not measurable."""

    cpu_utilization_percent: float  # of one core
    gpu_memory_peak_bytes: int | None = None
    gpu_memory_reserved_bytes: int | None = None
    gpu_utilization_percent: float | None = None


class ResourceSampler:
    """Samples the resources of one rank between successive calls of `sample`."""

    def __init__(self, device: torch.device, utilization: UtilizationSampler | None = None) -> None:
        self._device = device
        self._on_gpu = device.type == "cuda"
        self._utilization = utilization
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def sample(self) -> ResourceSample:
        """CPU use, GPU memory peaks and mean GPU utilisation since the last sample (peaks reset)."""
        wall, cpu = time.perf_counter(), time.process_time()
        cpu_percent = 100.0 * (cpu - self._cpu) / max(wall - self._wall, 1e-9)
        self._wall, self._cpu = wall, cpu
        peak = reserved = None
        if self._on_gpu:
            peak = int(torch.cuda.max_memory_allocated(self._device))
            reserved = int(torch.cuda.max_memory_reserved(self._device))
            torch.cuda.reset_peak_memory_stats(self._device)
        utilization = self._utilization.take() if self._utilization is not None else None
        return ResourceSample(cpu_percent, peak, reserved, utilization)

    def close(self) -> None:
        if self._utilization is not None:
            self._utilization.stop()

"""Kubernetes resource quantities (the subset `rocmtrain.api.patterns.QUANTITY` admits) as exact numbers."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from rocmtrain.api.patterns import QUANTITY

_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_SPLIT = re.compile(r"^([0-9.]+)([A-Za-z]*)$")


def parse_quantity(text: str) -> Decimal:
    """The value of a quantity such as `500m`, `1.5` or `16Gi`; ValueError for anything else."""
    parts = _SPLIT.fullmatch(text) if re.fullmatch(QUANTITY, text) else None
    if parts is None:
        raise ValueError(f"not a resource quantity: {text!r}")
    number, suffix = parts.groups()
    return Decimal(number) * _SUFFIXES[suffix]


def quantity_text(value: Decimal) -> str:
    """`value` as a quantity in the largest unit that holds it whole (`1Gi`, `1500M`), else in whole units (rounded
    up, at least 1)."""
    for suffix, unit in sorted(_SUFFIXES.items(), key=lambda item: item[1], reverse=True):
        if unit >= 1 and value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(max(1, math.ceil(value)))


def whole_cpus(cpus: str | float) -> int:
    """CPUs (a quantity, or a number of them) as threads for thread pools: the floor, at least 1.

    Ray sets OMP_NUM_THREADS the same way; the renderer and the training workers both follow it.
    """
    value = parse_quantity(cpus) if isinstance(cpus, str) else cpus
    return max(1, math.floor(value))


AMD_DEVICE_PREFIX = "amd.com/"  # the AMD device plugin's resources: amd.com/gpu, or partitions (mixed naming)


def amd_devices(amounts: Mapping[str, Any]) -> int:
    """The AMD devices among resource `amounts`: `amd.com/gpu`, or partitions such as `amd.com/cpx_nps4`."""
    return sum(device_count(amount) for name, amount in amounts.items() if name.startswith(AMD_DEVICE_PREFIX))


def container_devices(container: Mapping[str, Any]) -> int:
    """A container's AMD devices as the scheduler and Kueue count them: its requests', else its limits'."""
    resources = container.get("resources") or {}
    return amd_devices(resources.get("requests") or {}) or amd_devices(resources.get("limits") or {})


def device_count(value: object) -> int:
    """A count of devices from an extended-resource quantity (`8`); 0 when absent, invalid or fractional."""
    try:
        count = parse_quantity(str(value)) if value is not None else 0
    except ValueError:
        return 0
    return int(count) if count == int(count) else 0

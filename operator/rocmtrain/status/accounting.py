"""GPU-seconds and cost of a job (pure): the AMD GPUs its Ray cluster holds, summed over time.

Whenever the operator computes a job's status it observes how many GPUs the job's
Ray cluster holds: ready workers × GPUs per worker, from the RayJob's
`rayClusterStatus`, while the job is Initializing or Running. `status.gpusHeld` and
`status.accountedUntil` keep the last observation; the next one adds
`gpusHeld × (now − accountedUntil)` to `status.gpuSeconds`, and the price of those
seconds to `status.cost`. The three fields move together in one status write, so an
operator restart neither loses nor counts twice an interval: the time the operator
was away is counted once, at the rate last observed.

So that a running job does not cost a status write per observation, the counters are
brought up to date only when the held count changes, the job ends, or
`FLUSH_SECONDS` have passed; `gpu_seconds_at` gives the exact figure at any moment
(the metrics and `rocmtrain status` use it).

Prices come from the operator's `ROCMTRAIN_GPU_PRICES` (per GPU-hour, by the AMD node
labeller's `amd.com/gpu.product-name`, with an optional `default`) in
`ROCMTRAIN_COST_CURRENCY`: a job's price is that of the product name it selects
(`spec.resources.gpu.productName`), else the default. A GPU partition
(`spec.resources.gpu.partition`) counts as one GPU here, at the price configured for the
partition's name (`cpx_nps4=0.45`), else its GPU's price divided by the partitions per GPU.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.api.contract import partitions_per_gpu
from rocmtrain.api.models import RocmTrainingJobSpec
from rocmtrain.api.patterns import CURRENCY, LABEL_VALUE
from rocmtrain.api.timestamps import parse_time, rfc3339

FLUSH_SECONDS = 300.0
DEFAULT_KEY = "default"
DEFAULT_CURRENCY = "USD"
MAX_PRICE = 1e6  # per GPU-hour: anything above is a typo
_CURRENCY = re.compile(CURRENCY)
_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?$")


@dataclass(frozen=True)
class Price:
    """The price of one GPU-hour."""

    per_gpu_hour: float
    currency: str


@dataclass(frozen=True)
class Pricing:
    """Prices per GPU-hour by GPU product name, with an optional default."""

    by_product: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None
    currency: str = DEFAULT_CURRENCY

    def price_for(self, spec: RocmTrainingJobSpec) -> Price | None:
        """The price of one of the job's GPUs: its selected product's, else the default; None without either.
        A partition's is the price configured for the partition's name, else its GPU's divided by the
        partitions a GPU is split into."""
        gpu = spec.resources.gpu
        product = gpu.product_name if gpu is not None else None
        partition = gpu.partition if gpu is not None else None
        if partition is not None and partition in self.by_product:
            return Price(self.by_product[partition], self.currency)
        per_hour = self.by_product.get(product, self.default) if product is not None else self.default
        return Price(per_hour / partitions_per_gpu(partition), self.currency) if per_hour is not None else None


@dataclass(frozen=True)
class Usage:
    """The accounting status fields after one observation (see the module's docstring)."""

    gpu_seconds: float
    gpus_held: int
    accounted_until: str | None
    cost: dict[str, Any] | None  # wire form: amount and currency

    def fields(self) -> dict[str, Any]:
        """The status fields (wire form)."""
        return {
            "gpuSeconds": self.gpu_seconds,
            "gpusHeld": self.gpus_held,
            "accountedUntil": self.accounted_until,
            "cost": self.cost,
        }


def parse_currency(text: str) -> str:
    """An ISO 4217 currency code (USD when empty); ValueError otherwise."""
    currency = text.strip() or DEFAULT_CURRENCY
    if not _CURRENCY.match(currency):
        raise ValueError(f"currency must be an ISO 4217 code such as USD or EUR, not {currency!r}")
    return currency


def parse_pricing(prices: str, currency: str = "") -> Pricing:
    """`NAME=PRICE,...` (NAME a GPU product name or `default`, PRICE per GPU-hour) and an ISO 4217 code.

    Raises ValueError naming the first bad entry.
    """
    currency = parse_currency(currency)
    table: dict[str, float] = {}
    for entry in (e.strip() for e in prices.split(",")):
        if not entry:
            continue
        name, sep, raw = (part.strip() for part in entry.partition("="))
        if not sep or not (name == DEFAULT_KEY or re.fullmatch(LABEL_VALUE, name)) or not name:
            raise ValueError(f"{entry!r} must be PRODUCT_NAME=PRICE or default=PRICE")
        if name in table:
            raise ValueError(f"{name} is priced twice")
        if not _DECIMAL.match(raw) or float(raw) > MAX_PRICE:
            raise ValueError(f"price of {name} must be a decimal number from 0 to {MAX_PRICE:g}, not {raw!r}")
        table[name] = float(raw)
    default = table.pop(DEFAULT_KEY, None)
    return Pricing(by_product=table, default=default, currency=currency)


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else 0.0


def _held(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def gpu_seconds_at(status: Mapping[str, Any], now: dt.datetime) -> float:
    """`status.gpuSeconds` brought forward to `now` at the rate last observed (ended jobs: as recorded)."""
    since = parse_time(status.get("accountedUntil"))
    extra = max(0.0, (now - since).total_seconds()) * _held(status.get("gpusHeld")) if since else 0.0
    return _seconds(status.get("gpuSeconds")) + extra


def _cost(
    current: Mapping[str, Any], seconds_before: float, added: float, price: Price | None
) -> dict[str, Any] | None:
    """The cost after `added` GPU-seconds; earlier seconds without a cost (or in another currency) at `price`."""
    found = current.get("cost")
    previous: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if price is None:
        return dict(previous) or None
    if previous.get("currency") == price.currency:
        amount = _seconds(previous.get("amount")) + added * price.per_gpu_hour / 3600
    else:
        amount = (seconds_before + added) * price.per_gpu_hour / 3600
    return {"amount": round(amount, 6), "currency": price.currency}


def account(
    current: Mapping[str, Any],
    held: int,
    now: dt.datetime,
    price: Price | None = None,
    *,
    flush_after: float = FLUSH_SECONDS,
) -> Usage:
    """The accounting status fields after observing `held` GPUs at `now`.

    `current` is the job's status as last written. The fields come back unchanged
    (so no status write follows) until the held count changes, `flush_after` seconds
    pass while GPUs are held, or the price appears or changes currency.
    """
    now = now.replace(microsecond=0)  # the stamp has second precision: count whole seconds, each once
    before = _seconds(current.get("gpuSeconds"))
    since = parse_time(current.get("accountedUntil"))
    previous_held = _held(current.get("gpusHeld"))
    unchanged = Usage(before, previous_held, current.get("accountedUntil"), _cost(current, before, 0.0, price))
    if since is not None:
        elapsed = max(0.0, (now - since).total_seconds())
        due = previous_held > 0 and elapsed >= flush_after
        if held == previous_held and not due and unchanged.cost == current.get("cost"):
            return unchanged
        added = previous_held * elapsed
    else:
        added = 0.0
    return Usage(
        gpu_seconds=round(before + added, 3),
        gpus_held=held,
        accounted_until=rfc3339(now) if since is None or now > since else current.get("accountedUntil"),
        cost=_cost(current, before, added, price),
    )

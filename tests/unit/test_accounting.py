"""GPU-seconds and cost (`rocmtrain.status.accounting`), alone and inside the status mapping; pure."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from rocmtrain.status.accounting import FLUSH_SECONDS, Price, Pricing, account, gpu_seconds_at, parse_pricing
from rocmtrain.status.phase import Observation, compute_status, status_patch
from unit.test_status import RUN, T0, cluster, rayjob, spec


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- prices ---------------------------------------------------------------------------------


def test_prices_parse_by_product_name_with_a_default():
    pricing = parse_pricing("AMD_Instinct_MI300X_OAM=3.5, AMD_Instinct_MI250X=1.25,default=2", "EUR")
    assert pricing == Pricing({"AMD_Instinct_MI300X_OAM": 3.5, "AMD_Instinct_MI250X": 1.25}, 2.0, "EUR")
    mi300x = spec(resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "AMD_Instinct_MI300X_OAM"}})
    other = spec(resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "AMD_Radeon_PRO_W7900"}})
    family = spec(resources={"workers": 1, "gpusPerWorker": 8, "gpu": {"family": "AI"}})
    assert pricing.price_for(mi300x) == Price(3.5, "EUR")
    assert pricing.price_for(other) == Price(2.0, "EUR")
    assert pricing.price_for(family) == Price(2.0, "EUR")
    assert parse_pricing("AMD_Instinct_MI300X_OAM=3.5").price_for(other) is None
    assert parse_pricing("").price_for(mi300x) is None and parse_pricing("").currency == "USD"


def test_a_partition_costs_its_gpus_price_divided_by_the_partitions_unless_priced_itself():
    pricing = parse_pricing("AMD_Instinct_MI300X_OAM=3.2,default=2", "EUR")
    mi300x = {"productName": "AMD_Instinct_MI300X_OAM"}
    cpx = spec(resources={"workers": 1, "gpusPerWorker": 8, "gpu": {**mi300x, "partition": "cpx_nps4"}})
    dpx = spec(resources={"workers": 1, "gpusPerWorker": 2, "gpu": {**mi300x, "partition": "dpx_nps1"}})
    unnamed = spec(resources={"workers": 1, "gpusPerWorker": 4, "gpu": {"partition": "qpx_nps1"}})
    assert pricing.price_for(cpx) == Price(0.4, "EUR") and pricing.price_for(dpx) == Price(1.6, "EUR")
    assert pricing.price_for(unnamed) == Price(0.5, "EUR")  # the default GPU's, in quarters
    assert parse_pricing("AMD_Instinct_MI300X_OAM=3.2,cpx_nps4=0.45").price_for(cpx) == Price(0.45, "USD")


@pytest.mark.parametrize(
    ("prices", "currency", "message"),
    [
        ("MI300X", "", "must be PRODUCT_NAME=PRICE"),
        ("bad name=1", "", "must be PRODUCT_NAME=PRICE"),
        ("=1", "", "must be PRODUCT_NAME=PRICE"),
        ("MI300X=-1", "", "must be a decimal number"),
        ("MI300X=1e3", "", "must be a decimal number"),
        ("MI300X=nan", "", "must be a decimal number"),
        ("MI300X=2000000", "", "must be a decimal number"),
        ("MI300X=1,MI300X=2", "", "priced twice"),
        ("MI300X=1", "usd", "ISO 4217"),
        ("MI300X=1", "DOLLARS", "ISO 4217"),
    ],
)
def test_bad_prices_are_refused_with_the_entry(prices: str, currency: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_pricing(prices, currency)


# ---- the counter ------------------------------------------------------------------------------


def observe(steps: list[tuple[float, int]], price: Price | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Feed (seconds after T0, GPUs held) observations; return the accounting fields after each."""
    current: dict[str, Any] = {}
    out = []
    for seconds, held in steps:
        current = {**current, **account(current, held, at(seconds), price, **kwargs).fields()}
        out.append(current)
    return out


def test_first_observation_starts_the_clock():
    (first,) = observe([(0, 16)])
    assert first == {"gpuSeconds": 0.0, "gpusHeld": 16, "accountedUntil": stamp(0), "cost": None}


def test_unchanged_holding_is_not_rewritten_until_the_flush_period():
    steps = observe([(0, 16), (60, 16), (FLUSH_SECONDS - 1, 16), (FLUSH_SECONDS, 16)])
    assert steps[1] == steps[0] and steps[2] == steps[0]  # no write for these
    assert steps[3]["gpuSeconds"] == 16 * FLUSH_SECONDS and steps[3]["accountedUntil"] == stamp(FLUSH_SECONDS)


def test_a_change_counts_the_interval_at_the_previous_rate():
    steps = observe([(0, 0), (10, 8), (40, 16), (100, 0), (1000, 0)])
    assert [s["gpuSeconds"] for s in steps] == [0, 0, 8 * 30, 8 * 30 + 16 * 60, 8 * 30 + 16 * 60]
    assert [s["gpusHeld"] for s in steps] == [0, 8, 16, 0, 0]
    assert steps[4]["accountedUntil"] == stamp(100)  # nothing held: nothing to bring forward


def test_an_operator_restart_counts_the_gap_once():
    written = observe([(0, 16), (120, 16)])[-1]  # as persisted in status
    after_restart = account(written, 16, at(1000))
    assert after_restart.gpu_seconds == 16 * 1000
    again = account(after_restart.fields(), 16, at(1000))
    assert again == after_restart  # the same moment observed twice adds nothing


def test_fractions_of_a_second_are_counted_once():
    current: dict[str, Any] = {}
    for seconds in (0.4, 0.9, 10.7, 20.2):
        current = {**current, **account(current, 1, at(seconds), flush_after=5).fields()}
    assert current["gpuSeconds"] == 20 and current["accountedUntil"] == stamp(20)


def test_gpu_seconds_at_brings_the_counter_forward():
    written = observe([(0, 16)])[-1]
    assert gpu_seconds_at(written, at(90)) == 16 * 90
    assert gpu_seconds_at({}, at(90)) == 0
    assert gpu_seconds_at({"gpuSeconds": 5, "gpusHeld": 0, "accountedUntil": stamp(0)}, at(90)) == 5


def test_cost_follows_the_seconds_and_keeps_old_prices():
    cheap, dear = Price(3.6, "USD"), Price(7.2, "USD")
    current = observe([(0, 10), (100, 10)], cheap, flush_after=50)[-1]
    assert current["cost"] == {"amount": 1.0, "currency": "USD"}  # 1000 GPU-s at 3.6 per GPU-hour
    current = {**current, **account(current, 10, at(200), dear, flush_after=50).fields()}
    assert current["cost"] == {"amount": 3.0, "currency": "USD"}  # the new price applies from now on


def test_a_price_set_later_or_in_another_currency_prices_every_second():
    current = observe([(0, 10), (360, 0)])[-1]
    assert current["gpuSeconds"] == 3600 and current["cost"] is None
    priced = account(current, 0, at(400), Price(2.0, "EUR"))
    assert priced.cost == {"amount": 2.0, "currency": "EUR"}
    assert account({**current, **priced.fields()}, 0, at(500), Price(3.0, "USD")).cost == {
        "amount": 3.0,
        "currency": "USD",
    }


# ---- inside the status mapping ------------------------------------------------------------------


def statuses(sequence: list[tuple[float, dict[str, Any] | None]], price: Price | None = None) -> list[dict[str, Any]]:
    current: dict[str, Any] = {}
    out = []
    for seconds, rj in sequence:
        obs = Observation(
            spec=spec(), generation=1, current=current, rayjob=rj, now=at(seconds), stall_after=1e6, price=price
        )
        merged = {**current, **status_patch(current, compute_status(obs))}
        current = {k: v for k, v in merged.items() if v is not None}
        out.append(current)
    return out


def test_a_job_is_charged_for_ready_workers_while_it_runs_until_its_end():
    end = stamp(700)
    steps = statuses(
        [
            (0, None),
            (10, rayjob("Initializing", **RUN, rayClusterStatus=cluster(0))),
            (20, rayjob("Initializing", **RUN, rayClusterStatus=cluster(1))),  # 8 GPUs from here
            (30, rayjob("Running", "RUNNING", **RUN, rayClusterStatus=cluster(2))),  # 16 from here
            (900, rayjob("Complete", "SUCCEEDED", **RUN, rayClusterStatus=cluster(2), endTime=end, succeeded=1)),
            (5000, None),
        ],
        price=Price(1.8, "USD"),
    )
    assert [s["gpusHeld"] for s in steps] == [0, 0, 8, 16, 0, 0]
    done = steps[4]
    assert done["gpuSeconds"] == 8 * 10 + 16 * 670  # counted up to the end, not to when the operator saw it
    assert done["cost"] == {"amount": round(done["gpuSeconds"] * 1.8 / 3600, 6), "currency": "USD"}
    assert steps[5]["gpuSeconds"] == done["gpuSeconds"]


def test_queued_and_suspended_jobs_hold_nothing():
    steps = statuses(
        [(0, rayjob("Running", "RUNNING", **RUN, rayClusterStatus=cluster(2))), (60, rayjob("Suspended", suspend=True))]
    )
    assert steps[0]["gpusHeld"] == 16 and steps[1]["gpusHeld"] == 0 and steps[1]["gpuSeconds"] == 16 * 60

"""Body and rate bounds of the progress endpoint (no cluster)."""

from __future__ import annotations

import json

import pytest

from fakes import Clock
from rocmtrain.api.models import PREFLIGHT_ERROR_LIMIT, Progress, ProgressReport
from rocmtrain.progress.limits import MAX_BODY_BYTES, MAX_KEYS, ReportError, parse_report
from rocmtrain.serving.rate import RateLimiter

GOOD = {"progress": {"step": 10, "totalSteps": 100, "percent": 10.0}, "metrics": {"trainLoss": 0.7}}


def test_parses_a_well_formed_report():
    report = parse_report(json.dumps(GOOD).encode())
    assert report.progress.step == 10
    assert report.metrics.train_loss == 0.7


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": NaN}}', "non-finite"),
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": Infinity}}', "non-finite"),
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": -Infinity}}', "non-finite"),
        (b'{"progress": {"step": 1}, "metrics": {"trainLoss": 1e999}}', "out of range"),
        (b'{"progress": {"step": 1}', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"progress": {"step": 1}, "progress": {"step": 2}}', "duplicate"),
        (b'{"progress": {"step": "1"}}', "progress.step"),
        (b'{"progress": {"step": true}}', "progress.step"),
        (b'{"progress": {"step": -1}}', "progress.step"),
        (b'{"progress": {"percent": 101}}', "progress.percent"),
        (b'{"metrics": {}}', "progress"),
    ],
)
def test_rejects_malformed_and_non_finite_bodies(body: bytes, reason: str):
    with pytest.raises(ReportError, match=reason):
        parse_report(body)


def test_unknown_field_names_are_not_echoed():
    with pytest.raises(ReportError) as info:
        parse_report(b'{"progress": {"step": 1}, "secret-looking-key": 1}')
    assert "secret-looking-key" not in str(info.value)
    assert "unknown field" in str(info.value)


def test_bounds_size_and_field_count():
    padded = json.dumps(GOOD).encode()[:-1] + b" " * MAX_BODY_BYTES + b"}"
    with pytest.raises(ReportError, match="larger than"):
        parse_report(padded)
    many = {"progress": {"step": 1}, **{f"k{i}": i for i in range(MAX_KEYS)}}
    with pytest.raises(ReportError, match="more than"):
        parse_report(json.dumps(many).encode())


def test_the_longest_preflight_refusal_fits_a_body_and_a_longer_one_is_refused():
    """The driver sends its refusal as pydantic writes it (UTF-8, not escaped): 2048 four-byte characters fit."""
    longest = ProgressReport(progress=Progress(), final=True, preflight_error="\U0001f4a5" * PREFLIGHT_ERROR_LIMIT)
    body = longest.model_dump_json(by_alias=True, exclude_none=True).encode()
    assert len(body) < MAX_BODY_BYTES and parse_report(body) == longest
    with pytest.raises(ReportError, match="preflightError"):
        parse_report(json.dumps({"progress": {}, "preflightError": "x" * (PREFLIGHT_ERROR_LIMIT + 1)}).encode())


def test_rate_limiter_allows_a_burst_then_the_rate():
    clock = Clock(1000.0)
    limiter = RateLimiter(rate=2.0, burst=10, clock=clock)
    assert [limiter.acquire("ns/a") for _ in range(10)] == [0.0] * 10
    assert limiter.acquire("ns/a") == pytest.approx(0.5)
    assert limiter.acquire("ns/b") == 0.0, "each job has its own bucket"
    clock.now += 0.5
    assert limiter.acquire("ns/a") == 0.0
    assert limiter.acquire("ns/a") > 0
    clock.now += 60
    assert sum(limiter.acquire("ns/a") == 0.0 for _ in range(20)) == 10, "refills to the burst, not beyond"


def test_rate_limiter_forgets_idle_jobs_within_its_bound():
    clock = Clock(1000.0)
    limiter = RateLimiter(rate=1.0, burst=2, clock=clock, max_keys=3)
    for key in ("a", "b", "c"):
        limiter.acquire(key)
        clock.now += 1
    limiter.acquire("d")
    assert len(limiter._buckets) <= 3
    for _ in range(2):
        limiter.acquire("d")
    assert limiter.acquire("d") > 0, "the new job's bucket is a real one"


def test_rate_limiter_rejects_nonsense_settings():
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(rate=0, burst=1)


def test_network_is_taken_within_its_bounds():
    """A network as the driver reads it from RCCL's log (written by hand: no RCCL runs here)."""
    network = {"transport": "IB", "devices": ["mlx5_0:1", "mlx5_1:1"], "link": "RoCE"}
    body = {"progress": {"step": 1}, "network": network}
    assert parse_report(json.dumps(body).encode()).network.dump() == network
    for bad in (
        {"transport": "x" * 65},
        {"transport": "IB; rm -rf /"},
        {"transport": "IB", "devices": [f"mlx5_{i}" for i in range(17)]},
        {"transport": "IB", "devices": ["mlx5_0 "]},
        {"transport": "IB", "link": "Ethernet"},
    ):
        with pytest.raises(ReportError, match="network"):
            parse_report(json.dumps({"progress": {"step": 1}, "network": bad}).encode())

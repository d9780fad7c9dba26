"""The informers' restart back-off and health policy (`rocmtrain.controller.supervision`), on a fake clock."""

from __future__ import annotations

import pytest

from rocmtrain.controller.settings import OperatorConfig
from rocmtrain.controller.supervision import RestartPolicy, Supervision, capped_backoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_back_off_doubles_up_to_its_cap():
    assert [capped_backoff(n, 1.0, 30.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert capped_backoff(10_000, 1.0, 30.0) == 30.0, "no overflow after many failures"


@pytest.mark.parametrize(("jitter", "delays"), [(0.0, [0.5, 1, 2, 4, 5]), (1.0, [1, 2, 4, 8, 10])])
def test_jitter_spreads_each_delay_over_the_upper_half_of_the_back_off(jitter: float, delays: list[float]):
    policy = RestartPolicy(first_delay=1.0, max_delay=10.0)
    assert [policy.delay(n, jitter) for n in range(1, 6)] == delays


def test_a_watch_that_keeps_failing_turns_unhealthy_after_the_bound():
    clock = Clock()
    supervision = Supervision(RestartPolicy(max_delay=8.0, recovery=20.0, unhealthy_after=60.0), clock=clock)
    assert supervision.healthy()
    elapsed = 0.0
    while elapsed <= 60.0:  # each restart fails at once
        assert supervision.healthy(), f"still within the bound after {elapsed}s"
        delay = supervision.failed()
        clock.now += delay
        elapsed += delay
    assert not supervision.healthy()
    assert supervision.failures >= 8, "it was restarted again and again before"
    clock.now += 10.0  # in its back-off sleep, or failing again soon after: still broken
    assert not supervision.healthy()


def test_a_watch_that_runs_long_enough_after_a_restart_has_recovered():
    clock = Clock()
    supervision = Supervision(RestartPolicy(max_delay=8.0, recovery=20.0, unhealthy_after=30.0), clock=clock)
    for _ in range(5):
        clock.now += supervision.failed()
    assert supervision.failures == 5
    clock.now += 21.0  # ran longer than the recovery time without failing
    assert supervision.healthy()
    clock.now += 1000.0
    assert supervision.healthy(), "a past run of failures does not count"
    delay = supervision.failed()
    assert supervision.failures == 1 and delay <= 1.0, "a new run of failures starts from the first delay"


def test_rare_failures_never_make_a_watch_unhealthy():
    clock = Clock()
    supervision = Supervision(RestartPolicy(recovery=60.0, unhealthy_after=120.0), clock=clock, jitter=lambda: 0.5)
    for _ in range(20):  # one failure every 10 minutes, each after the watch ran fine again
        clock.now += supervision.failed() + 600.0
        assert supervision.healthy()
    assert supervision.failures == 1


def test_the_bound_is_configured_by_the_environment():
    assert OperatorConfig.from_env({}).watch_restart.unhealthy_after == 300.0
    config = OperatorConfig.from_env({"ROCMTRAIN_WATCH_FAILING_SECONDS": "45"})
    assert config.watch_restart == RestartPolicy(unhealthy_after=45.0)

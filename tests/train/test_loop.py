"""Parts of the step loop that need no Ray: when the next report falls, and batches made ahead on a thread."""

from __future__ import annotations

import threading
import time

import pytest

from rocmtrain_train.data.prefetch import Prefetcher
from rocmtrain_train.loop.step_loop import steps_until_report
from rocmtrain_train.trainer.torch_trainer import poll_interval_s


@pytest.mark.parametrize(
    ("steps", "seconds", "interval", "expected"),
    [
        (10, 5.0, 10.0, 20),  # 2 steps a second: 20 steps make 10 s
        (1, 30.0, 10.0, 1),  # slower than the interval: report after every step
        (3, 0.0, 10.0, 1),  # no time measured yet
        (100, 1.0, 2.0, 200),
    ],
)
def test_the_next_report_comes_about_one_interval_later(steps, seconds, interval, expected):
    assert steps_until_report(steps, seconds, interval) == expected


@pytest.mark.parametrize(("report_interval", "poll"), [(10.0, 2.0), (4.0, 2.0), (2.0, 1.0), (1.0, 0.5), (0.5, 0.25)])
def test_ray_train_polls_twice_per_report_at_most_every_two_seconds(report_interval, poll):
    assert poll_interval_s(report_interval) == poll


def test_batches_come_in_order_from_a_background_thread():
    made_on = set()

    def make(item: int) -> int:
        made_on.add(threading.current_thread().name)
        return item * 10

    batches = Prefetcher(make, range(7), depth=2)
    assert list(batches) == [0, 10, 20, 30, 40, 50, 60]
    batches.close()
    assert made_on == {"rocmtrain-prefetch"}


def test_the_thread_stays_at_most_depth_batches_ahead_and_stops_when_closed():
    made = []
    prefetcher = Prefetcher(made.append, range(1000), depth=2)
    time.sleep(0.2)
    assert len(made) <= 3  # two waiting in the queue, one being put
    prefetcher.close()
    assert len(made) <= 4


def test_an_error_while_making_a_batch_reaches_the_loop():
    def make(item: int) -> int:
        if item == 2:
            raise ValueError("bad record 2")
        return item

    batches = Prefetcher(make, range(5))
    taken = []
    with pytest.raises(ValueError, match="bad record 2"):
        for batch in batches:
            taken.append(batch)
    assert taken == [0, 1]
    batches.close()

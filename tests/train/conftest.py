"""Fixtures of the training tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One embedded Ray for every training test, with as many CPUs as the machine has (at least two)."""
    import ray

    ray.init(
        num_cpus=max(2, os.cpu_count() or 1),
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
    )
    yield
    ray.shutdown()

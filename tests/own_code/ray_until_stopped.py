"""Starts its own Ray, as a Ray Train script does outside a cluster, and keeps a Ray worker busy until it is stopped;
says `training` on its error output once the worker runs (TEST-ONLY: tests/commands/test_run_own_code.py)."""

from __future__ import annotations

import sys
import time

import ray


@ray.remote(num_cpus=1)
class Trainer:
    def ready(self) -> bool:
        return True

    def train(self) -> None:
        while True:
            time.sleep(0.1)


def main() -> None:
    ray.init(num_cpus=1, include_dashboard=False)
    trainer = Trainer.remote()  # type: ignore[attr-defined]
    ray.get(trainer.ready.remote())
    running = trainer.train.remote()
    print("training", file=sys.stderr, flush=True)
    ray.get(running)


if __name__ == "__main__":
    main()

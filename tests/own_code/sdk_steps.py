"""A training loop of its own: each step reported with `sdk.report` (only rank 0's are sent); the script records
its arguments, and when each step ended, in the run folder."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from common import main

from rocmtrain_train import sdk

STEPS = 8
SECONDS_PER_STEP = float(os.environ.get("STEP_SECONDS", "1.5"))


def train_func() -> None:
    run = Path(sdk.storage_path())
    for step in range(1, STEPS + 1):
        time.sleep(SECONDS_PER_STEP)
        metrics = {"loss": 1.0 / step, "learning_rate": 1e-4, "eval_accuracy": step / STEPS, "tokens_seen": 512 * step}
        if sdk.report(step=step, total_steps=STEPS, epoch=step / STEPS, metrics=metrics):
            with (run / "steps.jsonl").open("a", encoding="utf-8") as trace:
                trace.write(json.dumps({"step": step, "time": time.time()}) + "\n")


if __name__ == "__main__":
    run_folder = Path(sdk.storage_path())
    run_folder.mkdir(parents=True, exist_ok=True)
    (run_folder / "argv.json").write_text(json.dumps(sys.argv[1:]))
    main(train_func)

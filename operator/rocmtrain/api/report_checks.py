"""What a run's progress reports tell beyond their numbers (pure): a code that is not data-parallel, a loss
that never arrives.

The operator's status mapping (`rocmtrain.status`) and `rocmtrain run` (`rocmtrain_train.driver.own_code`)
both read reports with these, so that a cluster job's conditions and a local run's warnings say the same.

- **Not data-parallel.** Only rank 0 reports (transformers' `KubeflowCallback`, `sdk.report`), so the step
  of a run's reports only grows, except where the run restarted: a report without a step (a `Trainer`'s
  first, or its last) or one that counts a new worker failure. A script that is not really data-parallel
  trains a full copy on every worker, each of which thinks it is rank 0 (on CPUs, transformers logs
  "parallel_mode != DISTRIBUTED" when Ray Train's process group is not the one its `Trainer` uses): their
  reports interleave, and the step goes back and forth. One step back may be a restart the code did not
  mark; `BACKWARD_STEPS_TO_WARN` of them are two copies. The progress endpoint also knows which pod sent each
  report: the last `REPORTING_PODS_KEPT` pods that reported in this run are remembered (`reporting_pods`),
  and a report from one of them that is not the last report's pod takes a turn back (`took_turn`). A rank 0
  that moved to another pod never reports from the first again, nor do the pods of a run that restarted (a
  report that counts a new worker failure forgets the others); a driver that reports before and after its
  workers takes one turn; `TURNS_TO_WARN` turns are two processes reporting as rank 0.
- **No loss.** A Hugging Face `Trainer` reports its loss every `logging_steps` (500 unless set); a run of
  fewer steps logs none until the end, where its mean `train_loss` arrives. Past 1% of the steps without a
  loss, the status says so and how to log more often.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

BACKWARD_STEPS_TO_WARN: Final = 2
# The pods remembered per job (`status.reportingPods`), and the turns back among them that warn.
REPORTING_PODS_KEPT: Final = 8
TURNS_TO_WARN: Final = 2
# Past this share of the steps, a run that reported no loss is told why (a Trainer's logging_steps).
LOSS_EXPECTED_AFTER: Final = 0.01


def went_backwards(step: int | None, previous: int | None, *, restarted: bool = False) -> bool:
    """Whether a report's step is below the previous report's, with no restart between them."""
    return step is not None and previous is not None and step < previous and not restarted


# What two rank 0s most likely mean, and the fix.
_COPIES: Final = (
    "more than one process reports as rank 0, most likely because the script trains a full copy of the model on "
    "every worker rather than one model data-parallel (transformers logs 'parallel_mode != DISTRIBUTED'), which "
    "multiplies the compute. Build the model and the Trainer inside Ray Train's train function and prepare them "
    "for it (ray.train.huggingface.transformers.prepare_trainer, or ray.train.torch.prepare_model with a "
    "DistributedSampler), or train on one worker (ScalingConfig(num_workers=1))"
)


def not_data_parallel(times: int) -> str:
    """Why the step went backwards `times` times, and the fix."""
    return f"the reported step went backwards {times} times: {_COPIES}"


def took_turn(pod: str, pods: Sequence[str], *, restarted: bool = False) -> bool:
    """Whether a report from `pod` comes back to it after another pod's report: `pod` is among `pods` (the pods
    that reported in this run, the latest first) but not the latest, with no restart between."""
    return not restarted and pod in pods[1:]


def reporting_pods(pod: str, pods: Sequence[str], *, restarted: bool = False) -> list[str]:
    """The pods that reported in this run, the latest first, after a report from `pod` (`REPORTING_PODS_KEPT`
    of them; only `pod` after a restart)."""
    kept = [] if restarted else [other for other in pods if other != pod]
    return [pod, *kept][:REPORTING_PODS_KEPT]


def two_rank_zeros(pods: Sequence[str], times: int) -> str:
    """Why the reports took `times` turns between `pods` (the latest first), and the fix."""
    more = f" (and {len(pods) - 2} more)" if len(pods) > 2 else ""
    return (
        f"pods {' and '.join(pods[:2])}{more} took turns reporting progress, {times} times with no restart "
        f"between: {_COPIES}"
    )


def missing_loss(step: int | None, total_steps: int | None, has_loss: bool) -> str | None:
    """Why no loss has arrived by `step` of `total_steps`, once past `LOSS_EXPECTED_AFTER` of them; else None."""
    if has_loss or step is None or not total_steps or step <= total_steps * LOSS_EXPECTED_AFTER:
        return None
    every = max(1, math.floor(total_steps * LOSS_EXPECTED_AFTER))
    return (
        f"no loss reported by step {step} of {total_steps}: a Hugging Face Trainer reports its loss every "
        f"logging_steps (500 unless set), and only its mean train_loss at the end; set logging_steps={every} "
        "(1% of the steps) in its TrainingArguments, or report metrics={'loss': ...} with sdk.report"
    )

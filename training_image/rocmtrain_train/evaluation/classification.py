"""Evaluating a classifier or a regression head: each rank sums over its shard, the sums are all-reduced, every
rank gets the same metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist

from rocmtrain.api.models import ModelSpec
from rocmtrain_train.evaluation.batches import Counted
from rocmtrain_train.reporting.rank_report import Evaluation


def sum_width(model: ModelSpec) -> int:
    """Length of the sums vector: [loss, count, correct|abs_error, tp[C], fp[C], fn[C]]."""
    return 3 if model.task == "regression" else 3 + 3 * (model.num_labels or 0)


def batch_sums(logits: torch.Tensor, labels: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """The sums of one batch (float64)."""
    logits = logits.double()
    count = logits.new_tensor(float(len(labels)))
    if model.task == "regression":
        error = logits.view(-1) - labels.double()
        return torch.stack([error.square().sum(), count, error.abs().sum()])
    classes = model.num_labels or 0
    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    predicted = logits.argmax(dim=-1)
    hit = predicted == labels
    tp = torch.bincount(labels[hit], minlength=classes)
    fp = torch.bincount(predicted[~hit], minlength=classes)
    fn = torch.bincount(labels[~hit], minlength=classes)
    head = torch.stack([loss, count, hit.sum().double()])
    return torch.cat([head, tp.double(), fp.double(), fn.double()])


def metrics_from_sums(sums: list[float], model: ModelSpec) -> Evaluation:
    """Evaluation metrics from (all-reduced) sums, keyed by `EVAL_METRICS` name.

    Classification: loss (mean cross-entropy), accuracy and macro-F1 over the classes that occur in
    the labels or the predictions. Regression: loss = MSE, and MAE.
    """
    loss, count, third = sums[:3]
    if count == 0:
        return {}
    if model.task == "regression":
        return {"eval_loss": loss / count, "eval_mse": loss / count, "eval_mae": third / count}
    classes = model.num_labels or 0
    tp, fp, fn = (sums[3 + k * classes : 3 + (k + 1) * classes] for k in range(3))
    f1 = [2 * t / (2 * t + p + n) for t, p, n in zip(tp, fp, fn, strict=True) if t + p + n > 0]
    return {"eval_loss": loss / count, "eval_accuracy": third / count, "eval_f1": sum(f1) / len(f1)}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    batches: Iterable[Counted],
    spec: ModelSpec,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
) -> Evaluation:
    """Evaluate this worker's shard and all-reduce the sums; every rank returns the same metrics."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(sum_width(spec), dtype=torch.float64, device=device)
    for batch, counted in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        labels = batch.pop("labels", None)
        with autocast():
            logits = model(**batch).logits
        if counted and labels is not None:
            sums += batch_sums(logits, labels, spec)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    model.train(was_training)
    return metrics_from_sums(sums.tolist(), spec)

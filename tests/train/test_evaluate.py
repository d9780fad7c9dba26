"""Evaluation sums and metrics (the all-reduce itself is exercised by the Ray training tests)."""

from __future__ import annotations

import pytest
import torch

from rocmtrain.api.models import ModelSpec
from rocmtrain_train.evaluation.classification import batch_sums, metrics_from_sums

CLASSIFY = ModelSpec(source="/m", numLabels=3)
REGRESS = ModelSpec(source="/m", task="regression")


def onehot_logits(predicted: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(predicted), 3).float() * 4.0


def test_classification_metrics():
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    predicted = [0, 1, 1, 1, 2, 0]
    metrics = metrics_from_sums(batch_sums(onehot_logits(predicted), labels, CLASSIFY).tolist(), CLASSIFY)
    assert metrics["eval_accuracy"] == pytest.approx(4 / 6)
    # F1 per class: 0 -> tp1 fp1 fn1 = 0.5; 1 -> tp2 fp1 fn0 = 0.8; 2 -> tp1 fp0 fn1 = 2/3.
    assert metrics["eval_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    expected_loss = torch.nn.functional.cross_entropy(onehot_logits(predicted), labels).item()
    assert metrics["eval_loss"] == pytest.approx(expected_loss)


def test_sums_of_shards_add_up_to_the_sums_of_the_whole():
    """What the all-reduce relies on: metrics from summed shard sums equal metrics over all records."""
    generator = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(50, 3, generator=generator), torch.randint(0, 3, (50,), generator=generator)
    whole = batch_sums(logits, labels, CLASSIFY)
    shards = batch_sums(logits[:17], labels[:17], CLASSIFY) + batch_sums(logits[17:], labels[17:], CLASSIFY)
    assert metrics_from_sums(shards.tolist(), CLASSIFY) == pytest.approx(metrics_from_sums(whole.tolist(), CLASSIFY))


def test_classes_absent_from_labels_and_predictions_do_not_count_in_macro_f1():
    labels = torch.tensor([0, 1])
    metrics = metrics_from_sums(batch_sums(onehot_logits([0, 1]), labels, CLASSIFY).tolist(), CLASSIFY)
    assert metrics["eval_f1"] == 1.0


def test_regression_metrics():
    outputs, labels = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1.0, 3.0, 2.0])
    metrics = metrics_from_sums(batch_sums(outputs, labels, REGRESS).tolist(), REGRESS)
    assert metrics == pytest.approx({"eval_loss": 5 / 3, "eval_mse": 5 / 3, "eval_mae": 1.0})


def test_no_records_give_no_metrics():
    assert metrics_from_sums([0.0] * 12, CLASSIFY) == {}

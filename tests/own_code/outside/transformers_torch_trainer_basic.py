# rocmtrain test: Ray's example behind AMD's blog on Ray Train and ROCm, as test data (tests/own_code/outside):
# python/ray/train/examples/transformers/transformers_torch_trainer_basic.py of ROCm/ray at
# a73a35e5e9466727f650480997af8bf55f3522f2, the fork whose release/2.51.1 the blog runs (ray-project/ray's, at
# 046d64d9f048ffbd60ed3765aef61fe48e30e532, differs only in num_workers=4). Unchanged but for the lines marked
# "rocmtrain test:": the hub's model, data and metric are local files beside this file (made by stand_ins.py),
# the blog's own fix of evaluation_strategy, and CPUs for GPUs.
# ruff: noqa
# import evaluate  # rocmtrain test: evaluate.load("accuracy") loads its module from the hub; Accuracy stands in
import os  # rocmtrain test: for HUB

import numpy as np

# Minimal Example adapted from https://huggingface.co/docs/transformers/training
from datasets import load_dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
)

from ray.train import ScalingConfig
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from ray.train.torch import TorchTrainer

HUB = os.path.dirname(os.path.abspath(__file__))  # rocmtrain test: where the hub's files are, here


class Accuracy:  # rocmtrain test: the hub's evaluate-metric/accuracy, as computed there
    def compute(self, predictions, references):
        return {"accuracy": float((np.asarray(predictions) == np.asarray(references)).mean())}


# [1] Define a training function that includes all your training logic
# ====================================================================
def train_func(config):
    # Datasets
    dataset = load_dataset(os.path.join(HUB, "yelp_review_full"))  # rocmtrain test: local
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(HUB, "bert-base-cased"))  # rocmtrain test: local

    def tokenize_function(examples):
        return tokenizer(examples["text"], padding="max_length", truncation=True)

    tokenized_ds = dataset.map(tokenize_function, batched=True)

    small_train_ds = tokenized_ds["train"].shuffle(seed=42).select(range(1000))
    small_eval_ds = tokenized_ds["test"].shuffle(seed=42).select(range(1000))

    # Model
    model = AutoModelForSequenceClassification.from_pretrained(
        os.path.join(HUB, "bert-base-cased"), num_labels=5  # rocmtrain test: local
    )

    # Evaluation metrics
    metric = Accuracy()  # rocmtrain test: was evaluate.load("accuracy")

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        predictions = np.argmax(logits, axis=-1)
        return metric.compute(predictions=predictions, references=labels)

    # Hugging Face Trainer
    training_args = TrainingArguments(
        # rocmtrain test: eval_strategy, as the blog's step 4 has it (transformers 4.46 removed evaluation_strategy)
        output_dir="test_trainer", eval_strategy="epoch", report_to="none"
    )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=small_train_ds,
        eval_dataset=small_eval_ds,
        compute_metrics=compute_metrics,
    )

    # [2] Report metrics and checkpoints to Ray Train
    # ===============================================
    trainer.add_callback(RayTrainReportCallback())

    # [3] Prepare your trainer for Ray Data integration
    # =================================================
    trainer = prepare_trainer(trainer)

    # Start Training
    trainer.train()


# [4] Build a Ray TorchTrainer to launch `train_func` on all workers
# ==================================================================
trainer = TorchTrainer(
    train_func, scaling_config=ScalingConfig(num_workers=2, use_gpu=False)  # rocmtrain test: CPUs
)

trainer.fit()

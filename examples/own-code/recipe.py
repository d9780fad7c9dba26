"""Fine-tune a sequence classifier with Hugging Face's `Trainer` on Ray Train: the recipe of AMD's ROCm blog on
Ray (a `TorchTrainer` whose training function runs a plain `Trainer`, with Ray's `RayTrainReportCallback` and
`prepare_trainer`), adapted only where a cluster without the Hugging Face hub needs it:

- the model and the reviews come from local or volume paths (the job's spec.model and spec.data) instead of
  the hub, and accuracy is computed here instead of by `evaluate` (which loads it from the hub);
- Ray Train's workers and storage are the job's (`sdk.scaling_config()`, `sdk.run_config()`) instead of two
  GPU workers and ~/ray_results, so the same file runs on a workstation's CPUs and on MI300X nodes; without
  GPUs, `use_cpu` tells the Trainer to train data-parallel on the CPU (it would train each worker alone).

It has no progress code: transformers registers its `KubeflowCallback` because the job sets
KUBEFLOW_TRAINER_SERVER_URL, and that callback reports each step into the job's status.

    rocmtrain run examples/own-code/job.yaml
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

import numpy as np
import ray.train.huggingface.transformers
import torch
from ray.train.torch import TorchTrainer
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

from rocmtrain_train import sdk


def read_records(uri: str, limit: int | None) -> list[dict[str, Any]]:
    """The JSON lines of a local or volume file (the hub recipe's `load_dataset`)."""
    with open(uri, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    return records[:limit] if limit else records


def train_func() -> None:
    model_spec, data, training = sdk.model(), sdk.data(), sdk.training()
    assert model_spec is not None and data is not None and data.eval is not None, "the job names a model and data"
    model_dir = sdk.model_path()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def tokenize(uri: str, limit: int | None) -> list[dict[str, Any]]:
        records = read_records(uri, limit)
        encoded = tokenizer(
            [record[data.text_field] for record in records],
            padding="max_length",
            truncation=True,
            max_length=model_spec.max_seq_length,
        )
        return [
            {"input_ids": ids, "attention_mask": mask, "labels": record[data.label_field]}
            for ids, mask, record in zip(encoded["input_ids"], encoded["attention_mask"], records, strict=True)
        ]

    small_train_dataset = tokenize(data.train.uri, data.train.max_samples)
    small_eval_dataset = tokenize(data.eval.uri, data.eval.max_samples)

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=model_spec.num_labels)

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        logits, labels = eval_pred
        return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}

    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="test_trainer-"),
        eval_strategy="epoch",
        save_strategy="epoch",
        report_to="none",
        num_train_epochs=training.epochs,
        per_device_train_batch_size=training.batch_size_per_worker,
        per_device_eval_batch_size=training.batch_size_per_worker,
        learning_rate=training.learning_rate,
        logging_steps=1,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=small_train_dataset,
        eval_dataset=small_eval_dataset,
        compute_metrics=compute_metrics,
    )
    callback = ray.train.huggingface.transformers.RayTrainReportCallback()
    trainer.add_callback(callback)
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)
    trainer.train()


if __name__ == "__main__":
    ray_trainer = TorchTrainer(train_func, scaling_config=sdk.scaling_config(), run_config=sdk.run_config())
    result = ray_trainer.fit()
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")

"""A plain Hugging Face `Trainer`: no progress code; transformers' KubeflowCallback reports by itself."""

from __future__ import annotations

import json
import tempfile

import torch
from common import main
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

from rocmtrain_train import sdk


def train_func() -> None:
    model, data, training = sdk.model(), sdk.data(), sdk.training()
    assert model is not None and data is not None
    tokenizer = AutoTokenizer.from_pretrained(sdk.model_path())
    with open(data.train.uri, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines][: data.train.max_samples]
    encoded = tokenizer([r[data.text_field] for r in records], truncation=True, max_length=model.max_seq_length)
    dataset = [
        {"input_ids": ids, "attention_mask": mask, "labels": r[data.label_field]}
        for ids, mask, r in zip(encoded["input_ids"], encoded["attention_mask"], records, strict=True)
    ]
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        report_to="none",
        num_train_epochs=training.epochs,
        per_device_train_batch_size=training.batch_size_per_worker,
        learning_rate=training.learning_rate,
        logging_steps=1,
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
    )
    classifier = AutoModelForSequenceClassification.from_pretrained(sdk.model_path(), num_labels=model.num_labels)
    Trainer(model=classifier, args=args, train_dataset=dataset, processing_class=tokenizer).train()


if __name__ == "__main__":
    main(train_func)

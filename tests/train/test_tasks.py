"""Other tasks and models end to end on Ray: regression on sentence pairs, a decoder-only model without a
padding token; and the model options (attention kernels, gradient checkpointing, torch.compile)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from rocmtrain.api.models import ModelSpec, TrainingSpec
from rocmtrain_train.data.records import Records
from rocmtrain_train.data.tokens import collate, encode
from rocmtrain_train.driver.train_job import run_local
from rocmtrain_train.loop.rank_setup import COMPILE_BUCKET, pad_multiple
from rocmtrain_train.model.pretrained import compile_model, load_model
from train.jobs import EXAMPLES, job, settings

CLASSIFY = ModelSpec(source="/tiny", numLabels=3)


def pairs(path: Path, count: int) -> Path:
    """Sentence pairs scored 1.0 where both reviews have the same sentiment, else 0.0 (a similarity task)."""
    reviews = [json.loads(line) for line in (EXAMPLES / "data" / "train.jsonl").read_text().splitlines()]
    rng = random.Random(3)
    with path.open("w") as f:
        for _ in range(count):
            a, b = rng.sample(reviews, 2)
            row = {"first": a["text"], "second": b["text"], "score": float(a["label"] == b["label"])}
            f.write(json.dumps(row) + "\n")
    return path


@pytest.mark.ray
def test_regression_on_sentence_pairs(ray_local, tiny_bert, tmp_path):
    spec = {
        "model": {"source": str(tiny_bert), "task": "regression", "numLabels": None, "maxSeqLength": 96},
        "data": {
            "train": {"uri": str(pairs(tmp_path / "train.jsonl", 96)), "maxSamples": None},
            "eval": {"uri": str(pairs(tmp_path / "eval.jsonl", 32)), "maxSamples": None},
            "textField": "first",
            "textPairField": "second",
            "labelField": "score",
        },
        "training": {"batchSizePerWorker": 8, "learningRate": 1e-3},
    }
    outcome = run_local(settings(job("pairs", spec), tmp_path / "runs"), console=False)
    summary = outcome.summary
    assert summary["steps"] == 96 // 16 and summary["world_size"] == 2
    assert {"eval_mse", "eval_mae", "eval_loss"} <= summary.keys() and "eval_accuracy" not in summary
    assert 0 < summary["eval_mse"] < 1 and summary["eval_loss"] == summary["eval_mse"]
    saved = AutoConfig.from_pretrained(summary["model_path"])
    assert saved.problem_type == "regression" and saved.num_labels == 1


@pytest.mark.ray
def test_a_decoder_only_model_without_a_padding_token_pads_with_its_end_of_sequence_token(
    ray_local, tiny_llama, tmp_path
):
    spec = {
        "model": {"source": str(tiny_llama), "maxSeqLength": 32},
        "data": {"train": {"maxSamples": 64}, "eval": {"maxSamples": 32}},
        "training": {"batchSizePerWorker": 8, "learningRate": 1e-3},
    }
    outcome = run_local(settings(job("decoder", spec), tmp_path), console=False)
    assert outcome.summary["steps"] == 4 and "eval_accuracy" in outcome.summary
    checksums = {r.weights_checksum for r in outcome.final_ranks}
    assert len(checksums) == 1
    exported = outcome.summary["model_path"]
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert tokenizer.pad_token == tokenizer.eos_token == "[SEP]"
    assert AutoConfig.from_pretrained(exported).pad_token_id == tokenizer.eos_token_id


def tiny_batch(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    encoded = encode(tokenizer, Records(texts, None, [0, 2]), max_length=32, regression=False)
    return collate(encoded, [0, 1], tokenizer.pad_token_id)


def gradients(model, batch) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(**batch).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_attention_kernels_and_gradient_checkpointing_compute_the_same_gradients(tiny_bert):
    texts = ["a short review", "a much longer review that needs padding in the batch"]
    results = {}
    for options in ({}, {"attentionImplementation": "eager"}, {"gradientCheckpointing": True}):
        torch.manual_seed(0)
        model, tokenizer = load_model(tiny_bert, CLASSIFY, TrainingSpec(**options))
        model.train()
        expected = options.get("attentionImplementation", "sdpa")
        assert model.config._attn_implementation == expected
        assert model.is_gradient_checkpointing == options.get("gradientCheckpointing", False)
        results[json.dumps(options)] = gradients(model, tiny_batch(tokenizer, texts))
    first, *others = results.values()
    for other in others:
        for name, grad in first.items():
            torch.testing.assert_close(grad, other[name], rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_models_see_few_shapes_and_compute_what_eager_models_do(tiny_bert):
    """The compiler is replaced by one that counts the graphs it is given and runs them as they are
    (inductor itself, minutes on this machine, is PyTorch's and runs in the GPU benchmark)."""
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(tuple(tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor))[:1])
        return graph.forward

    assert pad_multiple(TrainingSpec(compile=True), torch.device("cpu")) == COMPILE_BUCKET
    assert pad_multiple(TrainingSpec(), torch.device("cpu")) == 1
    torch.manual_seed(0)
    eager, tokenizer = load_model(tiny_bert, CLASSIFY, TrainingSpec())
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    compile_model(compiled, max_length=128, bucket=COMPILE_BUCKET, backend=counting)
    texts = [" ".join(["word"] * n) for n in (3, 9, 20, 40, 61, 70, 90, 100)]
    encoded = encode(tokenizer, Records(texts, None, [0, 1, 2] * 2 + [0, 1]), max_length=128, regression=False)
    for rows in ([0, 1], [2, 3], [4, 5], [6, 7], [0, 2], [1]):  # 5 lengths, two batch sizes
        batch = collate(encoded, rows, tokenizer.pad_token_id, multiple_of=COMPILE_BUCKET)
        assert batch["input_ids"].shape[1] in (64, 128)
        torch.testing.assert_close(compiled(**batch).loss, eager(**batch).loss)
    assert len(graphs) == 3, graphs  # (2, 64), (2, 128), (1, 64): one graph per bucketed shape

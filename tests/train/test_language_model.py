"""Causal-LM fine-tuning end to end on Ray: a LoRA adapter on the language-model example's tiny Llama.

One LoRA run of two ranks (module-scoped) serves most checks: only the adapter trains and the base stays
bit-identical, the adapter loads with peft and its merged model with transformers alone and gives the same
logits, checkpoints hold the adapter and its optimiser state only, and the evaluation reports perplexity and
exact match. More runs check what needs a run of their own: one rank with the global batch trains what two
ranks do (the loss is token-weighted across ranks); so do two ranks sharded with FSDP (`training.sharding: fsdp`),
whose sharded checkpoint then resumes on one rank in flat rows (padding-free) of a token budget; and a resumed
run, with packing, continues the curve.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rocmtrain.api.models import ProgressReport
from rocmtrain_train.driver.train_job import run_local
from rocmtrain_train.strategy.data_parallel import WEIGHTS_FILE
from train.jobs import EXAMPLES, job, settings

pytestmark = pytest.mark.ray

SFT = EXAMPLES / "sft" / "data"
SAMPLES, GLOBAL_BATCH, EPOCHS = 128, 16, 2
STEPS = SAMPLES // GLOBAL_BATCH * EPOCHS
TARGETS = ["q_proj", "v_proj"]
LORA = {
    "model": {"task": "causal-lm", "numLabels": None, "maxSeqLength": 48},
    "data": {
        "train": {"uri": str(SFT / "train.jsonl"), "maxSamples": SAMPLES},
        "eval": {"uri": str(SFT / "eval.jsonl"), "maxSamples": 24},
        "promptField": "prompt",
        "responseField": "response",
    },
    "training": {
        "epochs": EPOCHS,
        "learningRate": 1e-2,
        "warmupRatio": 0.0,
        "weightDecay": 0.0,
        "precision": "fp32",
        "evalEverySteps": STEPS // 2,
    },
    "adapter": {"rank": 4, "alpha": 8, "dropout": 0.0, "targetModules": TARGETS, "merge": True},
    "evaluation": {"generate": {"maxNewTokens": 3, "records": 8}},
    "checkpoint": {"everySteps": 4},
}


def lora_job(name: str, model: Path, *specs: dict):
    return job(name, LORA, *specs, model=model)


@pytest.fixture(scope="module")
def two_ranks(ray_local, tiny_lm, tmp_path_factory):
    run = settings(
        lora_job("lora", tiny_lm, {"resources": {"workers": 2}, "training": {"batchSizePerWorker": GLOBAL_BATCH // 2}}),
        tmp_path_factory.mktemp("lora"),
    )
    return run, run_local(run, console=False)


def base_model(path: Path):
    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_only_the_adapter_trains_and_the_base_stays_bit_identical(two_ranks, tiny_lm):
    _, outcome = two_ranks
    summary = outcome.summary
    merged = load_file(str(Path(summary["merged_model_path"]) / "model.safetensors"))
    original = load_file(str(tiny_lm / "model.safetensors"))
    assert merged.keys() == original.keys()
    adapted = [name for name in original if any(f".{t}." in name for t in TARGETS)]
    assert len(adapted) == 4  # q_proj and v_proj of both layers
    for name, value in original.items():
        if name not in adapted:
            assert torch.equal(merged[name], value), name  # never trained: bit for bit the base
    fresh = PeftModel.from_pretrained(base_model(tiny_lm), summary["model_path"]).merge_and_unload()
    for name in adapted:  # the base plus the exported adapter, merged here: so the base under it never moved
        torch.testing.assert_close(merged[name], fresh.state_dict()[name], rtol=0, atol=1e-7)
        assert not torch.equal(merged[name], original[name])  # the adapter did train
    trainable, total = summary["trainable_parameters"], summary["total_parameters"]
    assert trainable == sum(4 * (v.shape[0] + v.shape[1]) for k, v in original.items() if k in adapted)
    assert total == trainable + sum(v.numel() for k, v in original.items() if k != "lm_head.weight")


def test_the_adapter_loads_with_peft_and_the_merged_model_gives_its_logits(two_ranks, tiny_lm):
    _, outcome = two_ranks
    summary = outcome.summary
    adapter = Path(summary["model_path"])
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    with_adapter = PeftModel.from_pretrained(base_model(tiny_lm), adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(summary["merged_model_path"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    ids = tokenizer(["question : what colour is the zorb ? answer :"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter(ids).logits, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(base_model(tiny_lm)(ids).logits, merged(ids).logits)


def test_checkpoints_hold_the_adapter_and_its_optimiser_state_only(two_ranks):
    run, outcome = two_ranks
    states = sorted(Path(run.run_path).glob(f"checkpoint_*/{WEIGHTS_FILE}"))
    assert states
    saved = torch.load(states[-1], map_location="cpu", weights_only=True)
    assert saved["model"] and all("lora_" in name for name in saved["model"])
    adapter_values = sum(t.numel() for t in saved["model"].values())
    assert adapter_values == outcome.summary["trainable_parameters"]
    moments = saved["optimizer"]["state"].values()
    assert sum(s["exp_avg"].numel() for s in moments) == adapter_values


def test_a_language_model_reports_perplexity_exact_match_and_samples_never_in_status(two_ranks):
    run, outcome = two_ranks
    summary = outcome.summary
    assert summary["steps"] == STEPS and summary["world_size"] == 2
    assert summary["eval_perplexity"] == pytest.approx(math.exp(summary["eval_loss"]))
    assert 0 <= summary["eval_exact_match"] <= 1 and "eval_accuracy" not in summary
    samples = summary["generation_samples"]
    assert 1 <= len(samples) <= 3 and {"prompt", "output", "reference"} == set(samples[0])
    assert samples[0]["prompt"].startswith("question :")
    reports = [
        ProgressReport.model_validate_json(line) for line in Path(run.log_dir, "metrics.jsonl").read_text().splitlines()
    ]
    assert reports[-1].metrics.eval_perplexity == pytest.approx(summary["eval_perplexity"])
    assert reports[-1].metrics.trainable_parameters == summary["trainable_parameters"]
    files = summary["truncation"]  # what maxSeqLength did, counted over both ranks: the whole of each file
    assert (files["train"]["records"], files["eval"]["records"]) == (SAMPLES, 24)
    assert reports[-1].metrics.records_dropped == files["train"]["dropped"] + files["eval"]["dropped"]
    assert all("generation" not in line for line in Path(run.log_dir, "metrics.jsonl").read_text().splitlines())
    assert "generated for" in Path(run.log_dir, "rank-0.log").read_text()


@pytest.fixture(scope="module")
def one_rank(ray_local, tiny_lm, tmp_path_factory):
    """One rank with the whole global batch."""
    spec = {"resources": {"workers": 1}, "training": {"batchSizePerWorker": GLOBAL_BATCH}}
    return run_local(settings(lora_job("lora-one", tiny_lm, spec), tmp_path_factory.mktemp("one")), console=False)


def adapter_weights(summary: dict) -> dict[str, torch.Tensor]:
    return load_file(str(Path(summary["model_path"]) / "adapter_model.safetensors"))


def assert_trained_alike(mine: dict, theirs: dict) -> None:
    """Two runs ended with the same adapter, merged model and evaluation, up to float rounding."""
    for weights in (adapter_weights, lambda s: load_file(str(Path(s["merged_model_path"]) / "model.safetensors"))):
        found, expected = weights(mine), weights(theirs)
        assert found.keys() == expected.keys()
        for name, value in found.items():
            torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5, msg=name)
    assert mine["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=1e-4)


def test_one_rank_with_the_global_batch_trains_what_two_ranks_do(two_ranks, one_rank):
    """Each step's two ranks hold different numbers of response tokens: the loss is the mean over all of them,
    so one rank with the whole global batch ends with the same adapter."""
    _, two = two_ranks
    assert_trained_alike(two.summary, one_rank.summary)


@pytest.fixture(scope="module")
def sharded(ray_local, tiny_lm, tmp_path_factory):
    """Two ranks with FSDP (on CPUs, a pod holds one rank: they shard over the job)."""
    spec = {"resources": {"workers": 2}, "training": {"batchSizePerWorker": GLOBAL_BATCH // 2, "sharding": "fsdp"}}
    run = settings(lora_job("lora-fsdp", tiny_lm, spec), tmp_path_factory.mktemp("fsdp"))
    return run, run_local(run, console=False)


def evaluations(run) -> list[tuple[int, float]]:
    """The evaluation curve: (step, eval loss) of each report with a new evaluation."""
    lines = Path(run.log_dir, "metrics.jsonl").read_text().splitlines()
    found = {}
    for report in map(ProgressReport.model_validate_json, lines):
        found.setdefault(report.metrics.eval_loss, report.progress.step)
    return sorted((step, loss) for loss, step in found.items() if loss is not None)


def test_two_ranks_sharded_with_fsdp_train_what_one_rank_with_the_global_batch_does(sharded, one_rank, two_ranks):
    run, outcome = sharded
    assert_trained_alike(outcome.summary, one_rank.summary)
    curve, data_parallel = evaluations(run), evaluations(two_ranks[0])
    assert [step for step, _ in curve] == [step for step, _ in data_parallel] == [STEPS // 2, STEPS]
    for (_, loss), (_, expected) in zip(curve, data_parallel, strict=True):
        assert loss == pytest.approx(expected, rel=1e-4)  # fsdp and none: the same curve
    checksums = {r.weights_checksum for r in outcome.final_ranks}
    assert len(checksums) == 1
    shards = sorted(Path(run.run_path).glob("checkpoint_*/sharded/__*_0.distcp"))
    assert {p.name for p in shards} == {"__0_0.distcp", "__1_0.distcp"}  # every rank wrote its own shards


def test_a_sharded_checkpoint_of_two_ranks_resumes_on_one_and_continues_its_curve(sharded, ray_local, tiny_lm):
    """It resumes in flat rows (`attentionImplementation: varlen`) of a token budget (`tokensPerWorker`): each step
    is one row of at most that many tokens, none of them padding, and the epoch still trains every record once."""
    run, first = sharded
    budget = 160
    spec = {
        "resources": {"workers": 1},
        "training": {
            "tokensPerWorker": budget,
            "attentionImplementation": "varlen",
            "sharding": "fsdp",
            "epochs": EPOCHS + 1,
        },
    }
    again = settings(lora_job("lora-fsdp", tiny_lm, spec), Path(run.storage))
    outcome = run_local(again, console=False)
    summary = outcome.summary
    assert summary["resumed_from_step"] == STEPS and summary["world_size"] == 1
    assert_continues(again, outcome)
    before, after = first.final_ranks, outcome.final_ranks[0]
    steps = summary["steps"] - STEPS
    assert steps > SAMPLES // GLOBAL_BATCH  # steps of 160 tokens hold fewer records than 16 do
    assert after.samples - sum(r.samples for r in before) == SAMPLES  # the epoch: every record once
    computed = after.padded_tokens - sum(r.padded_tokens for r in before)
    assert computed == after.tokens - sum(r.tokens for r in before) <= steps * budget  # no padding, within budget


def assert_continues(run, outcome) -> None:
    """A run that resumed at STEPS went on near the loss it had reached, far below where it started."""
    reports = [
        ProgressReport.model_validate_json(line) for line in Path(run.log_dir, "metrics.jsonl").read_text().splitlines()
    ]
    before = [r.metrics.train_loss for r in reports if r.progress.step <= STEPS and r.metrics.train_loss]
    after = [r.metrics.train_loss for r in reports if r.progress.step > STEPS and r.metrics.train_loss]
    # An adapter on a randomly initialised model learns slowly: the curve falls by a few tenths in these steps,
    # ten times its steps' spread. The resumed run goes on near where the first stopped, not where it started.
    assert after and after[0] < before[0] - 0.15
    assert abs(after[0] - before[-1]) < 0.1


def test_a_resumed_adapter_run_continues_its_loss_curve_with_packing(two_ranks, ray_local, tiny_lm):
    """The same job with one more epoch, its records packed, on the same storage: it resumes from the adapter's
    last checkpoint and goes on from the loss it had reached."""
    run, _ = two_ranks
    more = lora_job(
        "lora",
        tiny_lm,
        {
            "resources": {"workers": 2},
            "training": {"batchSizePerWorker": GLOBAL_BATCH // 2, "epochs": EPOCHS + 1, "packing": True},
        },
    )
    again = settings(more, Path(run.storage))
    outcome = run_local(again, console=False)
    assert outcome.summary["resumed_from_step"] == STEPS
    assert outcome.summary["steps"] == STEPS // EPOCHS * (EPOCHS + 1)
    assert_continues(again, outcome)


def test_a_search_over_learning_rate_and_rank_picks_the_trial_of_lowest_perplexity(ray_local, tiny_lm, tmp_path):
    search = {
        "resources": {"workers": 1},
        "training": {"batchSizePerWorker": GLOBAL_BATCH, "epochs": 1},
        "evaluation": {"generate": None},
        "adapter": {"merge": False},
        "tuning": {
            "searchSpace": {"learningRate": {"min": 1e-3, "max": 3e-2}, "adapterRank": [2, 8]},
            "numTrials": 2,
            "seed": 5,
            "scheduler": {"type": "None"},
        },
    }
    run = settings(lora_job("lora-search", tiny_lm, search), tmp_path)
    summary = run_local(run, console=False).summary
    assert (summary["metric"], summary["mode"]) == ("evalPerplexity", "min")
    trials = summary["trials"]
    assert len(trials) == 2 and {t["state"] for t in trials} == {"Succeeded"}
    assert sorted(t["config"]["adapter_rank"] for t in trials) == [2, 8]  # what seed 5 draws
    best = min(trials, key=lambda t: t["metric"])
    assert summary["best_trial"] == best["id"] and summary["eval_perplexity"] == best["metric"]
    for trial in trials:  # each trial trained an adapter of the rank it drew
        config = json.loads(Path(trial["model_path"], "adapter_config.json").read_text())
        assert config["r"] == trial["config"]["adapter_rank"] and config["lora_alpha"] == 8  # adapter.alpha stays
    assert json.loads(Path(run.model_output, "adapter_config.json").read_text())["r"] == best["config"]["adapter_rank"]

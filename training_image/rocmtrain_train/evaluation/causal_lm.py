"""Evaluating a causal language model: loss and perplexity over the tokens that carry loss, and greedy
generation on held-out prompts scored by exact match against their responses.

Each rank sums over its shard; the sums are all-reduced, so every rank gets the same metrics. Generation
runs on the first `evaluation.generate.records` evaluation records (shared out like the rest), with the
prompts left-padded into batches; a few samples (truncated) go to the log and the run's summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rocmtrain.api.models import GenerateSpec
from rocmtrain_train.collectives import MAX, over_ranks
from rocmtrain_train.data.causal_lm.tokens import IGNORE
from rocmtrain_train.data.tokens import Encoded
from rocmtrain_train.evaluation.batches import Counted
from rocmtrain_train.reporting.rank_report import Evaluation

# Samples kept per evaluation, and the characters kept of each text in them.
SAMPLES = 3
SAMPLE_CHARS = 200
# exp() of a larger loss overflows a float: perplexity then reads as the largest finite value it has.
MAX_LOG_PERPLEXITY = 690.0

Sample = dict[str, str]


def normalise(text: str) -> str:
    """Text as exact match compares it: whitespace runs as single spaces, none at the ends."""
    return " ".join(text.split())


def truncated(text: str, limit: int = SAMPLE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Generated:
    """What generation on one rank's prompts gave."""

    hits: int
    count: int
    samples: list[Sample]


def metrics_from_sums(sums: list[float], generate: bool) -> Evaluation:
    """Evaluation metrics from (all-reduced) sums [loss over tokens, tokens, exact matches, generated]."""
    loss, tokens, hits, generated = sums
    if not tokens:
        return {}
    mean = loss / tokens
    found = {"eval_loss": mean, "eval_perplexity": math.exp(min(mean, MAX_LOG_PERPLEXITY))}
    if generate and generated:
        found["eval_exact_match"] = hits / generated
    return found


@torch.no_grad()
def loss_sums(
    model: torch.nn.Module,
    batches: Iterable[Counted],
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> torch.Tensor:
    """[loss summed over the tokens that carry it, those tokens] of this rank's counted batches (on the device)."""
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for batch, counted in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast():
            out = model(**batch)
        if counted:
            count = (batch["labels"][:, 1:] != IGNORE).sum()
            sums += torch.stack([out.loss.double() * count, count.double()])
    return sums


def _prompts(encoded: Encoded, rows: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """The prompt and the reference response (token ids) of each record."""
    assert encoded.response_starts is not None
    prompts, references = [], []
    for row in rows:
        start, end = int(encoded.offsets[row]), int(encoded.offsets[row + 1])
        split = start + int(encoded.response_starts[row])
        prompts.append(encoded.ids[start:split].tolist())
        references.append(encoded.ids[split:end].tolist())
    return prompts, references


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    encoded: Encoded,
    rows: list[int],
    spec: GenerateSpec,
    *,
    batch_size: int,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
    lockstep: bool = False,
) -> Generated:
    """Greedy responses to the prompts of `rows`, compared with their references. In `lockstep`, every rank calls
    `generate` as often as the rank with the most prompts (a filler prompt where it has none left), and each call
    runs until every rank's answers are done (`synced_gpus`)."""
    prompts, references = _prompts(encoded, rows)
    hits, samples = 0, list[Sample]()
    pad = tokenizer.pad_token_id
    starts = range(0, len(prompts), batch_size)
    calls = int(over_ranks([len(starts)], MAX, device)[0]) if lockstep else len(starts)
    for call in range(calls):
        start = call * batch_size
        chunk = prompts[start : start + batch_size] or [[tokenizer.eos_token_id]]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        with autocast():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=spec.max_new_tokens,
                do_sample=False,
                use_cache=True,
                pad_token_id=pad,
                eos_token_id=tokenizer.eos_token_id,
                synced_gpus=lockstep,
            )
        if start >= len(prompts):  # a filler call
            continue
        for i, new in enumerate(out[:, width:].tolist()):
            output = tokenizer.decode(new, skip_special_tokens=True)
            reference = tokenizer.decode(references[start + i], skip_special_tokens=True)
            hits += normalise(output) == normalise(reference)
            if len(samples) < SAMPLES:
                prompt = tokenizer.decode(chunk[i], skip_special_tokens=True)
                samples.append(
                    {"prompt": truncated(prompt), "output": truncated(output), "reference": truncated(reference)}
                )
    return Generated(hits, len(prompts), samples)


def evaluate_lm(
    model: torch.nn.Module,
    batches: Iterable[Counted],
    generated: Callable[[], Generated] | None,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> tuple[Evaluation, list[Sample]]:
    """Evaluate this rank's shard (and generate, where `generated` is given) and all-reduce the sums; every rank
    returns the same metrics, and its own samples."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    sums[:2] = loss_sums(model, batches, device, autocast)
    found = generated() if generated is not None else Generated(0, 0, [])
    sums[2:] = torch.tensor([found.hits, found.count], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    model.train(was_training)
    return metrics_from_sums(sums.tolist(), generated is not None), found.samples

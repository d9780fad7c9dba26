"""The causal-LM loss's peak memory on CPU: transformers' loss against ours (chunked), forward and backward.

transformers' arm is what a causal LM computes with labels: the output head over every token (`F.linear`), then
`ForCausalLMLoss` (float32 logits, cross-entropy with -100 ignored, the sum over `num_items_in_batch`). Ours is
`rocmtrain_train.model.linear_loss.linear_cross_entropy`, the training image's default loss: the head and the
cross-entropy a chunk of tokens at a time.

Each arm runs in a fresh Python process, in float32: it makes the inputs (hidden states, the head's weight, labels
with a tenth ignored, from a fixed seed), resets the process's peak resident memory (`/proc/self/clear_refs` 5),
runs the loss's forward and backward pass, and reports its peak resident memory above the inputs' (VmHWM less
the VmRSS at the reset): the logits, the loss's temporaries and the gradients (of the hidden states and the
weight, 1 GiB at the full size). Both arms' losses and gradients are compared, and the run fails where they
differ by more than float32's rounding. Linux only (/proc).

    python bench/lm_loss_memory.py            # vocabulary 128,256, hidden 2,048, 8,192 tokens (~15 GB free)
    python bench/lm_loss_memory.py --smoke    # tiny sizes, seconds (tests/bench/test_lm_loss_memory.py runs it)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ARMS = ("transformers", "chunked")
FULL = {"vocabulary": 128_256, "hidden": 2_048, "tokens": 8_192}
SMOKE = {"vocabulary": 1_000, "hidden": 64, "tokens": 512}
IGNORED = 0.1  # the share of labels that carry no loss
MIB = 2**20
# Loss and gradients agree where they differ by at most this, relative to their largest magnitude.
TOLERANCE = 1e-4


def _status_kib(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert found is not None, field
    return int(found.group(1))


def run_arm(arm: str, vocabulary: int, hidden: int, tokens: int, grads_path: Path) -> dict[str, Any]:
    """One arm's loss, forward and backward, in this process: its peak resident bytes above the inputs', its loss and
    its seconds; its gradients saved to `grads_path`."""
    import torch
    import torch.nn.functional as F
    from transformers.loss.loss_utils import ForCausalLMLoss

    from rocmtrain_train.model.linear_loss import IGNORE, linear_cross_entropy

    def inputs(tokens: int) -> tuple[Any, Any, Any, Any]:
        generator = torch.Generator().manual_seed(0)
        states = torch.randn(1, tokens, hidden, generator=generator, requires_grad=True)
        weight = (torch.randn(vocabulary, hidden, generator=generator) / hidden**0.5).requires_grad_()
        labels = torch.randint(0, vocabulary, (1, tokens), generator=generator)
        labels[torch.rand(labels.shape, generator=generator) < IGNORED] = IGNORE
        return states, weight, labels, (labels[:, 1:] != IGNORE).sum()

    def loss_of(states: Any, weight: Any, labels: Any, items: Any) -> Any:
        if arm == "transformers":
            return ForCausalLMLoss(F.linear(states, weight), labels, vocabulary, num_items_in_batch=items)
        return linear_cross_entropy(states, weight, None, labels, items)

    loss_of(*inputs(8)).backward()  # the kernels' first use (their buffers, thread pools) before measuring
    states, weight, labels, items = inputs(tokens)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
    base = _status_kib("VmRSS")
    start = time.perf_counter()
    loss = loss_of(states, weight, labels, items)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = (_status_kib("VmHWM") - base) * 1024
    assert states.grad is not None and weight.grad is not None
    torch.save({"loss": loss.detach(), "hidden": states.grad, "weight": weight.grad}, grads_path)
    return {"arm": arm, "peak_bytes": peak, "loss": float(loss), "seconds": round(seconds, 2)}


def _spawn(arm: str, sizes: dict[str, int], grads_path: Path) -> dict[str, Any]:
    """`run_arm` in a fresh Python process (nothing allocated before it but the inputs)."""
    flags = [f"--{name}={value}" for name, value in sizes.items()]
    command = [sys.executable, __file__, "--arm", arm, "--grads", str(grads_path), *flags]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"arm {arm} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _difference(found: Any, expected: Any) -> float:
    """The largest difference of two tensors, relative to the second's largest magnitude."""
    return float((found - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def measure(sizes: dict[str, int]) -> dict[str, Any]:
    """Both arms at `sizes`, each in its own process; their peaks, ours over transformers', and how far apart their
    loss and gradients are."""
    import torch

    with tempfile.TemporaryDirectory() as folder:
        arms = {arm: _spawn(arm, sizes, Path(folder) / f"{arm}.pt") for arm in ARMS}
        theirs, ours = (torch.load(Path(folder) / f"{arm}.pt") for arm in ARMS)
        differences = {name: _difference(ours[name], theirs[name]) for name in ("loss", "hidden", "weight")}
    ratio = arms["chunked"]["peak_bytes"] / arms["transformers"]["peak_bytes"]
    return {
        "sizes": sizes,
        "arms": list(arms.values()),
        "ratio": round(ratio, 4),
        "differences": differences,
        "agree": all(d <= TOLERANCE for d in differences.values()),
    }


def smoke() -> dict[str, Any]:
    """`--smoke`: both arms at tiny sizes."""
    return measure(SMOKE)


def table(report: dict[str, Any]) -> str:
    sizes = report["sizes"]
    lines = [
        f"vocabulary {sizes['vocabulary']:,}, hidden {sizes['hidden']:,}, {sizes['tokens']:,} tokens, float32",
        f"{'arm':<14}{'peak MiB':>12}{'loss':>12}{'seconds':>10}",
        *(f"{a['arm']:<14}{a['peak_bytes'] / MIB:>12,.1f}{a['loss']:>12.6f}{a['seconds']:>10}" for a in report["arms"]),
        f"chunked / transformers: {report['ratio']:.3f}",
        "largest differences (relative): " + ", ".join(f"{k} {v:.1e}" for k, v in report["differences"].items()),
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    found.add_argument("--smoke", action="store_true", help="tiny sizes: " + json.dumps(SMOKE))
    for name, value in FULL.items():
        found.add_argument(f"--{name}", type=int, default=value)
    found.add_argument("--out", type=Path, default=Path("lm_loss_memory.json"), help="JSON results file")
    found.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm, in this process
    found.add_argument("--grads", type=Path, help=argparse.SUPPRESS)
    return found


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    sizes = SMOKE if args.smoke else {name: getattr(args, name) for name in FULL}
    if args.arm is not None:
        print(json.dumps(run_arm(args.arm, sizes["vocabulary"], sizes["hidden"], sizes["tokens"], args.grads)))
        return 0
    report = measure(sizes)
    print(table(report))
    args.out.write_text(json.dumps(report, indent=2))
    return 0 if report["agree"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`rocmtrain plan`: the memory plan per GPU of each job in a file, from the model's config.json alone.

Exit 0 when every job fits (or cannot be told: no GPU memory known, or a CPU job), 1 when one does not,
2 on a bad job or a config.json it cannot find or read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rocmtrain import cli
from unit.samples import EXAMPLES

EXAMPLE = EXAMPLES / "cluster-llama-70b-lora-fsdp-mi300x.yaml"
CONFIG_70B = EXAMPLES / "models" / "llama-3.1-70b" / "config.json"
CONFIG_8B = EXAMPLES / "models" / "llama-3.1-8b" / "config.json"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def edited(tmp_path: Path, source: Path = EXAMPLE, **spec: dict) -> Path:
    """The example job with parts of its spec replaced."""
    raw = yaml.safe_load(source.read_text())
    raw["spec"].update(spec)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_70b_lora_example_fits_eight_mi300x(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(EXAMPLE), "--config", str(CONFIG_70B))
    assert (code, err) == (0, "")
    assert (
        "model:  llama, 70,619,242,496 parameters (saved as bfloat16, trained from bfloat16), 65,536,000 train, "
        "a LoRA adapter of rank 16"
    ) in out
    assert "ranks:  8 (1 x 8 GPUs), fsdp over 8 GPUs, a LoRA adapter, bf16, micro-batch 1 x 8192 tokens" in out
    assert "GPU:    192.0 GiB (AMD_Instinct_MI300X_OAM, AMD's data sheet)" in out
    total = json.loads(run(capsys, str(EXAMPLE), "--config", str(CONFIG_70B), "-o", "json")[1])["perGpuBytes"]
    assert f"peak:   the step, {total / (1 << 30):.1f} GiB per GPU" in out
    assert out.splitlines()[-1] == f"fits:   yes, {(192 << 30) / (1 << 30) - total / (1 << 30):.1f} GiB to spare"


def test_json_carries_the_bytes_of_every_part_of_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(EXAMPLE), "--config", str(CONFIG_70B), "-o", "json")
    plan = json.loads(out)
    phases = plan["phases"]
    assert code == 0 and plan["fits"] is True and plan["changesThatFit"] == []
    assert list(phases) == ["load", "step", "evaluation"] and plan["peakPhase"] == "step"
    for parts in phases.values():
        assert parts["total"] == sum(v for k, v in parts.items() if k not in ("total", "logits"))
    assert plan["perGpuBytes"] == max(p["total"] for p in phases.values()) == phases["step"]["total"]
    assert phases["load"]["readBuffer"] == 128_256 // 8 * 8192 * 2 == plan["hostLoadBytesPerPod"] // 8
    assert plan["gpuMemory"] == {"bytes": 192 << 30, "source": "AMD_Instinct_MI300X_OAM, AMD's data sheet"}
    assert plan["ranks"]["shardGroup"] == 8 and plan["model"]["trainableParameters"] == 65_536_000
    assert (plan["ranks"]["evalMicroBatch"], plan["ranks"]["generationBatch"]) == (2, None)


def cells(out: str, term: str) -> list[str]:
    """The cells of one row of the table of parts, by its label (the description left out)."""
    (line,) = [line for line in out.splitlines() if line.startswith(term + "  ")]
    return line.removeprefix(term).split()


@pytest.mark.parametrize(("gpu", "spare"), [("MI250X", "19.8"), ("MI300X", "147.8")])
def test_the_70b_example_prints_each_term_of_each_phase(
    capsys: pytest.CaptureFixture[str], gpu: str, spare: str
) -> None:
    """Loaded sharded, the 70B example's peak is its training step, 44.2 GiB: it fits an MI250X's 64 GiB too."""
    code, out, _ = run(capsys, str(EXAMPLE), "--config", str(CONFIG_70B), "--gpu", gpu)
    assert code == 0
    assert "per GPU, GiB      load   step   evaluation   what" in out
    assert "load         each rank fills its 1/8 shard (bfloat16) from the safetensors files; the pod's host " in out
    assert "step         micro-batches of 1 x 8192 tokens, packed rows: forward, backward, AdamW's update" in out
    assert "evaluation   micro-batches of 2 x 8192 tokens (twice batchSizePerWorker, padded): forward only" in out
    assert cells(out, "parameters")[:3] == ["16.5", "16.5", "16.5"]
    assert cells(out, "read buffer")[:3] == ["0.2", "-", "-"]
    assert cells(out, "gradients")[:3] == ["-", "0.0", "-"]  # FSDP2's sharded gradients are freed after each step
    assert cells(out, "optimizer state")[:3] == ["-", "0.1", "0.1"]
    assert cells(out, "working copies")[:3] == ["-", "7.1", "7.1"]
    assert cells(out, "activations")[:3] == ["-", "14.7", "3.8"]
    assert cells(out, "  logits")[:3] == ["-", "0.5", "0.7"]  # the chunked loss's
    assert cells(out, "margin")[:3] == ["3.7", "5.8", "4.7"]
    assert cells(out, "total") == ["20.4", "44.2", "32.1", "per", "GPU"]
    assert "KV cache" not in out  # no generation
    assert out.splitlines()[-3:-1] == ["peak:   the step, 44.2 GiB per GPU", f"GPU:    {INSTINCT[gpu]}"]
    assert out.splitlines()[-1] == f"fits:   yes, {spare} GiB to spare"


INSTINCT = {"MI250X": "64.0 GiB (MI250X, AMD's data sheet)", "MI300X": "192.0 GiB (MI300X, AMD's data sheet)"}


def test_the_8b_example_peaks_in_the_step_and_prints_generation_s_kv_cache(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, str(EXAMPLES / "cluster-llama-lora-mi300x.yaml"), "--config", str(CONFIG_8B))
    assert code == 0
    assert "per GPU, GiB      load   step   evaluation   generation   what" in out
    assert "generation   8 prompts of up to 4096 tokens a call, 256 new tokens each: greedy, with a KV cache" in out
    assert "the pod's host holds 120.9 GiB (8 whole models), of its 1024Gi memoryPerWorker" in out
    assert cells(out, "gradients")[:4] == ["-", "0.2", "0.2", "0.2"]  # DDP's buckets stay
    assert cells(out, "  logits")[:4] == ["-", "0.5", "0.7", "0.0"]  # the chunked loss's
    assert cells(out, "KV cache")[:5] == ["-", "-", "-", "4.2", "keys"]
    assert "read buffer" not in out  # loaded whole
    assert cells(out, "total") == ["18.6", "29.9", "23.4", "28.0", "per", "GPU"]
    assert "peak:   the step, 29.9 GiB per GPU" in out


def test_a_job_that_does_not_fit_exits_1_with_the_cheapest_changes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    del raw["spec"]["adapter"]
    raw["spec"]["training"].update(sharding="none", gradientCheckpointing=False)
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(raw))
    code, out, err = run(capsys, str(tmp_path / "full.yaml"), "--config", str(CONFIG_8B), "--gpu", "MI250X")
    assert (code, err) == (1, "")
    verdict = out.splitlines()[-1]
    assert verdict.startswith("fits:   no: needs ")
    assert (
        "per GPU with sharding none, full fine-tuning, but a GPU has 64.0 GiB (MI250X, AMD's data sheet); " in verdict
    )
    assert "fits with fsdp over 8 GPUs and gradientCheckpointing (" in verdict
    code, out, _ = run(capsys, str(tmp_path / "full.yaml"), "--config", str(CONFIG_8B), "--gpu", "MI250X", "-o", "json")
    assert code == 1 and json.loads(out)["fits"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "missing.json"], "missing.json: No such file or directory"),
        ([], "/models/Llama-3.1-70B-Instruct/config.json: No such file or directory"),
        (["--config", str(EXAMPLE)], "not JSON"),
        (["--config", str(CONFIG_70B), "--gpu", "H100"], "--gpu H100: not an AMD Instinct model the plan knows"),
    ],
)
def test_a_config_it_cannot_read_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, str(EXAMPLE), *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"{EXAMPLE}: reports-llama-70b-lora: ") and message in err


def test_a_bad_job_exits_2_with_every_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = edited(tmp_path, training={"sharding": "zero3"})
    code, out, err = run(capsys, str(path), "--config", str(CONFIG_70B))
    assert (code, out) == (2, "")
    assert "spec.training.sharding" in err


def test_a_model_type_the_plan_does_not_know_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    code, _, err = run(capsys, str(EXAMPLE), "--config", str(tmp_path / "config.json"))
    assert code == 2 and "model_type 'bert' is not one the memory plan knows" in err


def test_the_nodes_labels_give_the_gpu_memory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`kubectl get nodes -o json`: the MI300X nodes are partitioned (CPX: 24 GiB per GPU), and the plan says so."""
    node = {
        "metadata": {
            "name": "mi300x-cpx",
            "labels": {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "amd.com/gpu.vram": "24G"},
        },
        "status": {"allocatable": {"amd.com/gpu": "64"}},
    }
    (tmp_path / "nodes.json").write_text(json.dumps({"kind": "List", "items": [node]}))
    code, out, _ = run(capsys, str(EXAMPLE), "--config", str(CONFIG_70B), "--nodes", str(tmp_path / "nodes.json"))
    assert "GPU:    24.0 GiB (amd.com/gpu.vram 24G on node mi300x-cpx)" in out
    assert code == 1 and "fits:   no: needs " in out


def test_a_hub_model_is_read_from_the_hugging_face_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(CONFIG_8B.read_text())
    (cache / "models--meta-llama--Llama-3.1-8B" / "refs").mkdir()
    (cache / "models--meta-llama--Llama-3.1-8B" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    path = edited(tmp_path, model={"source": "hf://meta-llama/Llama-3.1-8B", "task": "causal-lm", "maxSeqLength": 512})
    code, out, _ = run(capsys, str(path))
    assert (
        code == 0
        and ("model:  llama, 8,043,892,736 parameters (saved as bfloat16, trained from bfloat16), 13,631,488 train")
        in out
    )
    missing = edited(tmp_path, model={"source": "meta-llama/Llama-3.1-70B", "task": "causal-lm"})
    code, _, err = run(capsys, str(missing))
    assert code == 2 and f"meta-llama/Llama-3.1-70B is not in the Hugging Face cache ({cache})" in err


def test_a_cpu_job_is_planned_with_nothing_to_fit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    resources = {"workers": 2, "gpusPerWorker": 0}
    code, out, _ = run(capsys, str(edited(tmp_path, resources=resources)), "--config", str(CONFIG_8B))
    assert code == 0 and out.splitlines()[-1] == "fits:   a CPU job has no GPU memory to fit"


def test_plan_imports_no_heavy_modules() -> None:
    """The operator image has no torch, transformers or hub client: `plan` needs none."""
    code = (
        "import sys; from rocmtrain import cli; cli.main(['plan', sys.argv[1], '--config', sys.argv[2]]); "
        "heavy = {'torch', 'ray', 'kopf', 'kubernetes', 'kubernetes_asyncio', 'transformers', 'huggingface_hub'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE), str(CONFIG_70B)], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines()[-1] == "[]"


def test_a_flat_row_of_a_token_budget_is_planned_as_its_tokens_without_a_mask_on_gpus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The 70B example padding-free (`varlen`) in rows of 16,384 tokens: the step is one row of the budget's tokens,
    flash-attention's kernel holds no mask, and evaluation still runs padded records of maxSeqLength."""
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]["training"]
    flat = {**raw, "packing": False, "attentionImplementation": "varlen", "tokensPerWorker": 16384}
    code, out, _ = run(capsys, str(edited(tmp_path, training=flat)), "--config", str(CONFIG_70B))
    assert code == 0
    step = (
        "one flat row of up to 16384 tokens (a token budget), padding-free (flash-attention's variable-length kernel)"
    )
    assert f"step         {step}: forward, backward, AdamW's update" in out
    assert "evaluation   micro-batches of 2 x 8192 tokens (twice batchSizePerWorker, padded): forward only" in out
    plan = json.loads(run(capsys, str(edited(tmp_path, training=flat)), "--config", str(CONFIG_70B), "-o", "json")[1])
    packed = json.loads(run(capsys, str(EXAMPLE), "--config", str(CONFIG_70B), "-o", "json")[1])
    # twice the tokens of the example's packed row, without its 8192² mask per block: less than twice its activations
    assert packed["phases"]["step"]["activations"] < plan["phases"]["step"]["activations"]
    assert plan["phases"]["step"]["activations"] < 2 * packed["phases"]["step"]["activations"]

"""Bad jobs fail on the driver before any worker starts, with a message naming the problem.

These use the real model files and the real quickstart data; only the faulty part is changed.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoConfig, AutoTokenizer, ViTConfig

from rocmtrain.api.contract import JOB_ENV
from rocmtrain.api.errors import ConfigError
from rocmtrain.plan.fit import plan_job
from rocmtrain.plan.gpu_memory import job_gpu_memory
from rocmtrain_train.cli import run as cli
from rocmtrain_train.data.records import read_table
from rocmtrain_train.driver import train_job as local
from rocmtrain_train.driver.driver_checks import check_data, preflight
from rocmtrain_train.model.pretrained import position_limit
from train.jobs import EXAMPLES, job, settings
from train.test_object_store_checks import buckets


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"data": {"textField": "body"}}, r"train.jsonl: no field 'body' \(fields: text, label\)"),
        ({"model": {"numLabels": 2}}, r"label 2 out of range 0\.\.1"),
        ({"data": {"train": {"uri": "./data/missing.jsonl"}}}, "missing.jsonl: no such file or folder"),
        ({"model": {"source": "/nonexistent/model"}}, "model not found: /nonexistent/model has no config.json"),
        ({"resources": {"workers": 3}, "data": {"train": {"maxSamples": 2}}}, "2 training records for 3 ranks"),
    ],
)
def test_bad_jobs_are_named(tmp_path, spec, message):
    with pytest.raises(ConfigError, match=message):
        preflight(settings(job("bad", spec), tmp_path))


def test_an_empty_data_set_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("")
    bad = job("empty", {"data": {"train": {"uri": "./data/train.jsonl"}, "eval": None}})
    with pytest.raises(ConfigError, match=r"train\.jsonl: no records"):
        preflight(settings(bad, tmp_path / "runs", job_dir=tmp_path))


def test_an_unreadable_file_is_refused(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"text": "fine", "label": 1}\n{"text": broken\n')
    bad = job("corrupt", {"data": {"train": {"uri": str(tmp_path / "train.jsonl")}}})
    with pytest.raises(ConfigError, match=r"cannot read .*train\.jsonl as jsonl"):
        preflight(settings(bad, tmp_path / "runs"))


def test_a_hub_model_that_is_neither_installed_nor_cached_is_refused_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    bad = job("nomodel", {"model": {"source": "example-org/no-such-model"}})
    with pytest.raises(ConfigError, match=r"model 'example-org/no-such-model' not found.*HF_HUB_OFFLINE"):
        preflight(settings(bad, tmp_path))


def test_more_gpus_than_the_machine_has_is_refused(tmp_path):
    greedy = job("greedy", {"resources": {"workers": 2, "gpusPerWorker": 16}})
    with pytest.raises(
        ConfigError, match=r"asks for 32 GPUs \(2 workers x 16 GPUs per worker\) but this machine has 1"
    ):
        preflight(settings(greedy, tmp_path), available_gpus=1)


def test_the_cli_fails_fast_without_starting_training(tmp_path, monkeypatch, capsys):
    """`rocmtrain run` on a job asking for 32 GPUs: this machine's real GPU count is checked (no machine has 32)."""

    def no_training(*args, **kwargs):
        raise AssertionError("training must not start")

    monkeypatch.setattr(local, "run", no_training)
    raw = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    raw["spec"]["resources"].update(workers=2, gpusPerWorker=16)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    started = time.perf_counter()
    assert cli.main([str(tmp_path / "job.yaml"), "--storage", str(tmp_path / "runs")]) == 2
    assert time.perf_counter() - started < 30
    err = capsys.readouterr().err
    assert "asks for 32 GPUs (2 workers x 16 GPUs per worker)" in err and "--cpu" in err


# --- the model fits the job (real tiny models, built offline) --------------------------------------


def test_a_max_seq_length_beyond_the_models_positions_fails_fast_with_exit_code_2(tiny_bert, tmp_path, capsys):
    """`rocmtrain run` stops in the driver's pre-flight, before Ray starts or any weight loads."""
    raw = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    raw["spec"]["model"].update(source=str(tiny_bert), maxSeqLength=256)
    raw["spec"]["data"] = {"train": {"uri": str(EXAMPLES / "data" / "train.jsonl")}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    assert cli.main([str(tmp_path / "job.yaml"), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "spec.model.maxSeqLength: 256 tokens do not fit the 128 positions of model" in err
    assert "set maxSeqLength to at most 128" in err


def test_the_cluster_driver_exits_2_on_a_job_that_cannot_run_so_ray_train_never_retries(
    tiny_bert, tmp_path, monkeypatch, capsys
):
    import ray

    from rocmtrain_train import __main__ as driver

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray must not start")

    monkeypatch.setattr(ray, "init", no_ray)
    cluster_job = job(
        "too-long",
        {
            "model": {"source": str(tiny_bert), "maxSeqLength": 512},
            "data": {"train": {"uri": str(EXAMPLES / "data" / "train.jsonl")}, "eval": None},
            "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": "runs"}}],
            "volumeMounts": [{"name": "runs", "mountPath": "/mnt/shared"}],  # not under /tmp: the operator's
            "checkpoint": {"storagePath": "/mnt/shared/runs"},  # pre-flight refuses before anything is written
        },
    )
    monkeypatch.setenv(JOB_ENV, cluster_job.model_dump_json(by_alias=True))
    assert driver.main() == 2
    assert "512 tokens do not fit the 128 positions" in capsys.readouterr().err


def test_a_tokenizer_without_padding_or_end_of_sequence_token_is_refused(tiny_llama, tmp_path):
    model = tmp_path / "no-eos"
    shutil.copytree(tiny_llama, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(model)
    bad = job("no-eos", {"model": {"source": str(model), "maxSeqLength": 64}})
    with pytest.raises(ConfigError, match="the tokenizer has neither a padding nor an end-of-sequence token"):
        preflight(settings(bad, tmp_path / "runs"))


def test_a_model_type_without_a_classification_head_is_refused(tmp_path):
    ViTConfig().save_pretrained(tmp_path / "vit")
    bad = job("vit", {"model": {"source": str(tmp_path / "vit")}})
    with pytest.raises(ConfigError, match="no sequence-classification head for model type 'vit'"):
        preflight(settings(bad, tmp_path / "runs"))


@pytest.mark.parametrize(
    ("model_type", "positions", "pad", "limit"),
    [("bert", 512, 0, 512), ("roberta", 514, 1, 512), ("gpt2", 1024, None, 1024)],
)
def test_position_limits(model_type, positions, pad, limit):
    config = AutoConfig.for_model(model_type, max_position_embeddings=positions, pad_token_id=pad)
    assert position_limit(config) == limit


# --- language models: every bad input refused before training, with no traceback ----------------------

SFT = EXAMPLES / "sft" / "data"


def lm_job(name: str, model, *specs: dict):
    base = {
        "model": {"source": str(model), "task": "causal-lm", "numLabels": None, "maxSeqLength": 48},
        "data": {
            "train": {"uri": str(SFT / "train.jsonl")},
            "eval": {"uri": str(SFT / "eval.jsonl")},
            "promptField": "prompt",
            "responseField": "response",
        },
    }
    return job(name, base, *specs)


def chats(path, count: int = 8) -> str:
    import json

    rows = [
        {
            "messages": [
                {"role": "user", "content": f"what colour is the zorb {i} ?"},
                {"role": "assistant", "content": "red"},
            ]
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_language_model_job_passes_the_preflight(tiny_lm, tmp_path):
    preflight(settings(lm_job("fine", tiny_lm, {"adapter": {"targetModules": ["q_proj", "o_proj"]}}), tmp_path))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"data": {"promptField": "question"}}, r"train.jsonl: no field 'question' \(fields: prompt, response\)"),
        (
            {"model": {"maxSeqLength": 8}},
            r"no record keeps a token to learn within spec.model.maxSeqLength \(8 tokens\)",
        ),
        (
            {"adapter": {"targetModules": ["q_proj", "query_key_value"]}},
            r"targetModules: query_key_value match no linear module of the model; its linear modules are "
            r"down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj",
        ),
        ({"model": {"maxSeqLength": 512}}, "512 tokens do not fit the 256 positions"),
    ],
)
def test_bad_language_model_jobs_are_named(tiny_lm, tmp_path, spec, message):
    with pytest.raises(ConfigError, match=message):
        preflight(settings(lm_job("bad", tiny_lm, spec), tmp_path))


def test_an_empty_language_model_data_set_is_refused(tiny_lm, tmp_path):
    (tmp_path / "train.jsonl").write_text("")
    bad = lm_job("empty", tiny_lm, {"data": {"train": {"uri": str(tmp_path / "train.jsonl")}}})
    with pytest.raises(ConfigError, match=r"train\.jsonl: no records"):
        preflight(settings(bad, tmp_path / "runs"))


def test_chats_need_a_chat_template_which_the_job_may_give(tiny_lm, tmp_path):
    model = tmp_path / "no-template"
    shutil.copytree(tiny_lm, model)
    (model / "chat_template.jinja").unlink()
    data = {
        "data": {
            "train": {"uri": chats(tmp_path / "chats.jsonl")},
            "eval": None,
            "promptField": None,
            "responseField": None,
            "messagesField": "messages",
        }
    }
    with pytest.raises(ConfigError, match=r"the tokenizer has no chat template .* set spec\.model\.chatTemplate"):
        preflight(settings(lm_job("chat", model, data), tmp_path / "runs"))
    template = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    preflight(settings(lm_job("chat", model, data, {"model": {"chatTemplate": template}}), tmp_path / "runs"))


def test_a_language_model_without_an_end_of_sequence_token_is_refused(tiny_lm, tmp_path):
    model = tmp_path / "no-eos"
    shutil.copytree(tiny_lm, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(model)
    with pytest.raises(ConfigError, match="the tokenizer has no end-of-sequence token, which every training sequence"):
        preflight(settings(lm_job("no-eos", model), tmp_path / "runs"))


def test_a_bad_language_model_job_fails_the_cli_with_exit_code_2_and_no_traceback(tiny_lm, tmp_path, capsys):
    raw = lm_job("bad-cli", tiny_lm, {"adapter": {"targetModules": ["c_attn"]}}).dump()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    assert cli.main([str(tmp_path / "job.yaml"), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "c_attn match no linear module of the model" in err and "Traceback" not in err


# --- the memory plan: a GPU job too large for its GPUs stops before any weight loads -------------------------

MI300X_NODE = {"workers": 1, "gpusPerWorker": 8, "gpu": {"productName": "AMD_Instinct_MI300X_OAM"}}


def config_only(tmp_path, name: str = "llama-3.1-70b"):
    """A model folder holding only a config.json (Llama 3.1 70B's): the plan needs no weights, nor a tokenizer."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(EXAMPLES / "models" / name / "config.json", folder)
    return folder


def planned_refusal(job_: Any, folder: Path) -> str:
    """What the memory plan says of a job too large for its GPUs."""
    spec = job_.spec
    refusal = plan_job(spec, json.loads((folder / "config.json").read_text()), job_gpu_memory(spec)).refusal()
    assert refusal is not None
    return f"memory plan: {refusal}"


def test_a_gpu_job_too_large_for_its_gpus_is_refused_with_the_numbers_and_the_cheapest_changes(tmp_path):
    folder = config_only(tmp_path)
    big = lm_job("too-big", folder, {"resources": MI300X_NODE, "training": {"batchSizePerWorker": 1}})
    with pytest.raises(ConfigError) as refused:
        preflight(settings(big, tmp_path / "runs"))
    said = str(refused.value)
    assert said == planned_refusal(big, folder)
    assert said.startswith("memory plan: needs ")
    assert (
        " per GPU with sharding none, full fine-tuning, but a GPU has 192.0 GiB (AMD_Instinct_MI300X_OAM, AMD's data "
        "sheet); fits with fsdp over 8 GPUs ("
    ) in said
    # 16 bytes per parameter (fp32 master weights, fp32 gradients, AdamW's two moments) are over a TiB for 70B
    assert float(said.split()[3]) > 16 * 70_553_706_496 / (1 << 30) > 1024
    fitting = lm_job("sharded", config_only(tmp_path, "llama-3.1-8b"), {"resources": MI300X_NODE})
    with pytest.raises(ConfigError, match=r"tokenizer"):  # past the plan, to the next check
        preflight(settings(fitting, tmp_path / "runs"))


def test_a_gpu_job_run_on_cpus_has_no_gpu_memory_to_plan(tmp_path):
    """`rocmtrain run --cpu` of the job too large for its GPUs passes the plan and fails the next check: the
    folder has no tokenizer."""
    import uuid

    from rocmtrain_train.config import local_settings

    big = lm_job("on-cpu", config_only(tmp_path), {"resources": MI300X_NODE, "training": {"batchSizePerWorker": 1}})
    on_cpus = local_settings(big, job_dir=str(EXAMPLES), run_id=uuid.uuid4().hex, storage=str(tmp_path), force_cpu=True)
    with pytest.raises(ConfigError, match="tokenizer"):
        preflight(on_cpus)


def cluster_lm_job(name: str, model, resources: dict) -> str:
    """A causal-lm job as the operator hands it to the driver (ROCMTRAIN_JOB), its checkpoints in an object store
    (`checkpoints_bucket`)."""
    cluster = lm_job(name, model, {"resources": resources, "checkpoint": {"storagePath": "s3://checkpoints/runs"}})
    return cluster.model_dump_json(by_alias=True)


@pytest.fixture
def checkpoints_bucket(tmp_path, monkeypatch) -> None:
    """The bucket of `cluster_lm_job`'s checkpoints, a folder, where the cluster driver's pre-flight looks for it."""
    from rocmtrain_train import __main__ as driver

    (tmp_path / "buckets" / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(driver, "preflight", functools.partial(preflight, object_store=buckets(tmp_path / "buckets")))


@pytest.mark.usefixtures("checkpoints_bucket")
def test_the_cluster_driver_exits_2_on_a_job_too_large_for_its_gpus(tmp_path, monkeypatch, capsys):
    import ray

    from rocmtrain.api.contract import DRIVER_ERROR_PREFIX
    from rocmtrain_train import __main__ as driver

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: pytest.fail("Ray must not start"))
    folder = config_only(tmp_path)
    monkeypatch.setenv(JOB_ENV, cluster_lm_job("too-big", folder, MI300X_NODE))
    assert driver.main() == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == DRIVER_ERROR_PREFIX + planned_refusal(lm_job("too-big", folder, {"resources": MI300X_NODE}), folder)


@pytest.mark.usefixtures("checkpoints_bucket")
def test_the_cluster_driver_reports_the_planned_bytes_beside_the_measured_peak(tiny_lm, tmp_path, monkeypatch):
    """Every report the driver's sinks get carries the plan's bytes per GPU (`gpuMemoryPlannedBytes`)."""
    import ray

    from rocmtrain.api.models import Metrics, Progress, ProgressReport
    from rocmtrain_train import __main__ as driver
    from rocmtrain_train import config

    def train(settings, sinks, *, echo_log):
        report = ProgressReport(progress=Progress(step=1, total_steps=2), metrics=Metrics(gpu_memory_peak_bytes=7))
        for sink in sinks:
            sink.emit(report)
            sink.close()
        return type("Outcome", (), {"summary": {"model_path": "m"}})

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: None)
    monkeypatch.setattr(driver, "train", train)
    monkeypatch.setattr(config, "CLUSTER_LOG_ROOT", str(tmp_path / "logs"))
    resources = {"workers": 2, "gpusPerWorker": 1, "gpu": {"productName": "AMD_Instinct_MI300X_OAM"}}
    monkeypatch.setenv(JOB_ENV, cluster_lm_job("planned", tiny_lm, resources))
    assert driver.main() == 0
    (written,) = (tmp_path / "logs").rglob("metrics.jsonl")
    metrics = json.loads(written.read_text().splitlines()[0])["metrics"]
    spec = lm_job("planned", tiny_lm, {"resources": resources}).spec
    planned = plan_job(spec, json.loads((tiny_lm / "config.json").read_text()), job_gpu_memory(spec)).plan.total
    assert (metrics["gpuMemoryPeakBytes"], metrics["gpuMemoryPlannedBytes"]) == (7, planned)


@pytest.mark.parametrize(("fmt", "tail"), [("jsonl", '{"text": broken\n'), ("csv", "one,too,many,columns\n")])
def test_the_preflight_reads_only_the_first_records_of_the_data(tmp_path, fmt, tail):
    """A file whose tail is unreadable: the whole read (a rank's) fails on it, the pre-flight never gets there."""
    rows = [{"text": f"review number {i} of a long enough file", "label": i % 2} for i in range(60_000)]
    path = tmp_path / f"train.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)
    else:
        path.write_text("text,label\n" + "".join(f"{row['text']},{row['label']}\n" for row in rows) + tail)
    assert path.stat().st_size > 2 * 2**20  # beyond the first block the readers parse
    run = settings(job("head", {"data": {"train": {"uri": str(path)}, "eval": None}}), tmp_path / "runs")
    spec = run.job.spec
    with pytest.raises(ConfigError, match=rf"cannot read .*train\.{fmt} as {fmt}"):
        read_table(spec.data.train, spec.data, spec.model, run.base_dir)
    check_data(run)

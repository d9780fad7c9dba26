"""A job's own training code (spec.code): its validation, its quoted entrypoint, and the environment it is given.

Real parts: bash and sh, which read the entrypoint as KubeRay's submitter and Ray's job supervisor do, and
`shlex.join` as `ray job submit` joins its arguments again; KubeRay's RayJob schema (strict).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocmtrain import cli
from rocmtrain.api.code import entrypoint
from rocmtrain.api.contract import (
    DATA_ENV,
    KUBEFLOW_CA_ENV,
    KUBEFLOW_TOKEN_ENV,
    KUBEFLOW_URL_ENV,
    MODEL_ENV,
    PROGRESS_URL_ENV,
    STORAGE_PATH_ENV,
    TRAINING_ENV,
    WORLD_SIZE_ENV,
)
from rocmtrain.api.models import MAX_CODE_CHARS, CodeSpec, RocmTrainingJob
from rocmtrain.api.validate import validate_job
from rocmtrain.render import ENTRYPOINT, RenderOptions, render_rayjob
from rocmtrain_testworld import rayjob_schema
from unit.edits import drop, put
from unit.samples import EXAMPLES, full_job, minimal_job

OPTIONS = RenderOptions(
    progress_base_url="https://rocmtrain-progress.rocmtrain-system.svc:443", progress_ca_configmap="ca"
)
# Argument values a shell would act on if it read them as shell text; the file is made only if one does.
PWNED = Path(tempfile.gettempdir()) / f"pwned-by-rocmtrain-{uuid.uuid4().hex}"
HOSTILE = [
    "it's",
    '"double" \\back\\slash',
    f"$(touch {PWNED})",
    "`id`",
    "; rm -rf / #",
    "a\nb\n",
    "tab\there",
    "$HOME ${PATH} $0 $@",
    "'",
    "",
    "--",
    "&& exit 1 ||",
    "*",
    "ünïcödé ✓",
    "!event",
]


def code_job(code: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A cluster job running its own code, without model or data."""
    manifest = minimal_job()
    del manifest["spec"]["model"], manifest["spec"]["data"]
    manifest["spec"]["code"] = code
    manifest["spec"].update(spec)
    return manifest


def job_of(manifest: dict[str, Any]) -> RocmTrainingJob:
    job, errors = validate_job(manifest)
    assert job is not None, errors
    return job


def errors_of(manifest: dict[str, Any]) -> list[str]:
    job, errors = validate_job(manifest)
    assert job is None
    return [str(error) for error in errors]


# ---- validation ----------------------------------------------------------------------


def test_model_data_and_training_are_optional_with_code_and_read_as_such() -> None:
    job = job_of(code_job({"command": ["python", "/code/train.py"]}))
    assert job.spec.model_spec is None and job.spec.data_spec is None and job.spec.training.epochs == 3
    with pytest.raises(ValueError, match="the job runs its own code"):
        _ = job.spec.model


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (
            put("spec.tuning", {"searchSpace": {"epochs": [1, 2]}}),
            "spec.tuning: tuning (a hyper-parameter search) runs the built-in loop, not your own code",
        ),
        (
            put("spec.checkpoint.everySteps", 50),
            "spec.checkpoint.everySteps: checkpoint.everySteps is the built-in loop's: with code, your code "
            "decides when to checkpoint",
        ),
        (put("spec.checkpoint.resume", "never"), "spec.checkpoint.resume: checkpoint.resume: never is the built-in"),
        (put("spec.code.module", "team.train"), "spec.code: set exactly one of command or module"),
        (drop("spec.code.command"), "spec.code: set exactly one of command or module"),
        (put("spec.code.args", ["--epochs", "3"]), "spec.code.args: args go with module"),
        (put("spec.code.command", []), "spec.code.command: List should have at least 1 item"),
        (put("spec.code.command", ["", "x"]), "spec.code.command: the program, command[0], must not be empty"),
        (put("spec.code.command", ["python"] * 10_000), "spec.code.command: List should have at most 256 items"),
        (
            put("spec.code.command", ["python", *["x" * 4096] * 4]),
            f"spec.code.command: command holds at most {MAX_CODE_CHARS} characters in all",
        ),
        (put("spec.code.command", ["python", "x" * 4097]), "spec.code.command[1]: String should have at most 4096"),
        (put("spec.code.command", ["python", "nul\x00byte"]), "spec.code.command[1]: must be text without NUL"),
        (put("spec.code.workingDir", "code"), "spec.code.workingDir: must be an absolute path"),
        (put("spec.code.workingDir", "/code/../etc"), "spec.code.workingDir: must not contain '..'"),
        (put("spec.code.workingDir", "/code dir"), "spec.code.workingDir: must be an absolute path"),
        (put("spec.env", [{"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": "https://x"}]), "spec.env[0].name"),
    ],
    ids=[
        "tuning", "every-steps", "resume-never", "command-and-module", "neither", "args-with-command", "no-program",
        "empty-program", "ten-thousand-arguments", "too-many-characters", "argument-too-long", "nul", "relative-dir",
        "traversal-dir", "space-in-dir", "kubeflow-env",
    ],
)  # fmt: skip
def test_a_bad_code_block_is_refused_with_its_field_path(edit: Any, error: str) -> None:
    manifest = code_job({"command": ["python", "/code/train.py"]})
    edit(manifest)
    assert any(message.startswith(error) for message in errors_of(manifest)), errors_of(manifest)


def test_without_code_model_and_data_are_required_at_their_paths() -> None:
    for field in ("model", "data"):
        manifest = minimal_job()
        del manifest["spec"][field]
        assert errors_of(manifest) == [f"spec.{field}: {field} is required unless code runs your own training code"]


def test_rocmtrain_validate_explains_a_bad_code_block(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = code_job({"command": ["python", "train.py"], "args": ["--epochs"]})
    manifest["spec"]["tuning"] = {"searchSpace": {"epochs": [1]}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert cli.main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}: spec.code.args: args go with module; with command, the arguments are part of command"
    ]
    manifest["spec"]["code"] = {"module": "team.train", "args": ["--epochs", "3"]}
    path.write_text(yaml.safe_dump(manifest))
    assert cli.main(["validate", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: spec.tuning: tuning (a hyper-parameter search) runs the built-in loop, not your own code"
    ]


def test_the_example_is_a_local_job_running_the_recipe() -> None:
    path = EXAMPLES / "own-code" / "job.yaml"
    job, errors = validate_job(yaml.safe_load(path.read_text()), context="local")
    assert job is not None, errors
    assert job.spec.code is not None and job.spec.code.argv() == ["python", "recipe.py"]
    assert (path.parent / "recipe.py").is_file() and (path.parent / "data" / "train.jsonl").is_file()


# ---- the entrypoint ----------------------------------------------------------------------

RECORDER = "import json, sys; json.dump(sys.argv[1:], sys.stdout)"


def through_both_shells(entry: str) -> list[str]:
    """What a command gets as its arguments from the RayJob's `entrypoint`, read as in the cluster: KubeRay's
    submitter runs `bash -c "... ray job submit ... -- <entrypoint> ; ..."`; `ray job submit` joins its arguments
    with `shlex.join`; Ray's job supervisor runs that with `/bin/sh -c`. Here the submitter's command records its
    arguments instead of submitting them, and the program at the end records what reaches it."""
    submitted = subprocess.run(
        ["/bin/bash", "-ce", "--", f"{sys.executable} -c {shlex.quote(RECORDER)} -- {entry} ; "],
        capture_output=True,
        text=True,
        check=True,
    )
    received = json.loads(submitted.stdout)
    assert received[0] == "--"
    supervised = shlex.join(received[1:])  # what `ray job submit` sends as the Ray job's entrypoint
    ran = subprocess.run(["/bin/sh", "-c", supervised], capture_output=True, text=True, check=True)
    return json.loads(ran.stdout)


def test_hostile_arguments_reach_the_command_as_written_through_both_shells(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", RECORDER, *HOSTILE]
    job = job_of(code_job({"command": argv}))
    rendered = render_rayjob(job)["spec"]["entrypoint"]
    assert rendered == shlex.join(argv)
    assert through_both_shells(rendered) == HOSTILE
    assert not PWNED.exists()


def test_module_args_and_working_folder_stay_data(tmp_path: Path) -> None:
    folder = tmp_path / "it's $(here)"
    (folder / "team").mkdir(parents=True)
    (folder / "team" / "train.py").write_text(
        "import json, os, sys\njson.dump([os.getcwd(), *sys.argv[1:]], sys.stdout)\n"
    )
    # The API admits plain absolute folders only; this one is hostile too, and stays data as well.
    code = CodeSpec(command=[sys.executable, "-m", "team.train", *HOSTILE]).model_copy(
        update={"working_dir": str(folder)}
    )
    assert through_both_shells(entrypoint(code)) == [str(folder), *HOSTILE]


def test_the_longest_quoted_entrypoint_fits_one_argument_of_the_submitters_shell() -> None:
    """KubeRay runs its submit command as one `bash -c` argument, which Linux caps at 128 KiB (MAX_ARG_STRLEN)."""
    quotes = "'" * 4096  # a quote becomes five characters when quoted
    rest = MAX_CODE_CHARS - len("python") - 3 * (len(quotes) + 1) - 1
    code = CodeSpec(command=["python", quotes, quotes, quotes, "'" * rest], working_dir="/" + "d" * 1000)
    assert len(" ".join(code.command or [])) == MAX_CODE_CHARS
    assert len(entrypoint(code).encode()) + 1024 < 128 * 1024  # KubeRay's own words take a few hundred bytes


def test_a_built_in_job_keeps_the_drivers_fixed_entrypoint() -> None:
    assert render_rayjob(job_of(minimal_job()))["spec"]["entrypoint"] == ENTRYPOINT


# ---- the environment contract ----------------------------------------------------------------


def env(container: dict[str, Any]) -> dict[str, str]:
    return {var["name"]: var["value"] for var in container["env"] if "value" in var}


def test_head_and_workers_get_the_contract_and_the_progress_channel_under_both_names() -> None:
    manifest = code_job(
        {"command": ["python", "/code/train.py"]},
        model={"source": "/models/m", "numLabels": 3},
        data={"train": {"uri": "/data/train.jsonl"}},
        resources={"workers": 3, "gpusPerWorker": 2, "cpusPerWorker": "12"},
        training={"epochs": 2},
    )
    manifest["metadata"]["namespace"] = "ml"
    rayjob = render_rayjob(job_of(manifest), options=OPTIONS)
    assert rayjob_schema.schema_errors(rayjob) == []
    cluster = rayjob["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    for pod in (head, worker):
        values = env(pod["containers"][0])
        assert values[WORLD_SIZE_ENV] == "6" and values["ROCMTRAIN_GPUS_PER_WORKER"] == "2"
        assert values["ROCMTRAIN_CPUS_PER_RANK"] == "6" and values["ROCMTRAIN_WORKERS"] == "3"
        assert values[STORAGE_PATH_ENV] == "s3://checkpoints/minimal/ml/minimal"
        assert (values["ROCMTRAIN_JOB_NAME"], values["ROCMTRAIN_JOB_NAMESPACE"]) == ("minimal", "ml")
        assert json.loads(values[MODEL_ENV])["source"] == "/models/m"
        assert json.loads(values[DATA_ENV])["train"]["uri"] == "/data/train.jsonl"
        assert json.loads(values[TRAINING_ENV])["epochs"] == 2
        assert values[PROGRESS_URL_ENV].endswith("/v1/namespaces/ml/rocmtrainingjobs/minimal/progress")
        assert values[KUBEFLOW_URL_ENV].endswith("/v1/namespaces/ml/rocmtrainingjobs/minimal/trainerstatus")
        assert values[KUBEFLOW_TOKEN_ENV] == values["ROCMTRAIN_PROGRESS_TOKEN"]
        assert values[KUBEFLOW_CA_ENV] == values["ROCMTRAIN_PROGRESS_CA"]
        mounted = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert values[KUBEFLOW_TOKEN_ENV].rsplit("/", 1)[0] in mounted, "the token's folder is mounted"
        assert "rocmtrain-progress" in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize(("cpus", "gpus", "share"), [("1", 3, "0.3333"), ("12", 2, "6"), ("1000127m", 1, "1000.127")])
def test_a_ranks_cpu_share_is_written_exactly_never_rounded_up(cpus: str, gpus: int, share: str) -> None:
    resources = {"workers": 1, "gpusPerWorker": gpus, "cpusPerWorker": cpus, "memoryPerWorker": "64Gi"}
    manifest = code_job({"command": ["python", "t.py"]}, resources=resources)
    head = render_rayjob(job_of(manifest))["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert env(head["containers"][0])["ROCMTRAIN_CPUS_PER_RANK"] == share


def test_a_built_in_jobs_workers_get_neither_contract_nor_token() -> None:
    rayjob = render_rayjob(job_of(minimal_job()), options=OPTIONS)
    worker = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert not [name for name in env(worker["containers"][0]) if name.startswith(("ROCMTRAIN_", "KUBEFLOW_"))]
    assert "rocmtrain-progress" not in {v["name"] for v in worker["volumes"]}


def test_without_model_and_data_the_code_gets_no_such_variables_and_without_an_endpoint_no_channel() -> None:
    rayjob = render_rayjob(job_of(code_job({"module": "team.train", "args": ["--fast"]})))
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    values = env(head)
    assert MODEL_ENV not in values and DATA_ENV not in values and TRAINING_ENV in values
    assert PROGRESS_URL_ENV not in values and KUBEFLOW_URL_ENV not in values
    assert rayjob["spec"]["entrypoint"] == "python -m team.train --fast"


def test_on_a_volume_ray_trains_default_storage_is_the_run_folder_of_every_pod() -> None:
    """The head's HOME is the run folder, so the driver's `~/ray_results` (Ray Train's default storage, which
    it passes to the workers) lies on the volume every pod mounts; the workers' HOME stays /tmp."""
    manifest = full_job()
    manifest["spec"]["code"] = {"command": ["python", "/code/train.py"]}
    cluster = render_rayjob(job_of(manifest), options=OPTIONS)["spec"]["rayClusterSpec"]
    head = env(cluster["headGroupSpec"]["template"]["spec"]["containers"][0])
    worker = env(cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0])
    assert head["HOME"] == head[STORAGE_PATH_ENV] == "/checkpoints/sample/ml/sample"
    assert (head["XDG_CACHE_HOME"], head["XDG_CONFIG_HOME"]) == ("/tmp/.cache", "/tmp/.config")
    assert worker["HOME"] == "/tmp" and "XDG_CACHE_HOME" not in worker


@pytest.mark.parametrize(
    ("code", "spec", "home"),
    [
        (None, {}, "/tmp"),  # the built-in loop names its storage
        ({"command": ["python", "t.py"]}, {"env": [{"name": "HOME", "value": "/work"}]}, "/work"),  # the user's
        ({"command": ["python", "t.py"]}, {"checkpoint": {"storagePath": "s3://bucket/runs"}}, "/tmp"),  # no path
    ],
)
def test_the_heads_home_stays_where_it_cannot_or_need_not_be_the_run_folder(
    code: dict[str, Any] | None, spec: dict[str, Any], home: str
) -> None:
    manifest = full_job()
    manifest["spec"].update(spec, **({"code": code} if code else {}))
    head = render_rayjob(job_of(manifest))["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert env(head["containers"][0])["HOME"] == home


def test_everything_but_the_entrypoint_and_the_contract_renders_as_for_a_built_in_job() -> None:
    """Resources, GPU model, scheduling, Kueue, images, env, volumes, fault tolerance, lifecycle and suspend:
    the RayJob of a job with code differs from the same job's without only where code needs it."""
    manifest = full_job()
    manifest["spec"]["scheduling"]["queueName"] = "team-a"
    manifest["spec"]["scheduling"]["kueuePriorityClass"] = "high"
    built_in = render_rayjob(job_of(manifest), options=OPTIONS)
    manifest["spec"]["code"] = {"module": "team.train"}
    own = render_rayjob(job_of(manifest), options=OPTIONS)
    assert own["spec"]["entrypoint"] == "python -m team.train" != built_in["spec"]["entrypoint"]

    def without_the_codes_parts(rayjob: dict[str, Any]) -> dict[str, Any]:
        rayjob = json.loads(json.dumps(rayjob))
        del rayjob["spec"]["entrypoint"]
        cluster = rayjob["spec"]["rayClusterSpec"]
        for pod in (cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]):
            container = pod["containers"][0]
            container["env"] = [
                v
                for v in container["env"]
                if not v["name"].startswith(("ROCMTRAIN_", "KUBEFLOW_", "HOME", "XDG_", "RAY_TRAIN_CALLBACKS"))
            ]
            container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "rocmtrain-progress"]
            pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "rocmtrain-progress"]
        return rayjob

    assert without_the_codes_parts(own) == without_the_codes_parts(built_in)
    assert own["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" and own["spec"]["suspend"] is True

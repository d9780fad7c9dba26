"""The `rocmtrain` command line: render, validate, crd, and `rocmtrain run` (the training package's command)."""

from __future__ import annotations

import io
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

from rocmtrain import cli
from rocmtrain.api import crd
from rocmtrain.api.contract import DRIVER_MODULE
from rocmtrain.api.models import STORAGE_REQUIRED
from rocmtrain_testworld import rayjob_schema
from unit.edits import Edit, both, drop, put
from unit.samples import EXAMPLES, documented_commands, example, full_job, minimal_job

CLUSTER_EXAMPLES = [
    "cluster-mi300x.yaml",
    "cluster-llama-lora-mi300x.yaml",
    "cluster-llama-70b-lora-fsdp-mi300x.yaml",
    "kueue.yaml",
]
LOCAL_EXAMPLES = ["quickstart.yaml", "sft-local.yaml", "tune.yaml"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, *documents: object) -> str:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def test_examples_are_all_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted([*CLUSTER_EXAMPLES, *LOCAL_EXAMPLES])


@pytest.mark.parametrize("name", CLUSTER_EXAMPLES)
def test_render_of_each_example_matches_kuberay_schema(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run(capsys, "render", str(EXAMPLES / name))
    assert (code, err) == (0, "")
    (rayjob,) = yaml.safe_load_all(out)
    assert rayjob_schema.schema_errors(rayjob) == []
    assert run(capsys, "render", str(EXAMPLES / name))[1] == out


@pytest.mark.parametrize("name", CLUSTER_EXAMPLES)
def test_validate_prints_one_ok_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run(capsys, "validate", str(EXAMPLES / name))
    assert (code, err) == (0, "")
    assert out.count("\n") == 1
    assert out.startswith(f"{EXAMPLES / name}: OK")


@pytest.mark.parametrize("name", LOCAL_EXAMPLES)
def test_local_examples_are_local_jobs(capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = str(EXAMPLES / name)
    assert run(capsys, "validate", "--context", "local", path)[0] == 0
    code, out, err = run(capsys, "render", path)
    assert (code, out) == (1, "")
    spec = example(name)["spec"]
    relative = [
        field
        for field, value in (
            ("spec.model.source", spec["model"]["source"]),
            ("spec.data.train.uri", spec["data"]["train"]["uri"]),
            ("spec.data.eval.uri", spec["data"]["eval"]["uri"]),
        )
        if value.startswith("./")
    ]
    assert "spec.data.train.uri" in relative
    assert err.splitlines() == [
        *(
            f"{path}: {field}: a ./relative path is only for `rocmtrain run`; a cluster job needs an "
            "absolute path on a mounted volume, an object-store URI or a hub id"
            for field in relative
        ),
        f"{path}: spec.checkpoint.storagePath: {STORAGE_REQUIRED}",
    ]


@pytest.mark.parametrize("name", [*LOCAL_EXAMPLES, "own-code/job.yaml"])
def test_each_local_example_runs_with_the_commands_the_readme_gives(name: str) -> None:
    """The commands an example's header gives (`#   python ...`, `#   rocmtrain run ...`): the run is of that
    example, and every command it needs first is in the README too, where the example is listed."""
    commands = documented_commands(name)
    runs = [command for command in commands if command.startswith("rocmtrain run ")]
    assert runs == [f"rocmtrain run examples/{name}"], commands
    readme = (EXAMPLES.parent / "README.md").read_text().replace("\n", " ")
    assert [command for command in commands if command not in runs and command not in readme] == []


def test_multi_document_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, full_job(), minimal_job())
    code, out, _ = run(capsys, "render", path)
    assert code == 0
    assert [r["metadata"]["name"] for r in yaml.safe_load_all(out)] == ["sample", "minimal"]
    code, out, _ = run(capsys, "validate", path)
    assert (code, out.split(" within ")[0]) == (0, f"{path}: OK (sample, minimal)")


def test_validate_reports_every_error_of_every_document(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = minimal_job()
    bad["spec"]["resources"] = {"workers": 0, "gpusPerWorker": 0.5}
    bad["spec"]["training"] = {"precision": "fp64"}
    worse = minimal_job()
    worse["metadata"]["name"] = "x" * 41
    path = write(tmp_path, full_job(), bad, worse)
    code, out, err = run(capsys, "validate", path)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"{path}: document 2: spec.training.precision: Input should be 'fp32', 'bf16' or 'fp16'",
        f"{path}: document 2: spec.resources.workers: Input should be greater than or equal to 1",
        f"{path}: document 2: spec.resources.gpusPerWorker: Input should be a valid integer",
        f"{path}: document 3: metadata.name: String should have at most 40 characters",
    ]
    code, out, _ = run(capsys, "render", path)
    assert (code, out) == (1, "")


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(yaml.safe_dump(full_job()).encode())))
    assert run(capsys, "validate", "-")[1].startswith("-: OK (sample) within ")


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: [1\n", "invalid YAML"), ("", "no job in the file"), ("--- \n---\n", "no job in the file")],
)
def test_unreadable_manifests(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    code, _, err = run(capsys, "validate", str(path))
    assert code == 1
    assert err.startswith(f"{path}: {message}")


def test_missing_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "render", str(tmp_path / "absent.yaml"))
    assert code == 2
    assert "absent.yaml" in err


def test_crd_prints_the_committed_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "crd")
    assert code == 0
    assert out == (EXAMPLES.parent / "crds" / crd.CRD_FILE).read_text()


# Jobs `rocmtrain run` used to start although validation refuses them: (id, edit of the quickstart job).
REFUSED_LOCALLY: list[tuple[str, Edit]] = [
    ("workers-as-string", put("spec.resources.workers", "2")),
    ("reserved-env", put("spec.env", [{"name": "ROCMTRAIN_JOB", "value": "{}"}])),
    ("ray-env", put("spec.env", [{"name": "RAY_ADDRESS", "value": "auto"}])),
    ("shm-over-memory", put("spec.resources.sharedMemory", "4Gi")),
    ("zero-cpus", put("spec.resources.cpusPerWorker", "0")),
    ("name-leading-digit", put("metadata.name", "1quickstart")),
    ("storage-on-the-hub", put("spec.checkpoint.storagePath", "org/checkpoints")),
    ("split-of-a-file", put("spec.data.train.split", "train")),
    ("az-scheme", put("spec.data.train.uri", "az://container/train.jsonl")),
    ("reserved-volume", put("spec.volumes", [{"name": "dshm", "emptyDir": {}}])),
    ("no-spec", drop("spec")),
    ("unknown-field", put("spec.trainng", {"epochs": 2})),
    ("two-errors", both(put("spec.resources.workers", 0), put("spec.training.precision", "fp64"))),
]


@pytest.mark.parametrize(("case", "edit"), REFUSED_LOCALLY, ids=[case for case, _ in REFUSED_LOCALLY])
def test_run_refuses_what_validate_refuses_with_the_same_messages(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, edit: Edit
) -> None:
    """`rocmtrain run` (the training package's command) reads the file as `validate --context local` does."""
    job = example("quickstart.yaml")
    edit(job)
    path = write(tmp_path, job)
    code, out, refused = run(capsys, "validate", "--context", "local", path)
    assert (code, out) == (1, "") and refused
    code, out, err = run(capsys, "run", path)  # fails before any heavy import: nothing trains
    assert (code, out, err) == (2, "", refused)


def test_run_trains_one_job_per_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, example("quickstart.yaml"), example("quickstart.yaml"))
    assert run(capsys, "run", path) == (2, "", f"{path}: holds 2 jobs; rocmtrain run takes one\n")


def test_run_is_the_training_package_s_command() -> None:
    (point,) = [p for p in entry_points(group=cli.COMMANDS_GROUP) if p.name == "run"]
    assert point.module.split(".")[0] == DRIVER_MODULE


def python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -c code` in `cwd` (which is then first on sys.path)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=cwd)


def test_without_the_training_package_run_says_so_and_is_not_offered(tmp_path: Path) -> None:
    """The operator image: the entry point is registered, the training package is not installed."""
    result = python(
        "import sys; sys.modules['rocmtrain_train'] = None; from rocmtrain import cli; "
        "code = cli.main(['run', 'job.yaml']); print('exit', code); cli.main(['--help'])",
        tmp_path,
    )
    assert result.returncode == 0 and "exit 2" in result.stdout
    assert "rocmtrain run: the package that provides it (rocmtrain_train) is not installed here" in result.stderr
    assert "render" in result.stdout and "\n    run " not in result.stdout


def test_a_stale_egg_info_in_the_working_directory_hides_no_command(tmp_path: Path) -> None:
    """What an in-tree build leaves behind (metadata of this project from before `run` existed) comes first on
    sys.path for `python -c` and `python -m pytest`; the installed package's commands are still found."""
    stale = tmp_path / "rocm_train_operator.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: rocm-train-operator\nVersion: 0.1.0\n")
    (stale / "entry_points.txt").write_text("[console_scripts]\nrocmtrain = rocmtrain.cli:main\n")
    result = python("from rocmtrain import cli; cli.main(['--help'])", tmp_path)
    assert result.returncode == 0 and "\n    run " in result.stdout


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["render"], ["frobnicate"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
    capsys.readouterr()


def test_cli_imports_no_heavy_modules() -> None:
    code = (
        "import sys; from rocmtrain import cli; cli.main(['validate', sys.argv[1]]); "
        "heavy = {'torch', 'ray', 'kopf', 'kubernetes', 'kubernetes_asyncio', 'transformers'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLES / "kueue.yaml")], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines()[-1] == "[]"

"""The `rocmtrain` command line: render, validate, crd, and the hand-off to `rocmtrain run`."""

from __future__ import annotations

import io
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

import kuberay
from rocmtrain import cli
from rocmtrain.api import crd
from unit.samples import EXAMPLES, full_job, minimal_job

CLUSTER_EXAMPLES = ["cluster-mi300x.yaml", "kueue.yaml"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, *documents: object) -> str:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def test_examples_are_all_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted([*CLUSTER_EXAMPLES, "quickstart.yaml"])


@pytest.mark.parametrize("name", CLUSTER_EXAMPLES)
def test_render_of_each_example_matches_kuberay_schema(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run(capsys, "render", str(EXAMPLES / name))
    assert (code, err) == (0, "")
    (rayjob,) = yaml.safe_load_all(out)
    assert kuberay.schema_errors(rayjob) == []
    assert run(capsys, "render", str(EXAMPLES / name))[1] == out


@pytest.mark.parametrize("name", CLUSTER_EXAMPLES)
def test_validate_prints_one_ok_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run(capsys, "validate", str(EXAMPLES / name))
    assert (code, err) == (0, "")
    assert out.count("\n") == 1
    assert out.startswith(f"{EXAMPLES / name}: OK")


def test_quickstart_is_a_local_job(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "quickstart.yaml")
    assert run(capsys, "validate", "--context", "local", path)[0] == 0
    code, out, err = run(capsys, "render", path)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"{path}: spec.data.train.uri: a ./relative path is only for `rocmtrain run`; a cluster job needs an "
        "absolute path on a mounted volume, an object-store URI or a hub id",
        f"{path}: spec.data.eval.uri: a ./relative path is only for `rocmtrain run`; a cluster job needs an "
        "absolute path on a mounted volume, an object-store URI or a hub id",
    ]


def test_multi_document_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, full_job(), minimal_job())
    code, out, _ = run(capsys, "render", path)
    assert code == 0
    assert [r["metadata"]["name"] for r in yaml.safe_load_all(out)] == ["sample", "minimal"]
    code, out, _ = run(capsys, "validate", path)
    assert (code, out) == (0, f"{path}: OK (sample, minimal)\n")


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
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(full_job())))
    assert run(capsys, "validate", "-")[1] == "-: OK (sample)\n"


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


def test_run_hands_the_rest_of_the_command_line_to_the_training_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stands in for training_image/rocmtrain_train/local.py, which the training tests cover.
    seen: list[list[str]] = []
    runner = types.ModuleType("rocmtrain_train.local")
    runner.main = lambda argv: seen.append(argv) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rocmtrain_train.local", runner)
    assert cli.main(["run", "job.yaml", "--summary", "out.json"]) == 7
    assert seen == [["job.yaml", "--summary", "out.json"]]


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

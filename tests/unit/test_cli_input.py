"""`rocmtrain` on any input: a file it cannot read as a job is one line that names it, exit 1 or 2, never a traceback;
duplicate keys are refused as kubectl refuses them; a document over the size limit is never parsed; and `validate`
applies the operator's admission policy (issue 49)."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import cycle
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocmtrain import cli
from rocmtrain.api import manifests
from unit.malformed import CORPUS, JOB, wide
from unit.samples import minimal_job

# Exit status of each command for a file it cannot use: validate and render 1 (the file is refused), plan and
# run 2 (a bad job). Each file goes through validate and one of the others in turn.
EXIT = {"validate": 1, "render": 1, "plan": 2, "run": 2}
OTHER = dict(zip(CORPUS, cycle(["render", "plan", "run"]), strict=False))
DEFAULT_LIMITS = "the operator's default limits; the cluster's admin may set others (see --policy)"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("malformed")
    for name, data in CORPUS.items():
        (folder / f"{name}.yaml").write_bytes(data)
    return folder


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 50


@pytest.mark.parametrize("name", CORPUS)
def test_a_malformed_file_is_one_line_naming_it(capsys: pytest.CaptureFixture[str], corpus: Path, name: str) -> None:
    path = corpus / f"{name}.yaml"
    for command in ("validate", OTHER[name]):
        code, out, err = run(capsys, command, str(path))
        assert (code, out) == (EXIT[command], ""), (command, err)
        (line,) = err.splitlines()
        assert line.startswith(f"{path}: ") and "Traceback" not in line


@pytest.mark.parametrize("name", ["3000-flow-sequences", "billion-laughs", "5000-digit-integer", "binary-junk"])
def test_the_pure_python_parser_is_bounded_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, corpus: Path, name: str
) -> None:
    """Where PyYAML was built without libyaml, its own scanner and parser feed the same bounded composer."""
    monkeypatch.setattr(manifests, "LOADER", manifests.PureLoader)
    path = corpus / f"{name}.yaml"
    code, _, err = run(capsys, "validate", str(path))
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith(f"{path}: ")


def test_the_pure_python_scanner_opens_no_more_levels_than_the_bound() -> None:
    """PyYAML's scanner looks ahead for simple keys at a cost that grows with the square of the open levels."""
    loader = manifests.PureLoader("a: " + "[" * 3000)
    with pytest.raises(yaml.scanner.ScannerError, match="nested more than 64 levels deep"):
        while loader.get_token() is not None:
            pass
    assert loader.flow_level == manifests.MAX_DEPTH


def test_no_traceback_reaches_stderr(corpus: Path) -> None:
    """The console script's own process, on the nesting that raised RecursionError before."""
    path = corpus / "3000-flow-mappings.yaml"
    script = "import sys; from rocmtrain import cli; sys.exit(cli.main())"
    result = subprocess.run(
        [sys.executable, "-c", script, "validate", str(path)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"{path}: invalid YAML at line 1, column 253: nested more than 64 levels deep\n"


def test_a_missing_file_or_a_folder_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for path in (tmp_path / "absent.yaml", tmp_path):
        code, out, err = run(capsys, "validate", str(path))
        assert (code, out) == (2, "")
        (line,) = err.splitlines()
        assert str(path) in line


# --- duplicate keys --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (JOB + "kind: RocmTrainingJob\n", "line 14, column 1: duplicate key 'kind' (first on line 2)"),
        (JOB.replace("    numLabels: 2\n", "    numLabels: 2\n    numLabels: 3\n"), "line 9, column 5: duplicate "),
        ("a:\n- {x: 1, y: 2, x: 3}\n", "line 2, column 16: duplicate key 'x' (first on line 2)"),
        ("1: a\n0x1: b\n", "line 2, column 1: duplicate key 1 (first on line 1)"),
        ("1: a\ntrue: b\n", "line 2, column 1: duplicate key True (first on line 1)"),
    ],
)
def test_duplicate_keys_are_refused_at_any_depth_with_the_key_and_line(text: str, line: str) -> None:
    with pytest.raises(manifests.ManifestError) as refused:
        manifests.load_documents(text)
    assert str(refused.value).startswith(f"invalid YAML at {line}")


def test_keys_a_merge_brings_may_be_set_again() -> None:
    text = "base: &base {a: 1, b: 2}\nmerged: {<<: *base, b: 3}\ndistinct: {1: a, '1': b, 'true': c}\n"
    (document,) = manifests.load_documents(text)
    assert document["merged"] == {"a": 1, "b": 3}
    assert document["distinct"] == {1: "a", "1": "b", "true": "c"}


def test_validate_refuses_a_duplicate_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(JOB + "kind: Deployment\n")
    assert run(capsys, "validate", str(path)) == (
        1,
        "",
        f"{path}: invalid YAML at line 14, column 1: duplicate key 'kind' (first on line 2)\n",
    )


def test_thousands_of_errors_print_one_screen(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job = minimal_job()
    job["spec"].setdefault("training", {}).update({f"unknown{index}": index for index in range(2000)})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    code, _, err = run(capsys, "validate", str(path))
    lines = err.splitlines()
    assert code == 1 and len(lines) == cli.MAX_REPORTED + 1
    assert lines[-1] == f"... and {2000 - cli.MAX_REPORTED} more errors"


# --- sizes ---------------------------------------------------------------------------------------------------


def test_an_oversized_document_is_refused_before_it_is_parsed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The issue's 1.2 MB job of 100,000 unknown keys: its size is checked first, and the YAML parse never runs."""
    parsed: list[int] = []
    parse = manifests.parse
    monkeypatch.setattr(manifests, "parse", lambda text: parsed.append(len(text)) or parse(text))
    big, small = tmp_path / "big.yaml", tmp_path / "small.yaml"
    big.write_bytes(wide(100_000))
    small.write_bytes(wide(10))
    code, _, err = run(capsys, "validate", str(big))
    assert (code, parsed) == (1, [])
    assert err == (
        f"{big}: the document is 1,200,285 bytes, over the limit of 1,048,576: a job is at most 98,304 bytes as "
        "JSON (the operator's limit)\n"
    )
    assert run(capsys, "validate", str(small))[0] == 1  # ten unknown keys: parsed, then refused field by field
    assert parsed == [len(wide(10))]


def test_each_document_of_a_file_is_sized_on_its_own(tmp_path: Path) -> None:
    half = "x: '" + "a" * (manifests.DOCUMENT_LIMIT // 2) + "'\n"
    assert len(manifests.load_documents("---\n".join([half] * 3))) == 3  # 1.5 MiB in all, each under 1 MiB
    with pytest.raises(manifests.ManifestError, match=r"^the document at line 2 is 1,048,5"):
        manifests.load_documents(half + "---\n" + half + half)


def test_stdin_is_read_as_bytes_and_bounded(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdin:
        def __init__(self, data: bytes) -> None:
            self.buffer = _Reader(data)

    monkeypatch.setattr(sys, "stdin", Stdin(b"\xef\xbb\xbf" + yaml.safe_dump(minimal_job()).encode()))
    assert run(capsys, "validate", "-")[1].startswith("-: OK (minimal)")
    monkeypatch.setattr(sys, "stdin", Stdin(b"#" * (manifests.FILE_LIMIT + 10)))
    assert run(capsys, "validate", "-")[2] == "-: larger than 16,777,216 bytes, far more than any job file\n"


class _Reader:
    """Standard input's bytes, read within the file limit."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int) -> bytes:
        assert size == manifests.FILE_LIMIT + 1
        return self.data[:size]


# --- the admission policy ------------------------------------------------------------------------------------


def wide_search() -> dict[str, Any]:
    """1,024 workers × 64 trials at once: 65,536 worker pods, valid as a job, over the operator's default cap."""
    job = minimal_job()
    job["spec"]["resources"] = {"workers": 1024, "gpusPerWorker": 0}
    job["spec"]["data"]["eval"] = {"uri": "/data/eval.jsonl"}
    job["spec"]["tuning"] = {
        "searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-3}},
        "numTrials": 64,
        "maxConcurrentTrials": 64,
        "metric": "evalAccuracy",
    }
    return job


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `ROCMTRAIN_*` variable in the environment: the operator's defaults."""
    for name in [name for name in os.environ if name.startswith("ROCMTRAIN_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def search_file(tmp_path: Path, no_settings: None) -> Path:
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(wide_search()))
    return path


def test_validate_applies_the_operator_s_default_limits(capsys: pytest.CaptureFixture[str], search_file: Path) -> None:
    assert run(capsys, "validate", str(search_file)) == (
        1,
        "",
        f"{search_file}: spec.resources.workers: 65536 worker pods (workers × trials at once) is over the limit of "
        f"1024\n{search_file}: refused by {DEFAULT_LIMITS}\n",
    )
    # `rocmtrain run` meets no operator
    assert run(capsys, "validate", "--context", "local", str(search_file))[:2] == (0, f"{search_file}: OK (minimal)\n")


@pytest.mark.usefixtures("no_settings")
def test_an_ok_says_the_admin_may_set_other_limits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    assert run(capsys, "validate", str(path)) == (0, f"{path}: OK (minimal) within {DEFAULT_LIMITS}\n", "")


def test_policy_reads_the_operator_s_settings_from_a_file(
    capsys: pytest.CaptureFixture[str], search_file: Path, tmp_path: Path
) -> None:
    """The format `kubectl set env deployment/rocm-train-operator --list` prints."""
    settings = tmp_path / "operator.env"
    settings.write_text(
        "# Deployment rocm-train-operator, container operator\nROCMTRAIN_MAX_WORKER_PODS=65536\n"
        "# ROCMTRAIN_OPERATOR_NAMESPACE from field path metadata.namespace\n\nROCMTRAIN_METRICS_HOST=0.0.0.0\n"
    )
    assert run(capsys, "validate", "--policy", str(settings), str(search_file)) == (
        0,
        f"{search_file}: OK (minimal) within the operator's settings in {settings}\n",
        "",
    )
    settings.write_text("ROCMTRAIN_ALLOWED_IMAGES=registry.local/\nROCMTRAIN_MAX_WORKER_PODS=65536\n")
    code, _, err = run(capsys, "validate", "--policy", str(settings), str(search_file))
    assert (code, err.splitlines()[-1]) == (1, f"{search_file}: refused by the operator's settings in {settings}")
    assert "spec.image: " in err


def test_policy_reads_the_operator_s_settings_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, search_file: Path
) -> None:
    monkeypatch.setenv("ROCMTRAIN_MAX_WORKER_PODS", "65536")
    assert run(capsys, "validate", str(search_file))[:2] == (
        0,
        f"{search_file}: OK (minimal) within the operator's settings in this environment's ROCMTRAIN_* variables\n",
    )


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ("ROCMTRAIN_MAX_WORKER_PODS=many\n", "ROCMTRAIN_MAX_WORKER_PODS must be an integer from 1 to 1000000"),
        ("max pods: 3\n", "line 1: not NAME=value"),
    ],
)
def test_settings_the_operator_would_refuse_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], search_file: Path, tmp_path: Path, settings: str, problem: str
) -> None:
    path = tmp_path / "operator.env"
    path.write_text(settings)
    code, out, err = run(capsys, "validate", "--policy", str(path), str(search_file))
    assert (code, out) == (2, "")
    assert err.startswith(f"rocmtrain validate: the policy: {path}: {problem}") and err.count("\n") == 1

"""Why a Python program failed, read from the end of its output (`rocmtrain.api.tracebacks`)."""

from __future__ import annotations

from rocmtrain.api.tracebacks import MAX_LINE, USER_FRAMES, Failure, Frame, last_failure, plain
from rocmtrain.status.messages import CONDITION_MESSAGE_LIMIT, bounded
from unit.test_status import RAY_TRAIN_FAILURE

FRAME = Frame("/code/train.py", 10, "check", 'raise ValueError(f"label {label} out of range 0..2")')
OUTER = Frame("/code/train.py", 15, "train_func", "check(label)")


def test_a_ray_train_workers_error_and_the_users_innermost_frame_from_the_last_ten_lines():
    failure = last_failure(RAY_TRAIN_FAILURE.partition("\n")[2])
    assert failure == Failure("ValueError: label 7 out of range 0..2", (FRAME,))


def test_rays_repeats_of_a_workers_traceback_serve_when_the_drivers_lines_were_cut_off():
    repeats = [line for line in RAY_TRAIN_FAILURE.splitlines() if "TrainController" in line]
    assert len(repeats) == 6
    assert last_failure("\n".join(repeats)) == Failure("ValueError: label 7 out of range 0..2", (OUTER, FRAME))


def test_a_driver_error_with_library_frames_only_keeps_the_error_line():
    output = (
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 9, in get\n'
        "    raise value\n"
        '  File "<frozen runpy>", line 88, in _run_code\n'
        "ray.exceptions.RaySystemError: System error: out of memory\n"
    )
    assert last_failure(output) == Failure("ray.exceptions.RaySystemError: System error: out of memory")


def test_a_whole_traceback_chained_exceptions_and_carets_read_the_last_one():
    output = (
        "Traceback (most recent call last):\n"
        '  File "/code/a.py", line 1, in <module>\n'
        "KeyError: 'label'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/code/a.py", line 3, in <module>\n'
        "    load(record)\n"
        "    ^^^^^^^^^^^^\n"
        "RuntimeError: record 12 has no label\n"
        "some output after it\n"
    )
    assert last_failure(output) == Failure(
        "RuntimeError: record 12 has no label", (Frame("/code/a.py", 3, "<module>", "load(record)"),)
    )


def test_without_a_traceback_the_last_line_is_the_error_and_long_lines_are_cut():
    assert last_failure("starting\nerror: no training data in /data\n\n") == Failure("error: no training data in /data")
    assert last_failure("") is None
    long = last_failure("x" * 10_000)
    assert long is not None and len(long.error) == MAX_LINE and long.error.endswith("…")


def test_only_rays_forwarded_lines_are_read_when_the_driver_wrote_none():
    output = "(RayTrainWorker pid=7, ip=10.0.0.2) OSError: disk full\n"
    assert last_failure(output) == Failure("OSError: disk full")


# The end of a Ray Train script's log as Ray's job supervisor quotes it when a worker raised: the driver's
# traceback through Ray's libraries, the worker's re-raised one, Ray's coloured `(RayTrainWorker pid=...)`
# copies of it. Here as KubeRay passed it and as a status quoted it (`rocmtrain.status.messages` writes
# ESC as the text `\\x1b`): both read the same.
STORAGE_FAILURE = (
    "Traceback (most recent call last):\n"
    '  File "/code/transformers_torch_trainer_basic.py", line 98, in <module>\n'
    "    result = trainer.fit()\n"
    '  File "/opt/venv/lib/python3.11/site-packages/ray/train/base_trainer.py", line 638, in fit\n'
    "    raise TrainingFailedError(\n"
    '  File "/opt/venv/lib/python3.11/site-packages/ray/train/_internal/storage.py", line 410, in _check\n'
    "    raise RuntimeError(\n"
    "RuntimeError: Unable to set up cluster storage with the following settings: "
    "storage_fs_path='/tmp/ray_results'\n"
    "\x1b[36m(RayTrainWorker pid=2211, ip=10.244.0.7)\x1b[0m Saving checkpoint to /tmp/ray_results/x\x1b[32m "
    "[repeated 2x across cluster]\x1b[0m\n"
    "\x1b[33m(raylet)\x1b[0m [2026-01-02 03:04:05] worker exited\n"
)
STORAGE_ERROR = (
    "RuntimeError: Unable to set up cluster storage with the following settings: storage_fs_path='/tmp/ray_results'"
)


def test_terminal_escapes_go_as_bytes_and_as_their_escaped_text():
    coloured = "\x1b[36m(RayTrainWorker pid=7)\x1b[0m loss 0.5\x1b[32m [repeated 2x across cluster]\x1b[0m"
    expected = "(RayTrainWorker pid=7) loss 0.5 [repeated 2x across cluster]"
    assert plain(coloured) == expected
    assert plain(bounded(coloured, 200)) == expected, "as a status quotes them: \\x1b[36m"
    assert plain("\\u001b[1;31mred\\033[0m \\x1b[2K") == "red "
    assert plain("C:\\x1b\\data") == "C:\\x1b\\data", "an escape is ESC [ ... final byte, nothing less"


def test_a_ray_job_log_with_colours_reads_as_a_person_would_either_quoted_or_not():
    failure = last_failure(STORAGE_FAILURE)
    assert failure == Failure(
        STORAGE_ERROR, (Frame("/code/transformers_torch_trainer_basic.py", 98, "<module>", "result = trainer.fit()"),)
    )
    quoted = bounded(STORAGE_FAILURE, CONDITION_MESSAGE_LIMIT)
    assert "\\x1b[36m" in quoted and last_failure(quoted) == failure
    assert "\x1b" not in failure.text() and "\\x1b" not in failure.text()


def test_only_the_innermost_user_frames_are_kept():
    frames = "".join(f'  File "/code/f.py", line {n}, in f{n}\n    f{n + 1}()\n' for n in range(1, 8))
    failure = last_failure(f"Traceback (most recent call last):\n{frames}RecursionError: too deep\n")
    assert failure is not None and [f.function for f in failure.frames] == ["f5", "f6", "f7"]
    assert len(failure.frames) == USER_FRAMES
    assert failure.text().splitlines()[:3] == [
        "RecursionError: too deep",
        '  File "/code/f.py", line 5, in f5',
        "    f6()",
    ]

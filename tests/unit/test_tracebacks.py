"""Why a Python program failed, read from the end of its output (`rocmtrain.api.tracebacks`)."""

from __future__ import annotations

from rocmtrain.api.tracebacks import MAX_LINE, Failure, Frame, last_failure
from unit.test_status import RAY_TRAIN_FAILURE

FRAME = Frame("/code/train.py", 10, "check", 'raise ValueError(f"label {label} out of range 0..2")')


def test_a_ray_train_workers_error_and_the_users_innermost_frame_from_the_last_ten_lines():
    failure = last_failure(RAY_TRAIN_FAILURE.partition("\n")[2])
    assert failure == Failure("ValueError: label 7 out of range 0..2", FRAME)


def test_rays_repeats_of_a_workers_traceback_serve_when_the_drivers_lines_were_cut_off():
    repeats = [line for line in RAY_TRAIN_FAILURE.splitlines() if "TrainController" in line]
    assert len(repeats) == 6
    assert last_failure("\n".join(repeats)) == Failure("ValueError: label 7 out of range 0..2", FRAME)


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
        "RuntimeError: record 12 has no label", Frame("/code/a.py", 3, "<module>", "load(record)")
    )


def test_without_a_traceback_the_last_line_is_the_error_and_long_lines_are_cut():
    assert last_failure("starting\nerror: no training data in /data\n\n") == Failure("error: no training data in /data")
    assert last_failure("") is None
    long = last_failure("x" * 10_000)
    assert long is not None and len(long.error) == MAX_LINE and long.error.endswith("…")


def test_only_rays_forwarded_lines_are_read_when_the_driver_wrote_none():
    output = "(RayTrainWorker pid=7, ip=10.0.0.2) OSError: disk full\n"
    assert last_failure(output) == Failure("OSError: disk full")

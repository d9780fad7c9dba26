"""Why a Python program failed, from the end of its output: its last error line and the user's frame (pure).

The operator puts this first in the Failed condition of a job whose own code (spec.code) exited
non-zero, reading the log tail that Ray's job supervisor quotes in the failed Ray job's message; and
`rocmtrain run` prints it when the code it ran failed. Where the code is a Ray Train script, the
error is usually a worker's: Ray Train's driver re-raises it with the worker's traceback in its
message, and Ray prints the workers' and its controller's own lines to the driver's output too,
prefixed `(RayTrainWorker pid=..., ip=...)` and, at the end, once more with `[repeated 2x across
cluster]`. Ray's message holds only the last ten lines of the log. So: terminal escapes are dropped
(`plain`: the colours Ray writes, and their escaped text where a status or an event quoted them); the
driver's own lines are read first, and the copies Ray forwarded (prefix and note taken off) when those
hold no traceback; the last exception line that follows a traceback's frames is the error, and those of
its frames outside libraries (site-packages, the standard library) are the user's, the innermost
`USER_FRAMES` of them kept. Without a traceback, the last line of output is the error line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# Longest line quoted (an exception's message may be a whole data record).
MAX_LINE: Final = 500
# The user's frames quoted, innermost last (a traceback through a user's helpers is rarely deeper).
USER_FRAMES: Final = 3
# A terminal escape (CSI: colours, cursor moves), as the byte ESC or as its escaped text (`\x1b[36m`, which
# `rocmtrain.status.messages` writes for the byte, `\u001b[36m` and `\033[36m`).
_ANSI = re.compile(r"(?:\x1b|\\x1b|\\u001b|\\033)\[[0-9;?]*[ -/]*[@-~]")
# Ray's prefix of a line that one of its actors or tasks printed, forwarded to the driver's output.
_RAY_PREFIX = re.compile(r"^\([A-Za-z_][\w.:-]* pid=\d+[^)]*\) ?")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<")


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback: where, and its line of code (empty when not printed)."""

    path: str
    line: int
    function: str
    code: str = ""

    def text(self) -> str:
        """The frame as Python prints it."""
        where = f'  File "{self.path}", line {self.line}, in {self.function}'
        return f"{where}\n    {self.code}" if self.code else where


@dataclass(frozen=True)
class Failure:
    """What a failed program's output says: the error line, and the user's frames if known (innermost last)."""

    error: str
    frames: tuple[Frame, ...] = ()

    def text(self) -> str:
        """The error line first, then the user's frames as Python prints them."""
        return "\n".join([self.error, *(frame.text() for frame in self.frames)])


def plain(text: str) -> str:
    """`text` without terminal escapes, whether as bytes or as their escaped text."""
    return _ANSI.sub("", text)


def _cut(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


def _readings(output: str) -> tuple[list[str], list[str]]:
    """The output's lines without colours: the driver's own, then all of them with Ray's prefixes and repeat
    notes taken off (Ray's forwarded copies of a worker's traceback, when the driver's own were cut off)."""
    lines = [line.rstrip() for line in plain(output).splitlines()]
    own = [line for line in lines if not _RAY_PREFIX.match(line)]
    return own, [_REPEATED.sub("", _RAY_PREFIX.sub("", line)) for line in lines]


def _frames(block: list[str]) -> list[Frame]:
    """The frames of a traceback's indented lines (`File ...` lines, each with its code line, carets skipped)."""
    frames: list[Frame] = []
    for line in block:
        if match := _FRAME.match(line):
            frames.append(Frame(match["path"], int(match["line"]), match["function"]))
        elif frames and not frames[-1].code and not line.strip().startswith(("^", "~")):
            frames[-1] = Frame(frames[-1].path, frames[-1].line, frames[-1].function, _cut(line))
    return frames


def _last_exception(lines: list[str]) -> Failure | None:
    """The last exception line that follows a traceback's frames, and the user's frames among them. The
    traceback's first line need not be there: Ray quotes only the last lines of a failed job's log."""
    for index in range(len(lines) - 1, 0, -1):
        line = lines[index]
        if not line.strip() or line[0].isspace():
            continue
        start = index
        while start > 0 and lines[start - 1][:1].isspace() and lines[start - 1].strip():
            start -= 1
        if frames := _frames(lines[start:index]):
            return Failure(_cut(line), user_frames(frames))
    return None


def user_frames(frames: list[Frame]) -> tuple[Frame, ...]:
    """The frames in the user's own code (not in a library or the standard library), the innermost
    `USER_FRAMES`, innermost last."""
    return tuple(frame for frame in frames if not _LIBRARY.search(frame.path))[-USER_FRAMES:]


def last_failure(output: str) -> Failure | None:
    """Why the program that wrote `output` failed, read from its end; None when it wrote nothing."""
    own, every = _readings(output)
    for lines in (own, every):
        if (failure := _last_exception(lines)) is not None:
            return failure
    last = next((line for line in reversed(own if any(own) else every) if line.strip()), None)
    return Failure(_cut(last)) if last is not None else None

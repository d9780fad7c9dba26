"""Log files: `main.log` (key events, written by the driver) and `rank-<k>.log` (one per worker)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(message)s"


def _logger(name: str, path: Path, *, echo: bool) -> logging.Logger:
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = [logging.FileHandler(path, encoding="utf-8")]
    if echo:
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
    return logger


def rank_logger(log_dir: str, rank: int) -> logging.Logger:
    """The log of one worker: `<log dir>/rank-<k>.log`, also on the worker's stdout (Ray collects it)."""
    return _logger(f"rocmtrain.rank.{rank}", Path(log_dir) / f"rank-{rank}.log", echo=True)


def main_logger(log_dir: str, *, echo: bool) -> logging.Logger:
    """The driver's log of key events: `<log dir>/main.log`, echoed to stdout where there is no progress bar."""
    return _logger("rocmtrain.main", Path(log_dir) / "main.log", echo=echo)

"""The file sink: every progress report as one JSON line of `metrics.jsonl`."""

from __future__ import annotations

from pathlib import Path

from rocmtrain.api.models import ProgressReport


class JsonlSink:
    """Appends every report, as its wire JSON, to a file (one line per report)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def emit(self, report: ProgressReport) -> None:
        self._file.write(report.model_dump_json(by_alias=True, exclude_none=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

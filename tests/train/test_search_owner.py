"""A search restores only its own job's experiment: Ray Tune's restore unpickles what it finds, so an
experiment that another job (or no job) left in the run folder is refused before anything is read."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest

from rocmtrain.api.errors import ConfigError
from rocmtrain_train.search.tune_trials import OWNER_FILE, SEARCH_DIR, _tuner
from train.jobs import job, settings

LOG = logging.getLogger(__name__)


class Planted:
    """A pickle that, when loaded, leaves a file behind: what a hostile `tuner.pkl` could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path(self.marker).touch, ())  # type: ignore[return-value]


def _search(tmp_path: Path, name: str):
    spec = {"tuning": {"searchSpace": {"learningRate": {"min": 1e-5, "max": 1e-3}}, "numTrials": 2}}
    run = settings(job(name, spec), tmp_path / "runs")
    return run, str(Path(run.run_path, SEARCH_DIR))


def _plant(experiment: str, marker: Path) -> None:
    Path(experiment).mkdir(parents=True)
    Path(experiment, "tuner.pkl").write_bytes(pickle.dumps(Planted(marker)))


@pytest.mark.parametrize("owner", [None, {"namespace": "team-b", "name": "victim"}, "not json {"])
def test_an_experiment_of_another_job_is_refused_unread(tmp_path: Path, owner) -> None:
    run, experiment = _search(tmp_path, "victim")
    marker = tmp_path / "unpickled"
    _plant(experiment, marker)
    if owner is not None:
        Path(run.run_path, OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    with pytest.raises(ConfigError, match="refusing to restore it"):
        _tuner(run, experiment, LOG)
    assert not marker.exists()


def test_a_new_search_records_its_job_before_any_trial(tmp_path: Path) -> None:
    run, experiment = _search(tmp_path, "fresh")
    _tuner(run, experiment, LOG)
    recorded = json.loads(Path(run.run_path, OWNER_FILE).read_text())
    assert recorded == {"namespace": run.job.metadata.namespace, "name": "fresh"}

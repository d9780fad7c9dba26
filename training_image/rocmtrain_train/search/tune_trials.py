"""Hyper-parameter search (`spec.tuning`): Ray Tune runs trials of the job's own TorchTrainer.

Each trial is a Tune function trainable that builds the job's TorchTrainer (`trainer.torch_trainer.build_trainer`)
with the trial's hyper-parameters and fits it: a full data-parallel run with the job's ranks, its
checkpoints under `<run>/trials/<trial id>/`, Ray Train's worker-failure recovery. `TrialReport`
(Ray Train's `TuneReportCallback`) passes every new evaluation of rank 0 to Tune, so ASHA compares
trials by evaluations (`evaluations` is its time attribute) and stops those that fall behind. The
network RCCL chose (`rccl_log`) rides along with it, and the search reports it and logs it once
(`trial_status.search_network`).

Tune keeps the experiment under `<run>/search/`; a restarted driver restores it
(`Tuner.restore(..., resume_errored=True)`): finished trials keep their results and are not run
again, unfinished ones start again and resume from their own checkpoints. At the end the best
trial's model is copied to `<run>/model` (where a single job's model goes) and
`<run>/search-summary.json` lists every trial. `<run>/search-owner.json` names the job, and a
driver restores only its own job's experiment.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import pyarrow.fs as pafs
import ray
from pydantic.alias_generators import to_snake
from ray import tune
from ray.train import Checkpoint
from ray.tune.experiment import Trial as TuneTrial
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator

from rocmtrain.api.errors import ConfigError
from rocmtrain.api.models import Metrics, Progress, ProgressReport, TuningSpec
from rocmtrain_train.config import RunSettings, join_location
from rocmtrain_train.reporting.driver_report import Sink
from rocmtrain_train.reporting.log_files import main_logger
from rocmtrain_train.reporting.rank_report import RankReport
from rocmtrain_train.reporting.rccl_log import TransportLog
from rocmtrain_train.search.trial_status import TrialView, best_trial, search_network, tuning_status
from rocmtrain_train.storage import filesystem
from rocmtrain_train.trainer.torch_trainer import build_trainer

SEARCH_DIR = "search"
TRIALS_DIR = "trials"
SUMMARY_FILE = "search-summary.json"
# Beside the experiment: the job whose search it is; a search restores only its own job's experiment.
OWNER_FILE = "search-owner.json"
MAX_OWNER_BYTES = 4096
TIME_ATTR = "evaluations"
# What a trial's own actor reserves: it only runs the trial's Ray Train controller, and needs no CPU
# (the head has none for Ray; the worker pods' CPUs all go to ranks). Tune refuses an empty request.
TRIAL_ACTOR_RESOURCES: dict[str, float] = {"memory": 64.0 * 2**20}
# ASHA's horizon: far beyond any run's evaluations, so that only the rungs stop trials.
ASHA_MAX_T = 1_000_000


@dataclass(frozen=True)
class SearchOutcome:
    """What a finished search leaves: its summary (every trial) and the trials."""

    summary: dict[str, Any]
    trials: list[TrialView]


def param_space(tuning: TuningSpec) -> dict[str, Any]:
    """Tune's search space, keyed by `TrialConfig` field name (`TrainingSpec`'s, and the adapter's rank)."""
    space = tuning.search_space
    found: dict[str, Any] = {}
    if space.learning_rate is not None:
        found["learning_rate"] = tune.loguniform(space.learning_rate.min, space.learning_rate.max)
    if space.batch_size_per_worker is not None:
        found["batch_size_per_worker"] = tune.choice(space.batch_size_per_worker)
    if space.warmup_ratio is not None:
        found["warmup_ratio"] = tune.uniform(space.warmup_ratio.min, space.warmup_ratio.max)
    if space.weight_decay is not None:
        found["weight_decay"] = tune.uniform(space.weight_decay.min, space.weight_decay.max)
    if space.epochs is not None:
        found["epochs"] = tune.choice(space.epochs)
    if space.adapter_rank is not None:
        found[ADAPTER_RANK] = tune.choice(space.adapter_rank)
    return found


# The search-space key of the adapter's rank (the others are `TrainingSpec` fields).
ADAPTER_RANK = "adapter_rank"


def scheduler(tuning: TuningSpec) -> TrialScheduler:
    if tuning.scheduler.type == "None":
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr=TIME_ATTR,
        max_t=ASHA_MAX_T,
        grace_period=tuning.scheduler.grace_period,
        reduction_factor=tuning.scheduler.reduction_factor,
    )


def trial_settings(settings: RunSettings, config: Mapping[str, Any], trial_id: str) -> RunSettings:
    """The run of one trial: the job with the trial's hyper-parameters, in its own folder under the run."""
    job = settings.job
    config = dict(config)
    update: dict[str, Any] = {}
    if (rank := config.pop(ADAPTER_RANK, None)) is not None and job.spec.adapter is not None:
        update["adapter"] = job.spec.adapter.model_copy(update={"rank": rank})
    update["training"] = job.spec.training.model_copy(update=config)
    trial_job = job.model_copy(update={"spec": job.spec.model_copy(update=update)})
    return dataclasses.replace(
        settings,
        job=trial_job,
        storage=join_location(settings.run_path, TRIALS_DIR),
        run_name=trial_id,
        log_dir=join_location(settings.log_dir, TRIALS_DIR, trial_id),
    )


def tune_result(report: RankReport, evaluations: int) -> dict[str, Any]:
    """What Tune gets of a rank-0 report: its evaluation, the count of evaluations, where it stands, and the
    network RCCL chose (GPU trials, where rank 0's RCCL log tells)."""
    values = {
        **report.evaluation,
        TIME_ATTR: evaluations,
        "step": report.step,
        "epoch": report.epoch,
        "final": report.final,
        "model_path": report.model_path,
        "network": report.network,
    }
    return {k: v for k, v in values.items() if v is not None}


class TrialReport(TuneReportCallback):
    """On the trial's Ray Train controller: each new evaluation (and the final report) goes to Tune."""

    def __init__(self) -> None:
        super().__init__()
        self._evaluated_at: int | None = None
        self._evaluations = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        first = RankReport.from_metrics(metrics[0])
        fresh = bool(first.evaluation) and first.step != self._evaluated_at
        if not (fresh or first.final):
            return
        if fresh:
            self._evaluations += 1
            self._evaluated_at = first.step
        super().after_report(run_context, [tune_result(first, self._evaluations)], checkpoint)


def run_trial(config: dict[str, Any], settings: RunSettings) -> None:
    """The Tune trainable: fit the job's TorchTrainer with this trial's hyper-parameters."""
    trial_id = tune.get_context().get_trial_id()
    build_trainer(trial_settings(settings, config, trial_id), [TrialReport()]).fit()


class SearchReporter:
    """Turns Tune's trials into `status.tuning` reports for the sinks, and logs each new best trial."""

    def __init__(self, settings: RunSettings, sinks: list[Sink], log: logging.Logger) -> None:
        tuning = settings.job.spec.tuning
        assert tuning is not None
        task = settings.job.spec.model.task
        self.metric, self.mode, self.total = tuning.metric_for(task), tuning.mode_for(task), tuning.num_trials
        self._space = set(param_space(tuning))
        self._sinks = sinks
        self._log = log
        self._best: str | None = None
        self._network = TransportLog(log)
        self.trials: list[TrialView] = []

    def view(
        self, trial_id: str, tune_state: str, config: Mapping[str, Any], last: Mapping[str, Any] | None
    ) -> TrialView:
        """One trial, from what Tune knows of it."""
        result = dict(last or {})
        finished = result.get("final") is True
        return TrialView(
            id=trial_id,
            tune_state=tune_state,
            config={k: v for k, v in config.items() if k in self._space},
            result=result,
            finished=finished,
            checkpoint=result.get("model_path") if finished else result.get(CHECKPOINT_PATH_KEY),
        )

    def update(self, trials: list[TuneTrial]) -> None:
        self.trials = [self.view(t.trial_id, t.status, t.config, t.last_result) for t in trials]
        self.emit(final=False)

    def ended(self, grid: tune.ResultGrid) -> None:
        """The trials as the ended search left them (finished ones a restore did not run again included)."""
        self.trials = [
            self.view(
                str((result.metrics or {}).get("trial_id") or PurePosixPath(result.path).name),
                "ERROR" if result.error else "TERMINATED",
                result.config or {},
                result.metrics,
            )
            for result in (grid[i] for i in range(len(grid)))
        ]

    def emit(self, *, final: bool) -> None:
        status = tuning_status(self.trials, metric=self.metric, mode=self.mode, total=self.total)
        best = best_trial(self.trials, self.metric, self.mode)
        if best is not None and best.id != self._best:
            self._best = best.id
            self._log.info(
                "new best trial %s: %s=%.4f with %s", best.id, self.metric, best.metric(self.metric), best.config
            )
        done = status.trials_done
        try:
            report = ProgressReport(
                progress=Progress(step=done, total_steps=self.total, percent=100.0 * done / self.total),
                metrics=Metrics(**best.evaluation()) if best else Metrics(),
                tuning=status,
                final=final,
                network=search_network(self.trials, best),
            )
        except ValueError as exc:  # a value outside the API's bounds: log it, keep searching
            self._log.warning("progress report of the search not sent: %s", exc)
            return
        self._network.seen(report.network)
        for sink in self._sinks:
            try:
                sink.emit(report)
            except Exception as exc:  # a failing sink must not stop the search
                self._log.warning("progress sink %s failed: %s", type(sink).__name__, exc)

    def finish(self, model_path: str) -> None:
        """The final report: the best trial's checkpoint is now the exported model."""
        best = best_trial(self.trials, self.metric, self.mode)
        self.trials = [dataclasses.replace(t, checkpoint=model_path) if t is best else t for t in self.trials]
        self.emit(final=True)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()


# The reporters of the searches this process runs, by experiment path. Tune pickles its callbacks
# with the experiment (and restores them from there), so `SearchProgress` carries only the key.
_REPORTERS: dict[str, SearchReporter] = {}


class SearchProgress(tune.Callback):
    """On the driver: every change of a trial updates the search's reporter."""

    def __init__(self, key: str) -> None:
        self._key = key

    def _update(self, trials: list[TuneTrial]) -> None:
        if (reporter := _REPORTERS.get(self._key)) is not None:
            reporter.update(trials)

    def on_trial_start(self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, **info: Any) -> None:
        self._update(trials)

    def on_trial_result(
        self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, result: dict, **info: Any
    ) -> None:
        self._update(trials)

    def on_trial_complete(self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, **info: Any) -> None:
        self._update(trials)

    def on_trial_error(self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, **info: Any) -> None:
        self._update(trials)


def search_owner(settings: RunSettings) -> dict[str, str]:
    """The job a search belongs to, as `OWNER_FILE` records it: its namespace and name."""
    return {"namespace": settings.job.metadata.namespace, "name": settings.job.metadata.name}


def _recorded_owner(settings: RunSettings) -> Any:
    fs, path = filesystem(join_location(settings.run_path, OWNER_FILE), None)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as source:
        try:
            return json.loads(source.read(MAX_OWNER_BYTES))
        except ValueError:
            return None


def _tuner(settings: RunSettings, experiment: str, log: logging.Logger) -> tune.Tuner:
    """A new search, or the one a previous driver of this job left under `experiment` (resume: auto).

    `Tuner.restore` unpickles what it finds, so it only restores an experiment whose run folder
    `OWNER_FILE` names this job, written before its first trial: another job's search is refused,
    not run. Whoever can write the run folder could still forge both, so write access to it is
    the trust boundary (docs/operations/security.md).
    """
    tuning = settings.job.spec.tuning
    assert tuning is not None
    trainable = tune.with_resources(tune.with_parameters(run_trial, settings=settings), TRIAL_ACTOR_RESOURCES)
    owner = search_owner(settings)
    if settings.job.spec.checkpoint.resume == "auto" and tune.Tuner.can_restore(experiment):
        recorded = _recorded_owner(settings)
        if recorded != owner:
            raise ConfigError(
                f"{experiment} holds a search that {OWNER_FILE} does not give to {owner['namespace']}/"
                f"{owner['name']}: refusing to restore it (Ray Tune's restore runs the pickles it finds); "
                "move the folder away, or use another storagePath or checkpoint.resume: never"
            )
        log.info("continuing the search in %s", experiment)
        return tune.Tuner.restore(experiment, trainable, resume_errored=True)
    _write_json(join_location(settings.run_path, OWNER_FILE), owner)
    task = settings.job.spec.model.task
    return tune.Tuner(
        trainable,
        param_space=param_space(tuning),
        tune_config=tune.TuneConfig(
            metric=to_snake(tuning.metric_for(task)),
            mode=tuning.mode_for(task),
            num_samples=tuning.num_trials,
            scheduler=scheduler(tuning),
            search_alg=BasicVariantGenerator(
                random_state=tuning.seed if tuning.seed is not None else settings.job.spec.training.seed,
                max_concurrent=tuning.max_concurrent_trials,
            ),
        ),
        run_config=tune.RunConfig(
            name=SEARCH_DIR,
            storage_path=settings.run_path,
            callbacks=[SearchProgress(experiment)],
            verbose=0,
        ),
    )


def copy_model(source: str, destination: str) -> None:
    """Copy a trial's exported model (a folder, local or in an object store) to `destination`."""
    source_fs, source_path = filesystem(source, None)
    fs, path = filesystem(destination, None)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(source_path, path, source_filesystem=source_fs, destination_filesystem=fs)


def _write_json(location: str, document: dict[str, Any]) -> None:
    fs, path = filesystem(location, None)
    fs.create_dir(str(PurePosixPath(path).parent), recursive=True)
    with fs.open_output_stream(path) as out:
        out.write((json.dumps(document, indent=2) + "\n").encode())


def search_summary(reporter: SearchReporter, model_path: str, wall_seconds: float) -> dict[str, Any]:
    """The search's summary: the best trial's evaluation and where its model went, then every trial."""
    best = best_trial(reporter.trials, reporter.metric, reporter.mode)
    assert best is not None
    return {
        **best.evaluation(),
        "metric": reporter.metric,
        "mode": reporter.mode,
        "best_trial": best.id,
        "best_metric": best.metric(reporter.metric),
        "best_config": dict(best.config),
        "model_path": model_path,
        "wall_seconds": wall_seconds,
        "trials": [
            {
                "id": t.id,
                "state": t.state,
                "config": dict(t.config),
                "metric": t.metric(reporter.metric),
                "evaluations": t.evaluations,
                "steps": t.result.get("step"),
                "model_path": t.result.get("model_path"),
            }
            for t in sorted(reporter.trials, key=lambda t: t.id)
        ],
    }


def ended_trials(experiment: str) -> int:
    """Trials that ended (ran to their end, stopped early, failed), as Tune's saved experiment state says.

    Not the `ResultGrid`'s count: on SIGINT Tune saves the state and then stops the trials that still
    run, which the grid then lists as terminated. The saved state keeps them unfinished, and a
    restore runs them again.
    """
    trials = tune.ExperimentAnalysis(experiment).trials
    return sum(t.status in (TuneTrial.TERMINATED, TuneTrial.ERROR) for t in trials)


def state_api_reachable() -> bool:
    """Whether the connected Ray serves its state API (its dashboard runs)."""
    from ray.util.state import list_nodes
    from ray.util.state.exception import RayStateApiException

    try:  # this cluster's address: without one, Ray looks for a cluster and refuses when it finds several
        list_nodes(address=ray.get_runtime_context().gcs_address, limit=1, timeout=10, raise_on_missing_output=False)
    except RayStateApiException:
        return False
    return True


def run_search(settings: RunSettings, sinks: list[Sink], *, echo_log: bool) -> SearchOutcome:
    """Run (or continue) the job's search on the connected Ray cluster and export the best trial's model."""
    tuning = settings.job.spec.tuning
    assert tuning is not None
    log = main_logger(settings.log_dir, echo=echo_log)
    experiment = join_location(settings.run_path, SEARCH_DIR)
    log.info(
        "search %s started: %d trials, %d at a time, of %d ranks each; storage %s",
        settings.name,
        tuning.num_trials,
        tuning.max_concurrent_trials,
        settings.layout.world_size,
        settings.run_path,
    )
    if not state_api_reachable():
        log.warning(
            "Ray's state API is not reachable (is its dashboard off?): a trial stopped early keeps its "
            "workers' CPUs and GPUs until the search ends, and later trials may wait for them"
        )
    reporter = SearchReporter(settings, sinks, log)
    _REPORTERS[experiment] = reporter
    started = time.perf_counter()
    try:
        tuner = _tuner(settings, experiment, log)
        grid = tuner.fit()
        if (done := ended_trials(experiment)) < tuning.num_trials:
            raise RuntimeError(
                f"search {settings.name} was interrupted with {tuning.num_trials - done} trials unfinished; "
                "run it again on the same storage to continue"
            )
        reporter.ended(grid)
        best = best_trial(reporter.trials, reporter.metric, reporter.mode)
        if best is None or best.result.get("model_path") is None:
            raise RuntimeError(f"no trial of search {settings.name} finished with a model")
        copy_model(best.result["model_path"], settings.model_output)
        reporter.finish(settings.model_output)
        log.info(
            "best trial %s: %s=%.4f; model at %s",
            best.id,
            reporter.metric,
            best.metric(reporter.metric),
            settings.model_output,
        )
    finally:
        _REPORTERS.pop(experiment, None)
        reporter.close()
    summary = search_summary(reporter, settings.model_output, time.perf_counter() - started)
    _write_json(join_location(settings.run_path, SUMMARY_FILE), summary)
    return SearchOutcome(summary=summary, trials=reporter.trials)

"""The training image: Ray Train + PyTorch DDP + transformers fine-tuning, and `rocmtrain run`.

A separate program from the operator: it imports `rocmtrain.api` (the contract) and
nothing else of `rocmtrain` (`tests/unit/test_boundary.py` enforces it).

- entry points: `__main__` (the RayJob's driver, `python -m rocmtrain_train`) and
  `cli` (`rocmtrain run`, registered under the `rocmtrain.commands` entry point);
- `config` (run settings, the job from `ROCMTRAIN_JOB`), `local` (an embedded Ray);
- driver: `trainer` (the TorchTrainer of a run: one rank per GPU), `relay` (rank reports to
  the driver), `reporting` (per-rank reports to ProgressReports), `sinks` and `http_sink`;
- ranks: `worker` (builds model, optimiser, restores the checkpoint), `rank_data` (the batch
  plan and the rank's own records), `loop` (the step loop), `prefetch`, `rank_report` (what
  each rank reports), `evaluate`, `checkpoint`, `metrics` (resource sampling), `logs`;
- data and models: `data` (reading records), `plan` (the batch plan), `tokens` (tokenising,
  its cache, padding), `model`, `storage`; `preflight` (fail-fast checks that need I/O).
"""

"""The training image: Ray Train + PyTorch DDP + transformers fine-tuning, and `rocmtrain run`.

A separate program from the operator: it imports `rocmtrain.api` (the contract) and
nothing else of `rocmtrain` (`tests/unit/test_boundary.py` enforces it). One subpackage per stage:

- `__main__`: the RayJob's driver (`python -m rocmtrain_train`); `config`: run settings (the job
  from `ROCMTRAIN_JOB` or a file); `storage`: locations (paths, object stores, the hub);
- `cli`: the `rocmtrain run` and `rocmtrain scale` subcommands (`rocmtrain.commands` entry points);
- `driver`: a run on the driver (checks, the TorchTrainer, or a search; an embedded Ray locally);
- `search`: a hyper-parameter search (Ray Tune trials of the run's TorchTrainer) and its status;
- `data`: records, the batch plan, this rank's shard, tokenising and prefetching;
- `model`: finding and loading the pretrained model;
- `loop`: one rank (set-up, the step loop, evaluation, resource sampling);
- `checkpoint`: the state to resume from, and the final model export;
- `reporting`: rank reports to the driver, aggregated into ProgressReports for the sinks.
"""

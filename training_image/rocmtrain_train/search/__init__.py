"""Hyper-parameter search (`spec.tuning`).

- `tune_trials`: Ray Tune runs trials of the job's TorchTrainer; the best trial's model and summary;
- `trial_status`: where the search stands, as `status.tuning` shows it (pure).
"""

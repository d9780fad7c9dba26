"""The training package's `rocmtrain` subcommands (the `rocmtrain.commands` entry points).

- `run`: `rocmtrain run JOB.yaml`, one job on this machine with an embedded Ray;
- `scale_study`: `rocmtrain scale JOB.yaml --workers 1,2,4`, the job at several world sizes;
- `scaling_report`: that study's table, JSON and chart.
"""

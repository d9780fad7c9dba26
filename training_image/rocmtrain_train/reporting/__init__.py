"""Progress, from the ranks to the driver and on to where it is shown.

- `rank_report`: what a rank hands the driver at every `ray.train.report`;
- `relay`: how those reports reach the driver process (a Ray Train callback and an actor);
- `driver_report`: the ranks' reports aggregated into one ProgressReport for every `Sink`;
- `console_sink`: the progress bar or lines, and the summary table; `jsonl_sink`: `metrics.jsonl`;
- `operator_sink`: the reports pushed to the operator's HTTPS progress endpoint;
- `log_files`: `main.log` (the driver) and `rank-<k>.log` (one per rank);
- `log_upload`: that log folder copied beside a run whose folder is in an object store;
- `rccl_log`: which network RCCL chose, read from rank 0's RCCL log.
"""

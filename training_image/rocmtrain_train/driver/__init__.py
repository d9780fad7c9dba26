"""One run on the driver, in a cluster's RayJob or on this machine.

- `driver_checks`: the fail-fast checks before any worker starts (data, model, GPUs, storage);
- `own_code`: a job's own code (`spec.code`) on this machine, with the cluster's contract;
- `train_job`: a run (`trainer`) or the job's search (`search`), its sinks, and `run_local` (`rocmtrain run`'s
  embedded Ray).
"""

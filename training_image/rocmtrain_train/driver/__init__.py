"""One run on the driver, in a cluster's RayJob or on this machine.

- `driver_checks`: the fail-fast checks before any worker starts (data, model, GPUs, storage);
- `torch_trainer`: Ray Train's TorchTrainer of a run (one rank per GPU) and running it with reporting;
- `train_job`: a run or the job's search, and `run_local` (`rocmtrain run`'s embedded Ray).
"""

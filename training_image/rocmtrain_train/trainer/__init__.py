"""One run of the job's ranks on Ray Train, for the driver and for each trial of a search.

- `torch_trainer`: Ray Train's TorchTrainer of a run (one rank per GPU) and running it with reporting.
"""

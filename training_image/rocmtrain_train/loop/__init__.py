"""One training rank, as Ray Train runs it under DDP.

- `rank_setup`: builds the rank once (model, batch plan, records, optimiser, the checkpoint to resume);
- `step_loop`: the per-rank training function, the step loop over the built rank;
- `evaluate`: sharded evaluation, all-reduced so every rank has the same metrics;
- `resource_sampling`: CPU use, GPU memory and GPU utilisation per report interval.
"""

"""One training rank, as Ray Train runs it under DDP.

- `rank_setup`: builds the rank once (model, batch plan, records, optimiser, the checkpoint to resume);
- `rank_shard`: this rank's share of the data: the plan and its own rows, read and tokenised by the task;
- `step_loop`: the per-rank training function (`train_rank`), the step loop over the built rank;
- `resource_sampling`: CPU use, GPU memory and GPU utilisation per report interval.
"""

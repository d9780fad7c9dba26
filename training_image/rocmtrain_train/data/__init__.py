"""Training data, from the source to the batches a rank trains on.

- `records`: reading JSONL, CSV or Parquet (a path, an object store, the hub) and the sample order;
- `batch_plan`: which records each rank trains on at each step, alike on every rank;
- `rank_shard`: this rank's share: the plan and its own rows, read and tokenised;
- `tokens`: tokenising (threaded, cached across restarts) and padding batches;
- `prefetch`: batches made ahead of the step loop on a background thread.
"""

"""Training data, from the source to the batches a rank trains on.

- `records`: reading JSONL, CSV or Parquet (a path, an object store, the hub) and the sample order;
- `batch_plan`: which records each rank trains on at each step, alike on every rank;
- `tokens`: tokenising (threaded, cached across restarts) and padding batches;
- `causal_lm`: a language model's records (pairs, chats, text) and their tokens (loss masks, packing);
- `prefetch`: batches made ahead of the step loop on a background thread.
"""

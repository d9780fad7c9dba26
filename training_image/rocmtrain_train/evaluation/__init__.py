"""Sharded evaluation, per task: each rank sums over its shard, the sums are all-reduced, every rank gets the
same metrics.

- `batches`: a rank's evaluation batches, with fillers where the ranks go in lockstep (shared by the tasks);
- `classification`: loss, accuracy and macro-F1 of a classifier; MSE and MAE of a regression head;
- `causal_lm`: loss and perplexity of a language model, and exact match of its greedy generations.
"""

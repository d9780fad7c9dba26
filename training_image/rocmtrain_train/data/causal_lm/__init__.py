"""A causal language model's records (task causal-lm).

- `records`: instruction pairs, chats or plain text, read and checked as columns;
- `tokens`: the records as tokens (which carry loss), in padded or packed batches.
"""

"""What a run leaves behind.

- `train_state`: checkpoints, everything needed to continue a run where it stopped;
- `model_export`: the trained model and tokenizer, where `from_pretrained` loads them.
"""

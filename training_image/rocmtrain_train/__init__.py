"""The training image: Ray Train + PyTorch DDP + transformers fine-tuning loop."""

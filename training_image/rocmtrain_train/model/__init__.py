"""The model: `pretrained` finds the weights (path, installed package, hub, object store) and loads them."""

"""The operator's door to the API server (`client`): create, read, patch, post events."""

"""A checkpoint directory read: the model's shape (config.json) and its weight files."""

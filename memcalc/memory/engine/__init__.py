"""The step engine: one training step's moments, replayed from what each layer allocates and frees."""

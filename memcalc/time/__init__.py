"""How long a training step takes: FLOPs, hardware rates, step time."""

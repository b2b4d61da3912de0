"""Ground truth from real PyTorch runs (needs the optional ``validate`` extra: torch)."""

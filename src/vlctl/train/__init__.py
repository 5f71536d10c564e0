"""Training: one loop (loop.py) for every trainer, and the DDP helpers it runs on (distributed.py)."""

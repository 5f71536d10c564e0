"""Settings every test process needs before any test module imports torch."""

import os

# As vlctl/__init__.py sets it (a test module may import torch before vlctl): OpenMP threads that
# spin while they wait make torch 10-100x slower on cores shared with other processes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

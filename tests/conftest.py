"""Settings every test process needs before any test module imports torch."""

# vlctl sets OMP_WAIT_POLICY=PASSIVE on import (OpenMP threads that spin while they wait make torch
# 10-100x slower on shared cores); imported here, before any test module can import torch first.
import vlctl  # noqa: F401

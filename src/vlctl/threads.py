"""Intra-op torch threads for a block of code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with `n` intra-op torch threads, then restore the count.

    Many tiny tensor ops (a per-image transform, a training step of a model with 18-d inputs) only
    pay synchronisation for a second thread, and on a busy machine a lot of it: OpenCLIP's ViT-B-32
    transform took 70 ms per image with 2 threads and 5 ms with 1; a step of tevi-mad's SAE 38 ms
    and 8 ms (docs/findings.md, "Threads on a shared machine").
    """
    import torch

    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

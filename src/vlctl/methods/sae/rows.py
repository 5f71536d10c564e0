"""The rows an SAE trains on: in memory, or streamed from a store's shards.

A store of 10M x 512 rows is 20 GB as float32 (40 GB as the float64 the fit's sums take), more
than a machine holds beside everything else, and a store of many shards or of float16 rows has
no single memory map to share. `Rows` reads such a store batch by batch (`batch`) and block by
block (`blocks`), so a fit holds one minibatch and one block, never the store. The two passes a
fit makes over all of its rows, b_pre's geometric median and the training FVU, are written here
over blocks.

Blocks are global row ranges [a, a + BLOCK): a store of one shard, of many, or of the same rows in
another layout sums the same rows in the same order, so its fit is the same bit for bit. Rows in
memory take the expressions an in-memory fit always took (the same fit as before, bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from vlctl.methods.base import as_tensor

BLOCK = 32_768  # rows per block of a streamed pass: 64 MB of float32 at d = 512


class Rows:
    """(n, d) float32 rows: an in-memory array or tensor, or a store's image table
    (`vlctl.embeddings.table.Table`: `vectors(ids)`, `len`, `dim`), read on demand."""

    def __init__(self, source: Any):
        self._table = source if hasattr(source, "vectors") and hasattr(source, "dim") else None
        self._x = None if self._table is not None else as_tensor(source)
        self.shape = (len(source), int(source.dim)) if self._table is not None else tuple(self._x.shape)

    @property
    def streamed(self) -> bool:
        return self._table is not None

    def __len__(self) -> int:
        return self.shape[0]

    def batch(self, idx: np.ndarray) -> torch.Tensor:
        """Rows `idx` (m,) -> (m, d) float32, in that order."""
        if self._table is None:
            return self._x[torch.as_tensor(idx)]
        return torch.from_numpy(self._table.vectors(idx))

    def blocks(self) -> Iterator[torch.Tensor]:
        """Every row, in order: one block in memory, BLOCK global rows at a time from a store."""
        if self._table is None:
            yield self._x
            return
        for a in range(0, len(self), BLOCK):
            yield self.batch(np.arange(a, min(a + BLOCK, len(self))))


def _mean(rows: Rows, weight: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(d,) float64: sum_i w_i x_i / sum_i w_i over the rows (w = 1 without `weight`)."""
    if not rows.streamed:  # in memory: the very expressions an in-memory fit always evaluated
        x = next(rows.blocks()).to(torch.float64)
        if weight is None:
            return x.mean(0)
        w = weight(x)
        return (w[:, None] * x).sum(0) / w.sum()
    num, den = torch.zeros(rows.shape[1], dtype=torch.float64), 0.0
    for block in rows.blocks():
        b = block.to(torch.float64)
        if weight is None:
            num, den = num + b.sum(0), den + len(b)
        else:
            w = weight(b)
            num, den = num + (w[:, None] * b).sum(0), den + w.sum()
    return num / den


def geometric_median(x: Any, iters: int = 100, tol: float = 1e-7) -> torch.Tensor:
    """argmin_m sum_i ||x_i - m|| of the rows of x (n, d) (an array, a tensor or `Rows`) by
    Weiszfeld's iteration -> (d,) float64.

    Each step is the mean of the points weighted by 1/distance to the current estimate (distances
    floored at a tiny value so a point that coincides with the estimate does not divide by zero).
    The geometric median is what OpenAI initialises b_pre with: robust to outlying embeddings.
    """
    rows = x if isinstance(x, Rows) else Rows(torch.as_tensor(x).detach())
    m = _mean(rows)
    for _ in range(iters):
        new = _mean(rows, lambda b, m=m: 1.0 / (b - m).norm(dim=1).clamp_min(1e-12))
        done = (new - m).norm() <= tol * max(1.0, float(m.norm()))
        m = new
        if done:
            break
    return m


def column_mean(rows: Rows) -> torch.Tensor:
    """(d,) float32: the mean row."""
    return _mean(rows).float() if rows.streamed else next(rows.blocks()).mean(0)


def fraction_variance_unexplained(x: Any, x_hat: Any) -> float:
    """FVU = sum_i ||x_i - x^_i||^2 / sum_i ||x_i - mean(x)||^2 over the rows of x (n, d).

    0 is a perfect reconstruction; 1 is as good as predicting the mean embedding for every input.
    """
    x, x_hat = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(x_hat, dtype=torch.float64)
    return float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum().clamp_min(1e-30))


def streamed_fvu(rows: Rows, reconstruct: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """`fraction_variance_unexplained` of `reconstruct` over `rows`, block by block (rows in memory:
    that function on them)."""
    if not rows.streamed:
        x = next(rows.blocks())
        return fraction_variance_unexplained(x, reconstruct(x))
    mean, err, var = _mean(rows), 0.0, 0.0
    for block in rows.blocks():
        b = block.to(torch.float64)
        err += float((b - reconstruct(block).to(torch.float64)).pow(2).sum())
        var += float((b - mean).pow(2).sum())
    return err / max(var, 1e-30)

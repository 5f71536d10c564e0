"""FAISS indexes over a store's image rows, search results and rerankers.

Index kinds (`IndexConfig.kind`): "none" (no index; exact search in numpy), "flat" (exact inner
product), "ivfpq" (inverted lists + product quantisation, trained on the first add), "hnsw"
(graph over the full vectors). Scores are inner products of L2-normalised vectors (cosine).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vlctl.config import opt, validate_config
from vlctl.io import VlctlError

INDEX_KINDS = ("none", "flat", "ivfpq", "hnsw")




@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """Which FAISS index a gallery uses, and its parameters."""

    kind: str = opt(
        "flat", "index kind: 'none' (no FAISS index; exact search in numpy), 'flat' (exact inner product), "
        "'ivfpq' or 'hnsw' (approximate, for large stores)",
        choices=INDEX_KINDS,
    )
    nlist: int = opt(
        0, "ivfpq: number of inverted lists (coarse centroids); 0 = 4*sqrt(n) of the first add, at most n/39",
        ge=0, le=2**24,
    )
    pq_m: int = opt(64, "ivfpq: sub-quantisers per vector (must divide dim); codes take pq_m * pq_nbits / 8 bytes",
                    ge=1, le=4096)
    pq_nbits: int = opt(8, "ivfpq: bits per sub-quantiser code", ge=1, le=16)
    nprobe: int = opt(32, "ivfpq: inverted lists visited per query (recall vs speed)", ge=1, le=2**24)
    refine: int = opt(50, "ivfpq: re-score k * refine candidates exactly from the stored embeddings (1 = off)",
                      ge=1, le=10_000)
    train_size: int = opt(100_000, "ivfpq: rows of the first add sampled to train the quantisers (at least 39 * nlist)",
                          ge=1, le=10**9)
    hnsw_m: int = opt(32, "hnsw: graph neighbours per node", ge=1, le=1024)
    ef_construction: int = opt(80, "hnsw: candidate list size while building", ge=1, le=10**6)
    ef_search: int = opt(64, "hnsw: candidate list size per query (recall vs speed)", ge=1, le=10**6)

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise VlctlError(f"IndexConfig.kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        for f in ("pq_m", "pq_nbits", "nprobe", "refine", "train_size", "hnsw_m", "ef_construction", "ef_search"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise VlctlError(f"IndexConfig.{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.nlist, int) or self.nlist < 0:
            raise VlctlError(f"IndexConfig.nlist must be >= 0 (0 = automatic), got {self.nlist!r}")
        validate_config(self)  # then every field in its declared range (the opt() above)


# --------------------------------------------------------------------------------------------
# FAISS


def faiss_module():
    import faiss

    return faiss


def new_index(cfg: IndexConfig, dim: int, first: np.ndarray | None):
    """A FAISS index for `cfg`; ivfpq is trained on (a sample of) `first`, the first add's rows."""
    faiss = faiss_module()
    if cfg.kind == "none":
        return None
    if cfg.kind == "flat":
        return faiss.IndexFlatIP(dim)
    if cfg.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        return index
    # ivfpq
    if dim % cfg.pq_m:
        raise VlctlError(f"IndexConfig.pq_m={cfg.pq_m} does not divide the embedding dim {dim}")
    n = 0 if first is None else len(first)
    nlist = cfg.nlist or max(1, min(int(4 * np.sqrt(n)), n // 39))
    need = max(39 * nlist, 2**cfg.pq_nbits)  # FAISS's own minimum training set sizes
    if n < need:
        raise VlctlError(
            f"an ivfpq gallery trains its quantisers on the first add, which needs at least {need} rows "
            f"(nlist={nlist}, pq_nbits={cfg.pq_nbits}); got {n}. Use --index-kind flat for small galleries, or a "
            "smaller nlist / pq_nbits"
        )
    size = min(n, max(cfg.train_size, need))
    # A fixed-seed sample keeps builds reproducible; k-means cost grows with it, not with n.
    train = first if size == n else first[np.sort(np.random.default_rng(0).choice(n, size, replace=False))]
    train = normalise(train, "ivfpq training sample")
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, cfg.pq_m, cfg.pq_nbits, faiss.METRIC_INNER_PRODUCT)
    index.train(train)
    return index


def set_search_params(index, cfg: IndexConfig) -> None:
    if cfg.kind == "ivfpq":
        index.nprobe = cfg.nprobe
    elif cfg.kind == "hnsw":
        index.hnsw.efSearch = cfg.ef_search


def normalise(x: np.ndarray, what: str, divide: bool = True) -> np.ndarray:
    """`x` as float32 rows of unit L2 norm (a copy); NaN, inf and all-zero rows are refused.
    divide=False: rows already normalised by the encoder are checked and kept exactly."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise VlctlError(f"{what}: expected a 2-D array (n, dim), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise VlctlError(f"{what}: expected floating-point embeddings, got dtype {x.dtype}")
    x = x.astype(np.float32, copy=True)
    if not np.isfinite(x).all():
        raise VlctlError(f"{what}: embeddings contain NaN or inf")
    if not divide:
        return x
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise VlctlError(f"{what}: row {int(np.flatnonzero(norms[:, 0] == 0)[0])} is all zeros (cannot normalise)")
    return x / norms

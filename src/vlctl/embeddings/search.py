"""FAISS indexes over a store's image rows, search results and rerankers.

Index kinds (`IndexConfig.kind`): "none" (no index; exact search in numpy), "flat" (exact inner
product), "ivfpq" (inverted lists + product quantisation, trained on the first add), "hnsw"
(graph over the full vectors). Scores are inner products of L2-normalised vectors (cosine).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from vlctl.config import opt
from vlctl.io import VlctlError

if TYPE_CHECKING:
    from vlctl.embeddings.store import Store

INDEX_KINDS = ("none", "flat", "ivfpq", "hnsw")




@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """Which FAISS index a gallery uses, and its parameters."""

    kind: str = opt(
        "flat", "index kind: 'none' (no FAISS index; exact search in numpy), 'flat' (exact inner product), "
        "'ivfpq' or 'hnsw' (approximate, for large stores)"
    )
    nlist: int = opt(
        0, "ivfpq: number of inverted lists (coarse centroids); 0 = 4*sqrt(n) of the first add, at most n/39"
    )
    pq_m: int = opt(64, "ivfpq: sub-quantisers per vector (must divide dim); codes take pq_m * pq_nbits / 8 bytes")
    pq_nbits: int = opt(8, "ivfpq: bits per sub-quantiser code")
    nprobe: int = opt(32, "ivfpq: inverted lists visited per query (recall vs speed)")
    refine: int = opt(50, "ivfpq: re-score k * refine candidates exactly from the stored embeddings (1 = off)")
    train_size: int = opt(100_000, "ivfpq: rows of the first add sampled to train the quantisers (at least 39 * nlist)")
    hnsw_m: int = opt(32, "hnsw: graph neighbours per node")
    ef_construction: int = opt(80, "hnsw: candidate list size while building")
    ef_search: int = opt(64, "hnsw: candidate list size per query (recall vs speed)")

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise VlctlError(f"IndexConfig.kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        for f in ("pq_m", "pq_nbits", "nprobe", "refine", "train_size", "hnsw_m", "ef_construction", "ef_search"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise VlctlError(f"IndexConfig.{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.nlist, int) or self.nlist < 0:
            raise VlctlError(f"IndexConfig.nlist must be >= 0 (0 = automatic), got {self.nlist!r}")


class Reranker(Protocol):
    """Re-scores search candidates; higher is better.

    Called as `reranker(queries, candidate_ids, gallery)` with queries (q, d) float32 (the query
    embeddings), candidate_ids (q, c) int64 (row numbers; -1 where the index found fewer than c)
    and the gallery (use `gallery.vectors(ids)` for embeddings, `gallery.metadata(ids)` for
    metadata). Returns scores (q, c); -inf drops a candidate. TEVI rerank (text-conditioned
    scores) and ControlEmbed attribute queries implement this.
    """

    def __call__(self, queries: np.ndarray, candidate_ids: np.ndarray, gallery: Store) -> np.ndarray: ...


def exact_rerank(queries: np.ndarray, candidate_ids: np.ndarray, gallery: Store) -> np.ndarray:
    """The exact inner product of each query with its candidates' stored embeddings: (q, c)."""
    vecs = gallery.vectors(np.maximum(candidate_ids, 0).ravel()).reshape(*candidate_ids.shape, -1)
    scores = np.einsum("qd,qcd->qc", queries, vecs)
    return np.where(candidate_ids >= 0, scores, -np.inf).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Top-k results of q queries: ids (q, k) int64 row numbers (-1 = no result), scores (q, k)."""

    ids: np.ndarray
    scores: np.ndarray

    def hits(self, gallery: Store) -> list[list[dict]]:
        """Per query, [{**metadata, "id", "score"}] best first (rows with id -1 left out).

        "id" (the row number) and "score" are reserved: a metadata field of that name is shadowed.
        """
        out = []
        for ids, scores in zip(self.ids, self.scores):
            keep = ids >= 0
            metas = gallery.metadata(ids[keep])
            out.append([{**m, "id": int(i), "score": float(s)} for i, s, m in zip(ids[keep], scores[keep], metas)])
        return out


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


def write_index(index, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    faiss_module().write_index(index, str(tmp))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)



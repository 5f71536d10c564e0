"""FAISS indexes over a store's image rows, search results and rerankers.

Index kinds (`IndexConfig.kind`): "none" and "flat" (no index file: exact search over the stored
rows), "ivfpq" (inverted lists + product quantisation, trained on the first add), "hnsw" (graph
over the full vectors); how their files are kept is `vlctl.embeddings.parts`. Scores are inner
products of L2-normalised vectors (cosine).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError

INDEX_KINDS = ("none", "flat", "ivfpq", "hnsw")


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """How a store keeps its image rows: their dtype, which FAISS index searches them, its parameters."""

    kind: str = opt(
        "flat", "index kind: 'none' or 'flat' (no index file: exact inner product over the stored rows, "
        "read blockwise), 'ivfpq' or 'hnsw' (approximate, for large stores; one index part per add)",
        choices=INDEX_KINDS,
    )
    dtype: str = opt("float32", "stored dtype of the embeddings: float16 halves the shards; search and every "
                     "method compute in float32", choices=("float32", "float16"))
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
    target_recall: float = opt(
        0.0, "ivfpq: at each add, pick the cheapest nprobe <= --index-nprobe and refine <= --index-refine whose "
        "recall@10 on held-out queries sampled from the stored rows reaches this, e.g. 0.95 (recorded in the "
        "manifest, used by every search). It holds for queries like the stored rows (image to image); queries "
        "far from them (text queries across CLIP's modality gap) may need more: 0 (default) = no tuning",
        ge=0.0, le=1.0,
    )
    tune_queries: int = opt(256, "ivfpq: stored rows sampled as held-out tuning queries (see target_recall)",
                            ge=1, le=100_000)
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
    """A FAISS index for `cfg` (None for the exact kinds, which search the stored rows); ivfpq is
    trained on (a sample of) `first`, the first add's rows."""
    faiss = faiss_module()
    if cfg.kind in ("none", "flat"):
        return None
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


def refine_exact(q: np.ndarray, ids: np.ndarray, arrays: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top k of each query's candidates `ids` (q, c) by exact inner product with their stored rows
    (`arrays`: the store's shards; row numbers run on across them). -1 candidates are dropped;
    FAISS puts them last, after every row it found. Returns (scores, ids), (q, min(k, c)), best
    first; -1 / -inf where fewer than k candidates were rows.

    One shard (the usual store): FAISS's own re-ranking kernel (`knn_inner_products_by_idx`)
    reads the candidate rows straight from the memory-mapped shard in C++, no copy of them. Else
    one gather of every candidate row and a batched matrix-vector product in numpy."""
    kk = min(k, ids.shape[1])
    q = np.ascontiguousarray(q, dtype=np.float32)
    if len(arrays) == 1 and arrays[0].flags.c_contiguous and arrays[0].dtype == np.float32:
        faiss, y = faiss_module(), arrays[0]
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        # ld_ids (the last argument) given: with its default -1, faiss 1.15.1 reads the wrong ids for every
        # query after the first (tests/test_search_tuning.py checks the kernel against numpy).
        scores, out = np.empty((len(q), kk), np.float32), np.empty((len(q), kk), np.int64)
        faiss.knn_inner_products_by_idx(faiss.swig_ptr(q), faiss.swig_ptr(y), faiss.swig_ptr(ids), q.shape[1],
                                        len(q), len(y), ids.shape[1], kk, faiss.swig_ptr(scores), faiss.swig_ptr(out),
                                        ids.shape[1])
        return np.where(out >= 0, scores, np.float32(-np.inf)), out
    valid = ids >= 0
    flat = np.where(valid, ids, 0).ravel()
    order = np.argsort(flat, kind="stable")  # the shard read in file order
    rows = np.empty((flat.size, q.shape[1]), np.float32)
    rows[order] = row_reader(arrays)(flat[order])
    scores = np.matmul(rows.reshape(*ids.shape, -1), q[:, :, None])[:, :, 0]
    scores[~valid] = -np.inf
    best = top_positions(scores, kk)
    top_s, top_i = np.take_along_axis(scores, best, 1), np.take_along_axis(ids, best, 1)
    return top_s, np.where(top_s > -np.inf, top_i, -1)


def exact_search(q: np.ndarray, blocks, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) (q, n): the top n rows per query by exact inner product over `blocks`, the
    rows in order as float32 blocks (a store's memory maps, one block at a time), best first."""
    best_s = np.full((len(q), 0), -np.inf, np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    first = 0
    for block in blocks:
        scores = q @ block.T
        ids = np.broadcast_to(np.arange(first, first + len(block)), scores.shape)
        first += len(block)
        best_s, best_i = np.hstack([best_s, scores]), np.hstack([best_i, ids])
        top = top_positions(best_s, n)  # best first: the last pass leaves them sorted
        best_s, best_i = np.take_along_axis(best_s, top, 1), np.take_along_axis(best_i, top, 1)
    return best_s.astype(np.float32), best_i


def top_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """(q, m) -> (q, min(k, m)): per row, the positions of its k largest scores, best first, equal
    scores in position order: `np.argsort(-scores, axis=1, kind="stable")[:, :k]`, without sorting
    all m (a partition finds each row's k-th score; only the >= k-th are sorted)."""
    q, m = scores.shape
    if k >= m:
        return np.argsort(-scores, axis=1, kind="stable")
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]  # (q, 1) each row's k-th largest
    keep = scores >= kth  # k per row, more where the k-th score is tied (fewer with NaN)
    plain = keep.sum(1) == k
    out = np.empty((q, k), np.int64)
    if plain.any():
        pos = np.nonzero(keep[plain])[1].reshape(-1, k)  # ascending positions
        order = np.argsort(-np.take_along_axis(scores[plain], pos, 1), axis=1, kind="stable")
        out[plain] = np.take_along_axis(pos, order, 1)
    for r in np.flatnonzero(~plain):  # ties at the k-th score, or NaN: the full sort of that row
        out[r] = np.argsort(-scores[r], kind="stable")[:k]
    return out


def row_reader(arrays: list[np.ndarray]):
    """`read(ids) -> (m, dim)` float32 rows of the shards `arrays` (float32 or float16; row numbers
    run on across them); ids must be valid. One shard (the usual store): a single fancy index of its memory map."""
    if len(arrays) == 1:
        arr = arrays[0]
        return lambda ids: np.asarray(arr[ids], np.float32)
    offsets = np.cumsum([0] + [len(a) for a in arrays])

    def read(ids: np.ndarray) -> np.ndarray:
        out = np.empty((len(ids), arrays[0].shape[1]), np.float32)
        shard = np.searchsorted(offsets, ids, side="right") - 1
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = arrays[s][ids[sel] - offsets[s]]
        return out

    return read

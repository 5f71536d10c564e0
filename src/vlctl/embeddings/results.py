"""Search results and rerankers of a store (`vlctl.embeddings.store.Store.search`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from vlctl.fsops import VlctlError

Store = Any  # vlctl.embeddings.store.Store (not imported: it imports this module)


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


def rerank_candidates(queries: np.ndarray, candidate_ids: np.ndarray, reranker: Reranker,
                      gallery: Store) -> tuple[np.ndarray, np.ndarray]:
    """The candidates (q, c) re-ordered by the reranker's scores, best first: (ids, scores); -1 last."""
    scores = np.asarray(reranker(queries, candidate_ids, gallery), dtype=np.float32)
    if scores.shape != candidate_ids.shape:
        raise VlctlError(f"search: reranker returned scores of shape {scores.shape}, expected {candidate_ids.shape}")
    scores = np.where(candidate_ids >= 0, scores, -np.inf)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(candidate_ids, order, 1), np.take_along_axis(scores, order, 1)


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

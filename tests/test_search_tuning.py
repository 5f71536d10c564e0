"""ivfpq search: the exact re-scoring kernel against numpy, and the data-driven (nprobe, refine) tuning."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from vlctl.embeddings.search import IndexConfig, refine_exact, top_positions
from vlctl.embeddings.store import create_gallery, open_gallery
from vlctl.embeddings.tuning import NPROBE_STEPS, REFINE_STEPS, _time_points, exact_neighbours, grid

ENC = "test-encoder@0123456789abcdef"


def _clustered(n: int, dim: int, seed: int, centers: int = 40) -> np.ndarray:
    """Unit vectors around fixed centres (seed 123): every seed draws from the same distribution."""
    c = np.random.default_rng(123).standard_normal((centers, dim))
    rng = np.random.default_rng(seed)
    x = c[rng.integers(0, centers, n)] + 0.6 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _reference_top(q, ids, x, k):
    """Top k of each row's candidates by exact score, in plain Python (-1 candidates skipped)."""
    out = []
    for qi, row in zip(q, ids):
        cand = [int(i) for i in row if i >= 0]
        out.append(sorted(cand, key=lambda i: -float(x[i] @ qi))[:k])
    return out


def test_refine_exact_faiss_kernel_and_numpy_agree_with_a_reference():
    x = _clustered(2000, 16, seed=0)
    q = _clustered(7, 16, seed=1)
    rng = np.random.default_rng(0)
    ids = rng.choice(2000, (7, 60)).astype(np.int64)
    ids[2, 50:] = -1  # FAISS pads a short candidate list with -1 at its end
    ids[3, 5:] = -1  # fewer candidates than k
    ref = _reference_top(q, ids, x, 10)
    one = refine_exact(q, ids, [x], 10)  # one shard: FAISS's knn_inner_products_by_idx
    two = refine_exact(q, ids, [x[:900], x[900:]], 10)  # two shards: the numpy path
    for scores, got in (one, two):
        assert [[int(i) for i in r if i >= 0] for r in got] == ref
        assert np.allclose(scores[got >= 0], np.einsum("qd,qd->q", x[got[got >= 0]], np.repeat(q, 10, 0)
                                                       [(got >= 0).ravel()]), atol=1e-6)
        assert np.isneginf(scores[3, 5:]).all() and (got[3, 5:] == -1).all()


def test_top_positions_is_the_stable_argsort_prefix():
    # ties at the k-th score, NaN and -inf take the full sort of their row; the rest a partition
    rng = np.random.default_rng(0)
    for trial in range(300):
        q, m, k = rng.integers(1, 4), rng.integers(1, 40), rng.integers(1, 45)
        s = rng.integers(0, 4, (q, m)).astype(np.float32) if trial % 2 else rng.standard_normal((q, m), np.float32)
        if trial % 7 == 0:
            s[0, 0] = np.nan
        if trial % 5 == 0:
            s[:, :2] = -np.inf
        np.testing.assert_array_equal(top_positions(s, k), np.argsort(-s, axis=1, kind="stable")[:, :k])


def test_time_points_gives_each_point_every_query_and_never_the_last_points_query():
    """Each point is timed on every sample query `rounds` times, and within a turn no point searches
    the query the point before it just searched (whose candidate rows would still be in cache)."""
    q = np.arange(10, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)  # row j holds j
    points = [(1, 5, 0.9), (2, 5, 0.95), (4, 8, 0.99)]
    calls = []
    lat = _time_points(points, q, 10, lambda row, k, p, r: calls.append((p, int(row[0, 0]))), rounds=2)
    assert len(lat) == 3 and all(t >= 0 for t in lat)
    for p, _, _ in points:
        assert sorted(j for pp, j in calls if pp == p) == sorted(list(range(10)) * 2)
    turns = [calls[t : t + 3] for t in range(0, len(calls), 3)]
    assert all(a[1] != b[1] for turn in turns for a, b in itertools.pairwise(turn))


def test_exact_neighbours_hold_each_query_out():
    x = _clustered(500, 8, seed=0)
    ids = np.array([0, 17, 499])
    got = exact_neighbours([x[:200], x[200:]], ids, 5, chunk=64)
    sc = x[ids] @ x.T
    sc[np.arange(3), ids] = -np.inf
    assert got.tolist() == np.argsort(-sc, axis=1, kind="stable")[:, :5].tolist()


def _recall(index, x, query_ids, truth, nprobe, refine, k=10):
    """Recall@k of (nprobe, refine) on stored-row queries, their own row dropped (the tuning's rule)."""
    index.nprobe = nprobe
    _, cand = index.search(x[query_ids], k * refine + 1)
    hits = []
    for qid, row, t in zip(query_ids, cand, truth):
        row = [int(i) for i in row if i >= 0 and i != qid][: k * refine]
        top = row[:k] if refine == 1 else sorted(row, key=lambda i: -float(x[i] @ x[qid]))[:k]
        hits.append(len(set(top) & set(t.tolist())) / k)
    return float(np.mean(hits))


def test_tuned_store_picks_a_frontier_point_records_it_and_keeps_it(tmp_path):
    x = _clustered(4000, 32, seed=0)
    cfg = IndexConfig(kind="ivfpq", nlist=32, pq_m=4, nprobe=16, refine=20, target_recall=0.9, tune_queries=64)
    g = create_gallery(tmp_path / "g", ENC, 32, cfg).add(x)
    tuned = g.tuned
    assert tuned["reached"] and tuned["target"] == 0.9 and tuned["queries"] == 64 and tuned["k"] == 10
    assert tuned["nprobe"] <= 16 and tuned["refine"] <= 20 and g.index.nprobe == tuned["nprobe"]
    # The recorded recall is recomputed independently, and one step cheaper in nprobe misses the target.
    query_ids = np.sort(np.random.default_rng(0).choice(4000, 64, replace=False))
    sc = x[query_ids] @ x.T
    sc[np.arange(64), query_ids] = -np.inf
    truth = np.argsort(-sc, axis=1, kind="stable")[:, :10]
    index = g.index
    assert _recall(index, x, query_ids, truth, tuned["nprobe"], tuned["refine"]) == pytest.approx(tuned["recall"], abs=5e-5)
    nprobes = grid(16, NPROBE_STEPS)
    i = nprobes.index(tuned["nprobe"])
    if i:
        assert _recall(index, x, query_ids, truth, nprobes[i - 1], tuned["refine"]) < 0.9
    assert [r for _, r, _, _ in tuned["frontier"]] == sorted(r for _, r, _, _ in tuned["frontier"])
    assert {r for _, r, _, _ in tuned["frontier"]} <= set(grid(20, REFINE_STEPS))
    # Fresh queries from the same distribution reach about the target with the tuned setting.
    q = _clustered(100, 32, seed=1)
    reopened = open_gallery(tmp_path / "g")
    assert reopened.index.nprobe == tuned["nprobe"] and reopened.tuned == tuned
    res = reopened.search(q, k=10)
    exact = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :10]
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(res.ids, exact)]) >= 0.85
    assert np.allclose(res.scores, np.take_along_axis(q @ x.T, res.ids, 1), atol=1e-5)  # exact scores


def test_untuned_and_older_stores_search_with_the_config(tmp_path):
    x = _clustered(3000, 32, seed=0)
    cfg = IndexConfig(kind="ivfpq", nlist=16, pq_m=4, nprobe=8, refine=10)
    g = create_gallery(tmp_path / "g", ENC, 32, cfg).add(x)
    assert g.tuned is None and g.index.nprobe == 8  # the store an add returns, not only a reopened one
    # A manifest written before the tuning fields existed opens with their defaults (no tuning).
    path = tmp_path / "g" / "manifest.json"
    manifest = json.loads(path.read_text())
    for field in ("target_recall", "tune_queries"):
        del manifest["index"]["config"][field]
    path.write_text(json.dumps(manifest))
    old = open_gallery(tmp_path / "g")
    assert old.config.target_recall == 0 and old.tuned is None and old.index.nprobe == 8
    assert old.search(x[:5], k=3).ids[:, 0].tolist() == list(range(5))

"""Data-driven search parameters of an ivfpq store: the cheapest (nprobe, refine) that reaches a target recall.

The way autofaiss tunes an index (and FAISS's ParameterSpace explores one): try search settings on
sample queries whose exact answers are known, keep the settings that reach the target recall@k,
take the cheapest. Here:

- Queries: `IndexConfig.tune_queries` stored rows, a fixed-seed sample of the store's first add
  (never a benchmark's or a user's test queries), kept for the store's life. Each one is held out
  of its own answer: its exact top-k is the k nearest *other* rows, and its own row is dropped from
  the index's candidates, so a query cannot score by finding itself.
- Exact answers are kept in the manifest (`index.tune_truth`) and brought up to date by each add
  from its own rows only (`update_truth`): an add never re-reads the rows already stored.
- Grid: nprobe in 1, 2, 4, ... up to `IndexConfig.nprobe`; refine (k * refine candidates re-scored
  exactly) in 1, 2, 3, 5, 8, ... up to `IndexConfig.refine`. The configured values are the most the
  tuning may pick, so a tuned store is never slower than an untuned one with the same config.
- Recall@k of a setting = mean |returned top-k ∩ exact top-k| / k over the sample queries. For one
  nprobe the index is searched once with the largest candidate count; the candidate list of a
  smaller refine is its prefix (FAISS returns candidates best first), so every refine of the grid
  is scored from one search.
- Cheapest: for each refine the smallest nprobe reaching the target (recall grows with nprobe);
  among those frontier points the lowest measured single-query latency of the store's own search
  path (median over the sample queries, points timed in turn, each on a query whose candidate rows
  are not in cache from the point before it); points within 10% of it count as
  ties (timing noise), broken by the bytes a query reads (PQ codes scanned + rows re-scored). If no
  setting reaches the target, the one of highest recall (then the cheapest) is kept and `reached`
  says so.

The result is recorded in the manifest (`index.tuned`) and used by every search of the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from vlctl.embeddings.search import IndexConfig, refine_exact, row_reader

TUNE_K = 10  # recall@10, the figure users compare ANN indexes by
TUNE_SEED = 0


def grid(cap: int, steps: Sequence[int]) -> list[int]:
    """The values of `steps` below `cap`, then `cap` itself."""
    return sorted({s for s in steps if s < cap} | {cap})


NPROBE_STEPS = [2**i for i in range(25)]
REFINE_STEPS = [1, 2, 3, 5, 8, 12, 16, 24, 32, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000, 10_000]


def exact_neighbours(arrays: Sequence[np.ndarray], query_ids: np.ndarray, k: int, chunk: int = 65_536,
                     start: int = 0) -> np.ndarray:
    """(m, k) int64: for each stored row in `query_ids`, the k other rows of highest inner product
    (its own row excluded), best first, among the rows of `arrays[start:]` (`arrays`: the store's
    shards in order; row numbers run on across them); -1 where those hold fewer than k."""
    offsets = np.cumsum([0] + [len(a) for a in arrays])
    read = row_reader(list(arrays))
    q = read(query_ids)
    best_s = np.full((len(q), 0), -np.inf, np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    for s in range(start, len(arrays)):
        arr = arrays[s]
        for c in range(0, len(arr), chunk):
            sc = q @ np.asarray(arr[c : c + chunk], np.float32).T
            ids = np.arange(c, c + sc.shape[1]) + offsets[s]
            sc[ids[None, :] == query_ids[:, None]] = -np.inf  # held out of its own answer
            top = min(k, sc.shape[1])
            part = np.argpartition(-sc, top - 1, axis=1)[:, :top]
            best_s = np.concatenate([best_s, np.take_along_axis(sc, part, 1)], 1)
            best_i = np.concatenate([best_i, ids[part]], 1)
            keep = np.argsort(-best_s, axis=1, kind="stable")[:, :k]
            best_s, best_i = np.take_along_axis(best_s, keep, 1), np.take_along_axis(best_i, keep, 1)
    best_i = np.where(best_s > -np.inf, best_i, -1)
    return np.pad(best_i, ((0, 0), (0, k - best_i.shape[1])), constant_values=-1)


def update_truth(arrays: Sequence[np.ndarray], truth: dict | None, n_queries: int, k: int = TUNE_K) -> dict:
    """The tuning queries and their exact top-k after an add whose rows are `arrays[-1]`:
    {"queries": [row ids], "neighbours": [[k row ids], ...]} (JSON-ready). The first add draws the
    queries (a fixed-seed sample of its rows); a later add scans only its own rows and merges their
    best with the kept answers (ties keep the lower row, as a scan of every row would)."""
    if truth is None:
        n = sum(len(a) for a in arrays)
        query_ids = np.sort(np.random.default_rng(TUNE_SEED).choice(n, min(n_queries, n - 1), replace=False))
        neighbours = exact_neighbours(arrays, query_ids.astype(np.int64), k)
    else:
        query_ids = np.asarray(truth["queries"], np.int64)
        old = np.asarray(truth["neighbours"], np.int64).reshape(len(query_ids), k)
        new = exact_neighbours(arrays, query_ids, k, start=len(arrays) - 1)
        both = np.concatenate([old, new], 1)
        read = row_reader(list(arrays))
        q = read(query_ids)
        rows = read(np.maximum(both, 0).ravel()).reshape(*both.shape, -1)
        scores = np.where(both >= 0, np.matmul(rows, q[:, :, None])[:, :, 0], -np.inf)
        neighbours = np.take_along_axis(both, np.argsort(-scores, axis=1, kind="stable")[:, :k], 1)
    return {"queries": query_ids.tolist(), "neighbours": neighbours.tolist()}


def tune_ivfpq(
    index,
    vectors: Callable[[np.ndarray], np.ndarray],
    search: Callable[[np.ndarray, int, int, int], object],
    nprobe_cap: int,
    refine_cap: int,
    target: float,
    truth: dict,
    k: int = TUNE_K,
) -> dict:
    """The cheapest (nprobe, refine) reaching recall@k >= `target` (module docstring).

    Args:
        index: the trained FAISS IndexIVFPQ holding every row (its nprobe is changed here).
        vectors: stored rows by id (m,) -> (m, dim), the store's `vectors`.
        search: `search(query (1, dim), k, nprobe, refine)`, the store's own single-query path, timed.
        nprobe_cap, refine_cap: the largest values tried (the config's).
        target: recall@k to reach.
        truth: the tuning queries and their exact answers (`update_truth`).

    Returns: {"nprobe", "refine", "recall", "reached", "target", "k", "queries", "latency_ms",
    "frontier": [[nprobe, refine, recall, latency_ms], ...]} (JSON-ready).
    """
    n = int(index.ntotal)
    query_ids = np.asarray(truth["queries"], np.int64)
    m = len(query_ids)
    truth = np.asarray(truth["neighbours"], np.int64)
    q = vectors(query_ids)
    nprobes = grid(min(nprobe_cap, int(index.nlist)), NPROBE_STEPS)
    refines = grid(refine_cap, REFINE_STEPS)
    n_cand = min(k * refines[-1] + 1, n)  # + 1: the query's own row, dropped below
    recall = np.zeros((len(nprobes), len(refines)))
    for a, p in enumerate(nprobes):
        index.nprobe = p
        _, cand = index.search(q, n_cand)
        # The candidates without the query's own row, in the index's order (-1 where fewer were
        # found): a stable sort on "is own row" moves it last and keeps the others' order.
        order = np.argsort(cand == query_ids[:, None], axis=1, kind="stable")
        others = np.take_along_axis(cand, order, 1)[:, : n_cand - 1]
        valid = others >= 0
        exact = np.full(others.shape, -np.inf, np.float32)
        for c in range(0, m, 32):  # 32 queries' candidate rows at a time: 32 * k * refine_cap rows in memory
            o = others[c : c + 32]
            rows = vectors(np.maximum(o, 0).ravel()).reshape(*o.shape, -1)
            exact[c : c + 32] = np.where(valid[c : c + 32], np.matmul(rows, q[c : c + 32, :, None])[:, :, 0], -np.inf)
        for b, r in enumerate(refines):
            c = min(k * r, others.shape[1])
            sub = exact[:, :c]
            top = np.argpartition(-sub, min(k, c) - 1, axis=1)[:, :k] if c > k else np.arange(c)[None].repeat(m, 0)
            got = np.take_along_axis(others[:, :c], top, 1)
            got = np.where(np.take_along_axis(sub, top, 1) > -np.inf, got, -1)
            recall[a, b] = np.mean([len(set(g) & set(t)) / k for g, t in zip(got, truth)])
    frontier = []
    for b, r in enumerate(refines):
        hit = np.flatnonzero(recall[:, b] >= target)
        if len(hit):
            frontier.append((nprobes[hit[0]], r, float(recall[hit[0], b])))
    reached = bool(frontier)
    if not reached:  # the highest recall, then the fewest lists and candidates
        a, b = max(((a, b) for a in range(len(nprobes)) for b in range(len(refines))),
                   key=lambda ab: (recall[ab], -nprobes[ab[0]], -refines[ab[1]]))
        frontier = [(nprobes[a], refines[b], float(recall[a, b]))]
    latency = _time_points(frontier, q, k, search)
    # Bytes a query reads: PQ codes of the lists it scans, then the rows it re-scores. Among the points
    # within 10% of the fastest (timing noise on a loaded machine), the one that reads least.
    work = [p * index.ntotal / index.nlist * index.code_size + k * r * index.d * 4 for p, r, _ in frontier]
    close = [i for i, t in enumerate(latency) if t <= 1.1 * min(latency)]
    best = min(close, key=lambda i: work[i])
    p, r, rec = frontier[best]
    return {"nprobe": int(p), "refine": int(r), "recall": round(rec, 4), "reached": reached, "target": target,
            "k": k, "queries": int(m), "latency_ms": round(latency[best], 4),
            "frontier": [[int(a), int(b), round(c, 4), round(t, 4)] for (a, b, c), t in zip(frontier, latency)]}


def _time_points(points: list, q: np.ndarray, k: int, search: Callable, rounds: int = 3) -> list[float]:
    """Median single-query latency (ms) of each (nprobe, refine) point over `rounds` passes of the
    sample queries `q`.

    Points are timed in turn, so load from other processes hits them alike, but at each turn each
    point searches a different query: point i takes query (j + i * stride) mod m at turn j. Timing
    every point on the same query made each point after the first read the candidate rows the one
    before had just brought into cache: on 1M x 512 rows the first point measured 1.5x slower than
    it runs on a fresh query, and the tuning picked nprobe 1 / refine 150 at 0.35 ms, which served
    test queries at 0.62 ms, slower than nprobe 2 / refine 75. With the stride, m searches (of other
    queries) pass between two searches of one query, as for queries a server has not seen."""
    m = len(q)
    stride = max(1, m // max(1, len(points)))
    times = np.zeros((len(points), rounds * m))
    for j in range(rounds * m):
        for i, (p, r, _) in enumerate(points):
            row = q[(j + i * stride) % m][None]
            t0 = time.perf_counter()
            search(row, k, p, r)
            times[i, j] = time.perf_counter() - t0
    return [1000 * float(np.median(t)) for t in times]


def tune_store(cfg: IndexConfig, index, arrays: Sequence[np.ndarray], truth: dict | None) -> tuple[dict, dict] | None:
    """For an ivfpq store with target_recall > 0: the tuning queries' answers brought up to date with
    the add's rows (`arrays[-1]`; `truth`: the kept ones, None at the first add) and `tune_ivfpq`'s
    pick, as (tuned, truth), the index left with the picked nprobe; None (nothing tuned) otherwise."""
    if cfg.kind != "ivfpq" or cfg.target_recall <= 0 or index is None or index.ntotal < 2:
        return None
    arrays = list(arrays)
    read = row_reader(arrays)
    truth = update_truth(arrays, truth, cfg.tune_queries)

    def search(row, k, nprobe, refine):  # Store.search's ivfpq path, less its input checks
        index.nprobe = nprobe
        _, ids = index.search(row, min(k * refine, index.ntotal))
        return refine_exact(row, ids, arrays, k) if refine > 1 else ids

    tuned = tune_ivfpq(index, read, search, cfg.nprobe, cfg.refine, cfg.target_recall, truth)
    index.nprobe = tuned["nprobe"]
    return tuned, truth

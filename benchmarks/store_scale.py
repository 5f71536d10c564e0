"""Store scale benchmark (issue 44): a store grown by 100k-row adds, per add its time and peak
memory, and at checkpoints its disk, open time, search latency and recall@10 against exact search.

    python benchmarks/store_scale.py --rows 10000000 --json benchmarks/store_scale_10m_nlist1024.json
    python benchmarks/store_scale.py --rows 10000000 --first-add 1000000 --nlist 4096 --measure-every 30 \
        --points 32:100,32:200,32:400,64:200,64:400 --json benchmarks/store_scale_10m.json

(`make bench-store`: both, about 25 min and 22 GB of disk on 2 cores; docs/deployment.md.)

Rows: synthetic 512-d embedding-like unit vectors (`index_bench.synthetic`: 1000 centres + noise),
add a seeded from a; each row's metadata {"path", "caption"}. Index: ivfpq, nlist 1024, PQ64, the
default nprobe 32 and refine 50 (no tuning unless --target-recall; the tuning's cost is then in
the add's time).

Each add runs in a fresh process (`--one-add`), so its peak RSS (VmHWM, read right after the add,
the 100k x 512 input array included) is that add's alone, as is the open time: `open_store` of
the store as the previous add left it (page cache warm, as for a server reopening its store).
At checkpoints the same process then searches: the index parts' first load, then single-query
`Store.search` p50 / p99 over held-out queries (fresh draws, never stored rows) after one warm-up
pass, and recall@10 against the exact top-10, which the parent keeps up to date add by add from
each add's rows only; the same at each `--points` nprobe:refine setting. Disk = every file under the store; the target compares it with the shards
plus the PQ codes (rows x pq_m bytes).

Growth law: the slope of add time against store rows over the adds after the first (which
trains the quantisers), reported beside the mean add time: an add bound by the rows it adds has a
slope near 0. The store is deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_bench import _proc_status_mb, emit, recall_at_k, synthetic

DIM, CLUSTERS, SIGMA, K = 512, 1000, 0.6, 10


def add_rows(a: int, rows: int) -> np.ndarray:
    return synthetic(rows, DIM, CLUSTERS, SIGMA, seed=1000 + a)


def one_add(args: argparse.Namespace) -> dict:
    """One add into the store (created by the first), then the checkpoint's measurements."""
    from vlctl.embeddings.search import IndexConfig
    from vlctl.embeddings.store import create_store, open_store

    store_dir, a = Path(args.dir) / "store", args.one_add
    first_add = args.first_add or args.add
    x = add_rows(a, first_add if a == 0 else args.add)
    first = 0 if a == 0 else first_add + (a - 1) * args.add
    meta = [{"path": f"img/{first + i:09d}.jpg", "caption": f"synthetic photo {first + i}"} for i in range(len(x))]
    t0 = time.perf_counter()
    if a == 0:
        cfg = IndexConfig(kind="ivfpq", nlist=args.nlist, pq_m=args.pq_m, target_recall=args.target_recall,
                          dtype=args.dtype)
        store = create_store(store_dir, "synthetic@512", DIM, cfg)
    else:
        store = open_store(store_dir)
    open_s = time.perf_counter() - t0
    rss_before = _proc_status_mb("VmRSS")
    t0 = time.perf_counter()
    store = store.add(x, meta)
    out = {"add": a, "rows_before": first, "rows_after": len(store), "add_s": round(time.perf_counter() - t0, 3),
           "open_s": round(open_s, 4), "peak_rss_mb": _proc_status_mb("VmHWM"), "rss_before_add_mb": rss_before}
    queries = np.load(Path(args.dir) / "queries.npy")
    sc = queries @ x.T  # this add's rows' part of the exact answers
    part = np.argsort(-sc, axis=1, kind="stable")[:, :K]
    out["chunk_top"] = (part + first).tolist()
    out["chunk_scores"] = np.take_along_axis(sc, part, 1).tolist()
    if args.measure:
        del x, sc
        t0 = time.perf_counter()
        store = open_store(store_dir)
        out["open_after_s"] = round(time.perf_counter() - t0, 4)
        t0 = time.perf_counter()
        _ = store.index
        out["index_load_s"] = round(time.perf_counter() - t0, 3)
        for q in queries:  # warm-up: the rows re-scored come into the page cache as a server's would
            store.search(q, k=K)
        lat, ids = [], []
        for q in queries:
            t0 = time.perf_counter()
            ids.append(store.search(q, k=K).ids[0])
            lat.append(time.perf_counter() - t0)
        out |= {"search_ms_p50": round(1000 * float(np.percentile(lat, 50)), 3),
                "search_ms_p99": round(1000 * float(np.percentile(lat, 99)), 3), "found": np.array(ids).tolist(),
                "nprobe": int(store.index.nprobe), "refine": int((store.tuned or {}).get("refine", store.config.refine)),
                "points": sweep(store, queries, args.points),
                "disk_bytes": sum(p.stat().st_size for p in store_dir.rglob("*") if p.is_file()),
                "shard_bytes": sum(p.stat().st_size for p in (store_dir / "img_emb").iterdir()),
                "pq_code_bytes": len(store) * args.pq_m}
    return out


def sweep(store, queries: np.ndarray, points: str) -> list[dict]:
    """Single-query p50 / p99 and the found ids at each "nprobe:refine" point (one warm-up pass each)."""
    import dataclasses

    config, out = store.config, []
    for point in filter(None, points.split(",")):
        nprobe, refine = map(int, point.split(":"))
        store.config = dataclasses.replace(config, refine=refine)  # what Store.search reads, untuned
        store.index.nprobe = nprobe
        lat, ids = [], []
        for rnd in range(2):
            for q in queries:
                t0 = time.perf_counter()
                found = store.search(q, k=K).ids[0]
                if rnd:
                    lat.append(time.perf_counter() - t0)
                    ids.append(found)
        out.append({"nprobe": nprobe, "refine": refine, "search_ms_p50": round(1000 * float(np.percentile(lat, 50)), 3),
                    "search_ms_p99": round(1000 * float(np.percentile(lat, 99)), 3), "found": np.array(ids).tolist()})
    store.config = config
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--add", type=int, default=100_000, help="rows per add")
    p.add_argument("--first-add", type=int, default=0,
                   help="rows of the first add, which trains the quantisers (0 = --add): nlist needs 39 x nlist of them")
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--pq-m", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--target-recall", type=float, default=0.0)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--points", default="32:50,64:100,128:100,128:200",
                   help="nprobe:refine settings also measured at each checkpoint")
    p.add_argument("--measure-every", type=int, default=10, help="a checkpoint every this many adds (and the last)")
    p.add_argument("--dir", default=None, help="work directory (default: a new one under the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the store")
    p.add_argument("--json", default=None)
    p.add_argument("--one-add", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_add is not None:
        print(json.dumps(one_add(args)))
        return

    work = Path(args.dir or tempfile.mkdtemp(prefix="store_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    queries = synthetic(args.queries, DIM, CLUSTERS, SIGMA, seed=7)
    np.save(work / "queries.npy", queries)
    best_s = np.full((args.queries, 0), -np.inf, np.float32)
    best_i = np.zeros((args.queries, 0), np.int64)
    adds, checkpoints = [], []
    first_add = args.first_add or args.add
    n_adds = 1 + (args.rows - first_add) // args.add
    try:
        for a in range(n_adds):
            measure = (a + 1) % args.measure_every == 0 or a == n_adds - 1 or a == 0
            cmd = [sys.executable, __file__, "--one-add", str(a), "--dir", str(work), "--add", str(args.add),
                   "--first-add", str(first_add),
                   "--nlist", str(args.nlist), "--pq-m", str(args.pq_m), "--dtype", args.dtype,
                   "--target-recall", str(args.target_recall), "--points", args.points] + (["--measure"] if measure else [])
            done = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "src"})
            if done.returncode:
                raise SystemExit(f"add {a} failed:\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            best_s = np.concatenate([best_s, np.array(r.pop("chunk_scores"), np.float32)], 1)
            best_i = np.concatenate([best_i, np.array(r.pop("chunk_top"), np.int64)], 1)
            order = np.argsort(-best_s, axis=1, kind="stable")[:, :K]
            best_s, best_i = np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)
            if "found" in r:
                r["recall_at_10"] = round(recall_at_k(np.array(r.pop("found")), best_i, K), 4)
                r["disk_ratio"] = round(r["disk_bytes"] / (r["shard_bytes"] + r["pq_code_bytes"]), 4)
                for point in r.get("points", []):
                    point["recall_at_10"] = round(recall_at_k(np.array(point.pop("found")), best_i, K), 4)
                checkpoints.append(r)
            adds.append({k: r[k] for k in ("add", "rows_before", "add_s", "open_s", "peak_rss_mb")})
            print(json.dumps(r), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work / "store", ignore_errors=True)
    later = [x for x in adds if x["add"] > 0]
    slope = float(np.polyfit([x["rows_before"] for x in later], [x["add_s"] for x in later], 1)[0]) if len(later) > 1 else 0.0
    summary = {
        "rows": first_add + (n_adds - 1) * args.add, "first_add_rows": first_add, "add_rows": args.add, "dim": DIM, "dtype": args.dtype, "nlist": args.nlist,
        "pq_m": args.pq_m, "target_recall": args.target_recall,
        "first_add_s": adds[0]["add_s"], "mean_later_add_s": round(float(np.mean([x["add_s"] for x in later])), 3) if later else None,
        "add_s_per_million_store_rows": round(slope * 1e6, 4),
        "max_peak_rss_mb": max(x["peak_rss_mb"] for x in adds),
        "max_open_s": max(x["open_s"] for x in adds),
        "adds": adds, "checkpoints": checkpoints,
    }
    emit(summary, args.json)


if __name__ == "__main__":
    main()

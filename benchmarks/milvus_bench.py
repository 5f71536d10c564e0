"""The Milvus backend at scale (Milvus Lite on one machine): fill time, disk, open time, single-query
search latency and recall@10 against exact search; ControlEmbed attribute search through it.

    python benchmarks/milvus_bench.py --n 1000000 --ce-n 100000 --json benchmarks/milvus_bench.json
    python benchmarks/milvus_bench.py --n 20000 --ce-n 5000 --queries 50     # a quick check

Data: `index_bench.synthetic` (512-d unit vectors around 1000 centres, each row with a path and a
caption in its metadata), written to a local vlctl store (index kind "none": exact search over its
shards), then `vlctl.embeddings.milvus.fill` into a Milvus Lite collection (HNSW, IP). Queries are
fresh draws from the same distribution, held out from the rows.

- fill: `fill(store, backend)` wall time (one process: reading the store, the inserts through
  pymilvus's gRPC into Milvus Lite's server in the same process, its HNSW builds per segment) and
  that process's peak RSS;
- disk: bytes under the .db directory after the fill;
- open: `open_milvus(backend)` in a fresh process (Milvus Lite starts, loads segments and indexes);
- search: one `MilvusStore.search(query, k=10)` per query in that process, p50 / p99, after one
  untimed pass; recall@10 = |top-10 ∩ exact top-10| / 10 against `index_bench.exact_topk`;
- ControlEmbed (`--ce-n` rows, a collection of their own): a small model fitted on synthetic
  attribute labels of 4000 rows; each held-out query is moved by `transform(q, "color")` and searched
  through Milvus and through the local store's exact search: the fraction of queries whose top 10
  (ids, in order) are the same, and the largest score difference.

Each measured step runs in its own subprocess (`--step`), so RSS and open time are its own. The
scratch directory is deleted at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from index_bench import _proc_status_mb, emit, exact_topk, recall_at_k, synthetic

ENCODER = "synthetic@bench"
ADD_ROWS = 250_000  # rows per add to the local store


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _config(args):
    from vlctl.embeddings.milvus import MilvusConfig

    return MilvusConfig(index=args.index, m=args.m, ef_construction=args.ef_construction, ef=args.ef,
                        nlist=args.nlist, nprobe=args.nprobe, batch=args.batch)


def _knob(args) -> tuple[str, int]:
    """The query-time parameter the sweep varies: nprobe for IVF_FLAT, ef for HNSW."""
    return ("nprobe", args.nprobe) if args.index == "IVF_FLAT" else ("ef", args.ef)


def build_store(path: Path, data: np.ndarray) -> None:
    from vlctl.embeddings.search import IndexConfig
    from vlctl.embeddings.store import create_store

    store = create_store(path, ENCODER, data.shape[1], IndexConfig(kind="none"))
    for s in range(0, len(data), ADD_ROWS):
        rows = range(s, min(s + ADD_ROWS, len(data)))
        store = store.add(np.asarray(data[rows.start : rows.stop]),
                          [{"path": f"images/{i:08d}.jpg", "caption": f"synthetic image {i}"} for i in rows],
                          normalized=True)


def step_fill(args, work: Path) -> dict:
    from vlctl.embeddings.milvus import fill
    from vlctl.embeddings.store import open_store

    store = open_store(work / args.store)
    t = time.perf_counter()
    rep = fill(store, f"milvus:{work / 'bench.db'}#{args.collection}", _config(args), progress=True)
    return {"fill_s": round(time.perf_counter() - t, 1), "fill_peak_rss_mb": _proc_status_mb("VmHWM"),
            "added": rep["added"], "count": rep["count"]}


def _timed(coll, queries: np.ndarray) -> tuple[np.ndarray, list[float]]:
    for q in queries:  # untimed: the first touch of each segment
        coll.search(q, k=10)
    lat, ids = [], np.empty((len(queries), 10), np.int64)
    for i, q in enumerate(queries):
        t = time.perf_counter()
        ids[i] = coll.search(q, k=10).ids[0]
        lat.append(time.perf_counter() - t)
    return ids, lat


def step_search(args, work: Path) -> dict:
    from vlctl.embeddings.milvus import open_milvus

    queries, truth = np.load(work / "queries.npy"), np.load(work / "truth.npy")
    t = time.perf_counter()
    coll = open_milvus(f"milvus:{work / 'bench.db'}#{args.collection}")
    res: dict = {"open_s": round(time.perf_counter() - t, 2)}
    knob, base = _knob(args)
    for v in sorted({base, *args.sweep}):
        coll.config = dataclasses.replace(coll.config, **{knob: v})
        ids, lat = _timed(coll, queries)
        tag = "" if v == base else f"_{knob}{v}"
        res.update({f"search_ms_p50{tag}": round(1000 * float(np.percentile(lat, 50)), 2),
                    f"search_ms_p99{tag}": round(1000 * float(np.percentile(lat, 99)), 2),
                    f"recall@10{tag}": round(recall_at_k(ids, truth, 10), 4)})
    res["search_peak_rss_mb"] = _proc_status_mb("VmHWM")
    return res


def step_controlembed(args, work: Path) -> dict:
    from vlctl.embeddings.milvus import open_milvus
    from vlctl.embeddings.store import open_store
    from vlctl.methods.controlembed.estimator import ControlEmbed

    store = open_store(work / "store-ce")
    rng = np.random.default_rng(3)
    train = store.vectors(np.sort(rng.choice(len(store), 4000, replace=False)))
    axes = np.random.default_rng(4).standard_normal((7, store.dim)).astype(np.float32)
    labels = {"color": np.argmax(train @ axes[:4].T, 1).tolist(), "shape": np.argmax(train @ axes[4:].T, 1).tolist()}
    model = ControlEmbed(steps=50, hidden=64, images_per_subclass=8, align_weight=0.0, seed=0).fit(train, labels, encoder_id=ENCODER)
    moved = model.transform(np.load(work / "queries.npy")[: args.ce_queries], "color", encoder_id=ENCODER)
    local = store.search(moved, k=10)
    coll = open_milvus(f"milvus:{work / 'bench.db'}#ce")
    res: dict = {"ce_rows": len(store), "ce_queries": len(moved)}
    knob, base = _knob(args)
    for v in sorted({base, *args.sweep}):
        coll.config = dataclasses.replace(coll.config, **{knob: v})
        remote = coll.search(moved, k=10)
        tag = "" if v == base else f"_{knob}{v}"
        res.update({f"ce_top10_same_fraction{tag}": round(float((local.ids == remote.ids).all(1).mean()), 4),
                    f"ce_top10_overlap{tag}": round(recall_at_k(remote.ids, local.ids, 10), 4)})
    return res


def _run_step(step: str, args, work: Path, **extra: str) -> dict:
    argv = [sys.executable, __file__, "--step", step, "--work", str(work)]
    for k, v in {**vars(args), **extra}.items():
        if k not in ("step", "work", "json") and v is not None:
            argv += [f"--{k.replace('_', '-')}", *map(str, v if isinstance(v, list) else [v])]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    print(f"[bench] {step}: {res}", file=sys.stderr, flush=True)
    return res


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="rows of the large collection (default: 1,000,000)")
    p.add_argument("--ce-n", type=int, default=100_000, help="rows of the ControlEmbed collection (default: 100,000)")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--queries", type=int, default=200, help="held-out queries (default: 200)")
    p.add_argument("--ce-queries", type=int, default=100, help="ControlEmbed queries (default: 100)")
    p.add_argument("--index", default="HNSW", help="MilvusConfig.index (default: HNSW)")
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--ef", type=int, default=128)
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--nprobe", type=int, default=32)
    p.add_argument("--sweep", type=int, nargs="*", default=[], help="other values of the query-time parameter "
                   "(ef, or nprobe for IVF_FLAT) to measure")
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir; deleted after)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--step", default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default="store", help=argparse.SUPPRESS)
    p.add_argument("--collection", default="bench", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.step:
        res = {"fill": step_fill, "search": step_search, "controlembed": step_controlembed}[args.step](args, Path(args.work))
        print(json.dumps(res))
        return res

    work = Path(tempfile.mkdtemp(prefix="milvus_bench.", dir=args.work))
    try:
        t = time.perf_counter()
        data = np.lib.format.open_memmap(work / "data.npy", mode="w+", dtype=np.float32, shape=(args.n, args.dim))
        synthetic(args.n, args.dim, 1000, 0.6, seed=0, out=data)
        queries = synthetic(args.queries, args.dim, 1000, 0.6, seed=1)
        np.save(work / "queries.npy", queries)
        np.save(work / "truth.npy", exact_topk(data, queries, 10))
        build_store(work / "store", data)
        build_store(work / "store-ce", data[: args.ce_n])
        print(f"[bench] data and stores in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        del data
        res = {"n": args.n, "dim": args.dim, "queries": args.queries, "backend": "Milvus Lite (milvus-lite 3.2.2)",
               "config": {k: getattr(_config(args), k) for k in ("index", "m", "ef_construction", "ef", "nlist", "nprobe",
                                                                  "batch")},
               "store_bytes": _du(work / "store")}
        res.update(_run_step("fill", args, work))
        res["disk_bytes"] = _du(work / "bench.db")
        res.update(_run_step("search", args, work))
        _run_step("fill", args, work, store="store-ce", collection="ce")
        res.update(_run_step("controlembed", args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(res, args.json)
    return res


if __name__ == "__main__":
    main()

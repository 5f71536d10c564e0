"""Gallery benchmark: build time, memory, query latency and recall@10 of Flat and IVF-PQ galleries.

    python benchmarks/index_bench.py --n 1000000            # the issue's 1M x 512 setting
    python benchmarks/index_bench.py --n 100000 --kinds flat ivfpq hnsw --json out.json
    python benchmarks/index_bench.py --extract              # extraction vs raw forward (ViT-B-32)

Data: synthetic embedding-like unit vectors in `dim` dimensions: `clusters` random centres, each
point = centre + N(0, sigma^2 I), L2-normalised (pure isotropic noise has no neighbourhood
structure, so ANN numbers on it say nothing about real embeddings). Queries are fresh draws from
the same distribution, not gallery rows.

Each index kind is built in its own subprocess (`--one KIND`), so the peak resident memory it
reports (ru_maxrss) is that kind's alone. Build time = `create_gallery(...).add(all rows)`: the
FAISS build (IVF-PQ training included) plus writing the shard, metadata, index and manifest with
their sha256. Latency = one `Gallery.search(query, k)` call per query (Python overhead, IVF-PQ's
exact re-scoring of k * refine candidates included; with --target-recall, at the nprobe / refine
the build tuned on the store's own rows), p50 / p99 over `--queries` queries.
Recall@10 = |top-10 ∩ exact top-10| / 10, averaged, exact top-10 by brute force in numpy.
Search throughput = queries per second of one batched `search` over all queries. Peak memory
is the process's VmHWM: the gallery's rows are memory-mapped, so it counts the pages touched
(the whole shard for a Flat build, which copies them into the FAISS index).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic(
    n: int, dim: int, clusters: int, sigma: float, seed: int, out: np.ndarray | None = None, chunk: int = 100_000
) -> np.ndarray:
    """(n, dim) float32 unit vectors around `clusters` centres (generated in chunks, into `out`)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(12345).standard_normal((clusters, dim)).astype(np.float32)
    out = np.empty((n, dim), np.float32) if out is None else out
    for s in range(0, n, chunk):
        m = min(chunk, n - s)
        x = centres[rng.integers(0, clusters, m)] + sigma * rng.standard_normal((m, dim), dtype=np.float32)
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def exact_topk(data: np.ndarray, queries: np.ndarray, k: int, chunk: int = 200_000) -> np.ndarray:
    """Brute-force top-k ids (q, k) by inner product, over `data` in chunks."""
    best_s = np.full((len(queries), k), -np.inf, np.float32)
    best_i = np.zeros((len(queries), k), np.int64)
    for s in range(0, len(data), chunk):
        sc = queries @ np.asarray(data[s : s + chunk]).T
        part = np.argpartition(-sc, min(k, sc.shape[1] - 1), axis=1)[:, :k]
        cand_s = np.concatenate([best_s, np.take_along_axis(sc, part, 1)], 1)
        cand_i = np.concatenate([best_i, part + s], 1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, order, 1), np.take_along_axis(cand_i, order, 1)
    return best_i


def recall_at_k(ids: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean over queries of |found ∩ true top-k| / k (rows of `ids` and `truth`)."""
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, truth)]))


def emit(result: dict, path: str | None) -> None:
    """A benchmark's result: printed as JSON, and written to `path` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


def _proc_status_mb(field: str) -> float:
    """VmRSS / VmHWM (peak) of this process from /proc, in MB (ru_maxrss would carry the
    parent's peak across exec on Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def run_one(kind: str, data_path: Path, queries_path: Path, truth_path: Path, work: Path, args) -> dict:
    """Build one gallery kind from the memmapped data and measure it (runs in a subprocess)."""
    import faiss

    from vlctl.embeddings.search import IndexConfig
    from vlctl.embeddings.store import create_gallery, open_gallery

    faiss.omp_set_num_threads(args.threads)
    data = np.load(data_path, mmap_mode="r")
    queries = np.load(queries_path)
    truth = np.load(truth_path)
    cfg = {
        "flat": IndexConfig(kind="flat"),
        "ivfpq": IndexConfig(kind="ivfpq", nlist=args.nlist, pq_m=args.pq_m, nprobe=args.nprobe, refine=args.refine,
                             target_recall=getattr(args, "target_recall", 0.0)),
        "hnsw": IndexConfig(kind="hnsw", hnsw_m=32, ef_search=args.ef_search),
    }[kind]
    rss0 = _proc_status_mb("VmRSS")
    faiss.omp_set_num_threads(getattr(args, "build_threads", args.threads))
    t = time.perf_counter()
    gallery = create_gallery(work / kind, "synthetic@bench", data.shape[1], cfg).add(data)
    build_s = time.perf_counter() - t
    faiss.omp_set_num_threads(args.threads)
    del gallery
    gallery = open_gallery(work / kind)
    # Load the index from disk, then one untimed pass over the queries: a served gallery has its
    # pages mapped, as an in-memory FAISS index has (the first touch of each page of a fresh
    # memory map is a page fault, which would time the mapping, not the search).
    for i in range(len(queries)):
        gallery.search(queries[i : i + 1], k=args.k)
    lat = []
    ids = np.empty((len(queries), args.k), np.int64)
    for i in range(len(queries)):
        t = time.perf_counter()
        ids[i] = gallery.search(queries[i : i + 1], k=args.k).ids[0]
        lat.append(time.perf_counter() - t)
    t = time.perf_counter()
    gallery.search(queries, k=args.k)
    batch_s = time.perf_counter() - t
    recall = recall_at_k(ids, truth, args.k)
    index_file = work / kind / gallery.manifest["index"]["file"]
    return {
        "kind": kind,
        "config": {k: v for k, v in gallery.manifest["index"]["config"].items()},
        "tuned": gallery.tuned,  # the (nprobe, refine) the build picked on its own sample (target_recall > 0)
        "n": int(data.shape[0]),
        "dim": int(data.shape[1]),
        "build_s": round(build_s, 2),
        "add_rows_per_s": round(data.shape[0] / build_s, 1),
        "index_bytes": index_file.stat().st_size,
        "peak_rss_mb": _proc_status_mb("VmHWM"),
        "rss_before_build_mb": rss0,
        "latency_ms_p50": round(1000 * float(np.percentile(lat, 50)), 3),
        "latency_ms_p99": round(1000 * float(np.percentile(lat, 99)), 3),
        f"recall@{args.k}": round(recall, 4),
        "batch_queries_per_s": round(len(queries) / batch_s, 1),
        "threads": args.threads,
    }


def extract_bench(n_images: int, batch_size: int, workers: int, model: str, work: Path) -> dict:
    """Extraction throughput from JPEG files vs the raw forward pass on the same batches.

    Raw = `model.encode_image` on batches preprocessed beforehand (decode and transform not timed);
    ours = `embed_image_files` from the files (decode + OpenCLIP transform + forward), with one
    corrupt file among them. Random-init OpenCLIP `model` (nothing downloads).
    """
    import torch
    from PIL import Image

    from vlctl.embeddings.extract import embed_image_files
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.encoders.factory import create

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n_images):
        # Smooth 640x480 content (upsampled noise) so JPEG sizes and decode cost look like photos.
        small = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
        im = Image.fromarray(small).resize((640, 480), Image.BICUBIC)
        paths.append(work / f"{i:05d}.jpg")
        im.save(paths[-1], quality=90)
    (work / "corrupt.jpg").write_bytes(b"\xff\xd8 broken")
    paths.insert(n_images // 2, work / "corrupt.jpg")
    encoder = create(f"open_clip:{model}", batch_size=batch_size)
    good = [p for p in paths if p.name != "corrupt.jpg"]
    batches = [
        torch.stack([encoder.preprocess_pil(Image.open(p).convert("RGB")) for p in good[i : i + batch_size]])
        for i in range(0, len(good), batch_size)
    ]
    with torch.inference_mode():
        encoder.model.encode_image(batches[0][:2])  # warm-up
        t = time.perf_counter()
        for b in batches:
            encoder.model.encode_image(b, normalize=True)
        raw_s = time.perf_counter() - t
    res = embed_image_files(encoder, paths, ExtractConfig(batch_size=batch_size, workers=workers), progress=False)
    return {
        "model": model,
        "images": n_images,
        "batch_size": batch_size,
        "workers": workers,
        "torch_threads": torch.get_num_threads(),
        "raw_forward_images_per_s": round(n_images / raw_s, 2),
        "extraction_images_per_s": round(res.images_per_second, 2),
        "extraction_vs_raw": round(res.images_per_second / (n_images / raw_s), 3),
        "failed": [p for p, _ in res.failures],
        "rows": len(res.ok),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="gallery rows (default: 1,000,000)")
    p.add_argument("--dim", type=int, default=512, help="embedding dimension (default: 512)")
    p.add_argument("--queries", type=int, default=1000, help="queries for latency and recall (default: 1000)")
    p.add_argument("--k", type=int, default=10, help="results per query (default: 10)")
    p.add_argument("--kinds", nargs="+", default=["flat", "ivfpq"], choices=["flat", "ivfpq", "hnsw"])
    p.add_argument("--clusters", type=int, default=1000, help="synthetic cluster centres (default: 1000)")
    p.add_argument("--sigma", type=float, default=0.6, help="per-dimension noise around a centre (default: 0.6)")
    p.add_argument("--nlist", type=int, default=1024, help="ivfpq inverted lists (default: 1024)")
    p.add_argument("--pq-m", type=int, default=64, help="ivfpq sub-quantisers (default: 64 = 64-byte codes)")
    p.add_argument("--nprobe", type=int, default=32, help="ivfpq lists probed per query (default: 32)")
    p.add_argument("--refine", type=int, default=50, help="ivfpq exact re-scoring of k*refine candidates (default: 50)")
    p.add_argument("--ef-search", type=int, default=64, help="hnsw efSearch (default: 64)")
    p.add_argument("--target-recall", type=float, default=0.0,
                   help="ivfpq: tune nprobe <= --nprobe and refine <= --refine at build to this recall@10 on the "
                   "store's own held-out rows (IndexConfig.target_recall; default 0: no tuning)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="FAISS OpenMP threads (default: 1: on a busy 2-core machine OpenMP's second thread made "
        "single queries ~4x slower, measured)",
    )
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir, deleted after)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one kind
    p.add_argument(
        "--extract",
        action="store_true",
        help="instead: extraction throughput from JPEG files vs the raw forward (random-init OpenCLIP)",
    )
    p.add_argument("--extract-images", type=int, default=256, help="--extract: number of images (default: 256)")
    p.add_argument("--extract-batch", type=int, default=64, help="--extract: batch size (default: 64)")
    p.add_argument("--extract-workers", type=int, default=1, help="--extract: decoding workers (default: 1)")
    p.add_argument("--extract-model", default="ViT-B-32", help="--extract: OpenCLIP architecture (default: ViT-B-32)")
    args = p.parse_args(argv)

    if args.extract:
        with tempfile.TemporaryDirectory(prefix="extract_bench.", dir=args.work) as tmp:
            res = extract_bench(
                args.extract_images, args.extract_batch, args.extract_workers, args.extract_model, Path(tmp)
            )
        print(json.dumps(res, indent=2))
        return res

    if args.one:
        work = Path(args.work)
        res = run_one(args.one, work / "data.npy", work / "queries.npy", work / "truth.npy", work, args)
        print(json.dumps(res))
        return res

    with tempfile.TemporaryDirectory(prefix="index_bench.", dir=args.work) as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        data = np.lib.format.open_memmap(work / "data.npy", mode="w+", dtype=np.float32, shape=(args.n, args.dim))
        synthetic(args.n, args.dim, args.clusters, args.sigma, seed=0, out=data)
        data.flush()
        queries = synthetic(args.queries, args.dim, args.clusters, args.sigma, seed=1)
        np.save(work / "queries.npy", queries)
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        np.save(work / "truth.npy", exact_topk(data, queries, args.k))
        exact_s = time.perf_counter() - t
        del data
        print(
            f"[bench] data {args.n} x {args.dim} in {gen_s:.1f}s, exact top-{args.k} of {args.queries} queries "
            f"in {exact_s:.1f}s (numpy brute force)",
            file=sys.stderr,
        )
        results = {
            "n": args.n,
            "dim": args.dim,
            "queries": args.queries,
            "k": args.k,
            "data": f"{args.clusters} clusters, sigma={args.sigma}, unit vectors",
            "exact_numpy_s": round(exact_s, 2),
            "kinds": {},
        }
        passthrough = [
            "--k",
            str(args.k),
            "--nlist",
            str(args.nlist),
            "--pq-m",
            str(args.pq_m),
            "--nprobe",
            str(args.nprobe),
            "--refine",
            str(args.refine),
            "--target-recall",
            str(args.target_recall),
            "--ef-search",
            str(args.ef_search),
            "--threads",
            str(args.threads),
        ]
        for kind in args.kinds:
            out = subprocess.run(
                [sys.executable, __file__, "--one", kind, "--work", str(work), *passthrough],
                check=True,
                capture_output=True,
                text=True,
            )
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results["kinds"][kind] = res
            print(f"[bench] {kind}: {json.dumps(res)}", file=sys.stderr)
    emit(results, args.json)
    return results


if __name__ == "__main__":
    main()

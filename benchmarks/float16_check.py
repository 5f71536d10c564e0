"""float16 storage against float32 on the same rows (issue 44): disk, search recall@10, an SAE's FVU.

    PYTHONPATH=src .venv/bin/python benchmarks/float16_check.py --rows 200000 --json benchmarks/float16_check.json

Rows: `index_bench.synthetic` 512-d embedding-like unit vectors; queries: fresh draws. For each
dtype a store (exact, and ivfpq nlist 256 / PQ64 / nprobe 32 / refine 20) holds the same rows;
recall@10 is against the exact top-10 over the float32 rows. The method's number: a TopK SAE
(expansion 4, k 32, 2 epochs, seed 0) fitted on each store's rows, FVU on those rows and on the
float32 rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_bench import emit, exact_topk, recall_at_k, synthetic


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from vlctl.embeddings.search import IndexConfig
    from vlctl.embeddings.store import create_store
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.sae.rows import fraction_variance_unexplained

    x = synthetic(args.rows, 512, 1000, 0.6, seed=1)
    q = synthetic(args.queries, 512, 1000, 0.6, seed=2)
    truth = exact_topk(x, q, 10)
    work = Path(tempfile.mkdtemp(prefix="float16_"))
    out: dict = {"rows": args.rows, "queries": args.queries}
    try:
        for dtype in ("float32", "float16"):
            r: dict = {}
            exact = create_store(work / f"exact-{dtype}", "synthetic@512", 512, IndexConfig(kind="flat", dtype=dtype))
            exact = exact.add(x, normalized=True)
            r["shard_bytes"] = (work / f"exact-{dtype}" / "img_emb" / "img_emb_00000.npy").stat().st_size
            r["exact_recall_at_10"] = recall_at_k(exact.search(q, k=10).ids, truth, 10)
            cfg = IndexConfig(kind="ivfpq", nlist=256, pq_m=64, nprobe=32, refine=20, dtype=dtype)
            ivf = create_store(work / f"ivfpq-{dtype}", "synthetic@512", 512, cfg).add(x, normalized=True)
            r["ivfpq_recall_at_10"] = recall_at_k(ivf.search(q, k=10).ids, truth, 10)
            sae = SparseAutoencoder(expansion=4, k=32, epochs=2, seed=0).fit(exact)
            r["sae_fvu_own_rows"] = round(float(sae.fvu_), 5)
            r["sae_fvu_float32_rows"] = round(float(fraction_variance_unexplained(x, sae.reconstruct(x))), 5)
            out[dtype] = r
            print(dtype, json.dumps(r), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(out, args.json)


if __name__ == "__main__":
    main()

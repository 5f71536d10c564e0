"""An SAE fit on a store larger than the memory it may use (issue 44): the store's rows are read
batch by batch and block by block (`vlctl.methods.sae.rows`), never all at once.

    python benchmarks/sae_stream_check.py --rows 1000000 --json benchmarks/sae_stream_check.json

Writes a float16 store of `--rows` synthetic 512-d rows in 10 adds (10 shards: no single memory
map to share), then fits a TopK SAE on it in a fresh process, streamed (`fit(store)`), and again
in another from the rows as one float32 array (`fit(store.embeddings(), encoder_id)`: what a fit on
such a store did before, the geometric median's float64 copy included), and reports each process's
peak RSS (VmHWM) beside the bytes of the rows as float32 and float64, the fit's time and its FVU.
The store is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DIM = 512


def fit(store: str, in_memory: bool = False) -> dict:
    import torch
    from index_bench import _proc_status_mb

    from vlctl.embeddings.store import open_store
    from vlctl.methods.sae.model import SparseAutoencoder

    torch.set_num_threads(2)
    s = open_store(store)
    t0 = time.perf_counter()
    source = (s.embeddings(), s.encoder_id) if in_memory else (s,)  # in memory: the rows as one float32 array
    sae = SparseAutoencoder(k=32, expansion=2, epochs=1, batch_size=4096, seed=0, progress=False).fit(*source)
    # RssFile: the shards' pages mapped while read (the page cache's, dropped under pressure);
    # RssAnon: what the process itself holds.
    return {"fit_s": round(time.perf_counter() - t0, 1), "fvu": round(float(sae.fvu_), 5),
            "peak_rss_mb": _proc_status_mb("VmHWM"), "rss_anon_mb": _proc_status_mb("RssAnon"),
            "rss_file_mb": _proc_status_mb("RssFile"), "shards": len(s.manifest["shards"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--json", default=None)
    p.add_argument("--fit", default=None, help=argparse.SUPPRESS)
    p.add_argument("--in-memory", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fit:
        print(json.dumps(fit(args.fit, args.in_memory)))
        return
    from index_bench import emit, synthetic

    from vlctl.embeddings.search import IndexConfig
    from vlctl.embeddings.store import create_store

    work = Path(tempfile.mkdtemp(prefix="sae_stream_"))
    try:
        store = create_store(work / "store", "synthetic@512", DIM, IndexConfig(kind="none", dtype="float16"))
        for a in range(10):
            store = store.add(synthetic(args.rows // 10, DIM, 1000, 0.6, seed=2000 + a))
        r = {}
        for how, flag in (("streamed", []), ("in_memory", ["--in-memory"])):
            done = subprocess.run([sys.executable, __file__, "--fit", str(work / "store"), *flag], check=True,
                                  capture_output=True, text=True)
            r[how] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r |= {"rows": args.rows, "dim": DIM, "dtype": "float16", "sae": "k 32, 1024 latents, 1 epoch, batch 4096",
          "rows_float32_mb": round(args.rows * DIM * 4 / 2**20), "rows_float64_mb": round(args.rows * DIM * 8 / 2**20)}
    emit(r, args.json)


if __name__ == "__main__":
    main()

"""The field's layout both ways, checked with the field's own readers (issue 44).

    python3 -m venv /tmp/er-venv && /tmp/er-venv/bin/pip install embedding-reader autofaiss faiss-cpu pyarrow==18.1.0
    # (autofaiss 2.18 keeps numpy 1.26, which pyarrow 26 refuses: hence pyarrow 18.1.0 there)
    PYTHONPATH=src .venv/bin/python benchmarks/field_layout_check.py --er-python /tmp/er-venv/bin/python \
        --json benchmarks/field_layout_check.json

Run with vlctl's venv; the embedding-reader / autofaiss side runs in `--er-python` (a venv with
embedding-reader, autofaiss and faiss-cpu and no vlctl), which imports nothing of vlctl:

1. vlctl writes a store (two adds, metadata with path and caption).
2. The other venv writes a clip-retrieval folder with numpy and pyarrow alone, to clip-retrieval's
   documented layout (img_emb/img_emb_{i}.npy, text_emb/text_emb_{i}.npy, metadata/metadata_{i}.parquet,
   float16 as clip-retrieval writes them), reads it back with embedding-reader, reads the vlctl
   store with embedding-reader (npy, and parquet_npy with its metadata), and builds an autofaiss
   index from the vlctl store's img_emb/.
3. vlctl opens the folder in place: its rows, metadata and an exact search against numpy; then
   `vlctl fit sae` on it.
Every check is an equality or a count; the script exits 1 on the first that fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

N, DIM, PARTS = 3000, 64, 3


def rows(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def er_side(work: Path) -> dict:
    """In the embedding-reader venv: write the folder, read both layouts, build an autofaiss index."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from autofaiss import build_index
    from embedding_reader import EmbeddingReader

    out: dict = {}
    folder = work / "laion"
    img, txt = rows(N, 1).astype(np.float16), rows(N, 2).astype(np.float16)
    meta = [{"image_path": f"{i:05d}.jpg", "caption": f"caption {i}", "url": f"http://x/{i}"} for i in range(N)]
    for d in ("img_emb", "text_emb", "metadata"):
        (folder / d).mkdir(parents=True)
    for i, sel in enumerate(np.array_split(np.arange(N), PARTS)):
        np.save(folder / "img_emb" / f"img_emb_{i}.npy", img[sel])
        np.save(folder / "text_emb" / f"text_emb_{i}.npy", txt[sel])
        pq.write_table(pa.Table.from_pylist([meta[j] for j in sel]), folder / "metadata" / f"metadata_{i}.parquet")

    def read(emb_folder: Path, meta_folder: Path | None, columns: list[str]) -> tuple[np.ndarray, list]:
        fmt = "parquet_npy" if meta_folder else "npy"
        reader = EmbeddingReader(str(emb_folder), file_format=fmt, meta_columns=columns or None,
                                 metadata_folder=str(meta_folder) if meta_folder else None)
        embs, metas = [], []
        for e, m in reader(batch_size=10**6, start=0, end=reader.count, show_progress=False):
            embs.append(e)
            metas += m.to_dict("records") if columns else []
        return np.concatenate(embs), metas

    e, m = read(folder / "img_emb", folder / "metadata", ["image_path", "caption"])
    out["er_reads_clip_retrieval_folder"] = bool(np.array_equal(e.astype(np.float16), img) and
                                                 [r["image_path"] for r in m] == [r["image_path"] for r in meta])
    store = work / "store"
    want = np.load(work / "store_rows.npy")
    paths = json.loads((work / "store_paths.json").read_text())
    e, _ = read(store / "img_emb", None, [])
    out["er_reads_vlctl_store_npy"] = bool(np.array_equal(e, want))
    e, m = read(store / "img_emb", store / "metadata", ["path", "caption"])
    out["er_reads_vlctl_store_with_metadata"] = bool(np.array_equal(e, want) and [r["path"] for r in m] == paths)
    index, info = build_index(embeddings=str(store / "img_emb"), index_path=str(work / "knn.index"),
                              index_infos_path=str(work / "infos.json"), file_format="npy", metric_type="ip",
                              max_index_memory_usage="200M", current_memory_available="2G", verbose=40)
    _, found = index.search(want[:100], 1)
    out["autofaiss_index"] = info.get("index_key")
    out["autofaiss_builds_from_vlctl_store"] = bool(index.ntotal == len(want))
    out["autofaiss_self_recall_at_1"] = float(np.mean(found[:, 0] == np.arange(100)))
    return out


def vlctl_side(work: Path) -> dict:
    """In vlctl's venv: open the folder the other venv wrote, search it, fit an SAE on it."""
    from vlctl.cli import main
    from vlctl.embeddings.store import open_store

    folder = open_store(work / "laion")
    img = rows(N, 1).astype(np.float16).astype(np.float32)
    q = rows(5, 3)
    exact = np.argsort(-(q @ img.T), axis=1, kind="stable")[:, :10]
    out = {"vlctl_opens_folder": bool(len(folder) == N and folder.read_only and len(folder.texts_table) == N),
           "vlctl_folder_metadata": folder.metadata([2999])[0] == {"image_path": "02999.jpg", "caption": "caption 2999",
                                                                 "url": "http://x/2999"},
           "vlctl_folder_exact_search": bool((folder.search(q, k=10).ids == exact).all())}
    rc = main(["fit", "sae", "--store", str(work / "laion"), "--out", str(work / "sae"), "--epochs", "1"])
    out["vlctl_fit_sae_on_folder"] = rc == 0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--er-python", required=True, help="python of a venv with embedding-reader, autofaiss, faiss-cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--er-side", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.er_side:
        print(json.dumps(er_side(Path(args.er_side))))
        return
    from vlctl.embeddings.store import create_store

    work = Path(tempfile.mkdtemp(prefix="field_layout_"))
    x = rows(N, 4)
    paths = [f"img/{i}.jpg" for i in range(N)]
    store = create_store(work / "store", "synthetic@64", DIM)
    store = store.add(x[:2000], [{"path": p, "caption": f"c {i}"} for i, p in enumerate(paths[:2000])], normalized=True)
    store.add(x[2000:], [{"path": p, "caption": f"c {i}"} for i, p in enumerate(paths[2000:], 2000)], normalized=True)
    np.save(work / "store_rows.npy", x)
    (work / "store_paths.json").write_text(json.dumps(paths))
    done = subprocess.run([args.er_python, __file__, "--er-python", args.er_python, "--er-side", str(work)],
                          check=False, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the embedding-reader side failed:\n{done.stderr[-3000:]}")
    result = {"er_python": args.er_python, **json.loads(done.stdout.strip().splitlines()[-1]), **vlctl_side(work)}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    failed = [k for k, v in result.items() if v is False]
    if failed:
        raise SystemExit(f"failed: {failed}")


if __name__ == "__main__":
    main()

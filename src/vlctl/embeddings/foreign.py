"""Stores vlctl reads but does not write: clip-retrieval folders, opened in place, and the stores
of vlctl before issue 44, read once to be converted.

A clip-retrieval / embedding-reader folder (the layout of public LAION embeddings):

    FOLDER/
      img_emb/img_emb_{i}.npy          (rows, dim) float32 or float16 image embeddings
      text_emb/text_emb_{i}.npy        optional: the caption embedding of each image row
      metadata/metadata_{i}.parquet    optional: the rows' fields (image_path, caption, url, ...), row-aligned
    FOLDER.vlctl.json                  beside the folder, never inside: {"encoder_id", "encoder_spec"}

`foreign_manifest` describes the folder as a store manifest (read-only, no index: search is exact
over the memory-mapped files, streamed block by block), so every reader of a store reads it
unchanged. Files pair by their number i and run in its order. Its encoder is the sidecar's, or
unknown: then the folder is searched by embedding and methods fit on it, and a text or image
query needs `--encoder`, which `remember_encoder` writes to the sidecar.

An old store ("vlctl.store/1": emb-*.npy, meta-*.jsonl, txt-*.npy, txtmeta-*.jsonl, index-N.faiss)
is refused on open with the command that converts it (`vlctl store convert OLD NEW`, which reads it
through `old_tables` and leaves it as it is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_json, read_json

FOREIGN_FORMAT = "clip-retrieval"
OLD_FORMATS = ("vlctl.store/1", "vlctl.gallery/1")
UNKNOWN = "unknown:"  # prefix of the encoder id of a folder whose encoder nobody named
_NUMBERED = re.compile(r"^(?:img_emb|text_emb|metadata)_(\d+)\.(?:npy|parquet)$")


def is_foreign(path: Path) -> bool:
    """A clip-retrieval folder: `img_emb/`, no vlctl manifest, none of the directories only a vlctl
    store has (a store that lost its manifest is refused, unless it is that layout and no more)."""
    return ((path / "img_emb").is_dir() and not (path / "manifest.json").exists()
            and not (path / "text_metadata").exists() and not (path / "index").exists())


def sidecar(path: Path) -> Path:
    """The file beside a foreign folder that names its encoder."""
    return path.resolve().parent / f"{path.resolve().name}.vlctl.json"


def remember_encoder(path: Path, encoder_id: str, encoder_spec: str | None) -> None:
    """Name the encoder of the folder at `path` in its sidecar (the folder itself is not touched)."""
    atomic_write_json(sidecar(path), {"encoder_id": encoder_id, "encoder_spec": encoder_spec})


def _numbered(folder: Path, prefix: str, suffix: str) -> dict[int, str]:
    """{i: "folder/prefix_i.suffix"} of the files in `folder` (none if it is absent)."""
    if not folder.is_dir():
        return {}
    out = {}
    for f in folder.iterdir():
        m = _NUMBERED.match(f.name)
        if m and f.name.startswith(prefix + "_") and f.name.endswith(suffix):
            out[int(m.group(1))] = f"{folder.name}/{f.name}"
    return out


def _rows(path: Path, name: str) -> tuple[int, int, np.dtype]:
    """(rows, dim, dtype) of an embeddings file from its header."""
    try:
        arr = np.load(path / name, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise VlctlError(f"{path / name}: cannot read the embeddings ({e})") from None
    if arr.ndim != 2 or arr.dtype not in (np.float32, np.float16):
        raise VlctlError(f"{path / name}: expected a 2-D float32 or float16 array, got {arr.dtype} {arr.shape}")
    return arr.shape[0], arr.shape[1], arr.dtype


def foreign_manifest(path: Path) -> dict:
    """The store manifest of the clip-retrieval folder at `path` (module docstring)."""
    images = _numbered(path / "img_emb", "img_emb", ".npy")
    if not images:
        raise VlctlError(f"{path / 'img_emb'}: no img_emb_<i>.npy files (not a clip-retrieval folder)")
    metadata = _numbered(path / "metadata", "metadata", ".parquet")
    texts = _numbered(path / "text_emb", "text_emb", ".npy")
    if metadata and set(metadata) != set(images):
        raise VlctlError(f"{path / 'metadata'}: metadata files {sorted(metadata)} do not pair with the embedding "
                         f"files {sorted(images)} of {path / 'img_emb'} (metadata_<i>.parquet per img_emb_<i>.npy)")
    if texts and set(texts) != set(images):
        raise VlctlError(f"{path / 'text_emb'}: text_emb files {sorted(texts)} do not pair with {path / 'img_emb'}'s "
                         f"{sorted(images)}")
    shards, text_shards, dims = [], [], set()
    for i in sorted(images):
        rows, dim, dtype = _rows(path, images[i])
        dims.add((dim, str(dtype)))
        shards.append({"rows": rows, "embeddings": images[i], "metadata": metadata.get(i)})
        if texts:
            t_rows, t_dim, t_dtype = _rows(path, texts[i])
            if (t_rows, t_dim, str(t_dtype)) != (rows, dim, str(dtype)):
                raise VlctlError(f"{path / texts[i]}: {t_dtype} ({t_rows}, {t_dim}), but {path / images[i]} is "
                                 f"{dtype} ({rows}, {dim}): text rows pair with image rows")
            text_shards.append({"rows": rows, "embeddings": texts[i], "metadata": metadata.get(i)})
    if len(dims) > 1:
        raise VlctlError(f"{path / 'img_emb'}: the files differ in dim or dtype ({sorted(dims)}); one folder holds one "
                         "embedding space")
    (dim, dtype), = dims
    named = read_json(sidecar(path), "encoder sidecar") if sidecar(path).is_file() else {}
    if not isinstance(named, dict) or not isinstance(named.get("encoder_id", ""), str):
        raise VlctlError(f"{sidecar(path)}: field encoder_id must be a string")
    count = sum(s["rows"] for s in shards)
    return {
        "format": FOREIGN_FORMAT,
        "encoder_id": named.get("encoder_id") or UNKNOWN + str(path.resolve()),
        "encoder_spec": named.get("encoder_spec"),
        "dim": dim,
        "dtype": dtype,
        "count": count,
        "generation": 0,
        "shards": shards,
        "texts": {"count": count if texts else 0, "shards": text_shards},
        "index": {"config": {"kind": "none", "dtype": dtype}, "parts": []},
        "info": {"source": str(path.resolve())},
    }


def old_store_message(path: Path, fmt: str) -> str:
    return (f"{path / 'manifest.json'}: a store of an older vlctl ({fmt}: emb-*.npy + meta-*.jsonl); convert it with "
            f"`vlctl store convert {path} NEW_STORE` (it is read, not changed)")


def old_tables(path: Path, manifest: dict) -> Iterator[tuple[str, np.ndarray, list[dict]]]:
    """("image" | "text", embeddings, metadata) of each shard of an old store, in row order."""
    for what, shards in (("image", manifest["shards"]), ("text", manifest.get("texts", {}).get("shards", []))):
        for s in shards:
            emb = np.load(path / s["embeddings"], mmap_mode="r", allow_pickle=False)
            file = path / s["metadata"]
            try:
                meta = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise VlctlError(f"{file}: cannot read the metadata ({e})") from None
            if len(meta) != len(emb) or len(emb) != s["rows"]:
                raise VlctlError(f"{file}: {len(meta)} metadata rows and {len(emb)} embeddings, the manifest says "
                                 f"{s['rows']}")
            yield what, emb, meta

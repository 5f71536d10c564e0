"""One table of a store: its image rows or its text rows.

Sharded (rows, dim) float32 `.npy` files, memory-mapped when read, one per `add`, and a jsonl
metadata file per shard with one JSON object per row, read row by row through a memory map.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.embeddings.search import normalise
from vlctl.fsops import VlctlError, fsync, replace
from vlctl.io import check_content, check_file, fast_hash_file, open_memmap, sha256_file

MANIFEST = "manifest.json"
ADD_CHUNK = 65_536  # rows normalised and indexed at a time by an add


class Table:
    """One table of a store (its image rows or its text rows): sharded (rows, dim) float32 `.npy`
    files, memory-mapped, and a jsonl metadata file per shard, each row one JSON object."""

    def __init__(self, path: Path, shards: list[dict], dim: int, what: str):
        self.path, self.shards, self.dim, self.what = path, shards, dim, what
        self._arrays = [self._open_shard(s) for s in shards]
        self._offsets = np.cumsum([0] + [s["rows"] for s in shards])
        self._metadata_shards: dict[int, tuple[mmap.mmap, np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _open_shard(self, shard: dict) -> np.ndarray:
        file = self.path / shard["embeddings"]
        check_file(file, shard["embeddings_bytes"], self.path / MANIFEST, f"{self.what} shard")
        try:
            arr = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise VlctlError(f"{file}: corrupt or truncated {self.what} shard ({e})") from None
        if arr.shape != (shard["rows"], self.dim) or arr.dtype != np.float32:
            raise VlctlError(
                f"{file}: array is {arr.dtype} {arr.shape}, but {self.path / MANIFEST} says float32 "
                f"({shard['rows']}, {self.dim})"
            )
        check_content(file, shard.get("embeddings_fast"), shard.get("embeddings_sha256"), self.path / MANIFEST)
        return arr

    def _check_ids(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise VlctlError(f"{self.path}: {self.what} row ids must lie in [0, {len(self)}), got {ids.min()}..{ids.max()}")

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        self._check_ids(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        shard_of = np.searchsorted(self._offsets, ids, side="right") - 1
        for s in np.unique(shard_of):
            sel = shard_of == s
            out[sel] = self._arrays[s][ids[sel] - self._offsets[s]]
        return out

    def all(self) -> np.ndarray:
        """Every row: the read-only memmap itself when there is one shard, else a copy."""
        if len(self._arrays) == 1:
            return self._arrays[0]
        if not self._arrays:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate([np.asarray(a) for a in self._arrays])

    def chunks(self, rows: int) -> Iterator[np.ndarray]:
        """Every row in order, as blocks of at most `rows` (views of the memory maps; a block never
        spans two shards), so a pass over a large table holds one block in memory."""
        for arr in self._arrays:
            for a in range(0, len(arr), rows):
                yield arr[a:a + rows]

    def _metadata_shard(self, s: int) -> tuple[mmap.mmap, np.ndarray]:
        """Shard s's jsonl, memory-mapped, and its line offsets (rows + 1,): row i is
        bytes[offsets[i]:offsets[i + 1]]. json.dumps escapes newlines inside strings and UTF-8
        never contains byte 0x0A inside a character, so every 0x0A ends a row."""
        if s not in self._metadata_shards:
            shard = self.shards[s]
            file = self.path / shard["metadata"]
            check_file(file, None, self.path / MANIFEST, "metadata shard")
            if file.stat().st_size == 0:
                raise VlctlError(f"{file}: empty metadata shard, but {self.path / MANIFEST} says {shard['rows']} rows")
            with open(file, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            ends = np.flatnonzero(np.frombuffer(mm, dtype=np.uint8) == 10) + 1
            if len(ends) != shard["rows"] or ends[-1] != len(mm):
                raise VlctlError(
                    f"{file}: {len(ends)} complete metadata rows, but {self.path / MANIFEST} says {shard['rows']} "
                    "(truncated or overwritten)"
                )
            check_content(file, shard.get("metadata_fast"), shard.get("metadata_sha256"), self.path / MANIFEST)
            self._metadata_shards[s] = (mm, np.concatenate([[0], ends]))
        return self._metadata_shards[s]

    def metadata(self, ids: np.ndarray | Sequence[int] | None = None) -> list[dict]:
        ids = np.arange(len(self)) if ids is None else np.asarray(ids, dtype=np.int64)
        self._check_ids(ids)
        shard_of = np.searchsorted(self._offsets, ids, side="right") - 1
        out = []
        for i, s in zip(ids.tolist(), shard_of.tolist()):
            mm, offsets = self._metadata_shard(s)
            r = i - int(self._offsets[s])
            try:
                out.append(json.loads(mm[offsets[r] : offsets[r + 1]]))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                file = self.path / self.shards[s]["metadata"]
                raise VlctlError(f"{file}: corrupt metadata row {r} ({e})") from None
        return out

    def verify(self) -> tuple[int, int]:
        """Every file's sha256 against the manifest, and every metadata row present: (files, bytes)."""
        files, size = 0, 0
        for s, shard in enumerate(self.shards):
            for key in ("embeddings", "metadata"):
                file = self.path / shard[key]
                check_file(file, shard.get("embeddings_bytes") if key == "embeddings" else None, self.path / MANIFEST,
                           f"{self.what} {key} shard")
                if sha256_file(file) != shard[f"{key}_sha256"]:
                    raise VlctlError(f"{file}: sha256 differs from {self.path / MANIFEST} (file changed or corrupt)")
                files, size = files + 1, size + file.stat().st_size
            self._metadata_shard(s)  # the rows counted
        return files, size


def metadata_text(metadata: Sequence[dict], what: str) -> str:
    try:
        return "".join(json.dumps(m, sort_keys=True, ensure_ascii=False) + "\n" for m in metadata)
    except TypeError as e:
        raise VlctlError(f"add: {what} metadata is not JSON-serialisable ({e})") from None


def check_rows(x: Any, dim: int, path: Path, encoder_id: str, what: str) -> np.ndarray:
    x = x if isinstance(x, np.ndarray) else np.asarray(x)  # memmaps stay lazy
    if x.ndim != 2:
        raise VlctlError(f"add: expected a 2-D array (n, dim) of {what}, got shape {x.shape}")
    if x.shape[1] != dim:
        raise VlctlError(
            f"add: {what} have dim {x.shape[1]}, the store at {path} has dim {dim} "
            f"(encoder {encoder_id}); a store holds one embedding space"
        )
    return x


def write_shard(path: Path, name: str, x: np.ndarray, dim: int, index, what: str, normalized: bool = False) -> None:
    """Normalise `x` in chunks into the new shard file `name` (and into `index`, if any), so memory
    holds one chunk, not another copy of every row; the file appears under its name complete."""
    file = path / name
    tmp = file.with_name(f".{name}.tmp")
    try:
        out = open_memmap(tmp, np.float32, (len(x), dim))  # blocks reserved: a full disk is an error, not SIGBUS
        for s in range(0, len(x), ADD_CHUNK):
            chunk = normalise(x[s : s + ADD_CHUNK], f"add ({'' if what == 'image' else what + ' '}rows {s}..{min(len(x), s + ADD_CHUNK) - 1})",
                              divide=not normalized)
            out[s : s + len(chunk)] = chunk
            if index is not None:
                index.add(chunk)
        out.flush()
        del out
        with open(tmp, "rb+") as f:
            fsync(f)
        replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def shard_record(path: Path, rows: int, emb_name: str, meta_name: str) -> dict:
    """A shard's manifest entry: rows, and per file its name, size, sha256 (checked by `verify`)
    and fast hash (checked on every open, `vlctl.io.fast_hash_file`)."""
    rec: dict[str, Any] = {"rows": rows}
    for key, name in (("embeddings", emb_name), ("metadata", meta_name)):
        rec |= {key: name, f"{key}_bytes": (path / name).stat().st_size, f"{key}_sha256": sha256_file(path / name),
                f"{key}_fast": fast_hash_file(path / name)}
    return rec

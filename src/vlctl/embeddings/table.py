"""One table of a store: its image rows or its text rows.

Sharded (rows, dim) `.npy` files (float32, or float16 when the store was created with
`dtype="float16"`), memory-mapped when read and handed out as float32, one per `add`; and a
parquet file per shard holding the rows' fields, row-aligned (clip-retrieval's layout: see
`vlctl.embeddings.store`). Metadata columns are the rows' fields (null where a row has not that
field); rows whose fields do not make one typed table (mixed types) go as one JSON string per row
in the column `JSON_COLUMN`. The shard record says which (`metadata_encoding`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.embeddings.search import normalise
from vlctl.fsops import VlctlError, fsync, replace
from vlctl.io import atomic_write_bytes, check_content, check_file, fast_hash_file, open_memmap, sha256_file

MANIFEST = "manifest.json"
ADD_CHUNK = 65_536  # rows normalised and indexed at a time by an add
DTYPES = ("float32", "float16")
JSON_COLUMN = "vlctl_json"
# Shard file names per table, as clip-retrieval names them (embedding-reader and autofaiss read the
# folders as they are); the number is zero-padded so that their name order is the row order.
LAYOUT = {"image": ("img_emb/img_emb_{:05d}.npy", "metadata/metadata_{:05d}.parquet"),
          "text": ("text_emb/text_emb_{:05d}.npy", "text_metadata/metadata_{:05d}.parquet")}


def shard_names(what: str, number: int) -> tuple[str, str]:
    """(embeddings file, metadata file) of shard `number` of the `what` ("image" / "text") table."""
    emb, meta = LAYOUT[what]
    return emb.format(number), meta.format(number)


class Table:
    """One table of a store (its image rows or its text rows): sharded (rows, dim) `.npy` files,
    memory-mapped, and a parquet metadata file per shard, row-aligned."""

    def __init__(self, path: Path, shards: list[dict], dim: int, what: str, dtype: str = "float32",
                 source: Path | None = None):
        self.path, self.shards, self.dim, self.what, self.dtype = path, shards, dim, what, np.dtype(dtype)
        self.source = source or path / MANIFEST  # where the shard list comes from, for messages
        self._arrays = [self._open_shard(s) for s in shards]
        self._offsets = np.cumsum([0] + [s["rows"] for s in shards])
        self._metadata_shards: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _open_shard(self, shard: dict) -> np.ndarray:
        file = self.path / shard["embeddings"]
        check_file(file, shard.get("embeddings_bytes"), self.source, f"{self.what} shard")
        try:
            arr = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise VlctlError(f"{file}: corrupt or truncated {self.what} shard ({e})") from None
        if arr.shape != (shard["rows"], self.dim) or arr.dtype != self.dtype:
            raise VlctlError(
                f"{file}: array is {arr.dtype} {arr.shape}, but {self.source} says {self.dtype} "
                f"({shard['rows']}, {self.dim})"
            )
        check_content(file, shard.get("embeddings_fast"), shard.get("embeddings_sha256"), self.source)
        return arr

    def _check_ids(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise VlctlError(f"{self.path}: {self.what} row ids must lie in [0, {len(self)}), got {ids.min()}..{ids.max()}")

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Rows `ids` (m,) -> (m, dim) float32, whatever the stored dtype."""
        ids = np.asarray(ids, dtype=np.int64)
        self._check_ids(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        shard_of = np.searchsorted(self._offsets, ids, side="right") - 1
        for s in np.unique(shard_of):
            sel = shard_of == s
            out[sel] = self._arrays[s][ids[sel] - self._offsets[s]]
        return out

    def all(self) -> np.ndarray:
        """Every row as float32: the read-only memmap itself when there is one float32 shard, else a copy."""
        if len(self._arrays) == 1 and self.dtype == np.float32:
            return self._arrays[0]
        if not self._arrays:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate([np.asarray(a, dtype=np.float32) for a in self._arrays])

    def chunks(self, rows: int) -> Iterator[np.ndarray]:
        """Every row in order as float32 blocks of at most `rows` (views of the memory maps for
        float32 shards; a block never spans two shards), so a pass over a large table holds one
        block in memory."""
        for arr in self._arrays:
            for a in range(0, len(arr), rows):
                yield arr[a:a + rows] if arr.dtype == np.float32 else np.asarray(arr[a:a + rows], np.float32)

    def _metadata_shard(self, s: int):
        """Shard s's parquet metadata as an Arrow table (memory-mapped), its row count checked;
        None for a shard without metadata (a foreign folder without metadata/)."""
        if s not in self._metadata_shards:
            import pyarrow as pa
            import pyarrow.parquet as pq

            shard = self.shards[s]
            if shard.get("metadata") is None:
                return None
            file = self.path / shard["metadata"]
            check_file(file, shard.get("metadata_bytes"), self.source, "metadata shard")
            check_content(file, shard.get("metadata_fast"), shard.get("metadata_sha256"), self.source)
            try:
                table = pq.read_table(file, memory_map=True)
            except (pa.ArrowException, OSError) as e:
                raise VlctlError(f"{file}: cannot read the parquet metadata ({str(e).splitlines()[0]})") from None
            if table.num_rows != shard["rows"]:
                raise VlctlError(f"{file}: {table.num_rows} metadata rows, but {self.source} says {shard['rows']} "
                                 "(truncated or overwritten)")
            self._metadata_shards[s] = table
        return self._metadata_shards[s]

    def metadata(self, ids: np.ndarray | Sequence[int] | None = None) -> list[dict]:
        """The fields of rows `ids` (all if None) as dicts; only the requested rows are converted."""
        ids = np.arange(len(self)) if ids is None else np.asarray(ids, dtype=np.int64)
        self._check_ids(ids)
        shard_of = np.searchsorted(self._offsets, ids, side="right") - 1
        out: list[dict] = [{}] * len(ids)
        for s in np.unique(shard_of).tolist():
            sel = np.flatnonzero(shard_of == s)
            table = self._metadata_shard(s)
            if table is None:
                continue
            rows = _rows(table.take(ids[sel] - int(self._offsets[s])), self.shards[s].get("metadata_encoding"))
            for j, r in zip(sel.tolist(), rows):
                out[j] = r
        return out

    def verify(self) -> tuple[int, int]:
        """Every file's sha256 against the manifest, and every metadata row present: (files, bytes).
        A clip-retrieval folder records no hash: its files are read whole and their rows counted."""
        files, size = 0, 0
        for s, shard in enumerate(self.shards):
            for key in ("embeddings", "metadata"):
                if shard.get(key) is None:
                    continue
                file = self.path / shard[key]
                check_file(file, shard.get(f"{key}_bytes"), self.source, f"{self.what} {key} shard")
                digest = sha256_file(file)  # read whole, also where no hash is recorded
                if digest != shard.get(f"{key}_sha256", digest):
                    raise VlctlError(f"{file}: sha256 differs from {self.source} (file changed or corrupt)")
                files, size = files + 1, size + file.stat().st_size
            self._metadata_shard(s)  # the rows counted
        return files, size


def metadata_table(metadata: Sequence[dict], what: str):
    """The rows' fields as (Arrow table, how it reads back): a typed column per field when the rows
    make one table that reads back as they are, a row's missing field null ("sparse" when some
    row misses one: nulls are dropped on reading); else one JSON string per row ("json")."""
    import pyarrow as pa

    keys = list(dict.fromkeys(k for m in metadata for k in m))
    sparse = any(len(m) != len(keys) for m in metadata)
    # sparse reads a null back as a missing field, so a row's own None would not read back
    if keys and not (sparse and any(v is None for m in metadata for v in m.values())):
        columns = {k: [m.get(k) for m in metadata] for k in keys}
        try:
            table = pa.table(columns)
            json_like = not any(pa.types.is_binary(f.type) or pa.types.is_temporal(f.type) for f in table.schema)
            if json_like and all(table.column(k).to_pylist() == v for k, v in columns.items()):  # cheap: by column
                return table, "sparse" if sparse else None
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass  # not one typed table: the JSON column
    try:
        text = [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in metadata]
    except TypeError as e:
        raise VlctlError(f"add: {what} metadata is not JSON-serialisable ({e})") from None
    return pa.table({JSON_COLUMN: pa.array(text, pa.string())}), "json"


def _rows(table, encoding: str | None) -> list[dict]:
    """An Arrow table's rows as the dicts they were written from (`metadata_table`'s encoding)."""
    rows = table.to_pylist()
    if encoding == "json":
        return [json.loads(r[JSON_COLUMN]) for r in rows]
    if encoding == "sparse":
        return [{k: v for k, v in r.items() if v is not None} for r in rows]
    return rows


def write_metadata(path: Path, name: str, table) -> None:
    """The Arrow table as the parquet file `name`, written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    atomic_write_bytes(path / name, buf.getvalue().to_pybytes())


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


def check_text_metadata(text_metadata: Sequence[dict] | None, m: int, total: int) -> list[dict]:
    """An add's text rows' metadata (m rows, each a "text" string and maybe "image": a row number
    below `total`, the image rows after the add) as a list, or one line saying which row is wrong."""
    text_metadata = [] if text_metadata is None else list(text_metadata)
    if len(text_metadata) != m:
        raise VlctlError(f"add: {m} text embeddings but {len(text_metadata)} text metadata rows")
    bad = next((j for j, tm in enumerate(text_metadata) if not isinstance(tm.get("text"), str)), None)
    if bad is not None:
        raise VlctlError(f"add: text metadata row {bad} has no \"text\" string")
    bad = next((j for j, tm in enumerate(text_metadata)
                if "image" in tm and not (isinstance(tm["image"], int) and 0 <= tm["image"] < total)), None)
    if bad is not None:
        raise VlctlError(f"add: text metadata row {bad} names image {text_metadata[bad]['image']!r}, "
                         f"the store will hold image rows 0..{total - 1}")
    return text_metadata


def write_shard(path: Path, name: str, x: np.ndarray, dim: int, index, what: str, normalized: bool = False,
                dtype: str = "float32", first_id: int = 0) -> None:
    """Normalise `x` in chunks into the new shard file `name` stored as `dtype` (and into `index`,
    if any, as the stored values read back in float32, ids from `first_id`), so memory holds one
    chunk, not another copy of every row; the file appears under its name complete."""
    file = path / name
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    try:
        out = open_memmap(tmp, np.dtype(dtype), (len(x), dim))  # blocks reserved: a full disk is an error, not SIGBUS
        for s in range(0, len(x), ADD_CHUNK):
            chunk = normalise(x[s : s + ADD_CHUNK], f"add ({'' if what == 'image' else what + ' '}rows {s}..{min(len(x), s + ADD_CHUNK) - 1})",
                              divide=not normalized)
            out[s : s + len(chunk)] = chunk
            if index is not None:  # what search re-scores: the stored (maybe rounded) values
                index.add_with_ids(np.asarray(out[s : s + len(chunk)], np.float32),
                                   np.arange(first_id + s, first_id + s + len(chunk), dtype=np.int64))
        out.flush()
        del out
        with open(tmp, "rb+") as f:
            fsync(f)
        replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def file_record(path: Path, key: str, name: str) -> dict:
    """A file's manifest fields under `key`: its name, size, sha256 (checked by `verify`) and fast
    hash (checked on every open, `vlctl.io.fast_hash_file`)."""
    return {key: name, f"{key}_bytes": (path / name).stat().st_size, f"{key}_sha256": sha256_file(path / name),
            f"{key}_fast": fast_hash_file(path / name)}


def shard_record(path: Path, rows: int, emb_name: str, meta_name: str, encoding: str | None) -> dict:
    """A shard's manifest entry: rows, per file its name, size and hashes (`file_record`), and how
    its metadata reads back (`metadata_table`)."""
    return {"rows": rows, **file_record(path, "embeddings", emb_name), **file_record(path, "metadata", meta_name),
            **({"metadata_encoding": encoding} if encoding else {})}

"""A store's FAISS index as parts: one file per add, searched together, so an add writes and
hashes only its own rows' part (time and memory proportional to the rows added).

- ivfpq: the first add trains the quantisers (`vlctl.embeddings.search.new_index`) and writes them,
  holding no row, as `index/trained.faiss`; every add encodes its rows with them into
  `index/part_<shard>.faiss` (ids = row numbers). On open the parts' inverted lists are stacked
  (`faiss.HStackInvertedLists`) under one IndexIVFPQ: a search quantises the query once and scans
  each probed list across every part, exactly as one index holding every row would.
- hnsw: one graph per add (`IndexIDMap` over `IndexHNSWFlat`, ids = row numbers); a search asks
  every graph and keeps the best (`faiss.IndexShards`).
- "none" and "flat": no index file; search is exact over the memory-mapped shards.

A run that commits in batches (`vlctl embed --commit-every`, `vlctl store convert`) writes a part
per commit and, at its end, merges its own parts into one (`merge_parts`, named after its first
and last shard: `index/part_<first>_<last>.faiss`), so a store holds a part per run, not per batch.
The merge reads and writes only the run's rows: ivfpq moves the parts' inverted lists into one
index (`IndexIVF.merge_from`, ids kept); hnsw builds one graph over the run's stored rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlctl.config import config_to_dict
from vlctl.embeddings.search import IndexConfig, faiss_module, new_index, row_reader
from vlctl.embeddings.tuning import tune_store
from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_bytes, check_content, check_file, fast_hash_file, sha256_file

INDEX_DIR = "index"
TRAINED = f"{INDEX_DIR}/trained.faiss"


def part_name(shard: int, last: int | None = None) -> str:
    """The file of the part of one add's rows (shard `shard`), or of a merge of shards shard..last."""
    return f"{INDEX_DIR}/part_{shard:05d}{'' if last is None else f'_{last:05d}'}.faiss"


def has_index(cfg: IndexConfig) -> bool:
    """Whether the store keeps index files (ivfpq, hnsw); exact kinds search the shards."""
    return cfg.kind in ("ivfpq", "hnsw")


def write_index(index, path: Path) -> None:
    """The FAISS index, serialised and written atomically (fsync, rename, a full disk as an error)."""
    atomic_write_bytes(path, faiss_module().serialize_index(index).tobytes())


def read_index(path: Path, record: dict, source: Path):
    """The index file of `record` ({"file", "bytes", "sha256", "fast"}), checked against `source`."""
    file = path / record["file"]
    check_file(file, record["bytes"], source, "FAISS index")
    check_content(file, record.get("fast"), record.get("sha256"), source)
    try:
        return faiss_module().read_index(str(file))
    except RuntimeError as e:
        raise VlctlError(f"{file}: cannot read FAISS index ({str(e).splitlines()[0]})") from None


def new_part(cfg: IndexConfig, dim: int, x: np.ndarray, trained):
    """An empty index part for an add of rows `x`: for ivfpq a copy of the `trained` quantisers
    (trained here on `x` when None, the store's first add); returns (part, trained or None)."""
    faiss = faiss_module()
    if cfg.kind == "hnsw":
        return faiss.IndexIDMap(new_index(cfg, dim, None)), None
    if trained is None:
        trained = new_index(cfg, dim, x)
    return faiss.clone_index(trained), trained


def faiss_type(part, trained) -> str:
    """The FAISS class of a part's rows' index: IndexIVFPQ, IndexHNSWFlat."""
    return type(trained if trained is not None else faiss_module().downcast_index(part.index)).__name__


def combine(parts: list, cfg: IndexConfig, trained):
    """(one searchable index over the parts, what it reads) (module docstring): the caller keeps
    `parts` and the second value alive while it uses the index."""
    faiss = faiss_module()
    if cfg.kind == "hnsw":
        shards = faiss.IndexShards(parts[0].d, False, False)  # not threaded; ids are the parts' own
        for p in parts:
            shards.add_shard(p)
        return shards, None
    lists = faiss.InvertedListsPtrVector()
    for p in parts:
        lists.push_back(p.invlists)
    stacked = faiss.HStackInvertedLists(lists.size(), lists.data())
    index = faiss.clone_index(trained)  # the quantisers, no row
    index.replace_invlists(stacked, False)
    index.ntotal = sum(int(p.ntotal) for p in parts)
    return index, (lists, stacked)


def set_search_params(index, parts: list, cfg: IndexConfig, tuned: dict | None = None) -> None:
    """The config's search parameters; for ivfpq the tuned nprobe where the store has one."""
    faiss = faiss_module()
    if cfg.kind == "ivfpq":
        index.nprobe = int(tuned["nprobe"]) if tuned else cfg.nprobe
    elif cfg.kind == "hnsw":
        for p in parts:
            faiss.downcast_index(p.index).hnsw.efSearch = cfg.ef_search


def add_part(path: Path, record: dict, cfg: IndexConfig, part, trained, shard_no: int, arrays: list,
             earlier: list) -> dict:
    """The manifest's index entry after an add whose rows `part` holds: the part written and
    recorded beside the earlier ones (never rewritten, never re-hashed), the trained quantisers
    written on the first add, and for a tuned ivfpq store (`earlier`: the store's parts, read) the
    tuning brought up to date over every part (`arrays`: the image shards, the add's last)."""
    record = dict(record)
    name = part_name(shard_no)
    write_index(part, path / name)
    if record.get("trained") is None and trained is not None:
        write_index(trained, path / TRAINED)
        record["trained"] = index_file(path, TRAINED)
    record["config"] = config_to_dict(cfg)
    record["faiss_type"] = faiss_type(part, trained)
    record["parts"] = [*record.get("parts", []), {**index_file(path, name), "rows": int(part.ntotal)}]
    if cfg.kind == "ivfpq" and cfg.target_recall > 0:
        index, keep = combine([*earlier, part], cfg, trained)
        record["tuned"], record["tune_truth"] = tune_store(cfg, index, arrays, record.get("tune_truth"))
        del keep
    return record


def merge_parts(path: Path, record: dict, cfg: IndexConfig, first: int, trained, read, arrays: list) -> dict:
    """The manifest's index entry with its parts from `first` on (one run's commits) merged into one
    part file (module docstring); there are at least two. `read(p)` reads a part record's index;
    `arrays`: the store's image shards (hnsw rebuilds from the stored rows). The earlier parts are
    neither read nor rewritten; the caller commits the entry (the merged file stays unnamed, and is
    removed as such, until the manifest names it)."""
    parts = record["parts"]
    faiss = faiss_module()
    start, rows = sum(int(p["rows"]) for p in parts[:first]), sum(int(p["rows"]) for p in parts[first:])
    if cfg.kind == "ivfpq":
        merged = faiss.clone_index(trained)  # the quantisers, no row
        for p in parts[first:]:
            merged.merge_from(read(p), 0)  # 0: keep the parts' ids (row numbers)
    else:  # the run's stored rows, 65,536 at a time
        merged, _ = new_part(cfg, arrays[0].shape[1], None, None)
        rows_of = row_reader(arrays)
        for a in range(start, start + rows, 65536):
            ids = np.arange(a, min(a + 65536, start + rows), dtype=np.int64)
            merged.add_with_ids(rows_of(ids), ids)
    # named after the first shard of its first part and the last of its last: part_00003 / part_00003_00007
    name = part_name(int(Path(parts[first]["file"]).stem.split("_")[1]),
                     int(Path(parts[-1]["file"]).stem.split("_")[-1]))
    if merged.ntotal != rows:
        raise VlctlError(f"{path / name}: the merged parts hold {merged.ntotal} rows, the manifest says {rows}")
    write_index(merged, path / name)
    return {**record, "parts": [*parts[:first], {**index_file(path, name), "rows": rows}]}


def index_file(path: Path, name: str) -> dict:
    """An index file's manifest fields: {"file", "bytes", "sha256", "fast"}."""
    return {"file": name, "bytes": (path / name).stat().st_size, "sha256": sha256_file(path / name),
            "fast": fast_hash_file(path / name)}

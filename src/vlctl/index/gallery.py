"""A gallery: embeddings of a collection, their metadata and a FAISS index, in one directory.

    GALLERY/
      manifest.json          written last on every change: format, encoder id (and spec), dim,
                             count, index config, generation, and per file its rows, bytes, sha256
      emb-00000.npy ...      (rows, dim) float32, L2-normalised; one shard per `add`, never rewritten;
                             memory-mapped when read
      meta-00000.jsonl ...   one JSON object per row of the shard with the same number; read row by
                             row through a memory map (parquet would need pyarrow, not a vlctl
                             dependency)
      index-<gen>.faiss      the FAISS index over all rows (ids = row numbers), rewritten per add

Atomicity: an `add` writes its new shard files and a new index file under fresh names, then
replaces manifest.json in one rename. Until that rename the previous manifest names only the
previous files, so a crash at any point leaves the previous gallery intact; files that no
manifest names (left by a crash) are deleted by the next successful add. One writer at a time;
readers re-open after an add.

Search is maximum inner product over the normalised embeddings (= cosine similarity). Index kinds
(`IndexConfig.kind`): "flat" (exact, the default), "ivfpq" (inverted lists + product
quantisation, trained on the first add; its top k * refine candidates are re-scored exactly from
the stored embeddings), "hnsw" (graph over the full vectors). A `Reranker` re-scores the top
candidates of any kind: TEVI rerank and ControlEmbed attribute queries plug in there.

Checks on open are cheap (sizes, shapes, counts against the manifest); `Gallery.verify()` also
recomputes every sha256.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import mmap
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.io import VlctlError, atomic_write_json, atomic_write_text, read_json, sha256_file

FORMAT = "vlctl.gallery/1"
MANIFEST = "manifest.json"
INDEX_KINDS = ("flat", "ivfpq", "hnsw")
_ADD_CHUNK = 65_536  # rows normalised and indexed at a time by Gallery.add
_SHARD_RE = re.compile(r"^(emb|meta)-(\d{5})\.(npy|jsonl)$|^index-(\d+)\.faiss$")


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """Which FAISS index a gallery uses, and its parameters."""

    kind: str = opt(
        "flat", "index kind: 'flat' (exact inner product), 'ivfpq' or 'hnsw' (approximate, for large galleries)"
    )
    nlist: int = opt(
        0, "ivfpq: number of inverted lists (coarse centroids); 0 = 4*sqrt(n) of the first add, at most n/39"
    )
    pq_m: int = opt(64, "ivfpq: sub-quantisers per vector (must divide dim); codes take pq_m * pq_nbits / 8 bytes")
    pq_nbits: int = opt(8, "ivfpq: bits per sub-quantiser code")
    nprobe: int = opt(32, "ivfpq: inverted lists visited per query (recall vs speed)")
    refine: int = opt(50, "ivfpq: re-score k * refine candidates exactly from the stored embeddings (1 = off)")
    train_size: int = opt(100_000, "ivfpq: rows of the first add sampled to train the quantisers (at least 39 * nlist)")
    hnsw_m: int = opt(32, "hnsw: graph neighbours per node")
    ef_construction: int = opt(80, "hnsw: candidate list size while building")
    ef_search: int = opt(64, "hnsw: candidate list size per query (recall vs speed)")

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise VlctlError(f"IndexConfig.kind must be one of {INDEX_KINDS}, got {self.kind!r}")
        for f in ("pq_m", "pq_nbits", "nprobe", "refine", "train_size", "hnsw_m", "ef_construction", "ef_search"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise VlctlError(f"IndexConfig.{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.nlist, int) or self.nlist < 0:
            raise VlctlError(f"IndexConfig.nlist must be >= 0 (0 = automatic), got {self.nlist!r}")


class Reranker(Protocol):
    """Re-scores search candidates; higher is better.

    Called as `reranker(queries, candidate_ids, gallery)` with queries (q, d) float32 (the query
    embeddings), candidate_ids (q, c) int64 (row numbers; -1 where the index found fewer than c)
    and the gallery (use `gallery.vectors(ids)` for embeddings, `gallery.metadata(ids)` for
    metadata). Returns scores (q, c); -inf drops a candidate. TEVI rerank (text-conditioned
    scores) and ControlEmbed attribute queries implement this.
    """

    def __call__(self, queries: np.ndarray, candidate_ids: np.ndarray, gallery: Gallery) -> np.ndarray: ...


def exact_rerank(queries: np.ndarray, candidate_ids: np.ndarray, gallery: Gallery) -> np.ndarray:
    """The exact inner product of each query with its candidates' stored embeddings: (q, c)."""
    vecs = gallery.vectors(np.maximum(candidate_ids, 0).ravel()).reshape(*candidate_ids.shape, -1)
    scores = np.einsum("qd,qcd->qc", queries, vecs)
    return np.where(candidate_ids >= 0, scores, -np.inf).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Top-k results of q queries: ids (q, k) int64 row numbers (-1 = no result), scores (q, k)."""

    ids: np.ndarray
    scores: np.ndarray

    def hits(self, gallery: Gallery) -> list[list[dict]]:
        """Per query, [{**metadata, "id", "score"}] best first (rows with id -1 left out).

        "id" (the row number) and "score" are reserved: a metadata field of that name is shadowed.
        """
        out = []
        for ids, scores in zip(self.ids, self.scores):
            keep = ids >= 0
            metas = gallery.metadata(ids[keep])
            out.append([{**m, "id": int(i), "score": float(s)} for i, s, m in zip(ids[keep], scores[keep], metas)])
        return out


# --------------------------------------------------------------------------------------------
# FAISS


def _faiss():
    import faiss

    return faiss


def _new_index(cfg: IndexConfig, dim: int, first: np.ndarray | None):
    """A FAISS index for `cfg`; ivfpq is trained on (a sample of) `first`, the first add's rows."""
    faiss = _faiss()
    if cfg.kind == "flat":
        return faiss.IndexFlatIP(dim)
    if cfg.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        return index
    # ivfpq
    if dim % cfg.pq_m:
        raise VlctlError(f"IndexConfig.pq_m={cfg.pq_m} does not divide the embedding dim {dim}")
    n = 0 if first is None else len(first)
    nlist = cfg.nlist or max(1, min(int(4 * np.sqrt(n)), n // 39))
    need = max(39 * nlist, 2**cfg.pq_nbits)  # FAISS's own minimum training set sizes
    if n < need:
        raise VlctlError(
            f"an ivfpq gallery trains its quantisers on the first add, which needs at least {need} rows "
            f"(nlist={nlist}, pq_nbits={cfg.pq_nbits}); got {n}. Use --index-kind flat for small galleries, or a "
            "smaller nlist / pq_nbits"
        )
    size = min(n, max(cfg.train_size, need))
    # A fixed-seed sample keeps builds reproducible; k-means cost grows with it, not with n.
    train = first if size == n else first[np.sort(np.random.default_rng(0).choice(n, size, replace=False))]
    train = _normalise(train, "ivfpq training sample")
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, cfg.pq_m, cfg.pq_nbits, faiss.METRIC_INNER_PRODUCT)
    index.train(train)
    return index


def _set_search_params(index, cfg: IndexConfig) -> None:
    if cfg.kind == "ivfpq":
        index.nprobe = cfg.nprobe
    elif cfg.kind == "hnsw":
        index.hnsw.efSearch = cfg.ef_search


# --------------------------------------------------------------------------------------------
# Gallery


def _normalise(x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise VlctlError(f"{what}: expected a 2-D array (n, dim), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise VlctlError(f"{what}: expected floating-point embeddings, got dtype {x.dtype}")
    x = x.astype(np.float32, copy=True)
    if not np.isfinite(x).all():
        raise VlctlError(f"{what}: embeddings contain NaN or inf")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise VlctlError(f"{what}: row {int(np.flatnonzero(norms[:, 0] == 0)[0])} is all zeros (cannot normalise)")
    return x / norms


class Gallery:
    """An opened gallery (see the module docstring). Use `create_gallery` / `open_gallery`."""

    def __init__(self, path: Path, manifest: dict):
        self.path = path
        self.manifest = manifest
        self.config = config_from_dict(IndexConfig, manifest["index"]["config"], source=str(path / MANIFEST))
        self._shards = [self._open_shard(s) for s in manifest["shards"]]
        self._offsets = np.cumsum([0] + [s["rows"] for s in manifest["shards"]])
        self._index = None
        self._metadata_shards: dict[int, tuple[mmap.mmap, np.ndarray]] = {}

    # -- properties ---------------------------------------------------------------------------
    @property
    def encoder_id(self) -> str:
        return self.manifest["encoder_id"]

    @property
    def encoder_spec(self) -> str | None:
        """The spec the gallery was built with (None if built from raw embeddings)."""
        return self.manifest.get("encoder_spec")

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def __len__(self) -> int:
        return int(self.manifest["count"])

    def __repr__(self) -> str:
        return f"Gallery({str(self.path)!r}, encoder_id={self.encoder_id!r}, count={len(self)}, index={self.config.kind!r})"

    # -- reading ------------------------------------------------------------------------------
    def _open_shard(self, shard: dict) -> np.ndarray:
        file = self.path / shard["embeddings"]
        if not file.is_file():
            raise VlctlError(f"{file}: embedding shard named in {self.path / MANIFEST} is missing")
        size = file.stat().st_size
        if size != shard["embeddings_bytes"]:
            raise VlctlError(
                f"{file}: {size} bytes, but {self.path / MANIFEST} records {shard['embeddings_bytes']} "
                "(truncated or overwritten)"
            )
        try:
            arr = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise VlctlError(f"{file}: corrupt or truncated embedding shard ({e})") from None
        if arr.shape != (shard["rows"], self.dim) or arr.dtype != np.float32:
            raise VlctlError(
                f"{file}: array is {arr.dtype} {arr.shape}, but {self.path / MANIFEST} says float32 "
                f"({shard['rows']}, {self.dim})"
            )
        return arr

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored embeddings of rows `ids` (m,) -> (m, dim) float32 (reads only those rows)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise VlctlError(f"{self.path}: row ids must lie in [0, {len(self)}), got {ids.min()}..{ids.max()}")
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        shard_of = np.searchsorted(self._offsets, ids, side="right") - 1
        for s in np.unique(shard_of):
            sel = shard_of == s
            out[sel] = self._shards[s][ids[sel] - self._offsets[s]]
        return out

    def embeddings(self) -> np.ndarray:
        """All embeddings (count, dim) float32 (a copy in memory; prefer `vectors` for subsets)."""
        if not self._shards:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate([np.asarray(s) for s in self._shards])

    def _metadata_shard(self, s: int) -> tuple[mmap.mmap, np.ndarray]:
        """Shard s's jsonl, memory-mapped, and its line offsets (rows + 1,): row i is
        bytes[offsets[i]:offsets[i + 1]]. json.dumps escapes newlines inside strings and UTF-8
        never contains byte 0x0A inside a character, so every 0x0A ends a row."""
        if s not in self._metadata_shards:
            shard = self.manifest["shards"][s]
            file = self.path / shard["metadata"]
            if not file.is_file():
                raise VlctlError(f"{file}: metadata shard named in {self.path / MANIFEST} is missing")
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
            self._metadata_shards[s] = (mm, np.concatenate([[0], ends]))
        return self._metadata_shards[s]

    def metadata(self, ids: np.ndarray | Sequence[int] | None = None) -> list[dict]:
        """Metadata dicts of rows `ids` (all rows if None).

        Only the requested rows are parsed (the jsonl shards are memory-mapped and their line
        offsets found once), so showing 10 hits of a 1M-row gallery does not parse 1M rows.
        """
        ids = np.arange(len(self)) if ids is None else np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise VlctlError(f"{self.path}: row ids must lie in [0, {len(self)}), got {ids.min()}..{ids.max()}")
        shard_of = np.searchsorted(self._offsets, ids, side="right") - 1
        out = []
        for i, s in zip(ids.tolist(), shard_of.tolist()):
            mm, offsets = self._metadata_shard(s)
            r = i - int(self._offsets[s])
            try:
                out.append(json.loads(mm[offsets[r] : offsets[r + 1]]))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                file = self.path / self.manifest["shards"][s]["metadata"]
                raise VlctlError(f"{file}: corrupt metadata row {r} ({e})") from None
        return out

    @property
    def index(self):
        """The FAISS index (read from disk on first use), with the config's search parameters."""
        if self._index is None:
            name = self.manifest["index"]["file"]
            if name is None:
                return None
            file = self.path / name
            if not file.is_file():
                raise VlctlError(f"{file}: FAISS index named in {self.path / MANIFEST} is missing")
            if file.stat().st_size != self.manifest["index"]["bytes"]:
                raise VlctlError(f"{file}: size differs from {self.path / MANIFEST} (truncated or overwritten)")
            try:
                index = _faiss().read_index(str(file))
            except RuntimeError as e:
                raise VlctlError(f"{file}: cannot read FAISS index ({str(e).splitlines()[0]})") from None
            if index.ntotal != len(self) or index.d != self.dim:
                raise VlctlError(
                    f"{file}: index holds {index.ntotal} x {index.d}, manifest says {len(self)} x {self.dim}"
                )
            _set_search_params(index, self.config)
            self._index = index
        return self._index

    def verify(self) -> None:
        """Recompute every file's sha256 and compare with the manifest (reads everything)."""
        for shard in self.manifest["shards"]:
            for key in ("embeddings", "metadata"):
                file = self.path / shard[key]
                if sha256_file(file) != shard[f"{key}_sha256"]:
                    raise VlctlError(f"{file}: sha256 differs from {self.path / MANIFEST} (file changed or corrupt)")
        idx = self.manifest["index"]
        if idx["file"] is not None and sha256_file(self.path / idx["file"]) != idx["sha256"]:
            raise VlctlError(f"{self.path / idx['file']}: sha256 differs from {self.path / MANIFEST}")

    # -- search -------------------------------------------------------------------------------
    def search(
        self, queries: np.ndarray, k: int = 10, reranker: Reranker | None = None, candidates: int | None = None
    ) -> SearchResult:
        """Top-k rows for each query embedding.

        Args:
            queries: (q, dim) or (dim,) float; L2-normalised here (scores are cosine similarities).
            k: results per query.
            reranker: re-scores the index's top `candidates` (see `Reranker`); None = the index's
                order (for ivfpq, with exact re-scoring of k * refine candidates).
            candidates: how many candidates the reranker sees (default max(k, 100)).

        Returns:
            SearchResult with ids (q, k) and scores (q, k), best first; -1 / -inf pad when the
            gallery holds fewer than k rows.
        """
        if k < 1:
            raise VlctlError(f"search: k must be >= 1, got {k}")
        q = _normalise(queries[None] if np.ndim(queries) == 1 else queries, "search queries")
        if q.shape[1] != self.dim:
            raise VlctlError(
                f"search: queries have dim {q.shape[1]}, the gallery at {self.path} has dim {self.dim} "
                f"(encoder {self.encoder_id})"
            )
        if len(self) == 0:
            return SearchResult(np.full((len(q), k), -1, np.int64), np.full((len(q), k), -np.inf, np.float32))
        if reranker is None and self.config.kind == "ivfpq" and self.config.refine > 1:
            reranker, candidates = exact_rerank, k * self.config.refine
        n_cand = k if reranker is None else max(k, candidates or 100)
        scores, ids = self.index.search(q, min(n_cand, len(self)))
        if reranker is not None:
            scores = np.asarray(reranker(q, ids, self), dtype=np.float32)
            if scores.shape != ids.shape:
                raise VlctlError(f"search: reranker returned scores of shape {scores.shape}, expected {ids.shape}")
            scores = np.where(ids >= 0, scores, -np.inf)
            order = np.argsort(-scores, axis=1, kind="stable")
            ids, scores = np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)
        ids, scores = ids[:, :k], scores[:, :k]
        if ids.shape[1] < k:  # fewer rows than k
            pad = k - ids.shape[1]
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        scores = np.where(ids >= 0, scores, -np.inf).astype(np.float32)
        return SearchResult(ids.astype(np.int64), scores)

    def search_texts(self, encoder: Any, texts: Sequence[str], k: int = 10, **kw: Any) -> SearchResult:
        """Embed `texts` with `encoder` (must be the gallery's encoder) and search."""
        self.check_encoder(encoder.id)
        tokens = encoder.tokenize(list(texts))
        return self.search(encoder.encode_texts(tokens, normalize=True).detach().cpu().numpy(), k, **kw)

    def search_images(self, encoder: Any, images: Any, k: int = 10, **kw: Any) -> SearchResult:
        """Embed preprocessed images (n, 3, S, S) with `encoder` (the gallery's) and search."""
        self.check_encoder(encoder.id)
        return self.search(encoder.encode_images(images, normalize=True).detach().cpu().numpy(), k, **kw)

    def check_encoder(self, encoder_id: str) -> None:
        if encoder_id != self.encoder_id:
            raise VlctlError(
                f"{self.path / MANIFEST}: gallery was built with encoder {self.encoder_id!r}, not {encoder_id!r}; "
                "embeddings of different encoders are not comparable (build a gallery with this encoder)"
            )

    # -- writing ------------------------------------------------------------------------------
    def add(
        self, embeddings: np.ndarray, metadata: Sequence[dict] | None = None, encoder_id: str | None = None
    ) -> Gallery:
        """Append rows; returns the gallery as re-opened after the add (this object is stale).

        Args:
            embeddings: (n, dim) float; L2-normalised before storing.
            metadata: n JSON-serialisable dicts (path, caption, labels, ...); default {} per row.
            encoder_id: if given, must equal the gallery's encoder id.

        Raises:
            VlctlError: another encoder, another dim, a metadata count that differs from n,
            non-serialisable metadata, an ivfpq first add too small to train on.
        """
        if encoder_id is not None:
            self.check_encoder(encoder_id)
        x = embeddings if isinstance(embeddings, np.ndarray) else np.asarray(embeddings)  # memmaps stay lazy
        if x.ndim != 2:
            raise VlctlError(f"add: expected a 2-D array (n, dim), got shape {x.shape}")
        if x.shape[1] != self.dim:
            raise VlctlError(
                f"add: embeddings have dim {x.shape[1]}, the gallery at {self.path} has dim {self.dim} "
                f"(encoder {self.encoder_id}); a gallery holds one embedding space"
            )
        n = len(x)
        metadata = [{} for _ in range(n)] if metadata is None else list(metadata)
        if len(metadata) != n:
            raise VlctlError(f"add: {n} embeddings but {len(metadata)} metadata rows")
        try:
            meta_text = "".join(json.dumps(m, sort_keys=True, ensure_ascii=False) + "\n" for m in metadata)
        except TypeError as e:
            raise VlctlError(f"add: metadata is not JSON-serialisable ({e})") from None
        if n == 0:
            return self

        generation = int(self.manifest["generation"]) + 1
        shard_no = len(self.manifest["shards"])
        emb_name, meta_name = f"emb-{shard_no:05d}.npy", f"meta-{shard_no:05d}.jsonl"
        index_name = f"index-{generation}.faiss"
        self._remove_unreferenced()  # a crashed add may have left files under these names

        # 1. + 2. the new shard and the index with the new rows, streamed in chunks so memory
        # holds the index plus one chunk (not another copy of all rows), under names no
        # manifest mentions yet.
        emb_path = self.path / emb_name
        tmp = emb_path.with_name(f".{emb_name}.tmp")
        try:
            index = self.index
            if index is None:  # first add: train where needed
                index = _new_index(self.config, self.dim, x)
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, self.dim))
            for s in range(0, n, _ADD_CHUNK):
                chunk = _normalise(x[s : s + _ADD_CHUNK], f"add (rows {s}..{min(n, s + _ADD_CHUNK) - 1})")
                out[s : s + len(chunk)] = chunk
                index.add(chunk)
            out.flush()
            del out
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, emb_path)
            atomic_write_text(self.path / meta_name, meta_text)
            _write_index(index, self.path / index_name)
        except BaseException:
            # The in-memory index may hold part of the rows: drop it, the file on disk is intact.
            self._index = None
            tmp.unlink(missing_ok=True)
            raise

        # 3. the manifest, in one rename: from here on the new gallery is the gallery
        manifest = dict(self.manifest)
        manifest["shards"] = [
            *self.manifest["shards"],
            {
                "rows": n,
                "embeddings": emb_name,
                "embeddings_bytes": emb_path.stat().st_size,
                "embeddings_sha256": sha256_file(emb_path),
                "metadata": meta_name,
                "metadata_sha256": sha256_file(self.path / meta_name),
            },
        ]
        manifest["count"] = len(self) + n
        manifest["generation"] = generation
        manifest["index"] = {
            "config": config_to_dict(self.config),
            "file": index_name,
            "bytes": (self.path / index_name).stat().st_size,
            "sha256": sha256_file(self.path / index_name),
            "faiss_type": type(index).__name__,
        }
        manifest["updated"] = _now()
        atomic_write_json(self.path / MANIFEST, manifest)
        new = Gallery(self.path, manifest)
        new._index = index
        new._remove_unreferenced()
        return new

    def _remove_unreferenced(self) -> None:
        """Delete shard/index files no manifest names (left by an interrupted add) and stale temps."""
        named = {self.manifest["index"]["file"]}
        for s in self.manifest["shards"]:
            named |= {s["embeddings"], s["metadata"]}
        for f in self.path.iterdir():
            if (_SHARD_RE.match(f.name) and f.name not in named) or (
                f.name.startswith(".") and f.name.endswith(".tmp")
            ):
                f.unlink(missing_ok=True)


def _write_index(index, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    _faiss().write_index(index, str(tmp))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def create_gallery(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
) -> Gallery:
    """Create an empty gallery directory (refuses a non-empty existing directory).

    `encoder_spec` (e.g. "open_clip:ViT-B-32/laion2b_s34b_b79k") is recorded so `vlctl search`
    can rebuild the encoder; the encoder id still decides compatibility.
    """
    path = Path(path)
    config = config or IndexConfig()
    if not isinstance(dim, int) or dim < 1:
        raise VlctlError(f"create_gallery: dim must be a positive integer, got {dim!r}")
    if not isinstance(encoder_id, str) or not encoder_id:
        raise VlctlError(f"create_gallery: encoder_id must be a non-empty string, got {encoder_id!r}")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise VlctlError(
            f"{path}: already exists and is not an empty directory; open it with open_gallery "
            "to add to it, or choose another path"
        )
    path.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": FORMAT,
        "encoder_id": encoder_id,
        "encoder_spec": encoder_spec,
        "dim": dim,
        "count": 0,
        "generation": 0,
        "shards": [],
        "index": {"config": config_to_dict(config), "file": None, "bytes": 0, "sha256": None, "faiss_type": None},
        "created": _now(),
        "updated": _now(),
    }
    atomic_write_json(path / MANIFEST, manifest)
    return Gallery(path, manifest)


_REQUIRED = ("format", "encoder_id", "dim", "count", "generation", "shards", "index")


def open_gallery(path: str | os.PathLike, encoder_id: str | None = None) -> Gallery:
    """Open and check a gallery directory.

    Checks (cheap, no full read): the manifest exists and is complete, every shard exists with the
    recorded size and shape, the counts add up. `Gallery.verify()` also checks the sha256 hashes.

    Raises:
        VlctlError naming the file: a missing directory or manifest, a corrupt manifest, a missing
        or truncated shard, a gallery built with another encoder than `encoder_id`.
    """
    path = Path(path)
    if not path.is_dir():
        raise VlctlError(f"{path}: gallery directory not found")
    if not (path / MANIFEST).is_file():
        raise VlctlError(
            f"{path / MANIFEST}: gallery manifest not found (not a vlctl gallery, or its manifest "
            "was deleted; rebuild it with `vlctl index`)"
        )
    manifest = read_json(path / MANIFEST, "gallery manifest")
    if not isinstance(manifest, dict) or any(k not in manifest for k in _REQUIRED):
        missing = [k for k in _REQUIRED if not isinstance(manifest, dict) or k not in manifest]
        raise VlctlError(f"{path / MANIFEST}: corrupt gallery manifest, missing field(s) {missing}")
    if manifest["format"] != FORMAT:
        raise VlctlError(f"{path / MANIFEST}: format {manifest['format']!r}, this vlctl reads {FORMAT!r}")
    if sum(s["rows"] for s in manifest["shards"]) != manifest["count"]:
        raise VlctlError(f"{path / MANIFEST}: shard rows do not add up to count={manifest['count']}")
    gallery = Gallery(path, manifest)
    if encoder_id is not None:
        gallery.check_encoder(encoder_id)
    return gallery


def open_or_create_gallery(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
) -> Gallery:
    """Open the gallery at `path` for adding (same encoder required), or create it if absent/empty."""
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).is_file():
        gallery = open_gallery(path, encoder_id=encoder_id)
        if config is not None and config != gallery.config:
            raise VlctlError(
                f"{path / MANIFEST}: gallery uses index {config_to_dict(gallery.config)}, "
                f"not the requested {config_to_dict(config)}"
            )
        return gallery
    return create_gallery(path, encoder_id, dim, config, encoder_spec=encoder_spec)

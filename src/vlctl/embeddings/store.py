"""The embeddings store: one directory holding a collection's embeddings, metadata and optional
FAISS index. `vlctl embed` and `vlctl index` write it; every method, `search` and `cluster` read it.

    STORE/
      manifest.json          written last on every change: format, encoder id and spec, dim, the
                             image rows' shards, the text rows' shards, index config, generation,
                             and per file its rows, bytes, sha256
      emb-00000.npy ...      image rows: (rows, dim) float32, L2-normalised; one shard per `add`,
                             never rewritten; memory-mapped when read
      meta-00000.jsonl ...   one JSON object per image row (path, captions, labels, ...); read row
                             by row through a memory map
      txt-00000.npy ...      text rows (captions, prompts), the same way; optional
      txtmeta-00000.jsonl    one object per text row: {"text": ..., "image": image row it describes}
      index-<gen>.faiss      the FAISS index over the image rows (ids = row numbers), rewritten per
                             add; absent for index kind "none" (search is then exact, in numpy)

Images and texts are two tables with their own row counts: a captioned collection has a text row
per caption whose metadata names its image row (`Store.pairs()`), a set of class prompts has only
text rows. Row i of the store means image row i.

Atomicity: an `add` writes its new shard files and a new index file under fresh names, then
replaces manifest.json in one rename. Until that rename the previous manifest names only the
previous files, so a crash at any point leaves the previous store intact; files that no manifest
names (left by a crash) are deleted by the next successful add. One writer at a time; readers
re-open after an add.

Search is maximum inner product over the normalised embeddings (= cosine similarity). Index kinds
(`IndexConfig.kind`): "none" (no index file; exact search in numpy, the default of `vlctl embed`),
"flat" (exact FAISS inner product, the default of `vlctl index`), "ivfpq" (inverted lists + product
quantisation, trained on the first add; its top k * refine candidates are re-scored exactly from
the stored embeddings), "hnsw" (graph over the full vectors). A `Reranker` re-scores the top
candidates of any kind: TEVI rerank and ControlEmbed attribute queries plug in there.

Checks on open are cheap (sizes, shapes, counts against the manifest); `Store.verify()` also
recomputes every sha256. A directory written by an older vlctl as a gallery
("vlctl.gallery/1") opens as a store without text rows.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vlctl.config import config_from_dict, config_to_dict
from vlctl.embeddings.search import (
    INDEX_KINDS,
    IndexConfig,
    faiss_module,
    new_index,
    normalise,
    set_search_params,
    write_index,
)
from vlctl.embeddings.table import (
    ADD_CHUNK,
    MANIFEST,
    Table,
    check_rows,
    metadata_text,
    shard_record,
    write_shard,
)
from vlctl.io import VlctlError, atomic_write_json, atomic_write_text, read_json, sha256_file

__all__ = ["INDEX_KINDS", "IndexConfig", "Reranker", "SearchResult", "Store", "create_store", "exact_rerank",
           "open_or_create_store", "open_store"]

FORMAT = "vlctl.store/1"
OLD_FORMATS = ("vlctl.gallery/1",)  # galleries of vlctl 0.1: a store without text rows
_SHARD_RE = re.compile(r"^(emb|meta|txt|txtmeta)-(\d{5})\.(npy|jsonl)$|^index-(\d+)\.faiss$")


class Reranker(Protocol):
    """Re-scores search candidates; higher is better.

    Called as `reranker(queries, candidate_ids, gallery)` with queries (q, d) float32 (the query
    embeddings), candidate_ids (q, c) int64 (row numbers; -1 where the index found fewer than c)
    and the gallery (use `gallery.vectors(ids)` for embeddings, `gallery.metadata(ids)` for
    metadata). Returns scores (q, c); -inf drops a candidate. TEVI rerank (text-conditioned
    scores) and ControlEmbed attribute queries implement this.
    """

    def __call__(self, queries: np.ndarray, candidate_ids: np.ndarray, gallery: Store) -> np.ndarray: ...


def exact_rerank(queries: np.ndarray, candidate_ids: np.ndarray, gallery: Store) -> np.ndarray:
    """The exact inner product of each query with its candidates' stored embeddings: (q, c)."""
    vecs = gallery.vectors(np.maximum(candidate_ids, 0).ravel()).reshape(*candidate_ids.shape, -1)
    scores = np.einsum("qd,qcd->qc", queries, vecs)
    return np.where(candidate_ids >= 0, scores, -np.inf).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Top-k results of q queries: ids (q, k) int64 row numbers (-1 = no result), scores (q, k)."""

    ids: np.ndarray
    scores: np.ndarray

    def hits(self, gallery: Store) -> list[list[dict]]:
        """Per query, [{**metadata, "id", "score"}] best first (rows with id -1 left out).

        "id" (the row number) and "score" are reserved: a metadata field of that name is shadowed.
        """
        out = []
        for ids, scores in zip(self.ids, self.scores):
            keep = ids >= 0
            metas = gallery.metadata(ids[keep])
            out.append([{**m, "id": int(i), "score": float(s)} for i, s, m in zip(ids[keep], scores[keep], metas)])
        return out



class Store:
    """An opened store (see the module docstring). Use `create_store` / `open_store`.

    `len(store)` and row ids count image rows; `store.texts_table` holds the text rows.
    """

    hit = False  # set by vlctl.embeddings.cache.embed when it found the entry on disk

    def __init__(self, path: str | os.PathLike, manifest: dict | None = None):
        """`Store(path)` opens and checks the store at `path` (as `open_store` does); `manifest`
        is for the writers, which hold the manifest they just wrote."""
        path = Path(path)
        if manifest is None:
            manifest = _read_manifest(path)
        self.path = path
        self.manifest = manifest
        self.config = config_from_dict(IndexConfig, manifest["index"]["config"], source=str(path / MANIFEST))
        self.images_table = Table(path, manifest["shards"], self.dim, "embedding")
        self.texts_table = Table(path, manifest.get("texts", {}).get("shards", []), self.dim, "text embedding")
        self._index = None

    # -- properties ---------------------------------------------------------------------------
    @property
    def encoder_id(self) -> str:
        return self.manifest["encoder_id"]

    @property
    def encoder_spec(self) -> str | None:
        """The spec the store was built with (None if built from raw embeddings)."""
        return self.manifest.get("encoder_spec")

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def key(self) -> str | None:
        """The cache key of an entry written by `vlctl.embeddings.cache.embed`."""
        return self.info.get("key")

    @property
    def info(self) -> dict:
        """What the writer recorded about the source (data id, preprocess id, cache key, ...)."""
        return self.manifest.get("info", {})

    def __len__(self) -> int:
        return int(self.manifest["count"])

    def __repr__(self) -> str:
        return (f"Store({str(self.path)!r}, encoder_id={self.encoder_id!r}, images={len(self)}, "
                f"texts={len(self.texts_table)}, index={self.config.kind!r})")

    # -- reading ------------------------------------------------------------------------------
    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored embeddings of image rows `ids` (m,) -> (m, dim) float32 (reads only those rows)."""
        return self.images_table.vectors(ids)

    def embeddings(self) -> np.ndarray:
        """All image embeddings (count, dim) float32."""
        return self.images_table.all()

    def metadata(self, ids: np.ndarray | Sequence[int] | None = None) -> list[dict]:
        """Metadata dicts of image rows `ids` (all rows if None).

        Only the requested rows are parsed (the jsonl shards are memory-mapped and their line
        offsets found once), so showing 10 hits of a 1M-row store does not parse 1M rows.
        """
        return self.images_table.metadata(ids)

    @property
    def image_emb(self) -> np.ndarray | None:
        """(n_images, dim) float32 read-only (a memmap for a store written in one add); None if empty."""
        return self.images_table.all() if len(self) else None

    @property
    def text_emb(self) -> np.ndarray | None:
        """(n_texts, dim) float32 text rows; None if the store holds none."""
        return self.texts_table.all() if len(self.texts_table) else None

    @property
    def texts(self) -> list[str] | None:
        """The text of every text row, in row order; None if the store holds none."""
        if not len(self.texts_table):
            return None
        return [m["text"] for m in self._text_metadata]

    @functools.cached_property
    def _text_metadata(self) -> list[dict]:
        # Parsed once per opened store (an add returns a new Store): texts, image_of_text and
        # pairs all read it, and a million captions take seconds to parse.
        return self.texts_table.metadata()

    def image_of_text(self) -> np.ndarray:
        """(n_texts,) int64: the image row each text row describes.

        Text rows written with an "image" field use it; a store whose texts carry none and whose
        text count equals its image count pairs them row by row (a captioned generated set).
        """
        meta = self._text_metadata
        if meta and all("image" in m for m in meta):
            return np.array([m["image"] for m in meta], dtype=np.int64)
        if len(meta) == len(self) and not any("image" in m for m in meta):
            return np.arange(len(self), dtype=np.int64)
        raise VlctlError(f"{self.path / MANIFEST}: the store's {len(meta)} text rows do not name the image rows "
                         f"they describe ({len(self)} images); it holds no image-caption pairs")

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(image embeddings, caption embeddings), row r of each one pair: (n_texts, dim) both."""
        if not len(self) or not len(self.texts_table):
            raise VlctlError(f"{self.path}: the store holds {len(self)} images and {len(self.texts_table)} captions; "
                             "image-caption pairs need both (embed a source with captions)")
        image_of = self.image_of_text()
        image_emb = self.image_emb
        if len(image_of) == len(self) and (image_of == np.arange(len(self))).all():
            return np.asarray(image_emb), np.asarray(self.text_emb)
        return self.vectors(image_of), np.asarray(self.text_emb)

    @property
    def index(self):
        """The FAISS index (read from disk on first use), with the config's search parameters;
        None for index kind "none" and for an empty store."""
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
                index = faiss_module().read_index(str(file))
            except RuntimeError as e:
                raise VlctlError(f"{file}: cannot read FAISS index ({str(e).splitlines()[0]})") from None
            if index.ntotal != len(self) or index.d != self.dim:
                raise VlctlError(
                    f"{file}: index holds {index.ntotal} x {index.d}, manifest says {len(self)} x {self.dim}"
                )
            set_search_params(index, self.config)
            self._index = index
        return self._index

    def verify(self) -> None:
        """Recompute every file's sha256 and compare with the manifest (reads everything)."""
        self.images_table.verify()
        self.texts_table.verify()
        idx = self.manifest["index"]
        if idx["file"] is not None and sha256_file(self.path / idx["file"]) != idx["sha256"]:
            raise VlctlError(f"{self.path / idx['file']}: sha256 differs from {self.path / MANIFEST}")

    # -- search -------------------------------------------------------------------------------
    def _exact_search(self, q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Top n image rows per query by exact inner product, shard by shard (no FAISS index)."""
        best_s = np.full((len(q), 0), -np.inf, np.float32)
        best_i = np.zeros((len(q), 0), np.int64)
        for s, arr in enumerate(self.images_table._arrays):
            for c in range(0, len(arr), ADD_CHUNK):
                scores = q @ np.asarray(arr[c : c + ADD_CHUNK]).T
                ids = np.broadcast_to(np.arange(c, c + scores.shape[1]) + self.images_table._offsets[s], scores.shape)
                best_s, best_i = np.hstack([best_s, scores]), np.hstack([best_i, ids])
                if best_s.shape[1] > n:
                    top = np.argsort(-best_s, axis=1, kind="stable")[:, :n]
                    best_s, best_i = np.take_along_axis(best_s, top, 1), np.take_along_axis(best_i, top, 1)
        order = np.argsort(-best_s, axis=1, kind="stable")
        return np.take_along_axis(best_s, order, 1).astype(np.float32), np.take_along_axis(best_i, order, 1)

    def search(
        self, queries: np.ndarray, k: int = 10, reranker: Reranker | None = None, candidates: int | None = None
    ) -> SearchResult:
        """Top-k image rows for each query embedding.

        Args:
            queries: (q, dim) or (dim,) float; L2-normalised here (scores are cosine similarities).
            k: results per query.
            reranker: re-scores the index's top `candidates` (see `Reranker`); None = the index's
                order (for ivfpq, with exact re-scoring of k * refine candidates).
            candidates: how many candidates the reranker sees (default max(k, 100)).

        Returns:
            SearchResult with ids (q, k) and scores (q, k), best first; -1 / -inf pad when the
            store holds fewer than k rows.
        """
        if k < 1:
            raise VlctlError(f"search: k must be >= 1, got {k}")
        q = normalise(queries[None] if np.ndim(queries) == 1 else queries, "search queries")
        if q.shape[1] != self.dim:
            raise VlctlError(
                f"search: queries have dim {q.shape[1]}, the store at {self.path} has dim {self.dim} "
                f"(encoder {self.encoder_id})"
            )
        if len(self) == 0:
            return SearchResult(np.full((len(q), k), -1, np.int64), np.full((len(q), k), -np.inf, np.float32))
        if reranker is None and self.config.kind == "ivfpq" and self.config.refine > 1:
            reranker, candidates = exact_rerank, k * self.config.refine
        n_cand = min(k if reranker is None else max(k, candidates or 100), len(self))
        if self.index is None:
            scores, ids = self._exact_search(q, n_cand)
        else:
            scores, ids = self.index.search(q, n_cand)
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
        """Embed `texts` with `encoder` (must be the store's encoder) and search."""
        self.check_encoder(encoder.id)
        tokens = encoder.tokenize(list(texts))
        return self.search(encoder.encode_texts(tokens, normalize=True).detach().cpu().numpy(), k, **kw)

    def search_images(self, encoder: Any, images: Any, k: int = 10, **kw: Any) -> SearchResult:
        """Embed preprocessed images (n, 3, S, S) with `encoder` (the store's) and search."""
        self.check_encoder(encoder.id)
        return self.search(encoder.encode_images(images, normalize=True).detach().cpu().numpy(), k, **kw)

    def check_encoder(self, encoder_id: str) -> None:
        if encoder_id != self.encoder_id:
            raise VlctlError(
                f"{self.path / MANIFEST}: store was built with encoder {self.encoder_id!r}, not {encoder_id!r}; "
                "embeddings of different encoders are not comparable (embed the images again with this encoder)"
            )

    # -- writing ------------------------------------------------------------------------------
    def add(
        self,
        embeddings: np.ndarray | None,
        metadata: Sequence[dict] | None = None,
        encoder_id: str | None = None,
        texts: np.ndarray | None = None,
        text_metadata: Sequence[dict] | None = None,
        normalized: bool = False,
    ) -> Store:
        """Append image rows and/or text rows; returns the store as re-opened after the add (this
        object is stale).

        Args:
            embeddings: (n, dim) float image embeddings (None or n = 0: none); L2-normalised before storing.
            metadata: n JSON-serialisable dicts (path, captions, labels, ...); default {} per row.
            encoder_id: if given, must equal the store's encoder id.
            texts: (m, dim) float text embeddings (captions, prompts), or None.
            text_metadata: m dicts, each with "text" (the string) and, for a caption, "image": the
                row number (in this store, after the add) of the image it describes.
            normalized: the rows come L2-normalised from the encoder: stored as given (checked
                finite and non-zero), so the store holds exactly the encoder's output.

        Raises:
            VlctlError: another encoder, another dim, a metadata count that differs from the rows,
            non-serialisable metadata, a text row without "text", an ivfpq first add too small to
            train on.
        """
        if encoder_id is not None:
            self.check_encoder(encoder_id)
        x = check_rows(embeddings if embeddings is not None else np.zeros((0, self.dim), np.float32),
                        self.dim, self.path, self.encoder_id, "embeddings")
        n = len(x)
        metadata = [{} for _ in range(n)] if metadata is None else list(metadata)
        if len(metadata) != n:
            raise VlctlError(f"add: {n} embeddings but {len(metadata)} metadata rows")
        meta_text = metadata_text(metadata, "image")
        t = None if texts is None else check_rows(texts, self.dim, self.path, self.encoder_id, "text embeddings")
        m = 0 if t is None else len(t)
        text_metadata = [] if text_metadata is None else list(text_metadata)
        if len(text_metadata) != m:
            raise VlctlError(f"add: {m} text embeddings but {len(text_metadata)} text metadata rows")
        bad = next((j for j, tm in enumerate(text_metadata) if not isinstance(tm.get("text"), str)), None)
        if bad is not None:
            raise VlctlError(f"add: text metadata row {bad} has no \"text\" string")
        total = len(self) + n
        bad = next((j for j, tm in enumerate(text_metadata)
                    if "image" in tm and not (isinstance(tm["image"], int) and 0 <= tm["image"] < total)), None)
        if bad is not None:
            raise VlctlError(f"add: text metadata row {bad} names image {text_metadata[bad]['image']!r}, "
                             f"the store will hold image rows 0..{total - 1}")
        txt_meta_text = metadata_text(text_metadata, "text")
        if n == 0 and m == 0:
            return self

        generation = int(self.manifest["generation"]) + 1
        self._remove_unreferenced()  # a crashed add may have left files under the new names
        manifest = dict(self.manifest)
        index = self.index
        try:
            if n:
                shard_no = len(self.manifest["shards"])
                emb_name, meta_name = f"emb-{shard_no:05d}.npy", f"meta-{shard_no:05d}.jsonl"
                if index is None:  # first add: train where needed ("none" stays None)
                    index = new_index(self.config, self.dim, x)
                write_shard(self.path, emb_name, x, self.dim, index, "image", normalized)
                atomic_write_text(self.path / meta_name, meta_text)
                manifest["shards"] = [*self.manifest["shards"], shard_record(self.path, n, emb_name, meta_name)]
                manifest["count"] = total
                if index is not None:
                    index_name = f"index-{generation}.faiss"
                    write_index(index, self.path / index_name)
                    manifest["index"] = {
                        "config": config_to_dict(self.config),
                        "file": index_name,
                        "bytes": (self.path / index_name).stat().st_size,
                        "sha256": sha256_file(self.path / index_name),
                        "faiss_type": type(index).__name__,
                    }
            if m:
                old = self.manifest.get("texts", {"count": 0, "shards": []})
                shard_no = len(old["shards"])
                emb_name, meta_name = f"txt-{shard_no:05d}.npy", f"txtmeta-{shard_no:05d}.jsonl"
                write_shard(self.path, emb_name, t, self.dim, None, "text", normalized)
                atomic_write_text(self.path / meta_name, txt_meta_text)
                manifest["texts"] = {"count": old["count"] + m,
                                     "shards": [*old["shards"], shard_record(self.path, m, emb_name, meta_name)]}
        except BaseException:
            # The in-memory index may hold part of the rows: drop it, the file on disk is intact.
            self._index = None
            raise

        # the manifest, in one rename: from here on the new store is the store
        manifest["format"] = FORMAT
        manifest["generation"] = generation
        manifest["updated"] = _now()
        atomic_write_json(self.path / MANIFEST, manifest)
        new = Store(self.path, manifest)
        new._index = index
        new._remove_unreferenced()
        return new

    def _remove_unreferenced(self) -> None:
        """Delete shard/index files no manifest names (left by an interrupted add) and stale temps."""
        named = {self.manifest["index"]["file"]}
        for s in [*self.manifest["shards"], *self.manifest.get("texts", {}).get("shards", [])]:
            named |= {s["embeddings"], s["metadata"]}
        for f in self.path.iterdir():
            if (_SHARD_RE.match(f.name) and f.name not in named) or (
                f.name.startswith(".") and f.name.endswith(".tmp")
            ):
                f.unlink(missing_ok=True)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def create_store(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
    info: dict | None = None,
) -> Store:
    """Create an empty store directory (refuses a non-empty existing directory).

    `encoder_spec` (e.g. "open_clip:ViT-B-32/laion2b_s34b_b79k") is recorded so `vlctl search`
    can rebuild the encoder; the encoder id still decides compatibility. `info` is what the
    writer knows about the source (data id, preprocessing, ...), kept in the manifest.
    """
    path = Path(path)
    config = config or IndexConfig()
    if not isinstance(dim, int) or dim < 1:
        raise VlctlError(f"create_store: dim must be a positive integer, got {dim!r}")
    if not isinstance(encoder_id, str) or not encoder_id:
        raise VlctlError(f"create_store: encoder_id must be a non-empty string, got {encoder_id!r}")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise VlctlError(
            f"{path}: already exists and is not an empty directory; open it with open_store "
            "to add to it, or choose another path"
        )
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path / MANIFEST, _new_manifest(encoder_id, dim, config, encoder_spec, info))
    return Store(path, read_json(path / MANIFEST))


def _new_manifest(encoder_id: str, dim: int, config: IndexConfig, encoder_spec: str | None, info: dict | None) -> dict:
    return {
        "format": FORMAT,
        "encoder_id": encoder_id,
        "encoder_spec": encoder_spec,
        "dim": dim,
        "count": 0,
        "generation": 0,
        "shards": [],
        "texts": {"count": 0, "shards": []},
        "index": {"config": config_to_dict(config), "file": None, "bytes": 0, "sha256": None, "faiss_type": None},
        "info": dict(info or {}),
        "created": _now(),
        "updated": _now(),
    }


_REQUIRED = ("format", "encoder_id", "dim", "count", "generation", "shards", "index")
_OLD_CACHE = "meta.json"  # the per-key embedding cache of vlctl 0.1 (image_emb.npy, text_emb.npy)


def open_store(path: str | os.PathLike, encoder_id: str | None = None) -> Store:
    """Open and check a store directory.

    Checks (cheap, no full read): the manifest exists and is complete, every shard exists with the
    recorded size and shape, the counts add up. `Store.verify()` also checks the sha256 hashes.

    Raises:
        VlctlError naming the file: a missing directory or manifest, a corrupt manifest, a missing
        or truncated shard, a store built with another encoder than `encoder_id`, an embedding
        cache of vlctl 0.1 (with how to convert it).
    """
    store = Store(path)
    if encoder_id is not None:
        store.check_encoder(encoder_id)
    return store


def _read_manifest(path: Path) -> dict:
    """The checked manifest of the store at `path` (see `open_store` for what is checked)."""
    if not path.is_dir():
        raise VlctlError(f"{path}: store directory not found")
    if not (path / MANIFEST).is_file():
        if (path / _OLD_CACHE).is_file() and (path / "image_emb.npy").exists() | (path / "text_emb.npy").exists():
            raise VlctlError(
                f"{path}: an embedding cache of vlctl 0.1, not a store; convert it with "
                f"`python -m vlctl.embeddings.cache convert {path} NEW_STORE` (or embed the data again with `vlctl embed`)"
            )
        raise VlctlError(
            f"{path / MANIFEST}: store manifest not found (not a vlctl store, or its manifest "
            "was deleted; rebuild it with `vlctl embed` or `vlctl index`)"
        )
    manifest = read_json(path / MANIFEST, "store manifest")
    if not isinstance(manifest, dict) or any(k not in manifest for k in _REQUIRED):
        missing = [k for k in _REQUIRED if not isinstance(manifest, dict) or k not in manifest]
        raise VlctlError(f"{path / MANIFEST}: corrupt store manifest, missing field(s) {missing}")
    if manifest["format"] != FORMAT and manifest["format"] not in OLD_FORMATS:
        raise VlctlError(f"{path / MANIFEST}: format {manifest['format']!r}, this vlctl reads {FORMAT!r}")
    if sum(s["rows"] for s in manifest["shards"]) != manifest["count"]:
        raise VlctlError(f"{path / MANIFEST}: shard rows do not add up to count={manifest['count']}")
    texts = manifest.get("texts", {"count": 0, "shards": []})
    if sum(s["rows"] for s in texts["shards"]) != texts["count"]:
        raise VlctlError(f"{path / MANIFEST}: text shard rows do not add up to texts.count={texts['count']}")
    return manifest


def open_or_create_store(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
    info: dict | None = None,
) -> Store:
    """Open the store at `path` for adding (same encoder required), or create it if absent/empty."""
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).is_file():
        store = open_store(path, encoder_id=encoder_id)
        if config is not None and config != store.config:
            raise VlctlError(
                f"{path / MANIFEST}: store uses index {config_to_dict(store.config)}, "
                f"not the requested {config_to_dict(config)}"
            )
        return store
    return create_store(path, encoder_id, dim, config, encoder_spec=encoder_spec, info=info)


# The names of vlctl 0.1, where a store with a FAISS index was a "gallery".
Gallery = Store
create_gallery = create_store
open_gallery = open_store
open_or_create_gallery = open_or_create_store

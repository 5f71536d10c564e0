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
names (left by a crash) are deleted by the next successful add.

Writers: one at a time. Creating a store and every add hold the store's lock (`vlctl.io.locked`,
`.NAME.lock` beside the directory); an add re-reads the manifest under the lock, so rows another
writer added since this one opened the store are kept, its own going after them. `vlctl index` and
`vlctl embed` hold the lock from opening the store to the commit, so a second run waits (saying
so) and then skips the images the first one added. Readers take no lock; a reader whose index file
was replaced by an add re-opens the store once.

Search is maximum inner product over the normalised embeddings (= cosine similarity). Index kinds
(`IndexConfig.kind`): "none" (no index file; exact search in numpy, the default of `vlctl embed`),
"flat" (exact FAISS inner product, the default of `vlctl index`), "ivfpq" (inverted lists + product
quantisation, trained on the first add; its top k * refine candidates are re-scored exactly from
the stored embeddings), "hnsw" (graph over the full vectors). A `Reranker` re-scores the top
candidates of any kind: TEVI rerank and ControlEmbed attribute queries plug in there.

Checks on open are cheap: sizes, shapes and counts against the manifest, and each file's fast hash
(`vlctl.io.fast_hash_file`: blake2b of the whole file up to 1 MiB, of 64 sampled blocks above), so
a shard edited or overwritten in place is refused; `Store.verify()` (`vlctl verify STORE`) also
recomputes every sha256. A directory written by an older vlctl as a gallery
("vlctl.gallery/1") opens as a store without text rows.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.config import config_from_dict, config_to_dict
from vlctl.embeddings.manifest import FORMAT, is_empty, new_manifest, now, read_manifest
from vlctl.embeddings.results import Reranker, SearchResult
from vlctl.embeddings.search import (
    IndexConfig,
    faiss_module,
    new_index,
    normalise,
    refine_exact,
    set_search_params,
    top_positions,
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
from vlctl.embeddings.tuning import tune_store
from vlctl.fsops import VlctlError, locked, output_policy
from vlctl.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_content,
    check_file,
    fast_hash_file,
    read_json,
    sha256_file,
)

__all__ = ["Store", "create_store", "open_or_create_store", "open_store"]

_NAMES = r"(emb|meta|txt|txtmeta)-\d{5}\.(npy|jsonl)|index-\d+\.faiss"
_SHARD_RE = re.compile(rf"^({_NAMES})$")
_TEMP_RE = re.compile(rf"^\.({_NAMES}|{MANIFEST.replace('.', '[.]')})(\.[a-z0-9_]{{8}})?\.tmp$")  # ours only


def write_index(index, path: Path) -> None:
    """The FAISS index, serialised and written atomically (fsync, rename, a full disk as an error)."""
    atomic_write_bytes(path, faiss_module().serialize_index(index).tobytes())


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
            manifest = read_manifest(path)
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
            try:
                index = self._read_index(file)
            except (VlctlError, OSError):
                if read_manifest(self.path)["generation"] == self.manifest["generation"]:
                    raise
                # An add committed since this store was opened and removed its index file (maybe
                # while it was being read): re-open the store as it is now.
                self.__init__(self.path)
                return self.index
            if index.ntotal != len(self) or index.d != self.dim:
                raise VlctlError(
                    f"{file}: index holds {index.ntotal} x {index.d}, manifest says {len(self)} x {self.dim}"
                )
            set_search_params(index, self.config, self.tuned)
            self._index = index
        return self._index

    @property
    def tuned(self) -> dict | None:
        """The search parameters the last add picked (`vlctl.embeddings.tuning`): {"nprobe", "refine",
        "recall", ...}; None for an untuned store (another kind, target_recall 0, or an older vlctl)."""
        return self.manifest["index"].get("tuned")

    def _read_index(self, file: Path):
        record = self.manifest["index"]
        check_file(file, record["bytes"], self.path / MANIFEST, "FAISS index")
        check_content(file, record.get("fast"), record.get("sha256"), self.path / MANIFEST)
        try:
            return faiss_module().read_index(str(file))
        except RuntimeError as e:
            raise VlctlError(f"{file}: cannot read FAISS index ({str(e).splitlines()[0]})") from None

    def verify(self) -> dict:
        """Recompute every file's sha256 and compare with the manifest (reads everything); check
        every metadata row is there. Returns {"files": checked, "bytes": read}."""
        files, size = 0, 0
        for table in (self.images_table, self.texts_table):
            f, b = table.verify()
            files, size = files + f, size + b
        idx = self.manifest["index"]
        if idx["file"] is not None:
            file = self.path / idx["file"]
            check_file(file, idx["bytes"], self.path / MANIFEST, "FAISS index")
            if sha256_file(file) != idx["sha256"]:
                raise VlctlError(f"{file}: sha256 differs from {self.path / MANIFEST}")
            files, size = files + 1, size + file.stat().st_size
        return {"files": files, "bytes": size}

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
                top = top_positions(best_s, n)  # best first: the last pass leaves them sorted
                best_s, best_i = np.take_along_axis(best_s, top, 1), np.take_along_axis(best_i, top, 1)
        return best_s.astype(np.float32), best_i

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
        refine = int(self.tuned["refine"]) if self.tuned else self.config.refine
        refine = refine if reranker is None and self.config.kind == "ivfpq" else 1
        n_cand = min(k * refine if reranker is None else max(k, candidates or 100), len(self))
        if self.index is None:
            scores, ids = self._exact_search(q, n_cand)
        else:
            scores, ids = self.index.search(q, n_cand)
        if refine > 1:  # ivfpq: the k best of the k * refine candidates by their exact scores
            scores, ids = refine_exact(q, ids, self.images_table._arrays, k)
        elif reranker is not None:
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
        scores = np.where(ids >= 0, scores, np.float32(-np.inf)).astype(np.float32, copy=False)
        return SearchResult(ids.astype(np.int64, copy=False), scores)

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

        Under the store's lock; when another writer has added since this store was opened, the
        add goes after its rows (row numbers in `text_metadata` are the caller's: hold
        `vlctl.io.locked(store.path)` from opening to adding to be sure of them).

        Raises:
            VlctlError: another encoder, another dim, a metadata count that differs from the rows,
            non-serialisable metadata, a text row without "text", an ivfpq first add too small to
            train on.
        """
        with locked(self.path):
            disk = read_manifest(self.path)
            store = self if disk["generation"] == self.manifest["generation"] else Store(self.path, disk)
            return store._add(embeddings, metadata, encoder_id, texts, text_metadata, normalized)

    def _add(self, embeddings, metadata, encoder_id, texts, text_metadata, normalized) -> Store:
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
                tuned = tune_store(self.config, index, [*self.images_table._arrays, np.load(self.path / emb_name, mmap_mode="r")])
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
                        "fast": fast_hash_file(self.path / index_name),
                        "faiss_type": type(index).__name__,
                        **({"tuned": tuned} if tuned else {}),
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
        manifest["updated"] = now()
        atomic_write_json(self.path / MANIFEST, manifest)
        new = Store(self.path, manifest)
        new._index = index
        if index is not None:  # a fresh index has FAISS's defaults (nprobe 1), not the config's
            set_search_params(index, new.config, new.tuned)
        new._remove_unreferenced()
        return new

    def _remove_unreferenced(self) -> None:
        """Delete shard/index files no manifest names (left by an interrupted add) and stale temps."""
        named = {self.manifest["index"]["file"]}
        for s in [*self.manifest["shards"], *self.manifest.get("texts", {}).get("shards", [])]:
            named |= {s["embeddings"], s["metadata"]}
        for f in self.path.iterdir():
            if (_SHARD_RE.match(f.name) and f.name not in named) or _TEMP_RE.match(f.name):
                f.unlink(missing_ok=True)


def create_store(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
    info: dict | None = None,
) -> Store:
    """Create an empty store directory (refuses a non-empty existing directory, unless the output
    policy says --overwrite: then the store's files go beside the others, which are kept).

    `encoder_spec` (e.g. "open_clip:ViT-B-32/laion2b_s34b_b79k") is recorded, local paths made
    absolute, so `vlctl search` can rebuild the encoder; the encoder id still decides
    compatibility. `info` is what the writer knows about the source (data id, preprocessing, ...),
    kept in the manifest.
    """
    path = Path(path)
    config = config or IndexConfig()
    if not isinstance(dim, int) or dim < 1:
        raise VlctlError(f"create_store: dim must be a positive integer, got {dim!r}")
    if not isinstance(encoder_id, str) or not encoder_id:
        raise VlctlError(f"create_store: encoder_id must be a non-empty string, got {encoder_id!r}")
    with locked(path):
        among = path.is_dir() and output_policy().overwrite and not (path / MANIFEST).exists()
        if path.exists() and (not path.is_dir() or any(path.iterdir())) and not among:
            raise VlctlError(
                f"{path}: already exists and is not an empty directory; open it with open_store "
                "to add to it, or choose another path (--overwrite: create the store among its files)"
            )
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path / MANIFEST, new_manifest(encoder_id, dim, config, encoder_spec, info))
        return Store(path, read_json(path / MANIFEST))


def open_store(path: str | os.PathLike, encoder_id: str | None = None) -> Store:
    """Open and check a store directory.

    Checks (cheap, no full read): the manifest exists and is complete, every shard exists with the
    recorded size, shape and fast hash, the counts add up. `Store.verify()` also checks the sha256
    hashes.

    Raises:
        VlctlError naming the file: a missing directory or manifest, a corrupt manifest, a missing,
        truncated or changed shard, a store built with another encoder than `encoder_id`, an
        embedding cache of vlctl 0.1 (with how to convert it).
    """
    store = Store(path)
    if encoder_id is not None:
        store.check_encoder(encoder_id)
    return store


def open_or_create_store(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
    info: dict | None = None,
) -> Store:
    """Open the store at `path` for adding (same encoder required), or create it if absent/empty.

    A store that holds nothing yet (its first add failed, e.g. on a bad ivfpq config) fixes
    nothing: it is re-created with this encoder and config."""
    path = Path(path)
    with locked(path):
        if path.is_dir() and (path / MANIFEST).is_file():
            store = open_store(path)
            if is_empty(store.manifest):
                atomic_write_json(path / MANIFEST, new_manifest(encoder_id, dim, config or store.config, encoder_spec,
                                                                info))
                return open_store(path)
            store.check_encoder(encoder_id)
            if config is not None and config != store.config:
                raise VlctlError(
                    f"{path / MANIFEST}: store uses index {config_to_dict(store.config)}, "
                    f"not the requested {config_to_dict(config)}"
                )
            return store
        return create_store(path, encoder_id, dim, config, encoder_spec=encoder_spec, info=info)


def discard_if_empty(path: str | os.PathLike) -> None:
    """Remove the store at `path` if nothing was ever added to it (its manifest; the directory too
    when that leaves it empty): what a first add that failed leaves behind."""
    path = Path(path)
    with locked(path), contextlib.suppress(VlctlError, OSError):
        if is_empty(read_manifest(path)):
            (path / MANIFEST).unlink()
            path.rmdir()


# The names of vlctl 0.1, where a store with a FAISS index was a "gallery".
Gallery = Store
create_gallery = create_store
open_gallery = open_store
open_or_create_gallery = open_or_create_store

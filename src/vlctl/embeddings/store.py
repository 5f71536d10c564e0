"""The embeddings store: one directory holding a collection's embeddings, metadata and optional
FAISS index. `vlctl embed` and `vlctl index` write it; every method, `search` and `cluster` read it.

    STORE/
      manifest.json                     written last on every change: format, encoder, dim, dtype,
                                        the image and text shards, index config and parts,
                                        generation, and per file its rows, bytes, sha256
      img_emb/img_emb_00000.npy ...     image rows: (rows, dim) float32 (or float16, `dtype`),
                                        L2-normalised; one shard per `add`, never rewritten;
                                        memory-mapped, float32 when handed out
      metadata/metadata_00000.parquet   the image rows' fields (path, captions, labels, ...)
      text_emb/text_emb_00000.npy ...   text rows (captions, prompts), the same way; optional
      text_metadata/metadata_00000.parquet   per text row {"text", "image": the image row it describes}
      index/trained.faiss, index/part_00000.faiss ...   ivfpq / hnsw: one index part per add, or
                                        per run for one committing in batches (`parts.merge_parts`)

The image table is clip-retrieval's layout (img_emb/, metadata/), so embedding-reader and
autofaiss read a store as it is; and a clip-retrieval folder opens here in place, read-only
(`vlctl.embeddings.foreign`). A store of an older vlctl (emb-*.npy, meta-*.jsonl) is refused with
the command that converts it.

Images and texts are two tables with their own row counts: a caption's text row names its image
row (`Store.pairs()`); class prompts are text rows alone. Row i of the store means image row i.

Atomicity: an `add` writes its new shard files and its index part under fresh names, then replaces
manifest.json in one rename. Until that rename the previous manifest names only the previous
files, so a crash at any point leaves the previous store intact; files that no manifest names
(left by a crash) are deleted by the next successful add. An add writes, reads and hashes only its
own rows' files (and, with target_recall, its own rows for the tuning's exact answers): its cost is
bound by the rows added, not by the store.

Writers: one at a time, under the store's lock (`vlctl.io.locked`, `.NAME.lock` beside it); an
add re-reads the manifest under the lock, so another writer's rows are kept, its own going after
them. `vlctl index` / `vlctl embed` hold the lock from opening the store to the commit, so a second
run waits, then skips the images the first added. Readers take no lock; a reader whose index part
an add removed re-opens the store once.

Search is maximum inner product over the normalised rows (cosine); the index kinds and their
files: `vlctl.embeddings.search`, `vlctl.embeddings.parts`. A `Reranker` re-scores the top
candidates of any kind: TEVI rerank and ControlEmbed attribute queries plug in there.

Checks on open are cheap: sizes, shapes and counts against the manifest, and each file's fast hash
(`vlctl.io.fast_hash_file`), so a shard edited in place is refused; `Store.verify()` (`vlctl verify
STORE`) also recomputes every sha256.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.config import config_from_dict, config_to_dict
from vlctl.embeddings.foreign import FOREIGN_FORMAT, UNKNOWN, is_foreign, remember_encoder
from vlctl.embeddings.manifest import FORMAT, is_empty, new_manifest, now, read_manifest
from vlctl.embeddings.parts import (
    INDEX_DIR,
    add_part,
    combine,
    has_index,
    merge_parts,
    new_part,
    read_index,
    set_search_params,
)
from vlctl.embeddings.results import Reranker, SearchResult, rerank_candidates
from vlctl.embeddings.search import IndexConfig, exact_search, normalise, refine_exact
from vlctl.embeddings.table import (
    ADD_CHUNK,
    LAYOUT,
    MANIFEST,
    Table,
    check_rows,
    check_text_metadata,
    metadata_table,
    shard_names,
    shard_record,
    write_metadata,
    write_shard,
)
from vlctl.fsops import VlctlError, fsync_dir, locked, output_policy
from vlctl.io import atomic_write_json, read_json, sha256_file

__all__ = ["Store", "create_store", "open_or_create_store", "open_store"]

# The directories of an add's files, and the temporaries of vlctl's atomic writes in them.
_DIRS = sorted({name.split("/")[0] for pair in LAYOUT.values() for name in pair} | {INDEX_DIR})
_NAMES = r"(img_emb|text_emb|metadata)_\d{5}\.(npy|parquet)|part_\d{5}(_\d{5})?\.faiss|trained\.faiss"
_OURS_RE = re.compile(rf"^({_NAMES})$|^\.({_NAMES})(\.[a-z0-9_]{{8}})?\.tmp$")
_MANIFEST_TEMP_RE = re.compile(r"^\.manifest\.json(\.[a-z0-9_]{8})?\.tmp$")


class Store:
    """An opened store (module docstring; `create_store` / `open_store` make one): `len(store)` and
    row ids count image rows; `store.texts_table` holds the text rows."""

    hit = False  # set by vlctl.embeddings.cache.embed when it found the entry on disk

    def __init__(self, path: str | os.PathLike, manifest: dict | None = None):
        """`Store(path)` opens and checks the store at `path` (as `open_store` does); `manifest`
        is for the writers, which hold the manifest they just wrote."""
        path = Path(path)
        self.path, self.manifest = path, read_manifest(path) if manifest is None else manifest
        manifest = self.manifest
        self.config = config_from_dict(IndexConfig, manifest["index"]["config"], source=str(path / MANIFEST))
        source = path / "img_emb" if self.read_only else path / MANIFEST
        dtype = manifest.get("dtype", "float32")
        self.images_table = Table(path, manifest["shards"], self.dim, "embedding", dtype, source)
        self.texts_table = Table(path, manifest.get("texts", {}).get("shards", []), self.dim, "text embedding",
                                 dtype, source)
        self._index = None
        self._parts: list = []  # the index parts the combined index reads (kept alive with it)

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
    def read_only(self) -> bool:
        """A clip-retrieval folder opened in place (`vlctl.embeddings.foreign`): never written."""
        return self.manifest["format"] == FOREIGN_FORMAT

    @property
    def encoder_known(self) -> bool:
        """False for a clip-retrieval folder whose encoder nobody named (see `adopt_encoder`)."""
        return not self.encoder_id.startswith(UNKNOWN)

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
        """Metadata dicts of image rows `ids` (all rows if None); only those rows are read."""
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
        # a clip-retrieval folder's text rows are its images' captions
        return [m["text"] if "text" in m else m.get("caption") for m in self._text_metadata]

    @functools.cached_property
    def _text_metadata(self) -> list[dict]:
        # Parsed once per opened store (an add returns a new Store): texts, image_of_text and
        # pairs all read it, and a million captions take seconds to parse.
        return self.texts_table.metadata()

    def image_of_text(self) -> np.ndarray:
        """(n_texts,) int64: the image row each text row describes: its "image" field, or, where no
        text row has one and the counts are equal, row by row (a captioned generated set)."""
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
        """The FAISS index over every index part (read from disk on first use), with the config's
        search parameters; None for the exact kinds and for an empty store."""
        if self._index is None:
            record = self.manifest["index"]
            if not record.get("parts"):
                return None
            try:
                trained = self._read_index(record.get("trained"))
                parts = [self._read_index(p) for p in record["parts"]]
            except (VlctlError, OSError):
                if read_manifest(self.path)["generation"] == self.manifest["generation"]:
                    raise
                # An add committed since this store was opened and removed an index file (maybe
                # while it was being read): re-open the store as it is now.
                self.__init__(self.path)
                return self.index
            index, keep = combine(parts, self.config, trained)
            if index.ntotal != len(self) or index.d != self.dim:
                raise VlctlError(f"{self.path / INDEX_DIR}: the index parts hold {index.ntotal} x {index.d}, "
                                 f"{self.path / MANIFEST} says {len(self)} x {self.dim}")
            set_search_params(index, parts, self.config, self.tuned)
            self._index, self._parts = index, [parts, keep, trained]
        return self._index

    @property
    def tuned(self) -> dict | None:
        """The search parameters the last add picked (`vlctl.embeddings.tuning`): {"nprobe", "refine",
        "recall", ...}; None for an untuned store (another kind, target_recall 0, or an older vlctl)."""
        return self.manifest["index"].get("tuned")

    def verify(self) -> dict:
        """Recompute every file's sha256 and compare with the manifest (reads everything); check
        every metadata row is there. Returns {"files": checked, "bytes": read}."""
        files, size = 0, 0
        for table in (self.images_table, self.texts_table):
            f, b = table.verify()
            files, size = files + f, size + b
        idx = self.manifest["index"]
        for record in [idx.get("trained"), *idx.get("parts", [])]:
            if record is not None:
                file = self.path / record["file"]
                self._read_index(record)  # there, its size, readable
                if sha256_file(file) != record["sha256"]:
                    raise VlctlError(f"{file}: sha256 differs from {self.path / MANIFEST}")
                files, size = files + 1, size + file.stat().st_size
        return {"files": files, "bytes": size}

    # -- search -------------------------------------------------------------------------------
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
            scores, ids = exact_search(q, self.images_table.chunks(ADD_CHUNK), n_cand)
        else:
            scores, ids = self.index.search(q, n_cand)
        if refine > 1:  # ivfpq: the k best of the k * refine candidates by their exact scores
            scores, ids = refine_exact(q, ids, self.images_table._arrays, k)
        elif reranker is not None:
            ids, scores = rerank_candidates(q, ids, reranker, self)
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
        if not self.encoder_known:
            raise VlctlError(f"{self.path}: a clip-retrieval folder that names no encoder; pass --encoder SPEC (the "
                             "encoder that made its embeddings; it is recorded beside the folder)")
        if encoder_id != self.encoder_id:
            raise VlctlError(
                f"{self.path / MANIFEST}: store was built with encoder {self.encoder_id!r}, not {encoder_id!r}; "
                "embeddings of different encoders are not comparable (embed the images again with this encoder)"
            )

    def adopt_encoder(self, encoder_id: str, encoder_spec: str | None) -> None:
        """For a clip-retrieval folder that names no encoder: take this one (the user's word) and
        record it in the sidecar beside the folder (`vlctl.embeddings.foreign.remember_encoder`)."""
        if self.read_only and not self.encoder_known:
            remember_encoder(self.path, encoder_id, encoder_spec)
            self.manifest = {**self.manifest, "encoder_id": encoder_id, "encoder_spec": encoder_spec}

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
        if self.read_only:
            raise VlctlError(f"{self.path}: a clip-retrieval folder is read in place and never written; to add rows, "
                             f"make it a vlctl store first: `vlctl store convert {self.path} NEW_STORE`")
        with locked(self.path):
            return self._latest()._add(embeddings, metadata, encoder_id, texts, text_metadata, normalized)

    def _latest(self) -> Store:
        """This store, or the store as another writer left it (the caller holds the lock)."""
        disk = read_manifest(self.path)
        return self if disk["generation"] == self.manifest["generation"] else Store(self.path, disk)

    def _add(self, embeddings, metadata, encoder_id, texts, text_metadata, normalized) -> Store:
        if encoder_id is not None:
            self.check_encoder(encoder_id)
        x = check_rows(embeddings if embeddings is not None else np.zeros((0, self.dim), np.float32),
                        self.dim, self.path, self.encoder_id, "embeddings")
        n = len(x)
        metadata = [{} for _ in range(n)] if metadata is None else list(metadata)
        if len(metadata) != n:
            raise VlctlError(f"add: {n} embeddings but {len(metadata)} metadata rows")
        meta_table, meta_encoding = metadata_table(metadata, "image")
        t = None if texts is None else check_rows(texts, self.dim, self.path, self.encoder_id, "text embeddings")
        m = 0 if t is None else len(t)
        total = len(self) + n
        text_metadata = check_text_metadata(text_metadata, m, total)
        txt_meta_table, txt_meta_encoding = metadata_table(text_metadata, "text")
        if n == 0 and m == 0:
            return self

        self._remove_unreferenced()  # a crashed add may have left files under the new names
        manifest = dict(self.manifest)
        index = self._index  # not read here: an add reads none of the earlier index parts
        dtype = self.config.dtype
        try:
            if n:
                shard_no = len(self.manifest["shards"])
                emb_name, meta_name = shard_names("image", shard_no)
                record = self.manifest["index"]
                part, trained = None, self._parts[2] if self._parts else None
                if has_index(self.config):
                    trained = trained if trained is not None else self._read_index(record.get("trained"))
                    part, trained = new_part(self.config, self.dim, x, trained)
                write_shard(self.path, emb_name, x, self.dim, part, "image", normalized, dtype, len(self))
                write_metadata(self.path, meta_name, meta_table)
                manifest["shards"] = [*self.manifest["shards"],
                                      shard_record(self.path, n, emb_name, meta_name, meta_encoding)]
                manifest["count"] = total
                if part is not None:
                    arrays = [*self.images_table._arrays, np.load(self.path / emb_name, mmap_mode="r")]
                    tuned = self.config.kind == "ivfpq" and self.config.target_recall > 0
                    manifest["index"] = add_part(self.path, self.manifest["index"], self.config, part, trained,
                                                 shard_no, arrays, self._loaded_parts() if tuned else [])
                    index = None  # the new store opens its parts on first use
            if m:
                old = self.manifest.get("texts", {"count": 0, "shards": []})
                shard_no = len(old["shards"])
                emb_name, meta_name = shard_names("text", shard_no)
                write_shard(self.path, emb_name, t, self.dim, None, "text", normalized, dtype)
                write_metadata(self.path, meta_name, txt_meta_table)
                manifest["texts"] = {"count": old["count"] + m, "shards": [
                    *old["shards"], shard_record(self.path, m, emb_name, meta_name, txt_meta_encoding)]}
        except BaseException:
            # The in-memory index may hold part of the rows: drop it, the files on disk are intact.
            self._index, self._parts = None, []
            raise

        new = self._commit(manifest)
        if index is not None:  # an add of text rows only: the image index is unchanged
            new._index, new._parts = index, self._parts
        return new

    def _commit(self, manifest: dict) -> Store:
        """The store after `manifest`, whose new files are written, becomes this store's: the renames
        into the directories made durable first, then the manifest in one rename."""
        for d in [d for d in _DIRS if (self.path / d).is_dir()] + ["."]:
            fsync_dir(self.path / d)
        manifest = {**manifest, "format": FORMAT, "generation": int(self.manifest["generation"]) + 1, "updated": now()}
        atomic_write_json(self.path / MANIFEST, manifest)
        new = Store(self.path, manifest)
        new._remove_unreferenced()
        return new

    def merge_index_parts(self, first: int) -> Store:
        """The store with its index parts from the `first`-th on (one run's commits) merged into one
        file (`vlctl.embeddings.parts.merge_parts`); else the store, rid of what a killed merge left."""
        with locked(self.path):
            store = self._latest()
            record = store.manifest["index"]
            if len(record.get("parts", [])) - first < 2:
                store._remove_unreferenced()
                return store
            merged = merge_parts(store.path, record, store.config, first, store._read_index(record.get("trained")),
                                 store._read_index, store.images_table._arrays)
            return store._commit({**store.manifest, "index": merged})

    def _read_index(self, record: dict | None):
        """The index file a manifest record names, checked (`vlctl.embeddings.parts.read_index`); None for None."""
        return None if record is None else read_index(self.path, record, self.path / MANIFEST)

    def _loaded_parts(self) -> list:
        """The index parts of this store, read (before an add appends its own)."""
        if self.index is None:
            return []
        return self._parts[0]

    def _remove_unreferenced(self) -> None:
        """Delete shard/index files no manifest names (left by an interrupted add) and stale temps
        of vlctl's writes; other files (the user's, beside a store made with --overwrite) stay."""
        named = {p["file"] for p in [self.manifest["index"].get("trained"), *self.manifest["index"].get("parts", [])]
                 if p is not None}
        for s in [*self.manifest["shards"], *self.manifest.get("texts", {}).get("shards", [])]:
            named |= {s["embeddings"], s["metadata"]}
        for f in self.path.iterdir():
            if _MANIFEST_TEMP_RE.match(f.name):
                f.unlink(missing_ok=True)
        for d in _DIRS:
            if (self.path / d).is_dir():
                for f in (self.path / d).iterdir():
                    if _OURS_RE.match(f.name) and f"{d}/{f.name}" not in named:
                        f.unlink(missing_ok=True)


def create_store(
    path: str | os.PathLike,
    encoder_id: str,
    dim: int,
    config: IndexConfig | None = None,
    encoder_spec: str | None = None,
    info: dict | None = None,
    dtype: str | None = None,
) -> Store:
    """Create an empty store directory (refuses a non-empty existing directory, unless the output
    policy says --overwrite: then the store's files go beside the others, which are kept).

    `encoder_spec` (e.g. "open_clip:ViT-B-32/laion2b_s34b_b79k") is recorded, local paths made
    absolute, so `vlctl search` can rebuild the encoder; the encoder id still decides
    compatibility. `info` is what the writer knows about the source (data id, preprocessing, ...),
    kept in the manifest. `dtype` ("float32" or "float16"), if given, overrides `config.dtype`.
    """
    path = Path(path)
    config = config or IndexConfig()
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype)
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
    """Open and check a store directory, cheaply (no full read): the manifest there and complete,
    every shard there with its recorded size, shape and fast hash, the counts adding up.
    `Store.verify()` also checks the sha256 hashes.

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
    if is_foreign(path):
        Store(path).add(None)  # refused: a clip-retrieval folder is read, never written
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
            for d in _DIRS:  # what an interrupted first add created, if it is still empty
                with contextlib.suppress(OSError):
                    (path / d).rmdir()
            path.rmdir()


# The names of vlctl 0.1, where a store with a FAISS index was a "gallery".
Gallery = Store
create_gallery = create_store
open_gallery = open_store
open_or_create_gallery = open_or_create_store

"""Embeddings of arrays, computed once per (encoder, data, preprocessing) and kept as a store.

Embedding a dataset is the expensive step of every evaluation and method fit, so the recipes and
`vlctl fit controlembed` embed a generated set once per key:

    root/<key>/        a store (vlctl.embeddings.store): image rows, text rows, manifest.json
                       whose "info" records the data id, preprocess id, key, counts and the
                       sha256 of the texts

The store is built under a temporary name and renamed into place (`atomic_dir`), so an
interrupted run leaves no half-written entry that a later run would mistake for a hit; the next
`embed` into the root removes the temporary entries of killed runs. Computing an entry holds its
lock (`.KEY.lock` in the root): a second process asking for the same key waits, then finds the hit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.embeddings.extract import check_image_array, embed_image_array, embed_text_list
from vlctl.embeddings.manifest import FORMAT
from vlctl.embeddings.search import IndexConfig
from vlctl.embeddings.store import Store, create_store, open_store
from vlctl.embeddings.table import MANIFEST
from vlctl.fsops import VlctlError, locked
from vlctl.io import ContentChangedError, atomic_dir, clean_dead_temps, open_memmap, read_json, sha256_json

__all__ = ["EmbeddingCache", "cache_key", "convert_cache", "embed", "open_cache"]

EmbeddingCache = Store  # a cache entry is a store whose info names its key
_TMP_TEXTS, _TMP_IMAGES = "computing-texts.npy", "computing-images.npy"
_INFO = ("data_id", "preprocess_id", "key", "n_images", "n_texts", "texts_sha256")


def cache_key(encoder_id: str, data_id: str, preprocess_id: str) -> str:
    """Cache directory name: the first 16 hex digits of sha256 of the three ids.

    The ids are hashed as a JSON list, so ("a|b", "c") and ("a", "b|c") get different keys.
    """
    for name, v in (("encoder_id", encoder_id), ("data_id", data_id), ("preprocess_id", preprocess_id)):
        if not isinstance(v, str) or not v:
            raise VlctlError(f"cache_key: {name} must be a non-empty string, got {v!r}")
    return sha256_json([encoder_id, data_id, preprocess_id])[:16]


def open_cache(path: str | os.PathLike, encoder_id: str | None = None) -> Store:
    """Open a cache entry written by `embed` (a store whose manifest info names its key).

    Raises:
        VlctlError naming the file: a missing or corrupt store, a store that is no cache entry,
        or one made with another encoder than `encoder_id`.
    """
    store = open_store(path, encoder_id=encoder_id)
    missing = [k for k in _INFO if k not in store.info]
    if missing:
        raise VlctlError(f"{store.path / 'manifest.json'}: not an embedding cache entry (info lacks {missing})")
    mismatch = f"{store.path}: the stored texts do not match info.texts_sha256 in manifest.json"
    try:
        texts = store.texts
    except ContentChangedError as e:
        raise VlctlError(f"{mismatch} ({e})") from None
    if texts is not None and sha256_json(texts) != store.info["texts_sha256"]:
        raise VlctlError(mismatch)
    return store


def embed(
    encoder: Any,
    *,
    images: Any = None,
    texts: Sequence[str] | None = None,
    data_id: str,
    root: str | os.PathLike,
    preprocess_id: str = "default",
    batch_size: int = 256,
    progress: bool = True,
) -> Store:
    """Embed images and/or texts with `encoder`, or return the cached embeddings.

    Args:
        encoder: a `vlctl.encoders.base.Encoder`. Images go through `encoder.preprocess_batch`
            if it has one, else `encoder.preprocess` per image, then `encode_images`; texts
            through `tokenize` and `encode_texts`. Both with normalize=True, so stored
            embeddings are L2-normalised. The encoder is used as is (call .eval() beforehand if
            it has dropout).
        images: array-like (N, H, W, 3) uint8 with `.shape` and slicing, e.g. a np.memmap. It is
            read `batch_size` rows at a time and never loaded whole.
        texts: list of str; one text row per text, in order (duplicates are kept).
        data_id: identifies the data exactly (dataset, split, version). The cache key is built
            from the ids only, never from the data, so two different datasets must not share a
            data_id.
        root: directory holding the caches; the entry goes to root/<cache_key(...)>.
        preprocess_id: identifies the preprocessing, for variants of the same encoder.
        batch_size: images/texts per encoder call.
        progress: show tqdm progress bars.

    Returns:
        The store; `hit` is True if it already existed and nothing was computed. If the existing
        entry lacks a requested modality (e.g. it holds texts only and images are now given),
        the missing part is computed, the existing part reused, and the entry rewritten.

    Raises:
        VlctlError: nothing to embed, an empty text list, malformed images, an entry at the key
        that belongs to another encoder or holds different data (other texts, another number of
        images), or a corrupt entry; the tokenizer's own VlctlError for an over-long text.
    """
    if images is None and texts is None:
        raise VlctlError("embed: give images, texts or both")
    if batch_size < 1:
        raise VlctlError(f"embed: batch_size must be >= 1, got {batch_size}")
    if texts is not None:
        if isinstance(texts, str):
            raise VlctlError("texts: expected a list of strings, got a single string")
        texts = list(texts)
        if not texts:
            raise VlctlError("texts: empty list; give at least one text (or texts=None)")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise VlctlError(f"texts[{bad}]: expected str, got {type(texts[bad]).__name__}")
    if images is not None and not hasattr(images, "shape"):
        images = np.asarray(images)  # a list of arrays; arrays and memmaps stay as they are
    n_images = check_image_array(images) if images is not None else None

    key = cache_key(encoder.id, data_id, preprocess_id)
    final = Path(root) / key
    texts_sha = sha256_json(texts) if texts is not None else None
    clean_dead_temps(root)  # entries half-built by killed runs

    hit = _hit(final, encoder, n_images, texts, texts_sha, data_id)
    if hit is not None:
        return hit
    with locked(final):
        # Another process may have computed it while this one waited for the lock.
        return _hit(final, encoder, n_images, texts, texts_sha, data_id) or _compute(
            encoder, images, texts, n_images, texts_sha, final, data_id, preprocess_id, key, batch_size, progress)


def _hit(final: Path, encoder: Any, n_images: int | None, texts: list | None, texts_sha: str | None,
         data_id: str) -> Store | None:
    """The entry at `final` if it holds everything asked for, else None."""
    if not final.exists():  # a directory that is no valid entry is refused by open_cache, not overwritten
        return None
    old = open_cache(final, encoder_id=encoder.id)
    _check_same_data(old, n_images, texts_sha, data_id)
    if (n_images is None or old.image_emb is not None) and (texts is None or old.text_emb is not None):
        old.hit = True
        return old
    return None


def _compute(encoder, images, texts, n_images, texts_sha, final, data_id, preprocess_id, key, batch_size,
             progress) -> Store:
    old = open_cache(final, encoder_id=encoder.id) if final.exists() else None

    dim = int(encoder.embed_dim)
    # Reuse what an existing entry already holds; compute the rest.
    if old is not None:
        if n_images is None and old.image_emb is not None:
            n_images = old.info["n_images"]
        if texts is None and old.texts is not None:
            texts, texts_sha = old.texts, old.info["texts_sha256"]

    info = {"data_id": data_id, "preprocess_id": preprocess_id, "key": key, "n_images": n_images,
            "n_texts": len(texts) if texts is not None else None, "texts_sha256": texts_sha}
    with atomic_dir(final, kind=(MANIFEST, FORMAT, None)) as tmp:
        store = create_store(tmp, encoder.id, dim, IndexConfig(kind="none"),
                             encoder_spec=getattr(encoder, "spec", None), info=info)
        # Texts first: they are cheap, and a bad caption (over-long for the tokenizer) should
        # fail before an hour of image embedding rather than after.
        text_emb = image_emb = None
        if texts is not None:
            if old is not None and old.text_emb is not None:
                text_emb = old.text_emb
            else:
                text_emb = open_memmap(tmp / _TMP_TEXTS, np.float32, (len(texts), dim))
                embed_text_list(encoder, texts, text_emb, batch_size, progress)
        if n_images is not None:
            if old is not None and old.image_emb is not None:
                image_emb = old.image_emb
            else:
                image_emb = open_memmap(tmp / _TMP_IMAGES, np.float32, (n_images, dim))
                embed_image_array(encoder, images, n_images, image_emb, batch_size, progress)
        store.add(image_emb, None if image_emb is None else [{}] * n_images, texts=text_emb,
                  text_metadata=None if texts is None else [{"text": t} for t in texts], normalized=True)
        del text_emb, image_emb, store
        for name in (_TMP_TEXTS, _TMP_IMAGES):  # the embeddings as computed, now copied into shards
            (tmp / name).unlink(missing_ok=True)
    # The old entry's memmaps pointed into the replaced directory; reopen from the new one.
    return open_cache(final, encoder_id=encoder.id)


def _check_same_data(old: Store, n_images: int | None, texts_sha: str | None, data_id: str) -> None:
    """Refuse an entry whose key matches but whose contents show it is other data."""
    manifest = old.path / "manifest.json"
    if n_images is not None and old.image_emb is not None and old.info["n_images"] != n_images:
        raise VlctlError(
            f"{manifest}: cache for data id {data_id!r} holds {old.info['n_images']} images, but {n_images} "
            f"were given; the data id must identify the data exactly (use another data id or delete {old.path})"
        )
    if texts_sha is not None and old.texts is not None and old.info["texts_sha256"] != texts_sha:
        raise VlctlError(
            f"{manifest}: cache for data id {data_id!r} holds other texts than those given; the data id "
            f"must identify the data exactly (use another data id or delete {old.path})"
        )


def convert_cache(old: str | os.PathLike, new: str | os.PathLike) -> Store:
    """Write the embedding cache of vlctl 0.1 at `old` (meta.json, image_emb.npy, text_emb.npy,
    texts.json) as a store at `new`; `old` is left as it is."""
    old = Path(old)
    meta = read_json(old / "meta.json", "vlctl 0.1 embedding cache meta")
    if not isinstance(meta, dict) or not {"encoder_id", "dim", "n_images", "n_texts"} <= set(meta):
        raise VlctlError(f"{old / 'meta.json'}: not an embedding cache of vlctl 0.1")

    def load(name: str, n: Any) -> np.ndarray | None:
        if n is None:
            return None
        try:
            arr = np.load(old / name, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise VlctlError(f"{old / name}: cannot read the embedding array ({e})") from None
        if arr.shape != (n, meta["dim"]):
            raise VlctlError(f"{old / name}: shape {arr.shape}, meta.json says ({n}, {meta['dim']})")
        return arr

    image_emb, text_emb = load("image_emb.npy", meta["n_images"]), load("text_emb.npy", meta["n_texts"])
    texts = read_json(old / "texts.json", "embedding cache texts") if text_emb is not None else None
    info = {k: meta.get(k) for k in _INFO} | {"texts_sha256": sha256_json(texts) if texts is not None else None}
    with atomic_dir(new, exist_ok=False) as tmp:
        store = create_store(tmp, meta["encoder_id"], int(meta["dim"]), IndexConfig(kind="none"), info=info)
        store.add(image_emb, None if image_emb is None else [{}] * len(image_emb), texts=text_emb,
                  text_metadata=None if texts is None else [{"text": t} for t in texts], normalized=True)
    return open_store(new)


if __name__ == "__main__":  # python -m vlctl.embeddings.cache convert OLD NEW
    if len(sys.argv) != 4 or sys.argv[1] != "convert":
        print("usage: python -m vlctl.embeddings.cache convert OLD_CACHE NEW_STORE", file=sys.stderr)
        raise SystemExit(2)
    try:
        print(convert_cache(sys.argv[2], sys.argv[3]))
    except VlctlError as e:
        print(f"vlctl: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

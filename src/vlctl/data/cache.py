"""On-disk cache of image and text embeddings, keyed by (encoder, data, preprocessing).

Embedding a dataset is the expensive step of every evaluation and method fit, so it is done once
per key and stored as memory-mapped .npy files:

    root/<key>/
        meta.json       encoder id, data id, preprocess id, key, counts, dim, dtype, created,
                        sha256 of the texts; written last, so its presence marks a complete cache
        image_emb.npy   (n_images, dim) float32, L2-normalised (present if images were embedded)
        text_emb.npy    (n_texts, dim) float32, L2-normalised (present if texts were embedded)
        texts.json      the texts, one per row of text_emb, in input order

The directory is built under a temporary name and renamed into place (`atomic_dir`), so an
interrupted run leaves no half-written cache that a later run would mistake for a hit.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from vlctl.io import VlctlError, atomic_dir, atomic_write_json, read_json, sha256_json

__all__ = ["EmbeddingCache", "cache_key", "embed", "open_cache"]

FORMAT_VERSION = 1
_META = "meta.json"
_TEXTS = "texts.json"
_IMAGE_EMB = "image_emb.npy"
_TEXT_EMB = "text_emb.npy"
_REQUIRED_META = (
    "format_version",
    "encoder_id",
    "data_id",
    "preprocess_id",
    "key",
    "n_images",
    "n_texts",
    "dim",
    "dtype",
)


def cache_key(encoder_id: str, data_id: str, preprocess_id: str) -> str:
    """Cache directory name: the first 16 hex digits of sha256 of the three ids.

    The ids are hashed as a JSON list, so ("a|b", "c") and ("a", "b|c") get different keys.
    """
    for name, v in (("encoder_id", encoder_id), ("data_id", data_id), ("preprocess_id", preprocess_id)):
        if not isinstance(v, str) or not v:
            raise VlctlError(f"cache_key: {name} must be a non-empty string, got {v!r}")
    return sha256_json([encoder_id, data_id, preprocess_id])[:16]


@dataclasses.dataclass(frozen=True)
class EmbeddingCache:
    """An opened embedding cache.

    Attributes:
        path: the cache directory.
        meta: the parsed meta.json.
        image_emb: (n_images, dim) float32 read-only memmap, or None if images were not embedded.
        text_emb: (n_texts, dim) float32 read-only memmap, or None if texts were not embedded.
        texts: the embedded texts (row order of text_emb), or None.
        hit: True if `embed` found this cache already on disk and computed nothing.
    """

    path: Path
    meta: dict
    image_emb: np.ndarray | None
    text_emb: np.ndarray | None
    texts: list[str] | None
    hit: bool = False

    @property
    def encoder_id(self) -> str:
        return self.meta["encoder_id"]

    @property
    def key(self) -> str:
        return self.meta["key"]

    @property
    def dim(self) -> int:
        return self.meta["dim"]


# --------------------------------------------------------------------------------------------
# reading


def open_cache(path: str | os.PathLike, encoder_id: str | None = None) -> EmbeddingCache:
    """Open and validate a cache directory written by `embed`.

    Args:
        path: the cache directory (root/<key>).
        encoder_id: if given, the cache must have been made with this encoder; embeddings of
            another encoder live in another space and must never be mixed in.

    Raises:
        VlctlError naming the file, if the directory or a file is missing or corrupt, if an
        array's shape or dtype disagrees with meta.json, or if meta.json names another encoder.
    """
    path = Path(path)
    if not path.is_dir():
        raise VlctlError(f"{path}: embedding cache directory not found")
    meta_path = path / _META
    meta = read_json(meta_path, "embedding cache meta")
    if not isinstance(meta, dict):
        raise VlctlError(f"{meta_path}: corrupt embedding cache meta (expected a JSON object)")
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise VlctlError(f"{meta_path}: corrupt embedding cache meta, missing field(s) {missing}")
    if meta["format_version"] != FORMAT_VERSION:
        raise VlctlError(
            f"{meta_path}: embedding cache format_version {meta['format_version']}, this vlctl reads {FORMAT_VERSION}"
        )
    if encoder_id is not None and meta["encoder_id"] != encoder_id:
        raise VlctlError(
            f"{meta_path}: embedding cache was made with encoder {meta['encoder_id']!r}, "
            f"not with the requested encoder {encoder_id!r}; embeddings of different encoders "
            f"are not comparable (embed the data again with this encoder)"
        )
    dim = meta["dim"]
    if not isinstance(dim, int) or dim < 1:
        raise VlctlError(f"{meta_path}: corrupt embedding cache meta, dim={dim!r}")

    image_emb = _open_array(path / _IMAGE_EMB, meta["n_images"], dim, meta_path, "n_images")
    text_emb = _open_array(path / _TEXT_EMB, meta["n_texts"], dim, meta_path, "n_texts")

    texts = None
    if meta["n_texts"] is not None:
        texts_path = path / _TEXTS
        texts = read_json(texts_path, "embedding cache texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise VlctlError(f"{texts_path}: corrupt embedding cache texts (expected a list of strings)")
        if len(texts) != meta["n_texts"]:
            raise VlctlError(f"{texts_path}: {len(texts)} texts, but {meta_path} says n_texts={meta['n_texts']}")
        if sha256_json(texts) != meta.get("texts_sha256"):
            raise VlctlError(f"{texts_path}: texts do not match texts_sha256 in {meta_path}")
    return EmbeddingCache(path=path, meta=meta, image_emb=image_emb, text_emb=text_emb, texts=texts)


def _open_array(file: Path, n: Any, dim: int, meta_path: Path, field: str) -> np.ndarray | None:
    if n is None:  # this modality was not embedded
        return None
    if not isinstance(n, int) or n < 0:
        raise VlctlError(f"{meta_path}: corrupt embedding cache meta, {field}={n!r}")
    if not file.is_file():
        raise VlctlError(f"{file}: embedding array not found ({meta_path} says {field}={n})")
    try:
        arr = np.load(file, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise VlctlError(f"{file}: corrupt embedding array ({e})") from None
    if arr.shape != (n, dim) or arr.dtype != np.float32:
        raise VlctlError(
            f"{file}: array is {arr.dtype} {arr.shape}, but {meta_path} says float32 ({field}={n}, dim={dim})"
        )
    return arr


# --------------------------------------------------------------------------------------------
# writing


def _device_of(encoder: Any) -> torch.device:
    """Where the encoder's weights live, so input batches can be moved there."""
    dev = getattr(encoder, "device", None)
    if dev is not None:
        return torch.device(dev)
    if isinstance(encoder, torch.nn.Module):
        for p in encoder.parameters():
            return p.device
    return torch.device("cpu")


def _check_images(images: Any) -> int:
    shape = tuple(images.shape)
    if len(shape) != 4 or shape[-1] != 3:
        raise VlctlError(f"images: expected an array of shape (N, H, W, 3), got shape {shape}")
    try:
        dtype = np.dtype(images.dtype)
    except TypeError:  # e.g. a torch dtype; each batch is checked after conversion instead
        dtype = None
    if dtype is not None and dtype != np.uint8:
        raise VlctlError(f"images: expected dtype uint8, got {dtype}")
    if shape[0] == 0:
        raise VlctlError("images: no images given (N = 0)")
    return int(shape[0])


def _check_output(emb: torch.Tensor, n: int, dim: int, encoder_id: str, what: str) -> np.ndarray:
    if tuple(emb.shape) != (n, dim):
        raise VlctlError(f"encoder {encoder_id!r}: {what} returned shape {tuple(emb.shape)}, expected ({n}, {dim})")
    return emb.detach().float().cpu().numpy()


def _preprocess_batch(encoder: Any, batch: np.ndarray) -> torch.Tensor:
    if hasattr(encoder, "preprocess_batch"):
        return encoder.preprocess_batch(batch)
    return torch.stack([encoder.preprocess(im) for im in batch])


def _embed_texts(encoder: Any, texts: list[str], out: np.ndarray, batch_size: int, progress: bool) -> None:
    device, dim = _device_of(encoder), out.shape[1]
    with tqdm(total=len(texts), desc="embed texts", unit="text", disable=not progress) as bar:
        for i in range(0, len(texts), batch_size):
            batch = texts[i : i + batch_size]
            # The tokenizer's VlctlError (e.g. a caption over the context length) passes through.
            tokens = encoder.tokenize(batch).to(device)
            with torch.inference_mode():
                emb = encoder.encode_texts(tokens, normalize=True)
            out[i : i + len(batch)] = _check_output(emb, len(batch), dim, encoder.id, "encode_texts")
            bar.update(len(batch))


def _embed_images(encoder: Any, images: Any, n: int, out: np.ndarray, batch_size: int, progress: bool) -> None:
    device, dim = _device_of(encoder), out.shape[1]
    with tqdm(total=n, desc="embed images", unit="img", disable=not progress) as bar:
        for i in range(0, n, batch_size):
            # Slicing a memmap reads only these rows, so a dataset larger than memory is fine.
            # The copy gives preprocessing a writable in-memory batch (torch.from_numpy warns on
            # read-only memmap views).
            batch = np.array(images[i : i + batch_size])
            if batch.dtype != np.uint8 or batch.ndim != 4 or batch.shape[-1] != 3:
                raise VlctlError(
                    f"images[{i}:{i + len(batch)}]: expected uint8 (n, H, W, 3), got {batch.dtype} {batch.shape}"
                )
            x = _preprocess_batch(encoder, batch).to(device)
            with torch.inference_mode():
                emb = encoder.encode_images(x, normalize=True)
            out[i : i + len(batch)] = _check_output(emb, len(batch), dim, encoder.id, "encode_images")
            bar.update(len(batch))


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
) -> EmbeddingCache:
    """Embed images and/or texts with `encoder`, or return the cached embeddings.

    Args:
        encoder: an `vlctl.encoders.base.Encoder`. Images go through `encoder.preprocess_batch`
            if it has one, else `encoder.preprocess` per image, then `encode_images`; texts
            through `tokenize` and `encode_texts`. Both with normalize=True, so stored
            embeddings are L2-normalised. The encoder is used as is (call .eval() beforehand if
            it has dropout).
        images: array-like (N, H, W, 3) uint8 with `.shape` and slicing, e.g. a np.memmap. It is
            read `batch_size` rows at a time and never loaded whole.
        texts: list of str; one embedding row per text, in order (duplicates are kept).
        data_id: identifies the data exactly (dataset, split, version). The cache key is built
            from the ids only, never from the data, so two different datasets must not share a
            data_id.
        root: directory holding the caches; the cache goes to root/<cache_key(...)>.
        preprocess_id: identifies the preprocessing, for variants of the same encoder.
        batch_size: images/texts per encoder call.
        progress: show tqdm progress bars.

    Returns:
        The EmbeddingCache; `hit` is True if it already existed and nothing was computed. If the
        existing cache lacks a requested modality (e.g. it holds texts only and images are now
        given), the missing part is computed, the existing part reused, and the cache rewritten.

    Raises:
        VlctlError: nothing to embed, an empty text list, malformed images, a cache at the key
        that belongs to another encoder or holds different data (other texts, another number of
        images), or a corrupt cache; the tokenizer's own VlctlError for an over-long text.
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
    n_images = _check_images(images) if images is not None else None

    key = cache_key(encoder.id, data_id, preprocess_id)
    final = Path(root) / key
    texts_sha = sha256_json(texts) if texts is not None else None

    old = None
    if final.exists():  # a directory without a valid meta.json is refused by open_cache, not overwritten
        old = open_cache(final, encoder_id=encoder.id)
        _check_same_data(old, n_images, texts_sha, data_id)
        need_images = n_images is not None and old.image_emb is None
        need_texts = texts is not None and old.text_emb is None
        if not need_images and not need_texts:
            return dataclasses.replace(old, hit=True)

    dim = int(encoder.embed_dim)
    # Reuse what an existing cache already holds; compute the rest.
    if old is not None:
        if n_images is None and old.image_emb is not None:
            n_images = old.meta["n_images"]
        if texts is None and old.texts is not None:
            texts, texts_sha = old.texts, old.meta["texts_sha256"]

    meta = {
        "format_version": FORMAT_VERSION,
        "encoder_id": encoder.id,
        "data_id": data_id,
        "preprocess_id": preprocess_id,
        "key": key,
        "n_images": n_images,
        "n_texts": len(texts) if texts is not None else None,
        "dim": dim,
        "dtype": "float32",
        "normalized": True,
        "texts_sha256": texts_sha,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    with atomic_dir(final) as tmp:
        # Texts first: they are cheap, and a bad caption (over-long for the tokenizer) should
        # fail before an hour of image embedding rather than after.
        if texts is not None:
            out = np.lib.format.open_memmap(tmp / _TEXT_EMB, mode="w+", dtype=np.float32, shape=(len(texts), dim))
            if old is not None and old.text_emb is not None:
                out[:] = old.text_emb
            else:
                _embed_texts(encoder, texts, out, batch_size, progress)
            out.flush()
            del out
            atomic_write_json(tmp / _TEXTS, texts)
        if n_images is not None:
            out = np.lib.format.open_memmap(tmp / _IMAGE_EMB, mode="w+", dtype=np.float32, shape=(n_images, dim))
            if old is not None and old.image_emb is not None:
                out[:] = old.image_emb
            else:
                _embed_images(encoder, images, n_images, out, batch_size, progress)
            out.flush()
            del out
        atomic_write_json(tmp / _META, meta)  # last: a meta.json means the arrays are complete
    # The old cache's memmaps pointed into the replaced directory; reopen from the new one.
    return dataclasses.replace(open_cache(final, encoder_id=encoder.id), hit=False)


def _check_same_data(old: EmbeddingCache, n_images: int | None, texts_sha: str | None, data_id: str) -> None:
    """Refuse a cache whose key matches but whose contents show it is other data."""
    meta_path = old.path / _META
    if n_images is not None and old.image_emb is not None and old.meta["n_images"] != n_images:
        raise VlctlError(
            f"{meta_path}: cache for data id {data_id!r} holds {old.meta['n_images']} images, but {n_images} "
            f"were given; the data id must identify the data exactly (use another data id or delete {old.path})"
        )
    if texts_sha is not None and old.texts is not None and old.meta["texts_sha256"] != texts_sha:
        raise VlctlError(
            f"{meta_path}: cache for data id {data_id!r} holds other texts than those given; the data id "
            f"must identify the data exactly (use another data id or delete {old.path})"
        )

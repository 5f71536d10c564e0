"""Batched image embedding from files, robust to bad images, and gallery building.

`embed_image_files` decodes images (optionally in DataLoader worker processes, so decoding
overlaps the forward pass), preprocesses them with the encoder's own transform and embeds them in
batches. An image that cannot be decoded (corrupt, truncated, not an image) or that is a
decompression bomb (more pixels than `max_pixels`, checked from the header before any pixel is
decoded) is skipped: it costs its own row only, and is listed with the reason in the result.

`embed_text_list` and `embed_image_array` embed texts and (N, H, W, 3) uint8 arrays (generated
sets) in batches into a preallocated (memory-mapped) output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vlctl.embeddings.extract_config import ExtractConfig
from vlctl.fsops import VlctlError
from vlctl.images import ImageDecodeError, decode_image
from vlctl.progress import progress_bar
from vlctl.threads import torch_threads


def _preprocess_fn(encoder: Any):
    """The encoder's transform for a PIL image (its own one if it has it, else via uint8 array)."""
    fn = getattr(encoder, "preprocess_pil", None)
    if fn is not None:
        return fn
    return lambda im: encoder.preprocess(np.asarray(im, dtype=np.uint8))


class _ImageFiles(torch.utils.data.Dataset):
    def __init__(self, paths: Sequence[str | os.PathLike], preprocess, max_pixels: int):
        self.paths, self.preprocess, self.max_pixels = list(paths), preprocess, max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            with torch_threads(1):  # a per-image transform is many tiny ops (vlctl.threads)
                read = decode_image(self.paths[i], self.max_pixels)
                return i, self.preprocess(read.image), None, read.note
        except ImageDecodeError as e:
            return i, None, str(e), None
        except Exception as e:  # noqa: BLE001 -- a transform failing on one odd image must not end a 1M-image run
            return i, None, f"{self.paths[i]}: preprocessing failed ({type(e).__name__}: {e})", None


def _collate(items):
    ok = [(i, x) for i, x, err, _ in items if err is None]
    failed = [(i, err) for i, _, err, _ in items if err is not None]
    notes = [(i, note) for i, _, _, note in items if note is not None]
    idx = torch.tensor([i for i, _ in ok], dtype=torch.int64)
    x = torch.stack([x for _, x in ok]) if ok else None
    return idx, x, failed, notes


@dataclasses.dataclass(frozen=True)
class ExtractResult:
    """Embeddings of the images that could be used.

    embeddings: (m, d) float32, L2-normalised; row r is image `ok[r]` of the input.
    ok: (m,) int64 input positions, ascending.
    failures: (path, reason) for every skipped image, in input order.
    seconds: wall time; images_per_second: m / seconds.
    notes: (path, note) for every used image the reader has something to say about (the first
    of several frames used), in input order.
    """

    embeddings: np.ndarray
    ok: np.ndarray
    failures: list[tuple[str, str]]
    seconds: float
    notes: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return len(self.ok) / self.seconds if self.seconds > 0 else float("inf")


# --- mixed precision --------------------------------------------------------------------------


def autocast_context(encoder: Any, precision: str | None) -> contextlib.AbstractContextManager:
    """bf16 / fp16 autocast around an encoder's forward pass when `precision` asks for it.

    None or "fp32": nothing. An encoder that autocasts by itself (OpenCLIP / HF built with a
    `precision`) is left to do so; any other (TinyCLIP) runs under torch.autocast on its device.
    Embeddings come out float32 either way (`_check_output` casts).
    """
    if precision in (None, "fp32"):
        return contextlib.nullcontext()
    from vlctl.encoders.open_clip_encoder import autocast_for, check_precision

    check_precision(precision)
    if getattr(encoder, "precision", "fp32") != "fp32":
        return contextlib.nullcontext()
    return autocast_for(_device_of(encoder), precision)


# --- arrays (generated sets, in-memory images) ----------------------------------------------


def _device_of(encoder: Any) -> torch.device:
    """Where the encoder's weights live, so input batches can be moved there."""
    dev = getattr(encoder, "device", None)
    if dev is not None:
        return torch.device(dev)
    if isinstance(encoder, torch.nn.Module):
        for p in encoder.parameters():
            return p.device
    return torch.device("cpu")


def check_image_array(images: Any) -> int:
    """The number of images in an (N, H, W, 3) uint8 array-like; VlctlError if it is not one."""
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


def embed_text_list(encoder: Any, texts: list[str], out: np.ndarray, batch_size: int, progress: bool,
                    precision: str | None = None) -> None:
    """Embed `texts` in batches into `out` (len(texts), dim), L2-normalised, in input order
    (`precision`: see `autocast_context`)."""
    device, dim = _device_of(encoder), out.shape[1]
    with progress_bar(total=len(texts), desc="embed texts", unit="text", disable=not progress) as bar:
        for i in range(0, len(texts), batch_size):
            batch = texts[i : i + batch_size]
            # The tokenizer's VlctlError (e.g. a caption over the context length) passes through.
            tokens = encoder.tokenize(batch).to(device)
            with torch.inference_mode(), autocast_context(encoder, precision):
                emb = encoder.encode_texts(tokens, normalize=True)
            out[i : i + len(batch)] = _check_output(emb, len(batch), dim, encoder.id, "encode_texts")
            bar.update(len(batch))


def embed_image_array(encoder: Any, images: Any, n: int, out: np.ndarray, batch_size: int, progress: bool) -> None:
    """Embed an (n, H, W, 3) uint8 array-like (a memmap is read `batch_size` rows at a time) into
    `out` (n, dim), L2-normalised, with the encoder's batched or per-image preprocessing."""
    device, dim = _device_of(encoder), out.shape[1]
    with progress_bar(total=n, desc="embed images", unit="img", disable=not progress) as bar:
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


# --- image files -----------------------------------------------------------------------------


def embed_image_files(
    encoder: Any, paths: Sequence[str | os.PathLike], config: ExtractConfig | None = None, progress: bool = True,
    precision: str | None = None,
) -> ExtractResult:
    """Embed image files in batches; bad files are skipped and listed, never fatal.

    Args:
        encoder: a vlctl Encoder (OpenCLIP / HF / TinyCLIP); its preprocessing is used.
        paths: image files.
        config: batch size, decoding workers, pixel limit.
        progress: a tqdm bar on stderr.
        precision: None / "fp32", or "bf16" / "fp16" autocast (`autocast_context`).
    """
    config = config or ExtractConfig()
    start = time.perf_counter()
    dataset = _ImageFiles(paths, _preprocess_fn(encoder), config.max_pixels)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=config.batch_size, num_workers=config.workers, collate_fn=_collate, shuffle=False
    )
    dim = int(encoder.embed_dim)
    out = np.empty((len(dataset), dim), dtype=np.float32)
    got = np.zeros(len(dataset), dtype=bool)
    failures: list[tuple[int, str]] = []
    notes: list[tuple[int, str]] = []
    with progress_bar(total=len(dataset), desc="embed images", unit="img", disable=not progress) as bar:
        for idx, x, failed, noted in loader:
            failures += failed
            notes += noted
            if x is not None:
                with torch.inference_mode(), autocast_context(encoder, precision):
                    emb = encoder.encode_images(x, normalize=True)
                out[idx.numpy()] = _check_output(emb, len(idx), dim, encoder.id, "encode_images")
                got[idx.numpy()] = True
            bar.update(len(idx) + len(failed))
            if failures:
                bar.set_postfix(failed=len(failures))
    ok = np.flatnonzero(got)
    failures.sort()
    notes.sort()
    rows = out if len(ok) == len(out) else out[ok]  # no second copy of 1M rows when nothing failed
    return ExtractResult(
        rows, ok.astype(np.int64), [(str(paths[i]), err) for i, err in failures], time.perf_counter() - start,
        [(str(paths[i]), note) for i, note in notes],
    )

"""Batched image embedding from files, robust to bad images, and gallery building.

`embed_image_files` decodes images (optionally in DataLoader worker processes, so decoding
overlaps the forward pass), preprocesses them with the encoder's own transform and embeds them in
batches. An image that cannot be decoded (corrupt, truncated, not an image) or that is a
decompression bomb (more pixels than `max_pixels`, checked from the header before any pixel is
decoded) is skipped: it costs its own row only, and is listed with the reason in the result.

`index_images` puts the embeddings and metadata of images into a gallery (creating it, or adding
only the images it does not hold yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from vlctl.config import opt
from vlctl.embeddings.store import IndexConfig, Store, open_or_create_store
from vlctl.images import DEFAULT_MAX_PIXELS, ImageDecodeError, read_image
from vlctl.io import VlctlError


@dataclasses.dataclass(frozen=True)
class ExtractConfig:
    """How images are decoded and embedded."""

    batch_size: int = opt(64, "images per forward pass")
    workers: int = opt(0, "DataLoader worker processes decoding images (0 = decode in the main process)")
    max_pixels: int = opt(
        DEFAULT_MAX_PIXELS, "refuse images with more pixels than this (decompression bombs; PIL's limit)"
    )

    def __post_init__(self) -> None:
        for f in ("batch_size", "max_pixels"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise VlctlError(f"ExtractConfig.{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise VlctlError(f"ExtractConfig.workers must be >= 0, got {self.workers!r}")


def _preprocess_fn(encoder: Any):
    """The encoder's transform for a PIL image (its own one if it has it, else via uint8 array)."""
    fn = getattr(encoder, "preprocess_pil", None)
    if fn is not None:
        return fn
    return lambda im: encoder.preprocess(np.asarray(im, dtype=np.uint8))


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Run the block with one intra-op torch thread.

    A per-image transform is many tiny tensor ops; extra threads only add synchronisation. On a
    busy 2-core machine OpenCLIP's ViT-B-32 transform took 70 ms per image with 2 threads and
    5 ms with 1 (measured). DataLoader workers already run with one thread; this covers
    decoding in the main process (workers=0).
    """
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class _ImageFiles(torch.utils.data.Dataset):
    def __init__(self, paths: Sequence[str | os.PathLike], preprocess, max_pixels: int):
        self.paths, self.preprocess, self.max_pixels = list(paths), preprocess, max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            with _one_torch_thread():
                return i, self.preprocess(read_image(self.paths[i], self.max_pixels)), None
        except ImageDecodeError as e:
            return i, None, str(e)
        except Exception as e:  # noqa: BLE001 -- a transform failing on one odd image must not end a 1M-image run
            return i, None, f"{self.paths[i]}: preprocessing failed ({type(e).__name__}: {e})"


def _collate(items):
    ok = [(i, x) for i, x, err in items if err is None]
    failed = [(i, err) for i, _, err in items if err is not None]
    idx = torch.tensor([i for i, _ in ok], dtype=torch.int64)
    x = torch.stack([x for _, x in ok]) if ok else None
    return idx, x, failed


@dataclasses.dataclass(frozen=True)
class ExtractResult:
    """Embeddings of the images that could be used.

    embeddings: (m, d) float32, L2-normalised; row r is image `ok[r]` of the input.
    ok: (m,) int64 input positions, ascending.
    failures: (path, reason) for every skipped image, in input order.
    seconds: wall time; images_per_second: m / seconds.
    """

    embeddings: np.ndarray
    ok: np.ndarray
    failures: list[tuple[str, str]]
    seconds: float

    @property
    def images_per_second(self) -> float:
        return len(self.ok) / self.seconds if self.seconds > 0 else float("inf")


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


def embed_text_list(encoder: Any, texts: list[str], out: np.ndarray, batch_size: int, progress: bool) -> None:
    """Embed `texts` in batches into `out` (len(texts), dim), L2-normalised, in input order."""
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


def embed_image_array(encoder: Any, images: Any, n: int, out: np.ndarray, batch_size: int, progress: bool) -> None:
    """Embed an (n, H, W, 3) uint8 array-like (a memmap is read `batch_size` rows at a time) into
    `out` (n, dim), L2-normalised, with the encoder's batched or per-image preprocessing."""
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


# --- image files -----------------------------------------------------------------------------


def embed_image_files(
    encoder: Any, paths: Sequence[str | os.PathLike], config: ExtractConfig | None = None, progress: bool = True
) -> ExtractResult:
    """Embed image files in batches; bad files are skipped and listed, never fatal.

    Args:
        encoder: a vlctl Encoder (OpenCLIP / HF / TinyCLIP); its preprocessing is used.
        paths: image files.
        config: batch size, decoding workers, pixel limit.
        progress: a tqdm bar on stderr.
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
    with tqdm(total=len(dataset), desc="embed images", unit="img", disable=not progress) as bar:
        for idx, x, failed in loader:
            failures += failed
            if x is not None:
                with torch.inference_mode():
                    emb = encoder.encode_images(x, normalize=True)
                if tuple(emb.shape) != (len(idx), dim):
                    raise VlctlError(
                        f"encoder {encoder.id!r}: encode_images returned shape {tuple(emb.shape)}, "
                        f"expected ({len(idx)}, {dim})"
                    )
                out[idx.numpy()] = emb.detach().float().cpu().numpy()
                got[idx.numpy()] = True
            bar.update(len(idx) + len(failed))
            if failures:
                bar.set_postfix(failed=len(failures))
    ok = np.flatnonzero(got)
    failures.sort()
    rows = out if len(ok) == len(out) else out[ok]  # no second copy of 1M rows when nothing failed
    return ExtractResult(
        rows, ok.astype(np.int64), [(str(paths[i]), err) for i, err in failures], time.perf_counter() - start
    )


def index_images(
    encoder: Any,
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    metadata: Sequence[dict] | None = None,
    index_config: IndexConfig | None = None,
    extract: ExtractConfig | None = None,
    encoder_spec: str | None = None,
    progress: bool = True,
) -> tuple[Store | None, dict]:
    """Embed images into the gallery at `out` (created if absent; otherwise only new paths are added).

    Each row's metadata is {"path": the absolute path, **metadata[i]}. Returns the gallery and a
    report: {"added", "already_present", "failed" (count), "failures" ([path, reason]),
    "count", "seconds", "images_per_second"}.

    Under torchrun (a process group initialised, e.g. by `vlctl.train.distributed.init_distributed`)
    every rank embeds every world_size-th new image; rank 0 alone writes the gallery, with the
    rows in the same order a single process would give. Other ranks return (None, their report).

    Raises:
        VlctlError: an existing gallery of another encoder or index config, an encoder that does
        not produce `embed_dim` columns.
    """
    from vlctl.train.distributed import all_gather_object, is_distributed

    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if is_distributed() else (0, 1)
    paths = [str(Path(p).resolve()) for p in paths]
    if metadata is not None and len(metadata) != len(paths):
        raise VlctlError(f"index_images: {len(paths)} paths but {len(metadata)} metadata rows")

    # Rank 0 opens the gallery; its verdict (or error) reaches every rank, so none waits forever
    # in a collective after another has failed.
    gallery, state = None, None
    if rank == 0:
        try:
            gallery = open_or_create_store(
                out, encoder.id, int(encoder.embed_dim), index_config, encoder_spec=encoder_spec
            )
            present = {m.get("path") for m in gallery.metadata()} if len(gallery) else set()
            state = {"todo": [i for i, p in enumerate(paths) if p not in present]}
        except VlctlError as e:
            state = {"error": str(e)}
    state = all_gather_object(state)[0]
    if "error" in state:
        raise VlctlError(state["error"])
    todo: list[int] = state["todo"]

    mine = todo[rank::world]
    result = embed_image_files(encoder, [paths[i] for i in mine], extract, progress=progress and rank == 0)
    rows = [mine[r] for r in result.ok]
    embeddings, failures, seconds = result.embeddings, result.failures, result.seconds
    if world > 1:
        # Embeddings travel through files: pickling gigabytes through gloo would double memory.
        part = Path(out).parent / f".{Path(out).name}.rank{rank}.npy"
        part.parent.mkdir(parents=True, exist_ok=True)
        tmp = part.with_name(part.name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, embeddings)
        os.replace(tmp, part)
        parts = all_gather_object({"rows": rows, "failures": failures, "file": str(part), "seconds": seconds})
        if rank != 0:
            return None, {"rank": rank, "embedded": len(rows), "failed": len(failures)}
        rows = [r for p in parts for r in p["rows"]]
        position = {p: i for i, p in enumerate(paths)}
        failures = sorted((f for p in parts for f in p["failures"]), key=lambda f: position[f[0]])
        embeddings = np.concatenate([np.load(p["file"]) for p in parts]) if rows else embeddings
        for p in parts:
            Path(p["file"]).unlink(missing_ok=True)
        order = np.argsort(rows, kind="stable")  # the single-process row order
        rows, embeddings = [rows[i] for i in order], embeddings[order]
        seconds = max(p["seconds"] for p in parts)

    assert gallery is not None  # rank 0
    if rows:
        meta = [{"path": paths[i], **(metadata[i] if metadata is not None else {})} for i in rows]
        gallery = gallery.add(embeddings, meta, encoder_id=encoder.id)
    report = {
        "added": len(rows),
        "already_present": len(paths) - len(todo),
        "failed": len(failures),
        "failures": [list(f) for f in failures],
        "count": len(gallery),
        "seconds": round(seconds, 3),
        "images_per_second": round(len(rows) / seconds, 2) if seconds > 0 else None,
        "world_size": world,
    }
    return gallery, report

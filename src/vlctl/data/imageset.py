"""The on-disk image set every generator writes (MAD, shapes, scenes): the one writer and reader.

Writing: chunks rendered in parallel into a memmapped images.npy (its blocks reserved first, so a
full disk is an error before any rendering), plus labels.jsonl and meta.json with the files' sha256
and fast hashes, all inside one atomically renamed directory (`write_image_set`); meta.json is the
marker that lets a later run of the same generator replace it (anything else at `out` is refused
unless --overwrite, see `vlctl.io.atomic_dir`).
Reading: `load_image_set` checks meta.json, the files, their fast hashes (an images.npy edited in
place is refused, so no cache serves embeddings of the old images), the counts and every label
(with the label checker of the directory's format) and returns the images memory-mapped; the pieces it is
made of (`open_image_set_files`, `read_labels`, `check_image_set`) serve formats with their own
meta checks (scenes).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.io import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    check_content,
    fast_hash_file,
    open_memmap,
    read_json,
    recover_dir,
    sha256_file,
)

Chunk = tuple[np.ndarray, list[dict]]  # (images (m, S, S, 3) uint8, one label dict per image)


def write_image_set(
    out: str | Path,
    *,
    n: int,
    image_size: int,
    workers: int,
    chunk_max: int,
    make_range: Callable[[tuple[int, int]], Chunk],
    meta: dict,
    initializer: Callable | None = None,
    initargs: Sequence = (),
    on_chunk: Callable[[Path, np.ndarray, list[dict]], None] | None = None,
    on_done: Callable[[Path, list[dict]], None] | None = None,
) -> Path:
    """Render images [0, n) in chunks with `make_range((start, stop))` -- in `workers` processes
    when > 1 (picklable callable; per-worker state via `initializer(*initargs)`) -- and write
    `out/` = images.npy + labels.jsonl + meta.json (`meta` plus the two files' sha256).
    `on_chunk(tmp_dir, images, labels)` and `on_done(tmp_dir, labels)` add files of their own.
    The directory appears only when complete (atomic rename)."""
    chunk = max(1, min(chunk_max, -(-n // (4 * workers))))
    bounds = [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    out = Path(out)
    with atomic_dir(out, kind=("meta.json", meta["format"], None), legacy=_old_set(meta["format"])) as tmp, \
            contextlib.ExitStack() as stack:
        images = open_memmap(tmp / "images.npy", np.uint8, (n, image_size, image_size, 3))
        if workers == 1:
            if initializer is not None:
                initializer(*initargs)
            results = (make_range(b) for b in bounds)
        else:
            # fork where available: workers start at once and callers need no `if __name__ == "__main__"`
            # guard; the generators only run numpy / scipy / scikit-image code, which is fork-safe
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            pool = stack.enter_context(ctx.Pool(workers, initializer, tuple(initargs)))
            results = pool.imap(make_range, bounds)
        labels: list[dict] = []
        for (start, stop), (imgs, labs) in zip(bounds, results):
            images[start:stop] = imgs
            labels.extend(labs)
            if on_chunk is not None:
                on_chunk(tmp, imgs, labs)
        stack.close()
        images.flush()
        del images
        atomic_write_text(tmp / "labels.jsonl", "".join(json.dumps(lab) + "\n" for lab in labels))
        if on_done is not None:
            on_done(tmp, labels)
        files = ("images.npy", "labels.jsonl")
        atomic_write_json(tmp / "meta.json", {  # last: the marker
            **meta, "sha256": {f: sha256_file(tmp / f) for f in files}, "fast": {f: fast_hash_file(tmp / f) for f in files},
        })
    return out


def _old_set(fmt: str) -> Callable[[Path], bool]:
    """Recognises a set of this format written by a vlctl before meta.json named it (MAD's only)."""
    def old(path: Path) -> bool:
        try:
            meta = read_json(path / "meta.json")
        except VlctlError:
            return False
        return fmt == "vlctl-mad" and isinstance(meta, dict) and "format" not in meta and "sha256" in meta

    return old


def open_image_set_files(path: Path, meta: dict) -> tuple[np.ndarray, Path]:
    """(images.npy memmapped read-only, path of labels.jsonl) of a written set, checked: both
    files exist and the images are uint8 of meta's image_shape. Clear errors name the file."""
    image_file, label_file = path / "images.npy", path / "labels.jsonl"
    for f in (image_file, label_file):
        if not f.is_file():
            raise VlctlError(f"{f}: file not found")
    try:
        images = np.load(image_file, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise VlctlError(f"{image_file}: corrupt .npy file ({e})") from None
    if images.dtype != np.uint8 or images.ndim != 4 or list(images.shape[1:]) != list(meta["image_shape"]):
        raise VlctlError(f"{image_file}: expected uint8 images of shape (N, {', '.join(map(str, meta['image_shape']))}), "
                         f"got {images.dtype} {images.shape}")
    return images, label_file


def check_image_set(path: Path, meta: dict, images: np.ndarray, labels: list, verify: bool) -> None:
    """Counts agree (images, labels, meta's n), both files have the fast hash meta.json records (if
    it does); with `verify`, both hash to meta's sha256."""
    if not len(images) == len(labels) == meta["n"]:
        raise VlctlError(f"{path}: count mismatch: {len(images)} images in images.npy, {len(labels)} labels in "
                         f"labels.jsonl, n={meta['n']} in meta.json")
    fast = meta.get("fast") if isinstance(meta.get("fast"), dict) else {}
    for f in (path / "images.npy", path / "labels.jsonl"):
        check_content(f, fast.get(f.name), meta["sha256"].get(f.name), path / "meta.json")
    if verify:
        for f in (path / "images.npy", path / "labels.jsonl"):
            if sha256_file(f) != meta["sha256"].get(f.name):
                raise VlctlError(f"{f}: sha256 does not match meta.json (file changed since it was generated)")


def check_set_config(cfg, splits: Sequence[str], min_image_size: int, size_why: str = "") -> None:
    """The fields every generated-set config shares (split, n, workers, image_size, seed): raise
    VlctlError naming the config class and the field when one is out of range."""
    name = type(cfg).__name__
    if cfg.split not in splits:
        raise VlctlError(f"{name}.split: {cfg.split!r} is not one of {list(splits)}")
    for field in ("n", "workers"):
        if getattr(cfg, field) < 1:
            raise VlctlError(f"{name}.{field}: must be >= 1, got {getattr(cfg, field)}")
    if cfg.image_size < min_image_size:
        why = f" ({size_why})" if size_why else ""
        raise VlctlError(f"{name}.image_size: must be >= {min_image_size}{why}, got {cfg.image_size}")
    if cfg.seed < 0:
        raise VlctlError(f"{name}.seed: must be >= 0, got {cfg.seed}")


def write_pngs(directory: Path, images: np.ndarray, labels: list[dict]) -> None:
    """Each image as `directory/images/<label's filename>` (PNG, atomic): what folder loaders read."""
    import io

    from PIL import Image

    for image, lab in zip(images, labels):
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="PNG")
        atomic_write_bytes(directory / "images" / lab["filename"], buf.getvalue())


def read_labels(label_file: Path, check_label: Callable[[dict, str], None]) -> list[dict]:
    """labels.jsonl, one JSON object a line, each passed to `check_label(label, where)`."""
    from vlctl.io import read_text_utf8

    labels = []
    lines = read_text_utf8(label_file, "labels file").split("\n")  # not UTF-8: an error naming the byte
    for lineno, line in enumerate(lines[:-1] if lines[-1] == "" else lines, 1):
        try:
            label = json.loads(line)
        except json.JSONDecodeError as e:
            raise VlctlError(f"{label_file}: line {lineno}: corrupt JSON ({e})") from None
        check_label(label, f"{label_file}: line {lineno}")
        labels.append(label)
    return labels


def load_image_set(path: str | Path, verify: bool, checkers: Mapping[str, Callable[[dict, str], None]],
                   default_format: str = "vlctl-mad") -> dict:
    """Load a generated image set: {"images": (N, H, W, 3) uint8 read-only memmap, "labels", "meta", "path"}.

    `checkers` maps each accepted meta["format"] (absent: `default_format`) to its label checker
    `check(label, where)`; another format is refused. Checks the counts, the image shape and dtype
    and every label; `verify=True` also re-hashes the files against meta.json (a full read of
    the images).
    """
    path = Path(path)
    if not path.is_dir():
        recover_dir(path)  # a rewrite killed between its two renames
    if not path.is_dir():
        raise VlctlError(f"{path}: MAD directory not found")
    meta = read_json(path / "meta.json", "MAD meta.json")
    if not isinstance(meta, dict) or not {"n", "image_shape", "sha256"} <= set(meta):
        raise VlctlError(f"{path / 'meta.json'}: not a MAD meta file (needs n, image_shape, sha256)")
    images, label_file = open_image_set_files(path, meta)
    fmt = meta.get("format", default_format)
    if fmt not in checkers:
        expected = " or ".join(repr(f) for f in checkers)
        raise VlctlError(f"{path / 'meta.json'}: unknown dataset format {fmt!r} (expected {expected})")
    labels = read_labels(label_file, checkers[fmt])
    check_image_set(path, meta, images, labels, verify)
    return {"images": images, "labels": labels, "meta": meta, "path": path}

"""What every loader shares: `ImageTextData`, the missing-file check (`_build`,
`_check_files`) and the CSV / TSV / JSONL table reader with its column finder (`_read_table`,
`_pick`)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.io import read_text_utf8

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
ON_MISSING = ("error", "skip")
_SHOW = 10  # missing files named in an error message


class MissingImagesError(VlctlError):
    """Image files an annotation names are not on disk (`on_missing="error"`). The message says
    which; a command that can skip them adds how (`vlctl embed --skip-missing`)."""


@dataclasses.dataclass(frozen=True)
class ImageTextData:
    """Images, captions and the caption -> image map of one dataset (or split).

    Attributes:
        name: where it came from ("<file>[:<split>]").
        root: the directory image paths are relative to (None: text only, not checked).
        images: (n_images,) image paths as written in the source file.
        captions: (n_texts,) every caption, in file order.
        image_of_text: (n_texts,) int64, index into `images` of each caption's image.
        image_fields: (n_images,) dicts of per-image fields (split, ids, attributes, ...).
        missing: image paths dropped because they were not under `root` (on_missing="skip").
    """

    name: str
    root: Path | None
    images: list[str]
    captions: list[str]
    image_of_text: np.ndarray
    image_fields: list[dict]
    missing: list[str] = dataclasses.field(default_factory=list)

    @property
    def n_images(self) -> int:
        return len(self.images)

    def image_paths(self) -> list[Path]:
        """Absolute-or-root-relative paths of the images (needs `root`)."""
        if self.root is None:
            raise VlctlError(f"{self.name}: loaded without an image root; pass root= to read images")
        return [self.root / p for p in self.images]

    def captions_of(self, i: int) -> list[str]:
        """The captions of image i, in file order."""
        return [self.captions[j] for j in np.flatnonzero(self.image_of_text == i)]

    def captions_by_image(self) -> list[list[str]]:
        """(n_images,) lists of captions, in file order (one pass; not n_images scans)."""
        out: list[list[str]] = [[] for _ in self.images]
        for c, j in zip(self.captions, self.image_of_text.tolist()):
            out[j].append(c)
        return out


def _show(value: Any) -> str:
    from vlctl.config import shorten

    return shorten(repr(value))


def _build(
    name: str, root: str | os.PathLike | None, per_image: Iterable[tuple[str, Sequence[str], dict]], on_missing: str
) -> ImageTextData:
    """Assemble an ImageTextData from (image path, captions, fields) per image, checking files."""
    if on_missing not in ON_MISSING:
        raise VlctlError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
    rows = list(per_image)
    for i, (p, _, _) in enumerate(rows):
        if not isinstance(p, str) or not p:  # e.g. "image": 123 in an annotation file
            raise VlctlError(f"{name}: item {i}: the image path must be a non-empty string, got {_show(p)}")
    root_path = Path(root) if root is not None else None
    missing: list[str] = []
    if root_path is not None:
        if not root_path.is_dir():
            raise VlctlError(f"{root_path}: image root directory not found (for {name})")
        missing = [p for p, _, _ in rows if not (root_path / p).is_file()]
        if missing and on_missing == "error":
            shown = ", ".join(missing[:_SHOW]) + (
                f", ... ({len(missing) - _SHOW} more)" if len(missing) > _SHOW else ""
            )
            raise MissingImagesError(
                f"{name}: {len(missing)} of {len(rows)} image files not found under {root_path.resolve()}: {shown}"
            )
        gone = set(missing)
        rows = [r for r in rows if r[0] not in gone]
    images, captions, owner, fields = [], [], [], []
    for i, (path, caps, extra) in enumerate(rows):
        images.append(path)
        fields.append(extra)
        captions += list(caps)
        owner += [i] * len(caps)
    return ImageTextData(name, root_path, images, captions, np.asarray(owner, dtype=np.int64), fields, missing)


def _check_caption_list(caps: Any, where: str) -> list[str]:
    if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
        raise VlctlError(f"{where}: 'caption' must be a list of strings, got {type(caps).__name__}")
    return caps



# --------------------------------------------------------------------------------------------
# Annotation tables: CSV / TSV (header row) or JSONL


def _sniff_sep(path: Path, sep: str | None) -> str:
    if sep is not None:
        return sep
    return "\t" if path.suffix.lower() in (".tsv", ".tab") else ","


def _pick(columns: Sequence[str], wanted: str | None, candidates: Sequence[str], path: Path, what: str) -> str:
    if wanted is not None:
        if wanted not in columns:
            raise VlctlError(f"{path}: no column {wanted!r} for the {what}; columns are {list(columns)}")
        return wanted
    for c in candidates:
        if c in columns:
            return c
    raise VlctlError(
        f"{path}: cannot tell which column holds the {what}: none of {list(candidates)} among "
        f"{list(columns)} (name it explicitly)"
    )


# Not "url": img2dataset's url column is the remote source, not the downloaded file.
IMAGE_COLUMNS = ("filepath", "image", "image_path", "path", "file", "filename")
CAPTION_COLUMNS = ("title", "caption", "text", "captions", "description")


def _read_table(path: Path, sep: str | None = None) -> tuple[list[str], list[dict]]:
    """A CSV/TSV (header row) or JSONL file -> (column names, rows as dicts)."""
    if not path.is_file():
        raise VlctlError(f"{path}: annotation file not found")
    if path.suffix.lower() in (".jsonl", ".jsonlines", ".ndjson"):
        rows, cols = [], {}
        for n, line in enumerate(read_text_utf8(path, "annotation file").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise VlctlError(f"{path}:{n}: invalid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise VlctlError(f"{path}:{n}: expected a JSON object per line")
            rows.append(row)
            cols.update(dict.fromkeys(row))
        return list(cols), rows
    with io.StringIO(read_text_utf8(path, "annotation file"), newline="") as f:
        reader = csv.DictReader(f, delimiter=_sniff_sep(path, sep))
        try:
            if not reader.fieldnames:
                raise VlctlError(f"{path}: empty file (no header row)")
            rows = []
            for n, row in enumerate(reader, 2):
                if None in row:
                    raise VlctlError(f"{path}:{n}: more fields than the header's {len(reader.fieldnames)}")
                rows.append(row)
        except csv.Error as e:
            raise VlctlError(f"{path}:{reader.line_num}: not a readable CSV/TSV ({e})") from None
        return list(reader.fieldnames), rows


def _check_files(name: str, root: str | os.PathLike | None, paths: Sequence[str], on_missing: str) -> list[str]:
    """The paths not under `root` (raising per on_missing = "error", with _build's message)."""
    if root is None:
        if on_missing not in ON_MISSING:
            raise VlctlError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
        return []
    return _build(name, root, ((p, [], {}) for p in dict.fromkeys(paths)), on_missing).missing


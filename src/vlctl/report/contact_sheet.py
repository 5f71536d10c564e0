"""Contact sheets: a titled grid of thumbnails in one PNG (used by `vlctl cluster`).

    write_contact_sheet(["a.jpg", "b.png"], "out/cluster_00.png", title="cluster 0 · 12 images")

Each thumbnail (default 128 px) has its file name under it (`names`; by default the file name of
every image given as a path), shortened in the middle ("chelsea_…_01.jpg") to fit the tile; tiles
narrower than MIN_NAMED_THUMB pixels, where a name would be a few letters, get none.

Images may be file paths, PIL images, uint8 arrays (H, W, 3) or (H, W), or encoded bytes. An
image that cannot be read (missing, corrupt, a decompression bomb) becomes a grey tile with a red
cross: it is counted and named in the result, never an exception, so one bad file cannot stop a
sheet of a 1M-image gallery.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_bytes

_BACKGROUND = (255, 255, 255)
_FAILED_TILE = (160, 160, 160)
_MARKER = (200, 0, 0)
_PAD = 2  # pixels between tiles
_TITLE_H = 18  # height of one title line
_TITLE_PT, _NAME_PT = 13, 11  # font sizes (pixels) of the title and the file names
_NAME_H = 15  # height of the name line under a tile
MIN_NAMED_THUMB = 48
DEFAULT_THUMB = 128


@dataclasses.dataclass(frozen=True)
class ContactSheet:
    """What `write_contact_sheet` wrote: the PNG path, the number of tiles, the size in pixels,
    and the unreadable images as (position in the input, reason)."""

    path: Path
    n_images: int
    size: tuple[int, int]
    unreadable: list[tuple[int, str]]


def _thumbnail(item: Any, thumb: int, max_pixels: int):
    """One image as an RGB thumbnail fitting thumb x thumb (aspect kept), or raise with a reason."""
    from PIL import Image

    from vlctl.images import read_image

    if isinstance(item, Image.Image):
        im = item.convert("RGB")
    elif isinstance(item, (bytes, bytearray, memoryview)):
        im = read_image(io.BytesIO(bytes(item)), max_pixels)
    elif isinstance(item, (str, os.PathLike)):
        im = read_image(item, max_pixels)
    else:
        a = np.asarray(item)
        if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (1, 3, 4)):
            raise ValueError(f"expected a uint8 array (H, W[, 1|3|4]), got {a.dtype} {a.shape}")
        im = Image.fromarray(a[..., 0] if a.ndim == 3 and a.shape[2] == 1 else a).convert("RGB")
    im = im.copy()
    # Upscale tiny images (28 px synthetic sets) as well: NEAREST keeps their pixels visible.
    scale = thumb / max(im.size)
    size = (max(1, round(im.size[0] * scale)), max(1, round(im.size[1] * scale)))
    return im.resize(size, Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BICUBIC)


def _failed_tile(thumb: int):
    from PIL import Image, ImageDraw

    tile = Image.new("RGB", (thumb, thumb), _FAILED_TILE)
    draw = ImageDraw.Draw(tile)
    w = max(1, thumb // 24)
    draw.line((0, 0, thumb - 1, thumb - 1), fill=_MARKER, width=w)
    draw.line((0, thumb - 1, thumb - 1, 0), fill=_MARKER, width=w)
    return tile


def _wrap(title: str, width_px: int, text_width) -> list[str]:
    """Split the title into lines no wider than width_px (measured with `text_width`), at spaces
    where possible; a word wider than a line is cut."""
    lines: list[str] = []
    for para in title.splitlines() or [""]:
        line = ""
        for word in para.split(" "):
            cand = f"{line} {word}" if line else word
            if text_width(cand) <= width_px:
                line = cand
                continue
            if line:
                lines.append(line)
            line = word
            while len(line) > 1 and text_width(line) > width_px:
                cut = len(line) - 1
                while cut > 1 and text_width(line[:cut]) > width_px:
                    cut -= 1
                lines.append(line[:cut])
                line = line[cut:]
        lines.append(line)
    return lines


def _fit_name(name: str, width_px: int, text_width) -> str:
    """`name`, or its start and end around an ellipsis, no wider than width_px."""
    if text_width(name) <= width_px:
        return name
    stem, dot, ext = name.rpartition(".")
    tail = f"{dot}{ext}" if dot and len(ext) <= 5 else ""
    body = stem if tail else name
    keep = len(body)
    while keep > 1:
        keep -= 1
        cand = f"{body[: (keep + 1) // 2]}\u2026{body[len(body) - keep // 2:] if keep // 2 else ''}{tail}"
        if text_width(cand) <= width_px:
            return cand
    return "\u2026" + tail if text_width("\u2026" + tail) <= width_px else "\u2026"


def _default_names(images: Sequence[Any]) -> list[str | None]:
    return [Path(x).name if isinstance(x, (str, os.PathLike)) else None for x in images]


def font_file() -> str | None:
    """DejaVu Sans as matplotlib bundles it (found without importing matplotlib), or None. PIL's
    own default font has ASCII glyphs only: 'Zürich' or 'café' came out with boxes. DejaVu covers
    the Latin, Greek and Cyrillic scripts (not CJK, which draws as boxes still)."""
    import importlib.util

    spec = importlib.util.find_spec("matplotlib")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "mpl-data", "fonts", "ttf", "DejaVuSans.ttf")
        if os.path.isfile(path):
            return path
    return None


def _font(size: int):
    from PIL import ImageFont

    path = font_file()
    if path is not None:
        return ImageFont.truetype(path, size)
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def write_contact_sheet(
    images: Sequence[Any],
    path: str | os.PathLike,
    title: str = "",
    thumb: int = DEFAULT_THUMB,
    cols: int = 8,
    max_pixels: int | None = None,
    names: Sequence[str | None] | None = None,
) -> ContactSheet:
    """Write a PNG grid of thumbnails with a title band above it, atomically.

    Args:
        images: file paths, PIL images, uint8 arrays or encoded image bytes, in grid order
            (row-major). May be empty (a sheet with the title only).
        path: the PNG to write (parent directories are created).
        title: text above the grid, wrapped to the sheet width.
        thumb: each tile is thumb x thumb pixels; images are scaled to fit, aspect kept, centred.
        names: the text under each tile (None entries: none); default: the file name of each
            image given as a path. Not drawn on tiles under MIN_NAMED_THUMB pixels.
        cols: tiles per row (fewer when there are fewer images).
        max_pixels: refuse images with more pixels than this (default: vlctl's decompression-bomb
            limit, PIL's).

    Returns:
        ContactSheet(path, n_images, size, unreadable) with unreadable = [(position, reason)].
    """
    from PIL import Image, ImageDraw

    from vlctl.images import DEFAULT_MAX_PIXELS

    if not isinstance(thumb, int) or thumb < 8:
        raise VlctlError(f"contact sheet: thumb must be an integer >= 8 pixels, got {thumb!r}")
    if not isinstance(cols, int) or cols < 1:
        raise VlctlError(f"contact sheet: cols must be a positive integer, got {cols!r}")
    images = list(images)
    names = _default_names(images) if names is None else [None if n is None else str(n) for n in names]
    if len(names) != len(images):
        raise VlctlError(f"contact sheet: {len(names)} names for {len(images)} images")
    n_cols = max(1, min(cols, len(images)))
    n_rows = -(-len(images) // n_cols)
    width = n_cols * thumb + (n_cols + 1) * _PAD
    font, name_font = _font(_TITLE_PT), _font(_NAME_PT)
    lines = _wrap(title, width - 2 * _PAD - 2, font.getlength) if title else []
    top = len(lines) * _TITLE_H + (_PAD if lines else 0)
    named = thumb >= MIN_NAMED_THUMB and any(names)
    pitch = thumb + (_NAME_H if named else 0) + _PAD  # one row of tiles (and names)
    height = top + n_rows * pitch + _PAD
    sheet = Image.new("RGB", (width, height), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    for i, line in enumerate(lines):
        draw.text((_PAD + 1, _PAD + i * _TITLE_H + 2), line, fill=(0, 0, 0), font=font)
    unreadable: list[tuple[int, str]] = []
    for i, item in enumerate(images):
        try:
            tile = _thumbnail(item, thumb, max_pixels or DEFAULT_MAX_PIXELS)
        except Exception as e:  # noqa: BLE001 -- any unreadable image is a marked tile, never a crash
            unreadable.append((i, str(e) or type(e).__name__))
            tile = _failed_tile(thumb)
        r, c = divmod(i, n_cols)
        x0 = _PAD + c * (thumb + _PAD) + (thumb - tile.size[0]) // 2
        y0 = top + _PAD + r * pitch + (thumb - tile.size[1]) // 2
        sheet.paste(tile, (x0, y0))
        if named and names[i]:
            label = _fit_name(names[i], thumb - 2, name_font.getlength)
            xl = _PAD + c * (thumb + _PAD) + (thumb - name_font.getlength(label)) / 2
            draw.text((xl, top + _PAD + r * pitch + thumb + 1), label, fill=(40, 40, 40), font=name_font)
    buf = io.BytesIO()
    sheet.save(buf, format="PNG", optimize=False)
    out = atomic_write_bytes(path, buf.getvalue())
    return ContactSheet(Path(out), len(images), (width, height), unreadable)

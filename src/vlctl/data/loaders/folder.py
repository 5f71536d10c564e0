"""Image folders and caption tables: OpenCLIP-style CSV / TSV (image path + caption per row), a
folder of images with optional CSV / TSV / JSONL annotations, Clevr-4's folder + JSON labels."""

from __future__ import annotations

import os
from pathlib import Path

from vlctl.data.loaders.common import (
    _SHOW,
    CAPTION_COLUMNS,
    IMAGE_COLUMNS,
    IMAGE_EXTENSIONS,
    ImageTextData,
    MissingImagesError,
    _build,
    _pick,
    _read_table,
)
from vlctl.fsops import VlctlError
from vlctl.io import gc_paused, read_json

# --------------------------------------------------------------------------------------------
# CSV / TSV of image path + caption (OpenCLIP's --csv-img-key / --csv-caption-key)


@gc_paused
def load_caption_table(
    path: str | os.PathLike,
    root: str | os.PathLike | None = None,
    image_column: str | None = None,
    caption_column: str | None = None,
    sep: str | None = None,
    on_missing: str = "error",
) -> ImageTextData:
    """A CSV (",") or TSV ("\\t", by extension .tsv) with a header: image path + caption per row.

    The form OpenCLIP trains from (`--csv-img-key filepath --csv-caption-key title`, tab-separated)
    and img2dataset writes. Columns are found by name (filepath/image/path/..., title/caption/text)
    unless given. Rows of the same image are grouped: one image, several captions. Relative paths
    are under `root` (default: the table's directory); absolute paths are kept.
    """
    path = Path(path)
    cols, rows = _read_table(path, sep)
    img_col = _pick(cols, image_column, IMAGE_COLUMNS, path, "image path")
    cap_col = _pick(cols, caption_column, CAPTION_COLUMNS, path, "caption")
    order: dict[str, list[str]] = {}
    for n, row in enumerate(rows, 2):
        img, cap = row.get(img_col), row.get(cap_col)
        if not img or cap is None:
            raise VlctlError(f"{path}:{n}: empty {img_col!r} or {cap_col!r}")
        order.setdefault(img, []).append(cap)
    return _build(
        str(path),
        root if root is not None else path.parent,
        ((img, caps, {}) for img, caps in order.items()),
        on_missing,
    )


# --------------------------------------------------------------------------------------------
# A generic image folder with optional captions / attributes


def list_images(root: str | os.PathLike) -> list[str]:
    """Image files under `root` (recursive, by extension), as sorted root-relative POSIX paths."""
    root = Path(root)
    if not root.is_dir():
        raise VlctlError(f"{root}: image directory not found")
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith(".")
    )


# Files an image folder collects beside its images: skipped and listed by name (`folder_extras`),
# so a user who counts the files sees where each went; any other non-image file is not listed.
_THUMBNAIL_CACHES = ("thumbs.db", "ehthumbs.db")


def folder_extras(root: str | os.PathLike) -> list[tuple[str, str]]:
    """(absolute path, reason) of the files under `root` that look like images but are not read:
    macOS '._' companions (AppleDouble metadata under an image's name) and hidden image files,
    Windows thumbnail caches (Thumbs.db). Sorted by path."""
    out = []
    for p in Path(root).rglob("*"):
        if not p.is_file():
            continue
        if p.name.lower() in _THUMBNAIL_CACHES:
            out.append((str(p.resolve()), f"{p.resolve()}: a Windows thumbnail cache, not an image; skipped"))
        elif p.name.startswith("._") and p.suffix.lower() in IMAGE_EXTENSIONS:
            out.append((str(p.resolve()), (f"{p.resolve()}: macOS metadata of {p.name[2:]} (an AppleDouble "
                                           "'._' file), not an image; skipped")))
        elif p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS:
            out.append((str(p.resolve()), f"{p.resolve()}: a hidden file; skipped"))
    return sorted(out)


@gc_paused
def load_image_folder(
    root: str | os.PathLike,
    annotations: str | os.PathLike | None = None,
    image_column: str | None = None,
    caption_column: str | None = None,
    on_missing: str = "error",
) -> ImageTextData:
    """Every image under `root`; with `annotations` (CSV, TSV or JSONL), their captions and attributes.

    Annotation rows name an image (column filepath/image/path/file/filename, relative to `root`)
    and optionally a caption (title/caption/text; in JSONL also a list of captions); every other
    column becomes an attribute in `image_fields` (e.g. {"color": "red", "mood": "calm"}).
    Images without a row are kept with no captions; rows naming a file that is not under `root`
    are the missing files (reported per `on_missing`).
    """
    root = Path(root)
    on_disk = list_images(root)
    if annotations is None:
        return _build(str(root), root, ((p, [], {}) for p in on_disk), on_missing)
    ann = Path(annotations)
    cols, rows = _read_table(ann)
    img_col = _pick(cols, image_column, IMAGE_COLUMNS, ann, "image path")
    try:
        cap_col: str | None = _pick(cols, caption_column, CAPTION_COLUMNS, ann, "caption")
    except VlctlError:
        if caption_column is not None:
            raise
        cap_col = None  # attributes only
    per_image: dict[str, tuple[list[str], dict]] = {}
    for n, row in enumerate(rows, 1):
        img = row.get(img_col)
        if not img or not isinstance(img, str):
            raise VlctlError(f"{ann}: row {n} has no {img_col!r}")
        caps, attrs = per_image.setdefault(img, ([], {}))
        if cap_col is not None and row.get(cap_col) not in (None, ""):
            c = row[cap_col]
            caps += c if isinstance(c, list) else [str(c)]
        for k, v in row.items():
            if k not in (img_col, cap_col):
                if k in attrs and attrs[k] != v:
                    raise VlctlError(f"{ann}: image {img!r} has two values for attribute {k!r}: {attrs[k]!r}, {v!r}")
                attrs[k] = v
    listed = [(img, caps, attrs) for img, (caps, attrs) in per_image.items()]
    gone = [img for img, _, _ in listed if not (root / img).is_file()]
    if gone and on_missing == "error":
        shown = ", ".join(gone[:_SHOW]) + (f", ... ({len(gone) - _SHOW} more)" if len(gone) > _SHOW else "")
        raise MissingImagesError(
            f"{ann}: {len(gone)} of the {len(listed)} images it names are not in {root.resolve()} (its paths are "
            f"relative to that folder: {gone[0]!r} was looked for at {(root / gone[0]).resolve()}): {shown}; the "
            f"image column is {img_col!r}"
        )
    rest = [(p, [], {}) for p in on_disk if p not in per_image]
    return _build(f"{root} + {ann}", root, listed + rest, on_missing)


@gc_paused
def load_clevr4(
    root: str | os.PathLike, split: str | None = None, check_images: bool = True, on_missing: str = "error"
) -> ImageTextData:
    """Clevr-4 (the 10k or 100k release): ROOT/clevr_4_annots.json + ROOT/images/<name>.png.

    The annotation file maps each image name to its labels ({"split", "color", "shape",
    "texture", "count", ...}); every field is kept in `image_fields`, so each taxonomy is a
    column. `split` selects "train" / "val" (None = all). Images are sorted by name, as the
    multi-clustering code that ships with the data does. No captions.
    """
    root = Path(root)
    ann = root / "clevr_4_annots.json"
    doc = read_json(ann, "Clevr-4 annotations")
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise VlctlError(f"{ann}: expected an object of image name -> labels (Clevr-4 format)")
    if split is not None:
        splits = sorted({str(v.get("split")) for v in doc.values()})
        if split not in splits:
            raise VlctlError(f"{ann}: no images in split {split!r}; the file has splits {splits}")
    # Names are written without the extension in the release and with it by `vlctl data shapes`
    # ("shapes_train_000000.png"); both name images/<name>[.png].
    rows = (
        (f"images/{name}" if name.lower().endswith(IMAGE_EXTENSIONS) else f"images/{name}.png", [], dict(doc[name]))
        for name in sorted(doc)
        if split is None or doc[name].get("split") == split
    )
    return _build(f"{ann}:{split}" if split else str(ann), root if check_images else None, rows, on_missing)



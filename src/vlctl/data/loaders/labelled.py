"""Labelled images, one label per attribute (multi-clustering benchmarks, ControlEmbed):
`LabelledImages`, Stanford 40 Actions (+ location / mood labels), ShotBench."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.data.loaders.common import (
    _SHOW,
    IMAGE_EXTENSIONS,
    _check_files,
    _pick,
    _read_table,
)
from vlctl.fsops import VlctlError
from vlctl.io import gc_paused, read_json, read_text_utf8


@dataclasses.dataclass(frozen=True)
class LabelledImages:
    """Images with a label per attribute, e.g. Stanford 40 Actions' action / location / mood.

    Attributes:
        name: where it came from.
        root: the directory image paths are relative to (None: not checked).
        images: (n_images,) image paths relative to `root` as the source writes them, or keys
            "embedded:<sha256 prefix>" of images stored inside the annotation file (in `embedded`).
        labels: {attribute: (n_images,) label text, or None where the image has no label for it}.
        image_fields: (n_images,) dicts of other per-image fields (split, source rows, ...).
        missing: image paths dropped because they were not under `root` (on_missing="skip").
        embedded: {key: encoded image bytes} for the "embedded:" images.
        skipped: source rows left out, each with the reason (e.g. ShotBench's video questions).

    `label_indices(attribute)` gives the integer labels ControlEmbed.fit / cluster_accuracy take.
    """

    name: str
    root: Path | None
    images: list[str]
    labels: dict[str, list[str | None]]
    image_fields: list[dict]
    missing: list[str] = dataclasses.field(default_factory=list)
    embedded: dict[str, bytes] = dataclasses.field(default_factory=dict)
    skipped: list[str] = dataclasses.field(default_factory=list)

    @property
    def n_images(self) -> int:
        return len(self.images)

    @property
    def attributes(self) -> list[str]:
        return list(self.labels)

    def label_indices(self, attribute: str) -> tuple[list[str], np.ndarray]:
        """(sorted distinct labels, (n_images,) int64 index into them; -1 = no label)."""
        if attribute not in self.labels:
            raise VlctlError(f"{self.name}: no attribute {attribute!r}; attributes are {self.attributes}")
        values = sorted({v for v in self.labels[attribute] if v is not None})
        pos = {v: i for i, v in enumerate(values)}
        return values, np.array([pos.get(v, -1) for v in self.labels[attribute]], dtype=np.int64)

    def image_source(self, i: int) -> Path | bytes:
        """Image i as a file path (root-relative paths joined to `root`) or its embedded bytes."""
        key = self.images[i]
        if key in self.embedded:
            return self.embedded[key]
        if self.root is None:
            raise VlctlError(f"{self.name}: loaded without an image root; pass root= to read images")
        return self.root / key

    def read_image(self, i: int, max_pixels: int | None = None):
        """Image i decoded as an RGB PIL image (vlctl.embeddings.extract.read_image: bombs refused)."""
        import io

        from vlctl.images import DEFAULT_MAX_PIXELS, read_image

        src = self.image_source(i)
        return read_image(io.BytesIO(src) if isinstance(src, bytes) else src, max_pixels or DEFAULT_MAX_PIXELS)

    def write_images(self, out_dir: str | os.PathLike) -> list[Path]:
        """Write the embedded images as files <out_dir>/<sha256 prefix>.<ext> (for `vlctl index`);
        returns one path per image (file images: their own path)."""
        from vlctl.io import atomic_write_bytes

        out_dir = Path(out_dir)
        paths = []
        for i, key in enumerate(self.images):
            if key in self.embedded:
                data = self.embedded[key]
                p = out_dir / f"{key.removeprefix('embedded:')}.{_image_ext(data) or 'bin'}"
                if not p.is_file():
                    atomic_write_bytes(p, data)
                paths.append(p)
            else:
                paths.append(Path(self.image_source(i)))
        return paths


def _image_ext(data: bytes) -> str | None:
    """File extension of encoded image bytes from their magic number, None if not an image."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tif"
    return None



# --------------------------------------------------------------------------------------------
# Stanford 40 Actions (+ the location / mood labels of the multi-clustering literature)

STANFORD40_SPLITS = ("train", "test")
_LABEL_IMAGE_COLUMNS = ("image", "image_name", "filename", "file", "name", "filepath", "path", "img", "image_path")


def stanford40_action(image_name: str) -> str:
    """The action of a Stanford 40 image from its file name: "blowing_bubbles_012.jpg" -> "blowing_bubbles"."""
    stem = Path(image_name).name.rsplit(".", 1)[0]
    action, sep, number = stem.rpartition("_")
    if not sep or not action or not number.isdigit():
        raise VlctlError(f"{image_name!r}: not a Stanford 40 image name (<action>_<number>.jpg)")
    return action


def _read_attribute_labels(path: Path) -> dict[str, dict[str, str]]:
    """A label file -> {image file name: {attribute: value}} (see load_stanford40 for the formats)."""
    if path.suffix.lower() == ".json":
        doc = read_json(path, "label file")
        if isinstance(doc, dict) and all(isinstance(v, dict) for v in doc.values()):
            rows = [{"image": k, **v} for k, v in doc.items()]
        elif isinstance(doc, list) and all(isinstance(v, dict) for v in doc):
            rows = doc
        else:
            raise VlctlError(f"{path}: expected {{image: {{attribute: value}}}} or [{{image, attribute: value}}]")
        cols = list(dict.fromkeys(k for r in rows for k in r))
    else:
        cols, rows = _read_table(path)
    img_col = _pick(cols, None, _LABEL_IMAGE_COLUMNS, path, "image name")
    if len(cols) < 2:
        raise VlctlError(f"{path}: no attribute columns besides {img_col!r} (expected e.g. action, location, mood)")
    out: dict[str, dict[str, str]] = {}
    for n, row in enumerate(rows, 1):
        img = row.get(img_col)
        if not isinstance(img, str) or not img.strip():
            raise VlctlError(f"{path}: row {n} has no {img_col!r}")
        key = Path(img.strip()).name  # "JPEGImages/x.jpg" and "x.jpg" name the same image
        attrs = {k: str(v).strip() for k, v in row.items() if k != img_col and v is not None and str(v).strip()}
        old = out.setdefault(key, {})
        for k, v in attrs.items():
            if k in old and old[k] != v:
                raise VlctlError(f"{path}: row {n}: image {key!r} has two values for {k!r}: {old[k]!r}, {v!r}")
            old[k] = v
    return out


@gc_paused
def load_stanford40(
    root: str | os.PathLike,
    split: str | None = "test",
    labels: str | os.PathLike | None = None,
    on_missing: str = "error",
    check_images: bool = True,
) -> LabelledImages:
    """Stanford 40 Actions in its upstream layout, with optional extra attribute labels.

    Layout (as downloaded): ROOT/JPEGImages/<action>_<nnn>.jpg, ROOT/ImageSplits/train.txt and
    test.txt (one image file name a line), ROOT/ImageSplits/actions.txt (header
    "action_name number_of_images", then one action a line). `split` is "train", "test" or None
    (both, train first). The action of an image is its file-name prefix ("applauding_001.jpg" ->
    "applauding"); with actions.txt present, every action must be listed there.

    `labels`: the location / mood (or any other) labels of the multi-clustering benchmarks, in
    one of these forms (the image named by its file name; a path's directories are ignored):
      - CSV / TSV / JSONL with a header: image,action,location,mood (the image column may also be
        called image_name, filename, file, name, path; any other column is another attribute);
      - JSON {"applauding_001.jpg": {"location": "...", "mood": "..."}, ...} or a list of objects.
    An "action" column, if present, must agree with the file name. Images of the split that the
    label file does not cover get None for its attributes; label rows of other images (the other
    split) are ignored.

    Returns LabelledImages with labels {"action", + the label file's attributes}, image_fields
    {"split"}, images "JPEGImages/<name>".
    """
    root = Path(root)
    splits_dir = root / "ImageSplits"
    if split is not None and split not in STANFORD40_SPLITS:
        raise VlctlError(f"Stanford 40 split must be one of {STANFORD40_SPLITS} or None (both), got {split!r}")
    names: list[tuple[str, str]] = []
    for s in STANFORD40_SPLITS if split is None else (split,):
        f = splits_dir / f"{s}.txt"
        if not f.is_file():
            raise VlctlError(f"{f}: Stanford 40 split file not found (expected ROOT/ImageSplits/{s}.txt)")
        for n, line in enumerate(read_text_utf8(f, "Stanford 40 split file").splitlines(), 1):
            if line.strip():
                name = line.strip()
                try:
                    stanford40_action(name)
                except VlctlError as e:
                    raise VlctlError(f"{f}:{n}: {e}") from None
                names.append((name, s))
    if len({n for n, _ in names}) != len(names):
        raise VlctlError(f"{splits_dir}: an image is listed twice in the split files")
    actions_file = splits_dir / "actions.txt"
    if actions_file.is_file():
        known = {ln.split()[0] for ln in read_text_utf8(actions_file, "actions file").splitlines()[1:] if ln.strip()}
        unknown = sorted({stanford40_action(n) for n, _ in names} - known)
        if unknown:
            raise VlctlError(f"{actions_file}: actions {unknown[:_SHOW]} of the split files are not listed there")
    extra = _read_attribute_labels(Path(labels)) if labels is not None else {}
    attributes = ["action"] + [a for a in dict.fromkeys(k for v in extra.values() for k in v) if a != "action"]
    name = f"{root}:{split}" if split else str(root)
    gone = set(_check_files(name, root if check_images else None, [f"JPEGImages/{n}" for n, _ in names], on_missing))
    images, fields, per_attr = [], [], {a: [] for a in attributes}
    for img, s in names:
        rel = f"JPEGImages/{img}"
        if rel in gone:
            continue
        action = stanford40_action(img)
        given = extra.get(img, {})
        if "action" in given and given["action"] != action:
            raise VlctlError(f"{labels}: image {img!r} has action {given['action']!r}, its file name says {action!r}")
        images.append(rel)
        fields.append({"split": s})
        per_attr["action"].append(action)
        for a in attributes[1:]:
            per_attr[a].append(given.get(a))
    return LabelledImages(name, root if check_images else None, images, per_attr, fields, sorted(gone))


# --------------------------------------------------------------------------------------------
# ShotBench: cinematography multiple-choice questions; the correct option's text is the label


def _literal(text: str) -> Any:
    """JSON, else a Python literal (ShotBench's own reader does the same)."""
    import ast

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def _read_tsv_big(path: Path) -> tuple[list[str], list[dict]]:
    """A TSV whose cells may hold whole base64 images (beyond csv's 128 KiB default field limit)."""
    import sys

    if not path.is_file():
        raise VlctlError(f"{path}: file not found")
    old = csv.field_size_limit()
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        with io.StringIO(read_text_utf8(path, "TSV file"), newline="") as f:
            reader = csv.DictReader(f, delimiter="\t")
            if not reader.fieldnames:
                raise VlctlError(f"{path}: empty file (no header row)")
            rows = []
            for row in reader:
                if None in row:
                    raise VlctlError(f"{path}:{reader.line_num}: more fields than the header's {len(reader.fieldnames)}")
                rows.append(row)
            return list(reader.fieldnames), rows
    except csv.Error as e:
        raise VlctlError(f"{path}: not a readable TSV ({e})") from None
    finally:
        csv.field_size_limit(old)


def _decode_embedded(value: str) -> bytes | None:
    """base64 image bytes in a cell, or None if the cell is not a base64-encoded image."""
    import base64
    import binascii

    if len(value) < 64:
        return None
    try:
        data = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if _image_ext(data) else None


@gc_paused
def load_shotbench(
    path: str | os.PathLike, root: str | os.PathLike | None = None, on_missing: str = "error"
) -> LabelledImages:
    """ShotBench's `test.tsv` -> images labelled per cinematography category.

    Each row is one multiple-choice question about a shot: columns `category` (e.g. "shot
    size", "camera angle"), `answer` (the correct option's letter), the options either as one
    `options` column holding a dict {"A": "close-up", ...} (JSON or a Python literal, ShotBench's
    form) or as one column per letter A, B, C, ... (MMBench's form), and the image as
      - `path` (ShotBench: a list literal of paths, with `type` the matching list of "image" /
        "video"; or one path), relative to `root` (default: the TSV's directory), or
      - `image_path`, or
      - `image` (MMBench / VLMEvalKit TSVs): the base64-encoded image, or the `index` of another
        row whose image it shares, or a path.
    The label of the row's image for its category is the TEXT of the correct option (category
    "shot size", answer "B", options {"B": "close-up"} -> "close-up"). Rows about videos only
    (ShotBench's camera-movement clips) are left out and listed in `skipped`. An image asked
    about twice in one category with different correct answers gets no label for it (None; the
    category is listed in its image_fields["conflicts"]).

    Raises:
        VlctlError naming the file, the row (TSV line) and the column: a missing column, options
        that do not parse, an answer that is not one of the options, an unreadable image cell;
        missing image files per `on_missing` (how many, which, the root).
    """
    path = Path(path)
    cols, rows = _read_tsv_big(path)
    for c in ("category", "answer"):
        if c not in cols:
            raise VlctlError(f"{path}: no column {c!r} (ShotBench columns: index, category, question, options, "
                             f"answer, type, path); columns are {cols}")
    letters = [c for c in cols if len(c) == 1 and c.isupper()]
    if "options" not in cols and not letters:
        raise VlctlError(f"{path}: no 'options' column and no option columns A, B, C, ...; columns are {cols}")
    image_col = next((c for c in ("path", "image_path", "image") if c in cols), None)
    if image_col is None:
        raise VlctlError(f"{path}: no image column ('path', 'image_path' or 'image'); columns are {cols}")
    root_path = Path(root) if root is not None else path.parent
    index_of_row = {str(r.get("index", i)).strip(): i for i, r in enumerate(rows)}

    per_image: dict[str, tuple[dict, dict]] = {}  # key -> (labels, fields)
    embedded: dict[str, bytes] = {}
    skipped: list[str] = []
    row_images: list[list[str] | None] = [None] * len(rows)

    def images_of(i: int, line: int, seen: tuple[int, ...] = ()) -> list[str]:
        if row_images[i] is not None:
            return row_images[i]
        row = rows[i]
        cell = (row.get(image_col) or "").strip()
        if not cell:
            raise VlctlError(f"{path}:{line}: empty {image_col!r} cell")
        if image_col == "path":
            paths = _literal(cell) if cell[:1] in "[(" else [cell]
            types = None
            if "type" in cols and (row.get("type") or "").strip():
                t = row["type"].strip()
                types = _literal(t) if t[:1] in "[(" else [t] * len(paths)
            if not isinstance(paths, (list, tuple)) or (types is not None and len(types) != len(paths)):
                raise VlctlError(f"{path}:{line}: columns 'path' / 'type' must be lists of equal length")
            keys = [str(p) for k, p in enumerate(paths)
                    if (types[k] == "image" if types is not None else Path(str(p)).suffix.lower() in IMAGE_EXTENSIONS)]
        elif image_col == "image_path":
            keys = [cell]
        else:
            data = _decode_embedded(cell)
            if data is not None:
                from vlctl.io import sha256_bytes

                key = f"embedded:{sha256_bytes(data)[:16]}"
                embedded[key] = data
                keys = [key]
            elif cell.isdigit() and cell in index_of_row and index_of_row[cell] != i:
                j = index_of_row[cell]  # MMBench: the image of the row with this index
                if j in seen:
                    raise VlctlError(f"{path}:{line}: column 'image' refers to rows in a cycle")
                keys = images_of(j, j + 2, (*seen, i))
            elif Path(cell).suffix.lower() in IMAGE_EXTENSIONS:
                keys = [cell]
            else:
                raise VlctlError(f"{path}:{line}: column 'image' holds neither a base64-encoded image, nor the "
                                 "index of another row, nor an image path")
        row_images[i] = keys
        return keys

    for i, row in enumerate(rows):
        line = i + 2  # the header is line 1 (cells with newlines would shift this; ShotBench has none)
        try:
            if "options" in cols:
                opts = _literal((row.get("options") or "").strip())
            else:
                opts = {c: row[c] for c in letters if row.get(c) not in (None, "")}
        except (ValueError, SyntaxError) as e:
            raise VlctlError(f"{path}:{line}: column 'options' is not a dict literal ({type(e).__name__})") from None
        if not isinstance(opts, dict) or not opts:
            raise VlctlError(f"{path}:{line}: column 'options' must be a non-empty dict of letter -> option text")
        answer = (row.get("answer") or "").strip()
        letter = answer if answer in opts else answer[:1] if answer[:1] in opts and answer[1:2] in ("", ".", ")", " ") else None
        if letter is None:
            raise VlctlError(f"{path}:{line}: column 'answer' is {answer!r}, not one of the options {sorted(opts)}")
        category = (row.get("category") or "").strip()
        if not category:
            raise VlctlError(f"{path}:{line}: empty 'category' cell")
        keys = images_of(i, line)
        if not keys:
            skipped.append(f"row {row.get('index', i)} (line {line}): {category!r} question about a video, not an image")
            continue
        label = str(opts[letter]).strip()
        for key in keys:
            labels, fields = per_image.setdefault(key, ({}, {"rows": []}))
            fields["rows"].append(row.get("index", str(i)))
            if category in labels and labels[category] != label:
                labels[category] = None
                fields.setdefault("conflicts", []).append(category)
            elif category not in fields.get("conflicts", ()):
                labels[category] = label
    files = [k for k in per_image if k not in embedded]
    gone = set(_check_files(str(path), root_path, files, on_missing))
    keys = [k for k in per_image if k not in gone]
    categories = list(dict.fromkeys(c for k in keys for c in per_image[k][0]))
    labels = {c: [per_image[k][0].get(c) for k in keys] for c in categories}
    return LabelledImages(str(path), root_path, keys, labels, [per_image[k][1] for k in keys], sorted(gone),
                          {k: embedded[k] for k in keys if k in embedded}, skipped)

"""Loaders for image-text data in the formats it is published in, read unchanged.

Every loader returns an `ImageTextData`: unique images (paths relative to `root`, as the file
writes them), all captions in file order, `image_of_text` mapping each caption to its image (the
array `vlctl.eval.metrics.recall_at_k` takes), and per-image fields (split, ids, attributes).

    load_karpathy("dataset_coco.json", split="test", root="coco/")      Karpathy COCO / Flickr30k
    load_karpathy("coco_karpathy_test.json", root="coco/")              [{image, caption: [...]}]
    load_caption_table("train.tsv", root="imgs/")                       OpenCLIP-style CSV / TSV
    load_image_folder("photos/", annotations="labels.csv")              a folder + CSV/JSONL
    load_clevr4("clevr_4_10k_v1/", split="val")                         Clevr-4 taxonomies per image
    load_sugarcrepe("replace_att.json"), load_vl_checklist("x.json")    (image, positive, negative)
    load_aro("visual_genome_relation.json")                             the same, with ARO's bbox crop
    load_rococo("same_concept.json")                                    5 original + 5 altered
    load_long_captions("iiw_docci_test.jsonl", field="DOCCI")           IIW / DOCCI descriptions
    iter_webdataset("shards/{00000..00031}.tar")                        img2dataset tar shards, streamed

Missing images: with `root` given, every image path is checked. `on_missing="error"` (default)
raises a VlctlError saying how many are missing, which ones (the first 10) and the root looked in;
"skip" drops them (and their captions) and records them in `.missing`; `root=None` loads the
text only, without checking (caption-only uses: trees, negatives, text embeddings).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.io import VlctlError, read_json

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
ON_MISSING = ("error", "skip")
_SHOW = 10  # missing files named in an error message


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


def _build(
    name: str, root: str | os.PathLike | None, per_image: Iterable[tuple[str, Sequence[str], dict]], on_missing: str
) -> ImageTextData:
    """Assemble an ImageTextData from (image path, captions, fields) per image, checking files."""
    if on_missing not in ON_MISSING:
        raise VlctlError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
    rows = list(per_image)
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
            raise VlctlError(
                f"{name}: {len(missing)} of {len(rows)} image files not found under {root_path.resolve()}: "
                f"{shown} (pass on_missing='skip' / --skip-missing to drop them)"
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
# Karpathy splits (COCO, Flickr30k) and the [{image, caption}] form


def load_karpathy(
    path: str | os.PathLike,
    split: str | None = "test",
    root: str | os.PathLike | None = None,
    on_missing: str = "error",
) -> ImageTextData:
    """COCO / Flickr30k Karpathy splits; every caption is kept (5, sometimes 6 or 7, per image).

    Accepts both published forms:
      - Karpathy's `dataset_coco.json` / `dataset_flickr30k.json`: {"images": [{"filepath"
        (COCO only), "filename", "split", "sentences": [{"raw", ...}], "imgid", "cocoid"?}],
        "dataset"}. `split` selects "train" / "val" / "test" / "restval" (None = all).
      - the `[{"image": "val2014/....jpg", "caption": [...]}]` list (BLIP / CLIP_benchmark /
        RoCOCO), which is one split already; `split` is ignored.
    Image paths: "filepath/filename" (COCO) or "filename" (Flickr30k), or "image" as written.
    """
    path = Path(path)
    doc = read_json(path, "Karpathy split JSON")
    if isinstance(doc, list):

        def rows_list():
            for i, item in enumerate(doc):
                if not isinstance(item, dict) or "image" not in item or "caption" not in item:
                    raise VlctlError(f"{path}: item {i} must be an object with 'image' and 'caption'")
                caps = item["caption"]
                caps = [caps] if isinstance(caps, str) else _check_caption_list(caps, f"{path}: item {i}")
                yield item["image"], caps, {}

        return _build(str(path), root, rows_list(), on_missing)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise VlctlError(f"{path}: not a Karpathy split file (expected a list, or an object with an 'images' list)")

    def rows_karpathy():
        for i, im in enumerate(doc["images"]):
            try:
                if split is not None and im["split"] != split:
                    continue
                rel = f"{im['filepath']}/{im['filename']}" if im.get("filepath") else im["filename"]
                caps = [s["raw"] for s in im["sentences"]]
            except (KeyError, TypeError) as e:
                raise VlctlError(
                    f"{path}: images[{i}] lacks field {e} (Karpathy format: filename, split, sentences[].raw)"
                ) from None
            fields = {"split": im["split"]}
            for k in ("imgid", "cocoid", "sentids"):
                if k in im:
                    fields[k] = im[k]
            yield rel, caps, fields

    name = f"{path}:{split}" if split else str(path)
    data = _build(name, root, rows_karpathy(), on_missing)
    if not data.images and not data.missing:
        splits = sorted({im.get("split") for im in doc["images"] if isinstance(im, dict)}, key=str)
        raise VlctlError(f"{path}: no images in split {split!r}; the file has splits {splits}")
    return data


# --------------------------------------------------------------------------------------------
# CSV / TSV of image path + caption (OpenCLIP's --csv-img-key / --csv-caption-key)


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
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
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
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=_sniff_sep(path, sep))
        if not reader.fieldnames:
            raise VlctlError(f"{path}: empty file (no header row)")
        rows = []
        for n, row in enumerate(reader, 2):
            if None in row:
                raise VlctlError(f"{path}:{n}: more fields than the header's {len(reader.fieldnames)}")
            rows.append(row)
        return list(reader.fieldnames), rows


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
    rest = [(p, [], {}) for p in on_disk if p not in per_image]
    return _build(f"{root} + {ann}", root, listed + rest, on_missing)


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
    rows = (
        (f"images/{name}.png", [], dict(doc[name]))
        for name in sorted(doc)
        if split is None or doc[name].get("split") == split
    )
    return _build(f"{ann}:{split}" if split else str(ann), root if check_images else None, rows, on_missing)


# --------------------------------------------------------------------------------------------
# Compositionality benchmarks: one image, a positive and a negative caption


@dataclasses.dataclass(frozen=True)
class ContrastItem:
    """One test item: the image, the true caption(s) and the false one(s).

    box: (left, top, right, bottom) pixels to crop the image to before embedding (ARO's VG
    items: the region holding the relation / attribute), None = the whole image.
    label: the item's category (ARO: the relation name or the attributes).
    """

    image: str
    positives: list[str]
    negatives: list[str]
    id: str = ""
    box: tuple[float, float, float, float] | None = None
    label: str = ""


def _check_roots(
    items: list[ContrastItem], name: str, root: str | os.PathLike | None, on_missing: str
) -> tuple[list[ContrastItem], list[str]]:
    if root is None:
        return items, []
    data = _build(name, root, ((im, [], {}) for im in dict.fromkeys(it.image for it in items)), on_missing)
    gone = set(data.missing)
    return [it for it in items if it.image not in gone], data.missing


def load_sugarcrepe(
    path: str | os.PathLike, root: str | os.PathLike | None = None, on_missing: str = "error"
) -> tuple[list[ContrastItem], list[str]]:
    """SugarCrepe: {id: {"filename", "caption", "negative_caption"}} -> (items, missing images)."""
    path = Path(path)
    doc = read_json(path, "SugarCrepe JSON")
    if not isinstance(doc, dict):
        raise VlctlError(f"{path}: expected an object of id -> item (SugarCrepe format)")
    items = []
    for k, v in doc.items():
        try:
            items.append(ContrastItem(v["filename"], [v["caption"]], [v["negative_caption"]], str(k)))
        except (KeyError, TypeError) as e:
            raise VlctlError(f"{path}: item {k!r} lacks field {e} (filename, caption, negative_caption)") from None
    return _check_roots(items, str(path), root, on_missing)


def load_vl_checklist(
    path: str | os.PathLike, root: str | os.PathLike | None = None, on_missing: str = "error"
) -> tuple[list[ContrastItem], list[str]]:
    """VL-CheckList data file: [[image_path, {"POS": [...], "NEG": [...]}], ...]."""
    path = Path(path)
    doc = read_json(path, "VL-CheckList JSON")
    if not isinstance(doc, list):
        raise VlctlError(f"{path}: expected a list of [image, {{POS, NEG}}] (VL-CheckList format)")
    items = []
    for i, entry in enumerate(doc):
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[1], dict)
            and "POS" in entry[1]
            and "NEG" in entry[1]
        ):
            raise VlctlError(f"{path}: item {i} is not [image_path, {{'POS': [...], 'NEG': [...]}}]")
        items.append(ContrastItem(entry[0], list(entry[1]["POS"]), list(entry[1]["NEG"]), str(i)))
    return _check_roots(items, str(path), root, on_missing)


def load_vl_checklist_corpus(
    corpus: str | os.PathLike, image_root: str | os.PathLike | None = None, on_missing: str = "error"
) -> dict[str, tuple[list[ContrastItem], list[str]]]:
    """VL-CheckList through its corpus yaml files, as its own evaluator reads them.

    corpus: one yaml (e.g. `corpus/v1/Attribute/color/vg.yaml`: `ANNO_PATH: "data/Attribute/vg/color.json"`,
        `IMG_ROOT: "vg"`, `TYPE: "TUPLE_JSON"`) or a folder searched recursively for *.yaml.
        ANNO_PATH is relative to the VL-CheckList checkout, the folder holding `corpus/`.
    image_root: where the image datasets are; IMG_ROOT is resolved under it (default: under the
        checkout). Every item's image is checked there; missing ones raise (on_missing="error",
        naming how many, which and the root) or are dropped and listed (on_missing="skip").
    returns {corpus name, e.g. "Attribute/color/vg": (items, missing images)}.
    """
    import yaml

    corpus = Path(corpus)
    files = sorted(corpus.rglob("*.yaml")) if corpus.is_dir() else [corpus]
    if not files:
        raise VlctlError(f"{corpus}: no VL-CheckList corpus yaml files found")
    out = {}
    for f in files:
        parts = f.resolve().parts
        if "corpus" not in parts:
            raise VlctlError(f"{f}: a VL-CheckList corpus yaml must lie under a 'corpus/' folder of the checkout")
        i = len(parts) - 1 - parts[::-1].index("corpus")
        checkout, name = Path(*parts[:i]), "/".join(parts[i + 1 :])[: -len(".yaml")]
        name = name.removeprefix("v1/")
        try:
            spec = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise VlctlError(f"{f}: unreadable corpus yaml ({e})") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("ANNO_PATH"), str):
            raise VlctlError(f"{f}: field ANNO_PATH missing (expected ANNO_PATH, IMG_ROOT, TYPE)")
        if spec.get("TYPE", "TUPLE_JSON") != "TUPLE_JSON":
            raise VlctlError(f"{f}: field TYPE is {spec['TYPE']!r}; only TUPLE_JSON exists in VL-CheckList")
        img_root = Path(image_root if image_root is not None else checkout) / str(spec.get("IMG_ROOT", ""))
        out[name] = load_vl_checklist(checkout / spec["ANNO_PATH"], root=img_root, on_missing=on_missing)
    return out


def load_aro(
    path: str | os.PathLike, root: str | os.PathLike | None = None, on_missing: str = "error"
) -> tuple[list[ContrastItem], list[str]]:
    """ARO's VG-Relation (`visual_genome_relation.json`) or VG-Attribution
    (`visual_genome_attribution.json`): [{"image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h",
    "true_caption", "false_caption", "relation_name" | "attributes"}].

    Each item's `box` is the crop ARO evaluates on: (x, y, x + w, y + h), as in ARO's own
    dataset code (PIL's crop box). `label` is the relation name, or the attributes joined by " / ".
    """
    path = Path(path)
    doc = read_json(path, "ARO JSON")
    if not isinstance(doc, list):
        raise VlctlError(f"{path}: expected a list of items (ARO VG-Relation / VG-Attribution format)")
    items = []
    for i, it in enumerate(doc):
        try:
            x, y, w, h = (float(it[k]) for k in ("bbox_x", "bbox_y", "bbox_w", "bbox_h"))
            label = it["relation_name"] if "relation_name" in it else " / ".join(map(str, it["attributes"]))
            items.append(
                ContrastItem(
                    it["image_path"], [it["true_caption"]], [it["false_caption"]], str(i), (x, y, x + w, y + h), label
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise VlctlError(
                f"{path}: item {i} lacks or has a bad field {e} (image_path, bbox_x/y/w/h, "
                "true_caption, false_caption, relation_name or attributes)"
            ) from None
    return _check_roots(items, str(path), root, on_missing)


def load_rococo(
    path: str | os.PathLike, root: str | os.PathLike | None = None, on_missing: str = "error"
) -> tuple[ImageTextData, ImageTextData]:
    """RoCOCO: [{image, caption: [originals..., 5 altered]}] -> (original data, altered data).

    The last 5 captions are the altered ones (made from the first 5 originals); the rest are the
    COCO originals, usually 5 but 6 for the images that have 6 in COCO (seen in the shipped file:
    one item of 11). Both results share image order; recall with the altered captions in the
    pool measures robustness (report both).
    """
    path = Path(path)
    doc = read_json(path, "RoCOCO JSON")
    if not isinstance(doc, list):
        raise VlctlError(f"{path}: expected a list of {{image, caption}} (RoCOCO format)")
    for i, item in enumerate(doc):
        caps = _check_caption_list(item.get("caption") if isinstance(item, dict) else None, f"{path}: item {i}")
        if len(caps) < 10:
            raise VlctlError(
                f"{path}: item {i} has {len(caps)} captions; RoCOCO items have 5 (or 6) original + 5 altered"
            )
    original = _build(f"{path}:original", root, ((it["image"], it["caption"][:-5], {}) for it in doc), on_missing)
    altered = _build(f"{path}:altered", root, ((it["image"], it["caption"][-5:], {}) for it in doc), "skip")
    return original, altered


def load_long_captions(
    path: str | os.PathLike,
    field: str = "DOCCI",
    root: str | os.PathLike | None = None,
    image_field: str | None = None,
    on_missing: str = "error",
) -> ImageTextData:
    """Long descriptions, one JSON object a line: IIW / DOCCI ({"image", "IIW", "DOCCI"}; DOCCI's
    docci_descriptions.jsonlines {"image_file", "description", "split"}; IIW's data.jsonl)."""
    path = Path(path)
    cols, rows = _read_table(path)
    img_col = _pick(cols, image_field, ("image", "image_file", "image/key", "filename"), path, "image")
    if field not in cols:
        raise VlctlError(f"{path}: no field {field!r}; fields are {cols}")
    per = [
        (
            r[img_col],
            [r[field]] if isinstance(r[field], str) else list(r[field]),
            {k: v for k, v in r.items() if k in ("split", "example_id")},
        )
        for r in rows
        if r.get(field)
    ]
    return _build(f"{path}:{field}", root, per, on_missing)


# --------------------------------------------------------------------------------------------
# WebDataset tar shards (img2dataset's output), streamed


@dataclasses.dataclass(frozen=True)
class WebDatasetSample:
    """One sample of a WebDataset shard: the files sharing a key, e.g. 000000042.{jpg,txt,json}.

    image: the encoded image bytes (decode with `vlctl.index.extract.read_image(io.BytesIO(...))`),
    None if the sample has no image file; image_ext: "jpg" / "png" / "webp" ...; caption: the
    .txt file (UTF-8), None if absent; meta: the parsed .json file ({} if absent).
    """

    key: str
    shard: str
    image: bytes | None
    image_ext: str | None
    caption: str | None
    meta: dict


def expand_shards(spec: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Shard paths from a list, a glob ("data/*.tar") or WebDataset braces ("data/{00000..00031}.tar")."""
    import glob
    import re

    if isinstance(spec, (list, tuple)):
        return [Path(p) for p in spec]
    s = str(spec)
    m = re.search(r"\{(\d+)\.\.(\d+)\}", s)
    if m:
        lo, hi, width = int(m.group(1)), int(m.group(2)), len(m.group(1))
        return [p for i in range(lo, hi + 1) for p in expand_shards(s[: m.start()] + f"{i:0{width}d}" + s[m.end() :])]
    if any(c in s for c in "*?["):
        found = sorted(glob.glob(s))
        if not found:
            raise VlctlError(f"{s}: no WebDataset shards match this pattern")
        return [Path(p) for p in found]
    return [Path(s)]


def iter_webdataset(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> Iterator[WebDatasetSample]:
    """Stream the samples of WebDataset tar shards in order, one shard open at a time.

    WebDataset's convention: a sample is the run of consecutive tar members whose basenames share
    the part before the first "."; the rest is the extension ("jpg", "txt", "json"). Images are
    the first member with an image extension. Nothing is extracted to disk.

    Raises:
        VlctlError: a missing shard (all missing ones are named before any is read), a corrupt
        tar or .json member (naming the shard and member).
    """
    import tarfile

    paths = expand_shards(shards)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(missing[:_SHOW]) + (f", ... ({len(missing) - _SHOW} more)" if len(missing) > _SHOW else "")
        raise VlctlError(f"{len(missing)} of {len(paths)} WebDataset shards not found: {shown}")
    for shard in paths:
        current: str | None = None
        files: dict[str, bytes] = {}
        try:
            with tarfile.open(shard, mode="r|*") as tar:  # streaming: members in file order
                for member in tar:
                    if not member.isfile():
                        continue
                    base = member.name.rsplit("/", 1)
                    prefix = base[0] + "/" if len(base) == 2 else ""
                    stem, _, ext = base[-1].partition(".")
                    key = prefix + stem
                    if key != current:
                        if current is not None:
                            yield _wds_sample(current, shard, files)
                        current, files = key, {}
                    f = tar.extractfile(member)
                    files[ext.lower()] = f.read() if f is not None else b""
            if current is not None:
                yield _wds_sample(current, shard, files)
        except tarfile.TarError as e:
            raise VlctlError(f"{shard}: corrupt WebDataset shard after sample {current!r} ({e})") from None


def _wds_sample(key: str, shard: Path, files: dict[str, bytes]) -> WebDatasetSample:
    ext = next((e for e in files if "." + e in IMAGE_EXTENSIONS), None)
    meta: dict = {}
    if "json" in files:
        try:
            meta = json.loads(files["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise VlctlError(f"{shard}: member {key}.json is not valid JSON ({e})") from None
    caption = files["txt"].decode("utf-8", errors="replace").strip() if "txt" in files else None
    return WebDatasetSample(key, str(shard), files.get(ext) if ext else None, ext, caption, meta)


# --------------------------------------------------------------------------------------------
# Labelled images: one label per attribute (multi-clustering benchmarks, ControlEmbed)


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
        """Image i decoded as an RGB PIL image (vlctl.index.extract.read_image: bombs refused)."""
        import io

        from vlctl.index.extract import DEFAULT_MAX_PIXELS, read_image

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


def _check_files(name: str, root: str | os.PathLike | None, paths: Sequence[str], on_missing: str) -> list[str]:
    """The paths not under `root` (raising per on_missing = "error", with _build's message)."""
    if root is None:
        if on_missing not in ON_MISSING:
            raise VlctlError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
        return []
    return _build(name, root, ((p, [], {}) for p in dict.fromkeys(paths)), on_missing).missing


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
        for n, line in enumerate(f.read_text("utf-8").splitlines(), 1):
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
        known = {ln.split()[0] for ln in actions_file.read_text("utf-8").splitlines()[1:] if ln.strip()}
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
        with open(path, newline="", encoding="utf-8") as f:
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

"""Image-text retrieval sets: Karpathy COCO / Flickr30k (and the [{image, caption}] form),
RoCOCO (originals + altered captions), long descriptions (IIW / DOCCI)."""

from __future__ import annotations

import os
from pathlib import Path

from vlctl.data.loaders.common import (
    ImageTextData,
    _build,
    _check_caption_list,
    _pick,
    _read_table,
)
from vlctl.fsops import VlctlError
from vlctl.io import gc_paused, read_json

# --------------------------------------------------------------------------------------------
# Karpathy splits (COCO, Flickr30k) and the [{image, caption}] form


@gc_paused
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



@gc_paused
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


@gc_paused
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


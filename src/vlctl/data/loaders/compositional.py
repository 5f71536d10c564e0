"""Compositionality benchmarks: one image, a positive and a negative caption (SugarCrepe,
VL-CheckList and its corpus yaml files, ARO's VG-Relation / VG-Attribution)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from vlctl.data.loaders.common import (
    _build,
)
from vlctl.fsops import VlctlError
from vlctl.io import gc_paused, read_json, read_text_utf8


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


@gc_paused
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


@gc_paused
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


@gc_paused
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
            spec = yaml.safe_load(read_text_utf8(f, "corpus yaml"))
        except (OSError, yaml.YAMLError) as e:
            raise VlctlError(f"{f}: unreadable corpus yaml ({e})") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("ANNO_PATH"), str):
            raise VlctlError(f"{f}: field ANNO_PATH missing (expected ANNO_PATH, IMG_ROOT, TYPE)")
        if spec.get("TYPE", "TUPLE_JSON") != "TUPLE_JSON":
            raise VlctlError(f"{f}: field TYPE is {spec['TYPE']!r}; only TUPLE_JSON exists in VL-CheckList")
        img_root = Path(image_root if image_root is not None else checkout) / str(spec.get("IMG_ROOT", ""))
        out[name] = load_vl_checklist(checkout / spec["ANNO_PATH"], root=img_root, on_missing=on_missing)
    return out


@gc_paused
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



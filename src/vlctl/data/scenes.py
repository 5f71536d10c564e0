"""Compositional scenes: a procedural benchmark for attribute binding and spatial relations (3VL).

Every image holds 2 or 3 non-overlapping objects on a light gray background. An object has a
shape (SHAPES), a color (COLORS), a size (small / large) and a texture (plain, striped, dotted:
stripes and dots are painted in image coordinates, their period scales with the image side).
Objects are drawn on a supersampled grid and area-averaged, with a dark outline.

Captions come from one grammar, always naming every attribute of the named objects:

    NP     := "a" SIZE COLOR TEXTURE SHAPE            ("a large red striped circle")
    2 obj  := NP_a REL NP_b                           ("... left of a small blue square")
    3 obj  := NP_a REL NP_b "and" NP_c

REL in {"left of", "right of", "above", "below"} relates the two first-named objects a and b and
holds with a margin of RELATION_MARGIN x image side between their centres (x for left/right, y
for above/below). The objects a, b (and c) are a random order of the scene's objects; a relation
is picked among those that hold with the margin.

Truth of a caption (`caption_holds`): a caption's structure ({"nps": [attribute dicts], "rel":
REL or None}) holds for a scene when some one-to-one assignment of its noun phrases to the scene's
objects matches every named attribute and the relation holds between the objects assigned to
a and b *without* margin (any centre offset in the right direction). Positives are generated true
with the margin; a negative is kept only if it does not hold even without margin, so it is false
for the image however its noun phrases are matched.

Splits. A scene's configuration key is the multiset of its objects' attribute tuples plus the
captioned relation in canonical form ((left|above), first object, second object): "A right of B"
is "B left of A". The split of a configuration is a fixed function of its key: sha256 of the key
mapped to [0, 1) and cut by SPLIT_FRACTIONS (train 0.6, finetune 0.2, test 0.2). A split's
generator draws scenes and keeps those whose key falls in its split, so train, finetune and test
share no configuration by construction (`scene_key`, `split_of_key`).

VL-CheckList-style test files (`write_checklist`, one per CHECKLIST_CATEGORIES), each a JSON list
of [image_path, {"POS": [caption], "NEG": [negative]}], the negative changing one word:
  attribute_color / attribute_size / attribute_material (texture): one object's attribute;
  relation_spatial: the relation swapped (left <-> right, above <-> below);
  object: one object's shape noun replaced (VL-CheckList's Object category); items record the
      changed object's size (small / large) and location (center / margin, by the distance of
      its centre from the image centre), VL-CheckList's Object location / size subsets.
Beside each file `<category>.meta.json` lists per item the scene index, the changed noun phrase,
the word replaced and its replacement, and the replaced word's POS tag (ADJ for color, size and
texture; ADP for relations; NOUN for objects).

On disk (like vlctl.data.shapes, written with vlctl.data.imageset): images.npy (N, S, S, 3)
uint8, labels.jsonl (filename, split, objects, caption, structure, key) and meta.json (format
"vlctl-scenes"); the test split also holds images/<filename>.png and checklist/. `load_scenes`
validates a directory.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from pathlib import Path

import numpy as np

from vlctl.config import config_to_dict, opt, validate_config
from vlctl.data.imageset import (
    check_image_set,
    check_set_config,
    open_image_set_files,
    read_labels,
    write_image_set,
    write_pngs,
)
from vlctl.data.shapes import in_polygon  # the shapes set draws its polygons with the same test
from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_json, read_json, recover_dir, sha256_json

SHAPES = ("circle", "square", "triangle", "star", "cross")
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40), "green": (40, 160, 60), "blue": (45, 80, 220), "yellow": (235, 205, 30),
    "purple": (145, 55, 190),
}
SIZES = ("small", "large")
TEXTURES = ("plain", "striped", "dotted")
RELATIONS = ("left of", "right of", "above", "below")
OPPOSITE_RELATION = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
ATTRIBUTES = ("size", "color", "texture", "shape")  # caption order inside a noun phrase
VALUES: dict[str, tuple[str, ...]] = {"size": SIZES, "color": tuple(COLORS), "texture": TEXTURES, "shape": SHAPES}
SPLITS = ("train", "finetune", "test")
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)
CHECKLIST_CATEGORIES = ("attribute_color", "attribute_size", "attribute_material", "relation_spatial", "object")
CATEGORY_ATTRIBUTE = {"attribute_color": "color", "attribute_size": "size", "attribute_material": "texture",
                      "object": "shape"}
CATEGORY_POS = {"attribute_color": "ADJ", "attribute_size": "ADJ", "attribute_material": "ADJ",
                "relation_spatial": "ADP", "object": "NOUN"}
FORMAT = "vlctl-scenes"
FORMAT_VERSION = 1
SUPERSAMPLE = 4
BACKGROUND = 200.0
DIAMETER = {"small": 0.24, "large": 0.40}  # object diameter as a fraction of the image side
RELATION_MARGIN = 0.12  # centre offset (fraction of the side) a generated relation holds with
CENTER_RADIUS = 0.22  # 'center' location: centre within this distance (fraction of side) of the middle

# The domain table of opposites for tree negatives (TreeGenerator(opposites=...)): within each
# attribute every other value is an opposite; relations flip; "left"/"right" alone (spaCy may
# split "left of" and tag "left" as a verb) flip as well.
SCENE_OPPOSITES: dict[str, list[str]] = {
    **{v: [w for w in vals if w != v] for vals in VALUES.values() for v in vals},
    "left": ["right"], "right": ["left"], "above": ["below"], "below": ["above"],
}


def vocabulary() -> tuple[str, ...]:
    """Every word the grammar can produce (the word-level tokenizer's vocabulary), sorted."""
    words = {"a", "and", "of", "left", "right", "above", "below"}
    for vals in VALUES.values():
        words.update(vals)
    return tuple(sorted(words))


def tokenizer_vocabulary() -> tuple[str, ...]:
    """The grammar's words plus "or", which only 3VL's Anchor texts ("AP or AN") use."""
    return tuple(sorted({*vocabulary(), "or"}))


@dataclasses.dataclass(frozen=True)
class ScenesConfig:
    n: int = opt(10000, "number of images", ge=1, le=10**7)
    seed: int = opt(0, "random seed (>= 0); image i depends only on (seed, split, i)", ge=0, le=2**32 - 1)
    split: str = opt("train", "'train', 'finetune' or 'test' (configurations are disjoint across splits)",
                     choices=SPLITS)
    image_size: int = opt(32, "output image side in pixels (>= 24)", ge=24, le=1024)
    p_three: float = opt(0.4, "probability that a scene has 3 objects (else 2)", ge=0, le=1)
    workers: int = opt(2, "worker processes (the output does not depend on it)", ge=1, le=256)
    write_png: bool = opt(False, "also write images/<filename>.png (always on for the test split's checklist)")

    def __post_init__(self):
        check_set_config(self, SPLITS, 24)
        if not 0 <= self.p_three <= 1:
            raise VlctlError(f"ScenesConfig.p_three: must be in [0, 1], got {self.p_three}")
        validate_config(self)  # then every field in its declared range (the opt() above)


# --- scene keys and splits ---------------------------------------------------------------------


def _attr_tuple(obj: dict) -> tuple[str, ...]:
    return tuple(obj[a] for a in ATTRIBUTES)


def scene_key(objects: list[dict], structure: dict) -> str:
    """Canonical configuration key: sorted object attribute tuples + the canonical relation."""
    nps, rel = structure["nps"], structure["rel"]
    a, b = _attr_tuple(nps[0]), _attr_tuple(nps[1])
    if rel in ("right of", "below"):
        rel, a, b = OPPOSITE_RELATION[rel], b, a
    return json.dumps({"objects": sorted(_attr_tuple(o) for o in objects), "rel": [a, rel, b]}, sort_keys=True)


def split_of_key(key: str) -> str:
    """The split a configuration belongs to (sha256 of the key cut by SPLIT_FRACTIONS)."""
    u = int(sha256_json(key)[:13], 16) / 16**13
    edges = np.cumsum(SPLIT_FRACTIONS)
    return SPLITS[min(int(np.searchsorted(edges, u, side="right")), len(SPLITS) - 1)]


# --- captions and truth ------------------------------------------------------------------------


def noun_phrase(attrs: dict) -> str:
    return "a " + " ".join(attrs[a] for a in ATTRIBUTES)


def render_caption(structure: dict) -> str:
    """The caption of a structure {"nps": [attrs, ...], "rel": REL}."""
    nps = structure["nps"]
    text = f"{noun_phrase(nps[0])} {structure['rel']} {noun_phrase(nps[1])}"
    if len(nps) == 3:
        text += f" and {noun_phrase(nps[2])}"
    return text


def relation_holds(rel: str, a: dict, b: dict, margin: float = 0.0) -> bool:
    """Whether `a REL b` holds between object centres (cx, cy in [0, 1], y down) by > margin."""
    dx, dy = b["cx"] - a["cx"], b["cy"] - a["cy"]
    return {"left of": dx, "right of": -dx, "above": dy, "below": -dy}[rel] > margin


def caption_holds(structure: dict, objects: list[dict], margin: float = 0.0) -> bool:
    """True if some one-to-one assignment of the noun phrases to `objects` matches every named
    attribute and the relation between the first two (by more than `margin`)."""
    nps = structure["nps"]
    for perm in itertools.permutations(range(len(objects)), len(nps)):
        attrs_ok = all(all(objects[j][k] == v for k, v in np_.items()) for np_, j in zip(nps, perm))
        if attrs_ok and (structure["rel"] is None
                         or relation_holds(structure["rel"], objects[perm[0]], objects[perm[1]], margin)):
            return True
    return False


def probe_labels(labels: list[dict], color: str = "red") -> dict[str, np.ndarray]:
    """Per scene, the label of each probe of what an image embedding holds, -1 where it does not
    apply; two-object scenes only. In the pair sorted by attribute tuple (a, b): `relation_x` 1 if a
    lies left of b, 0 if right, by more than RELATION_MARGIN (`relation_y`: above / below), the
    relation named by identity; controls: `color_present` 1 if an object is `color` (identity, what
    a contrastive base learns), `color_left` 1 if the one `color` object lies in the left half
    (position without the other object)."""
    out: dict[str, list[int]] = {"relation_x": [], "relation_y": [], "color_present": [], "color_left": []}
    for lab in labels:
        objs = lab["objects"]
        if len(objs) != 2:
            for v in out.values():
                v.append(-1)
            continue
        a, b = sorted(objs, key=_attr_tuple)
        for axis, name in (("cx", "relation_x"), ("cy", "relation_y")):
            d = b[axis] - a[axis]
            out[name].append(int(d > 0) if abs(d) > RELATION_MARGIN else -1)
        hue = [o for o in objs if o["color"] == color]
        out["color_present"].append(int(bool(hue)))
        out["color_left"].append(int(hue[0]["cx"] < 0.5) if len(hue) == 1 else -1)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


# --- drawing -----------------------------------------------------------------------------------


_ANG = -np.pi / 2 + np.arange(10) * np.pi / 5
_STAR = np.stack([np.where(np.arange(10) % 2 == 0, 1.0, 0.45) * np.sin(_ANG),
                  np.where(np.arange(10) % 2 == 0, 1.0, 0.45) * np.cos(_ANG)], axis=1) + [0.1, 0.0]
_TRIANGLE = np.array([[-0.95, 0.0], [0.75, 0.95], [0.75, -0.95]])


def shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Silhouette at object coordinates (u down, v right; the object spans [-1, 1]^2)."""
    if shape == "circle":
        return u * u + v * v <= 0.95**2
    if shape == "square":
        return (np.abs(u) <= 0.8) & (np.abs(v) <= 0.8)
    if shape == "triangle":
        return in_polygon(u, v, _TRIANGLE)
    if shape == "star":
        return in_polygon(u, v, _STAR)
    if shape == "cross":
        return ((np.abs(u) <= 0.3) & (np.abs(v) <= 0.95)) | ((np.abs(v) <= 0.3) & (np.abs(u) <= 0.95))
    raise VlctlError(f"shape_mask: unknown shape {shape!r} (expected one of {list(SHAPES)})")


def texture_shade(texture: str, y: np.ndarray, x: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(shade, highlight) of `texture` at image coordinates (pixels); period scales with size."""
    period = size / 8.0
    if texture == "plain":
        return np.ones_like(y), np.zeros_like(y)
    if texture == "striped":  # diagonal dark stripes
        return np.where(((y + x) / period) % 1.0 < 0.5, 0.3, 1.0), np.zeros_like(y)
    if texture == "dotted":  # white dots on a square grid
        fy, fx = (y / period) % 1.0 - 0.5, (x / period) % 1.0 - 0.5
        return np.ones_like(y), np.where(fy * fy + fx * fx < 0.25**2, 0.85, 0.0)
    raise VlctlError(f"texture_shade: unknown texture {texture!r} (expected one of {list(TEXTURES)})")


def render(objects: list[dict], size: int) -> np.ndarray:
    """One image (size, size, 3) uint8 of `objects` (each with cx, cy in [0, 1] and attributes)."""
    img = np.full((size, size, 3), BACKGROUND, dtype=np.float64)
    s = SUPERSAMPLE
    for o in objects:
        cy, cx, r = o["cy"] * size, o["cx"] * size, DIAMETER[o["size"]] * size / 2
        y0, y1 = max(int(np.floor(cy - r)) - 1, 0), min(int(np.ceil(cy + r)) + 1, size)
        x0, x1 = max(int(np.floor(cx - r)) - 1, 0), min(int(np.ceil(cx + r)) + 1, size)
        ys = y0 + (np.arange((y1 - y0) * s) + 0.5) / s
        xs = x0 + (np.arange((x1 - x0) * s) + 0.5) / s
        yy, xx = np.meshgrid(ys, xs, indexing="ij")
        mask = shape_mask(o["shape"], (yy - cy) / r, (xx - cx) / r)
        shade, highlight = texture_shade(o["texture"], yy, xx, size)
        inner = np.zeros_like(mask)
        k = max(1, s // 2)
        inner[k:-k, k:-k] = mask[k:-k, k:-k] & mask[:-2 * k, k:-k] & mask[2 * k:, k:-k] & mask[k:-k, :-2 * k] \
            & mask[k:-k, 2 * k:]
        outline = mask & ~inner
        shade = np.where(outline, 0.35, shade)
        highlight = np.where(outline, 0.0, highlight)
        rgb = np.asarray(COLORS[o["color"]], dtype=np.float64) * shade[..., None]
        rgb = rgb + (255.0 - rgb) * highlight[..., None]
        block = np.where(mask[..., None], rgb, img[y0:y1, x0:x1].repeat(s, 0).repeat(s, 1))
        img[y0:y1, x0:x1] = block.reshape(y1 - y0, s, x1 - x0, s, 3).mean(axis=(1, 3))
    return np.round(np.clip(img, 0, 255)).astype(np.uint8)


# --- sampling ----------------------------------------------------------------------------------


def _place(sizes: list[str], rng: np.random.Generator) -> list[tuple[float, float]] | None:
    """Centres (cx, cy) in [0, 1] of non-overlapping discs of the given sizes, or None."""
    placed: list[tuple[float, float, float]] = []
    for sz in sizes:
        r = DIAMETER[sz] / 2
        for _ in range(100):
            cx, cy = rng.uniform(r + 0.02, 1 - r - 0.02, size=2)
            if all((cx - px) ** 2 + (cy - py) ** 2 >= (r + pr + 0.03) ** 2 for px, py, pr in placed):
                placed.append((float(cx), float(cy), r))
                break
        else:
            return None
    return [(cx, cy) for cx, cy, _ in placed]


def sample_scene(rng: np.random.Generator, p_three: float) -> tuple[list[dict], dict]:
    """(objects, caption structure) of one random scene."""
    while True:
        n = 3 if rng.random() < p_three else 2
        objects = [{a: VALUES[a][rng.integers(len(VALUES[a]))] for a in ATTRIBUTES} for _ in range(n)]
        # Attribute tuples of one scene are distinct, so every noun phrase names one object.
        if len({_attr_tuple(o) for o in objects}) < n:
            continue
        centres = _place([o["size"] for o in objects], rng)
        if centres is None:
            continue
        for o, (cx, cy) in zip(objects, centres):
            o["cx"], o["cy"] = round(cx, 4), round(cy, 4)
        order = [int(i) for i in rng.permutation(n)]
        a, b = objects[order[0]], objects[order[1]]
        rels = [r for r in RELATIONS if relation_holds(r, a, b, RELATION_MARGIN)]
        if not rels:
            continue
        rel = rels[rng.integers(len(rels))]
        structure = {"nps": [{k: objects[i][k] for k in ATTRIBUTES} for i in order], "rel": rel}
        return objects, structure


def make_sample(i: int, cfg: ScenesConfig) -> tuple[np.ndarray, dict]:
    """Image i of the split and its label; draws scenes until one's configuration is in the split."""
    rng = np.random.default_rng([cfg.seed, SPLITS.index(cfg.split), i])
    while True:
        objects, structure = sample_scene(rng, cfg.p_three)
        key = scene_key(objects, structure)
        if split_of_key(key) == cfg.split:
            break
    label = {"filename": f"scenes_{cfg.split}_{i:06d}.png", "split": cfg.split, "objects": objects,
             "caption": render_caption(structure), "structure": structure, "key": key}
    return render(objects, cfg.image_size), label


def _make_range(bounds: tuple[int, int], cfg: ScenesConfig) -> tuple[np.ndarray, list[dict]]:
    samples = [make_sample(i, cfg) for i in range(*bounds)]
    return np.stack([s[0] for s in samples]), [s[1] for s in samples]



# --- checklist ---------------------------------------------------------------------------------


def checklist_items(labels: list[dict], category: str, seed: int = 0) -> list[dict]:
    """One item per scene where a false one-word negative exists: {"index", "pos", "neg",
    "np", "from", "to", "pos_tag"} (+ "object_size", "object_location" for 'object')."""
    if category not in CHECKLIST_CATEGORIES:
        raise VlctlError(f"checklist category {category!r} is not one of {list(CHECKLIST_CATEGORIES)}")
    items = []
    for idx, lab in enumerate(labels):
        rng = np.random.default_rng([seed, CHECKLIST_CATEGORIES.index(category), idx])
        structure, objects = lab["structure"], lab["objects"]
        candidates = []  # (np index or None, from, to, negative structure)
        if category == "relation_spatial":
            neg = {**structure, "rel": OPPOSITE_RELATION[structure["rel"]]}
            candidates.append((None, structure["rel"], neg["rel"], neg))
        else:
            attr = CATEGORY_ATTRIBUTE[category]
            for k in rng.permutation(len(structure["nps"])):
                old = structure["nps"][k][attr]
                for new in rng.permutation([v for v in VALUES[attr] if v != old]):
                    nps = [dict(p) for p in structure["nps"]]
                    nps[k][attr] = str(new)
                    candidates.append((int(k), old, str(new), {**structure, "nps": nps}))
        for k, old, new, neg in candidates:
            if caption_holds(neg, objects):
                continue  # true for the image under some matching: not a negative
            item = {"index": idx, "pos": render_caption(structure), "neg": render_caption(neg), "np": k,
                    "from": old, "to": new, "pos_tag": CATEGORY_POS[category]}
            if category == "object":
                o = _object_of_np(structure, objects, k)
                item["object_size"] = o["size"]
                dist = float(np.hypot(o["cx"] - 0.5, o["cy"] - 0.5))
                item["object_location"] = "center" if dist <= CENTER_RADIUS else "margin"
            items.append(item)
            break
    return items


def _object_of_np(structure: dict, objects: list[dict], k: int) -> dict:
    want = structure["nps"][k]
    return next(o for o in objects if all(o[a] == want[a] for a in ATTRIBUTES))


def write_checklist(directory: Path, labels: list[dict], seed: int = 0) -> None:
    """`directory/checklist/<category>.json` (VL-CheckList format) + `<category>.meta.json`."""
    for cat in CHECKLIST_CATEGORIES:
        items = checklist_items(labels, cat, seed)
        doc = [[f"images/{labels[it['index']]['filename']}", {"POS": [it["pos"]], "NEG": [it["neg"]]}] for it in items]
        atomic_write_json(directory / "checklist" / f"{cat}.json", doc)
        atomic_write_json(directory / "checklist" / f"{cat}.meta.json", items)


def load_checklist(path: str | Path, category: str) -> list[dict]:
    """The items of one category (meta records joined with the VL-CheckList file), validated."""
    path = Path(path)
    doc = read_json(path / "checklist" / f"{category}.json", "VL-CheckList JSON")
    meta = read_json(path / "checklist" / f"{category}.meta.json", "checklist meta JSON")
    if not isinstance(doc, list) or not isinstance(meta, list) or len(doc) != len(meta):
        raise VlctlError(f"{path / 'checklist'}: {category}.json and {category}.meta.json must be lists of equal length")
    for i, (entry, m) in enumerate(zip(doc, meta)):
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], dict)
                and entry[1].get("POS") == [m.get("pos")] and entry[1].get("NEG") == [m.get("neg")]):
            raise VlctlError(f"{path / 'checklist' / (category + '.json')}: item {i} does not match its meta record")
    return meta


# --- generation and loading --------------------------------------------------------------------


def generate_scenes(cfg: ScenesConfig, out: str | Path) -> Path:
    """Generate cfg.n scenes of cfg.split into `out` (replaced atomically); the test split also
    gets PNGs and the checklist files."""
    pngs = cfg.write_png or cfg.split == "test"

    def maybe_pngs(tmp: Path, imgs: np.ndarray, labs: list[dict]) -> None:
        if pngs:
            write_pngs(tmp, imgs, labs)

    def on_done(tmp: Path, labels: list[dict]) -> None:
        if cfg.split == "test":
            write_checklist(tmp, labels, cfg.seed)

    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "config": config_to_dict(cfg), "n": cfg.n,
            "image_shape": [cfg.image_size, cfg.image_size, 3], "values": {a: list(v) for a, v in VALUES.items()},
            "relations": list(RELATIONS), "split_fractions": list(SPLIT_FRACTIONS)}
    return write_image_set(out, n=cfg.n, image_size=cfg.image_size, workers=cfg.workers, chunk_max=500,
                           make_range=functools.partial(_make_range, cfg=cfg), meta=meta, on_chunk=maybe_pngs,
                           on_done=on_done)


def check_label(label: object, where: str) -> None:
    """VlctlError naming `where` and the field unless `label` is a valid scenes label."""
    if not isinstance(label, dict):
        raise VlctlError(f"{where}: expected a JSON object, got {type(label).__name__}")
    for f in ("filename", "split", "objects", "caption", "structure", "key"):
        if f not in label:
            raise VlctlError(f"{where}: missing field {f!r}")
    if label["split"] not in SPLITS:
        raise VlctlError(f"{where}: field 'split' has unknown value {label['split']!r}")
    objs = label["objects"]
    if not isinstance(objs, list) or not 2 <= len(objs) <= 3:
        raise VlctlError(f"{where}: field 'objects' must be a list of 2 or 3 objects")
    for o in objs:
        for a in ATTRIBUTES:
            if not isinstance(o, dict) or o.get(a) not in VALUES[a]:
                raise VlctlError(f"{where}: object {o!r} has an unknown or missing {a!r}")
        if not all(isinstance(o.get(c), (int, float)) and 0 <= o[c] <= 1 for c in ("cx", "cy")):
            raise VlctlError(f"{where}: object {o!r} needs cx, cy in [0, 1]")
    st = label["structure"]
    if not isinstance(st, dict) or st.get("rel") not in RELATIONS or not isinstance(st.get("nps"), list):
        raise VlctlError(f"{where}: field 'structure' must be {{'nps': [...], 'rel': one of {list(RELATIONS)}}}")
    if render_caption(st) != label["caption"]:
        raise VlctlError(f"{where}: caption {label['caption']!r} does not match its structure")


def load_scenes(path: str | Path, verify: bool = False) -> dict:
    """Load a scenes directory: {"images": (N, S, S, 3) uint8 read-only memmap, "labels", "meta",
    "path"}. Refuses (VlctlError naming the file) a missing directory or file, another format, a
    corrupt label line, counts that disagree; `verify` re-hashes the files against meta.json."""

    path = Path(path)
    if not path.is_dir():
        recover_dir(path)  # a rewrite killed between its two renames
    if not path.is_dir():
        raise VlctlError(f"{path}: scenes directory not found (vlctl data scenes)")
    meta = read_json(path / "meta.json", "scenes meta.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise VlctlError(f"{path / 'meta.json'}: format {found!r}, expected {FORMAT!r} (a scenes directory)")
    for f in ("n", "image_shape", "sha256"):
        if f not in meta:
            raise VlctlError(f"{path / 'meta.json'}: missing field {f!r}")
    images, label_file = open_image_set_files(path, meta)
    labels = read_labels(label_file, check_label)
    check_image_set(path, meta, images, labels, verify)
    return {"images": images, "labels": labels, "meta": meta, "path": path}


def scenes_dataset_id(path: str | Path) -> str:
    """A stable id of a scenes directory's content (from meta.json's hashes)."""
    meta = read_json(Path(path) / "meta.json", "scenes meta.json")
    try:
        return "scenes-" + sha256_json({"v": meta["format_version"], "sha": meta["sha256"]})[:16]
    except (KeyError, TypeError):
        raise VlctlError(f"{Path(path) / 'meta.json'}: no format_version / sha256 to identify the data") from None


# --- alt-text captions (the web-caption regime of a LiT pre-training, 3vl-lit) ------------------

ALT_TEXT_STYLES = ("phrases", "bag", "nouns_then_attributes", "count", "relation")
ALT_TEXT_STYLE_P = (0.25, 0.35, 0.2, 0.1, 0.1)
_COUNT_WORDS = {1: "one", 2: "two", 3: "three"}


def alt_text_caption(objects: list[dict], rng: np.random.Generator) -> str:
    """An alt-text-like caption of a scene: true of the image, naming a random subset of the
    objects and of their attributes, in varied order and phrasing, mostly without binding.

    A random non-empty subset of the objects is named; of each, every attribute is kept with
    probability 1/2 (the shape with 0.8), at least one. The style is drawn by ALT_TEXT_STYLE_P:
      phrases               "a red circle and a small striped shape" (partial noun phrases, shuffled)
      bag                   "blue, circle, striped, red, square" (the named words, shuffled, unbound)
      nouns_then_attributes "a circle and a square in red and blue, striped" (nouns, then the adjectives)
      count                 "three shapes: red, small" (the number of objects, then some adjectives)
      relation              "a red circle left of a star" (only where the relation holds with
                            RELATION_MARGIN between the two first named objects; else 'phrases')
    Words outside the scenes grammar ("shape", "shapes", "in", numbers) are plain English, for a
    pretrained text tower. Deterministic given `rng`'s state.
    """
    n = len(objects)
    order = [int(i) for i in rng.permutation(n)]
    named = [objects[i] for i in order[: int(rng.integers(1, n + 1))]]
    partial = []
    for o in named:
        keep = {a: o[a] for a in ATTRIBUTES if rng.random() < (0.8 if a == "shape" else 0.5)}
        if not keep:
            a = ATTRIBUTES[int(rng.integers(len(ATTRIBUTES)))]
            keep = {a: o[a]}
        partial.append(keep)
    style = ALT_TEXT_STYLES[int(rng.choice(len(ALT_TEXT_STYLES), p=ALT_TEXT_STYLE_P))]

    def phrase(p: dict) -> str:
        return " ".join(["a", *[p[a] for a in ATTRIBUTES[:3] if a in p], p.get("shape", "shape")])

    adjectives = list(dict.fromkeys(p[a] for p in partial for a in ATTRIBUTES[:3] if a in p))
    nouns = [p["shape"] for p in partial if "shape" in p]
    if style == "relation":
        rels = [r for r in RELATIONS if len(named) >= 2 and relation_holds(r, named[0], named[1], RELATION_MARGIN)]
        if rels:
            return f"{phrase(partial[0])} {rels[int(rng.integers(len(rels)))]} {phrase(partial[1])}"
        style = "phrases"
    if style == "phrases" or (style == "nouns_then_attributes" and (not nouns or not adjectives)):
        return " and ".join(phrase(partial[i]) for i in rng.permutation(len(partial)))
    if style == "bag":
        words = adjectives + list(dict.fromkeys(nouns))
        return ", ".join(words[i] for i in rng.permutation(len(words)))
    if style == "nouns_then_attributes":
        adj = [adjectives[i] for i in rng.permutation(len(adjectives))]
        return " and ".join(f"a {w}" for w in nouns) + " in " + " and ".join(adj)
    adj = [adjectives[i] for i in rng.permutation(len(adjectives))]
    head = f"{_COUNT_WORDS[n]} shape{'s' if n > 1 else ''}"
    return f"{head}: {', '.join(adj)}" if adj else head


def alt_text_captions(labels: list[dict], seed: int, per_scene: int = 1) -> list[list[str]]:
    """`per_scene` alt-text captions of each scene (`alt_text_caption`); caption k of scene i
    depends only on (seed, i, k)."""
    return [[alt_text_caption(lab["objects"], np.random.default_rng([seed, 0xA17, i, k])) for k in range(per_scene)]
            for i, lab in enumerate(labels)]


PLACES = {("cx", 0): "on the left", ("cx", 1): "on the right", ("cy", 0): "at the top", ("cy", 1): "at the bottom"}


def place_caption(objects: list[dict], rng: np.random.Generator) -> str | None:
    """One object named with its colour, shape and absolute place: "a red circle on the left", on
    the axis where its centre lies farthest from the middle, by more than RELATION_MARGIN; None if no
    object does. A bag-of-words text tower tells "red ... left" from "red ... right", so pre-training
    on these rewards an image embedding that keeps where each colour is, while the text side still
    scores "a left of b" and its swap alike (3vl-lit's `full+place`; measured in docs/findings.md:
    it raised the relation probe little and relations stayed at chance)."""
    placed = []
    for o in objects:
        axis = max(("cx", "cy"), key=lambda a: abs(o[a] - 0.5))
        if abs(o[axis] - 0.5) > RELATION_MARGIN:
            placed.append((o, PLACES[(axis, int(o[axis] > 0.5))]))
    if not placed:
        return None
    o, place = placed[int(rng.integers(len(placed)))]
    return f"a {o['color']} {o['shape']} {place}"


def place_captions(labels: list[dict], seed: int) -> list[str | None]:
    """`place_caption` of each scene; scene i's depends only on (seed, i)."""
    return [place_caption(lab["objects"], np.random.default_rng([seed, 0x9A1, i])) for i, lab in enumerate(labels)]

"""Shapes: a Clevr-4-like benchmark drawn procedurally in 2D, fast enough to render on a CPU.

Clevr-4 (Vaze et al. 2023) gives every image four independent taxonomies of 10 classes each;
ControlEmbed (docs/methods.md §2) evaluates attribute-aware retrieval and multi-clustering on it. We
keep Clevr-4's taxonomies and class names exactly and draw the scene in 2D instead of ray tracing:

- color: CLEVR's RGB values (gray, red, blue, green, brown, purple, cyan, yellow) plus Clevr-4's
  orange and pink;
- texture: a 2D pattern painted on each object, in object coordinates so it moves and scales
  with it (rubber: flat matte; metal: shaded with a specular highlight; checkered: fine diagonal
  checks against white; emojis: a smiley face; wave: wavy stripes; brick: staggered bricks with
  light mortar; star: light five-pointed stars; circles: concentric rings; zigzag: chevron
  stripes; chessboard: coarse axis-aligned checks against black);
- count: 1 to 10 copies of the object;
- shape: a 2D silhouette (cube: square; sphere: disk; monkey: a head with two ears; cone: a
  triangle on an elliptic base; torus: a ring; star: five-pointed; teapot: body, lid, knob, spout
  and handle; diamond: a rhombus; gear: a toothed wheel with a hole; cylinder: an upright
  rectangle with elliptic ends).

An image holds `count` non-overlapping copies of one object (one shape, one color, one texture)
with jittered size and position, outlined in a darker shade of its color, on a light gray
background. Objects are drawn on a 4x supersampled grid and area-averaged (anti-aliased). The
four attributes are drawn uniformly and independently; image i comes from its own RNG seeded
with (seed, split, i), so the output does not depend on the number of workers.

Caption scheme (for training a TinyCLIP on the set, with the information imbalance of real
captions): each attribute is named independently with its probability in
`ShapesConfig.caption_probs` (default color 0.9, shape 0.75, texture 0.5, count 0.5; if none is
drawn, one attribute is picked uniformly). The caption is one noun phrase
"[count word] [color] [texture phrase] <shape noun>", e.g. "three red wavy cubes" or "blue sphere";
when the shape is not named the noun is "object" ("two emoji-covered objects", "red object"). The
noun is plural only when a count above one is named, so an unnamed count leaks nothing. Texture
phrases are adjectives that never collide with a shape name (TEXTURE_PHRASES: the star texture
is "star-patterned", the star shape "star").

Resolution. Objects span 17-23% of the image side so that ten fit. At 64 px (the default) an
object is 11-15 px and its texture is visible; at 32 px (the CPU recipe's setting) it is 5-7 px
and most textures blur into a tint, which caps how much texture any encoder can learn from it.

On disk, the MAD format (so `vlctl train clip` and the embedding cache read it unchanged):
images.npy (N, H, W, 3) uint8, labels.jsonl (one object per image: filename, color, texture,
count, shape, split, caption) and meta.json (format "vlctl-shapes"); plus
clevr_4_annots.json in Clevr-4's annotation schema {filename: {color, texture, count, shape,
split}} and, with `write_png`, images/<filename> as PNG files, so a Clevr-4 folder loader reads
the set too. `load_clevr4` reads a real Clevr-4 folder (or such a folder) into the same
in-memory form as `load_shapes`; it takes the annotation file by name or finds the folder's only
JSON file (the name clevr_4_annots.json is ours, not verified against the Clevr-4 release).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from vlctl.config import config_to_dict, opt, validate_config
from vlctl.data.imageset import check_set_config, load_image_set, write_image_set, write_pngs
from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_json, read_json, recover_dir

CATEGORIES = ("color", "texture", "count", "shape")
VALUES: dict[str, tuple[str, ...]] = {
    "color": ("gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow", "pink", "orange"),
    "texture": ("rubber", "metal", "checkered", "emojis", "wave", "brick", "star", "circles", "zigzag", "chessboard"),
    "count": tuple(str(k) for k in range(1, 11)),
    "shape": ("cube", "sphere", "monkey", "cone", "torus", "star", "teapot", "diamond", "gear", "cylinder"),
}
# CLEVR's RGB values (clevr-dataset-gen properties.json); orange and pink as Clevr-4 adds them.
COLORS: dict[str, tuple[int, int, int]] = {
    "gray": (87, 87, 87), "red": (173, 35, 35), "blue": (42, 75, 215), "green": (29, 105, 20),
    "brown": (129, 74, 25), "purple": (129, 38, 192), "cyan": (41, 208, 208), "yellow": (255, 238, 51),
    "orange": (255, 146, 51), "pink": (255, 205, 243),
}
COUNT_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
TEXTURE_PHRASES = {
    "rubber": "rubber", "metal": "metal", "checkered": "checkered", "emojis": "emoji-covered", "wave": "wavy",
    "brick": "brick-patterned", "star": "star-patterned", "circles": "ringed", "zigzag": "zigzag",
    "chessboard": "chessboard-patterned",
}
SHAPE_PLURALS = {"torus": "tori", "monkey": "monkeys"}
SPLITS = ("train", "test")
FORMAT = "vlctl-shapes"
FORMAT_VERSION = 1
CLEVR4_ANNOTATIONS = "clevr_4_annots.json"
SUPERSAMPLE = 4  # drawing grid points per output pixel side
BACKGROUND = 200.0  # light gray, so every CLEVR color (dark gray 87 included) stands out
OBJECT_DIAMETER = (0.17, 0.23)  # range of an object's diameter as a fraction of the image side


@dataclasses.dataclass(frozen=True)
class ShapesConfig:
    n: int = opt(10000, "number of images", ge=1, le=10**7)
    seed: int = opt(0, "random seed (>= 0); image i depends only on (seed, split, i)", ge=0, le=2**32 - 1)
    split: str = opt("train", "'train' or 'test': recorded in the labels and part of every image's seed",
                     choices=SPLITS)
    image_size: int = opt(64, "output image side in pixels (>= 16)", ge=16, le=1024)
    caption_probs: tuple[float, ...] = opt(
        (0.9, 0.5, 0.5, 0.75),
        "probability that a caption names each attribute, in the order color, texture, count, shape",
        ge=0, le=1, length=4,
    )
    workers: int = opt(2, "worker processes (the output does not depend on it)", ge=1, le=256)
    write_png: bool = opt(False, "also write images/<filename>.png (what a Clevr-4 folder loader reads)")

    def __post_init__(self):
        check_set_config(self, SPLITS, 16, "10 objects must fit")
        probs = tuple(float(p) for p in self.caption_probs)
        if len(probs) != len(CATEGORIES) or not all(0 <= p <= 1 for p in probs):
            raise VlctlError(f"ShapesConfig.caption_probs: expected {len(CATEGORIES)} probabilities in [0, 1] "
                             f"(order {list(CATEGORIES)}), got {list(self.caption_probs)}")
        object.__setattr__(self, "caption_probs", probs)
        validate_config(self)  # then every field in its declared range (the opt() above)


# --- silhouettes: functions of object coordinates (u down, v right), object within [-1, 1]^2 ---


def in_polygon(u: np.ndarray, v: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """Even-odd point-in-polygon test, vectorised over points; vertices (k, 2) as (u, v)."""
    inside = np.zeros(u.shape, dtype=bool)
    for (u1, v1), (u2, v2) in zip(vertices, np.roll(vertices, -1, axis=0)):
        crosses = (u1 > u) != (u2 > u)
        with np.errstate(divide="ignore", invalid="ignore"):
            v_at = v1 + (u - u1) * (v2 - v1) / (u2 - u1)
        inside ^= crosses & (v < v_at)
    return inside


def _star_vertices(outer: float, inner: float, points: int = 5) -> np.ndarray:
    angle = -np.pi / 2 + np.arange(2 * points) * np.pi / points  # first point straight up
    radius = np.where(np.arange(2 * points) % 2 == 0, outer, inner)
    return np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)


_STAR = _star_vertices(1.0, 0.45) + np.array([0.1, 0.0])  # centred on its area, not its tips
_CONE = np.array([[-0.95, 0.0], [0.7, 0.75], [0.7, -0.75]])
_SPOUT = np.array([[0.25, 0.45], [-0.45, 0.95], [-0.3, 1.0], [0.5, 0.5]])


def _disk(u, v, cu, cv, r):
    return (u - cu) ** 2 + (v - cv) ** 2 <= r * r


def _ellipse(u, v, cu, cv, ru, rv):
    return ((u - cu) / ru) ** 2 + ((v - cv) / rv) ** 2 <= 1


def shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean silhouette of `shape` at object coordinates (u, v) (same shape arrays)."""
    if shape == "cube":
        return (np.abs(u) <= 0.8) & (np.abs(v) <= 0.8)
    if shape == "sphere":
        return _disk(u, v, 0, 0, 0.92)
    if shape == "monkey":
        return _disk(u, v, 0.15, 0, 0.68) | _disk(u, v, -0.3, -0.68, 0.32) | _disk(u, v, -0.3, 0.68, 0.32)
    if shape == "cone":
        return in_polygon(u, v, _CONE) | _ellipse(u, v, 0.7, 0, 0.22, 0.75)
    if shape == "torus":
        r2 = u * u + v * v
        return (r2 <= 0.95**2) & (r2 >= 0.45**2)
    if shape == "star":
        return in_polygon(u, v, _STAR)
    if shape == "teapot":
        body = _ellipse(u, v, 0.2, 0, 0.6, 0.62)
        lid = _ellipse(u, v, -0.4, 0, 0.14, 0.38) | _disk(u, v, -0.58, 0, 0.14)
        r2 = (u - 0.15) ** 2 + (v + 0.62) ** 2
        handle = (r2 <= 0.36**2) & (r2 >= 0.2**2) & (v <= -0.6)
        return body | lid | handle | in_polygon(u, v, _SPOUT)
    if shape == "diamond":
        return np.abs(u) / 0.97 + np.abs(v) / 0.65 <= 1
    if shape == "gear":
        r = np.hypot(u, v)
        teeth = np.cos(8 * np.arctan2(u, v)) > 0
        return (r <= np.where(teeth, 0.95, 0.72)) & (r >= 0.28)
    if shape == "cylinder":
        return ((np.abs(u) <= 0.72) & (np.abs(v) <= 0.55)) | _ellipse(u, v, -0.72, 0, 0.22, 0.55) \
            | _ellipse(u, v, 0.72, 0, 0.22, 0.55)
    raise VlctlError(f"shape_mask: unknown shape {shape!r} (expected one of {list(VALUES['shape'])})")


# --- textures: (shade, highlight) at object coordinates ------------------------------------------
# The drawn color is  rgb = color * shade, then mixed towards white by `highlight`.


def texture_maps(texture: str, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shade, highlight) arrays of `texture` at object coordinates (u, v), both in [0, 1]."""
    ones, zeros = np.ones_like(u), np.zeros_like(u)
    if texture == "rubber":
        return 0.85 * ones, zeros
    if texture == "metal":
        shade = np.clip(1.05 - 0.35 * np.hypot(u + 0.3, v + 0.3), 0.4, 1.0)
        return shade, 0.85 * np.exp(-((u + 0.4) ** 2 + (v + 0.4) ** 2) / 0.05)
    if texture == "checkered":  # fine diagonal checks, color against white
        check = (np.floor((u + v) * 2.2) + np.floor((u - v) * 2.2)) % 2 == 0
        return ones, np.where(check, 0.75, 0.0)
    if texture == "emojis":  # one smiley face: two eyes and a smile
        eyes = _disk(u, v, -0.28, -0.3, 0.17) | _disk(u, v, -0.28, 0.3, 0.17)
        r2 = (u + 0.05) ** 2 + v * v
        mouth = (r2 <= 0.58**2) & (r2 >= 0.4**2) & (u >= 0.15)
        return np.where(eyes | mouth, 0.12, 1.0), zeros
    if texture == "wave":
        stripe = np.sin(7.0 * u + 1.6 * np.sin(6.0 * v)) > 0.2
        return np.where(stripe, 0.3, 1.0), zeros
    if texture == "brick":
        row = np.floor((u + 1) * 2.0)
        shifted = v + 0.5 * (row % 2)
        mortar = ((u + 1) * 2.0 % 1 < 0.22) | (((shifted + 1) * 1.0) % 1 < 0.12)
        return np.where(mortar, 1.0, 0.7), np.where(mortar, 0.8, 0.0)
    if texture == "star":  # a 2x2 tiling of light stars
        cu, cv = ((u + 1) * 1.0) % 1 * 2 - 1, ((v + 1) * 1.0) % 1 * 2 - 1
        return ones, np.where(in_polygon(cu, cv, _star_vertices(0.95, 0.42) + [0.08, 0]), 0.85, 0.0)
    if texture == "circles":  # concentric rings
        return np.where(np.hypot(u, v) * 3.2 % 1 < 0.45, 0.25, 1.0), zeros
    if texture == "zigzag":  # horizontal chevron stripes
        tri = np.abs(((v + 1) * 2.0) % 2 - 1)  # triangle wave in [0, 1]
        return np.where(((u + 0.45 * tri) * 3.0) % 1 < 0.45, 0.25, 1.0), zeros
    if texture == "chessboard":  # coarse axis-aligned checks, color against black
        check = (np.floor((u + 1) * 1.5) + np.floor((v + 1) * 1.5)) % 2 == 0
        return np.where(check, 1.0, 0.08), zeros
    raise VlctlError(f"texture_maps: unknown texture {texture!r} (expected one of {list(VALUES['texture'])})")


# --- scenes --------------------------------------------------------------------------------------


def place_objects(count: int, size: int, rng: np.random.Generator) -> list[tuple[float, float, float]]:
    """`count` non-overlapping discs (centre row, centre col, radius) in pixels, 1 px apart.

    Diameters are drawn from OBJECT_DIAMETER x size, independently of `count` (so object size
    says nothing about the count); positions by random sequential placement. If a disc finds no
    room in 200 tries, all radii shrink by 10% and the placement starts over.
    """
    radii = rng.uniform(*OBJECT_DIAMETER, size=count) * size / 2
    while True:
        placed: list[tuple[float, float, float]] = []
        for r in radii:
            for _ in range(200):
                cy, cx = rng.uniform(r + 0.5, size - r - 0.5, size=2)
                if all((cy - py) ** 2 + (cx - px) ** 2 >= (r + pr + 1) ** 2 for py, px, pr in placed):
                    placed.append((float(cy), float(cx), float(r)))
                    break
            else:
                break
        if len(placed) == count:
            return placed
        radii = radii * 0.9


def _shrink(mask: np.ndarray, steps: int) -> np.ndarray:
    """Binary erosion by a 4-neighbour cross, `steps` times (cheap slicing, no scipy)."""
    for _ in range(steps):
        inner = np.zeros_like(mask)
        inner[1:-1, 1:-1] = mask[1:-1, 1:-1] & mask[:-2, 1:-1] & mask[2:, 1:-1] & mask[1:-1, :-2] & mask[1:-1, 2:]
        mask = inner
    return mask


def render(attrs: dict, size: int, rng: np.random.Generator) -> np.ndarray:
    """One image (size, size, 3) uint8 of `attrs` (color, texture, count, shape)."""
    img = np.full((size, size, 3), BACKGROUND, dtype=np.float64)
    color = np.asarray(COLORS[attrs["color"]], dtype=np.float64)
    s = SUPERSAMPLE
    for cy, cx, r in place_objects(int(attrs["count"]), size, rng):
        y0, y1 = max(int(np.floor(cy - r)) - 1, 0), min(int(np.ceil(cy + r)) + 1, size)
        x0, x1 = max(int(np.floor(cx - r)) - 1, 0), min(int(np.ceil(cx + r)) + 1, size)
        # Sample points at the centres of the s x s sub-pixels of every output pixel of the block.
        ys = y0 + (np.arange((y1 - y0) * s) + 0.5) / s
        xs = x0 + (np.arange((x1 - x0) * s) + 0.5) / s
        u, v = np.meshgrid((ys - cy) / r, (xs - cx) / r, indexing="ij")
        mask = shape_mask(attrs["shape"], u, v)
        shade, highlight = texture_maps(attrs["texture"], u, v)
        # A dark outline about half an output pixel wide keeps light colors apart from the background.
        outline = mask & ~_shrink(mask, max(1, s // 2))
        shade = np.where(outline, 0.35, shade)
        highlight = np.where(outline, 0.0, highlight)
        rgb = color * shade[..., None]
        rgb = rgb + (255.0 - rgb) * highlight[..., None]
        # Area-average the sub-pixels: covered ones carry the object, the rest the background.
        m = mask[..., None]
        block = np.where(m, rgb, img[y0:y1, x0:x1].repeat(s, 0).repeat(s, 1))
        img[y0:y1, x0:x1] = block.reshape(y1 - y0, s, x1 - x0, s, 3).mean(axis=(1, 3))
    return np.round(np.clip(img, 0, 255)).astype(np.uint8)


def subclass_phrase(category: str, value: str) -> str:
    """A noun phrase naming one subclass, as captions phrase it: 'red objects', 'three objects',
    'wavy objects', 'cubes' (for prompt templates: 'a photo of {phrase}')."""
    if category == "color":
        return f"{value} objects"
    if category == "texture":
        return f"{TEXTURE_PHRASES[value]} objects"
    if category == "count":
        return f"{COUNT_WORDS[int(value) - 1]} {'object' if value == '1' else 'objects'}"
    if category == "shape":
        return SHAPE_PLURALS.get(value, value + "s")
    raise VlctlError(f"subclass_phrase: unknown category {category!r} (expected one of {list(CATEGORIES)})")


def caption(attrs: dict, rng: np.random.Generator, probs: tuple[float, ...]) -> str:
    """A noun phrase naming each attribute with its probability in `probs` (see the module doc)."""
    named = [c for c, p in zip(CATEGORIES, probs) if rng.random() < p]
    if not named:
        named = [CATEGORIES[rng.integers(len(CATEGORIES))]]
    count = int(attrs["count"])
    plural = "count" in named and count > 1
    shape = attrs["shape"] if "shape" in named else "object"
    words = []
    if "count" in named:
        words.append(COUNT_WORDS[count - 1])
    if "color" in named:
        words.append(attrs["color"])
    if "texture" in named:
        words.append(TEXTURE_PHRASES[attrs["texture"]])
    words.append(SHAPE_PLURALS.get(shape, shape + "s") if plural else shape)
    return " ".join(words)


def make_sample(i: int, cfg: ShapesConfig) -> tuple[np.ndarray, dict]:
    """Image i and its label, from an RNG that depends only on (seed, split, i)."""
    rng = np.random.default_rng([cfg.seed, SPLITS.index(cfg.split), i])
    attrs = {c: VALUES[c][rng.integers(len(VALUES[c]))] for c in CATEGORIES}
    label = {"filename": f"shapes_{cfg.split}_{i:06d}.png", **attrs, "count": int(attrs["count"]), "split": cfg.split}
    label["caption"] = caption(attrs, rng, cfg.caption_probs)
    return render(attrs, cfg.image_size, rng), label


def _make_range(bounds: tuple[int, int], cfg: ShapesConfig) -> tuple[np.ndarray, list[dict]]:
    samples = [make_sample(i, cfg) for i in range(*bounds)]
    return np.stack([s[0] for s in samples]), [s[1] for s in samples]



def generate_shapes(cfg: ShapesConfig, out: str | Path) -> Path:
    """Generate cfg.n shapes images into directory `out` (replaced atomically); returns its path."""
    def maybe_pngs(tmp: Path, imgs: np.ndarray, labs: list[dict]) -> None:
        if cfg.write_png:
            write_pngs(tmp, imgs, labs)

    def write_clevr4_annotations(tmp: Path, labels: list[dict]) -> None:
        atomic_write_json(tmp / CLEVR4_ANNOTATIONS, {
            lab["filename"]: {c: lab[c] for c in (*CATEGORIES, "split")} for lab in labels})

    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "config": config_to_dict(cfg),
        "n": cfg.n, "image_shape": [cfg.image_size, cfg.image_size, 3],
        "categories": list(CATEGORIES), "values": {c: list(v) for c, v in VALUES.items()},
    }
    return write_image_set(out, n=cfg.n, image_size=cfg.image_size, workers=cfg.workers, chunk_max=500,
                           make_range=functools.partial(_make_range, cfg=cfg), meta=meta,
                           on_chunk=maybe_pngs, on_done=write_clevr4_annotations)


# --- loading -------------------------------------------------------------------------------------


def check_label(label: object, where: str, need_caption: bool = True) -> None:
    """VlctlError naming `where` and the field unless `label` is a valid shapes / Clevr-4 label."""
    if not isinstance(label, dict):
        raise VlctlError(f"{where}: expected a JSON object, got {type(label).__name__}")
    for c in (*CATEGORIES, *(("caption",) if need_caption else ())):
        if c not in label:
            raise VlctlError(f"{where}: missing field {c!r}")
    if need_caption and not isinstance(label["caption"], str):
        raise VlctlError(f"{where}: field 'caption' must be a string, got {label['caption']!r}")
    count = label["count"]
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 10):
        raise VlctlError(f"{where}: field 'count' has unknown value {count!r} (expected an int 1-10)")
    for c in ("color", "texture", "shape"):
        if label[c] not in VALUES[c]:
            raise VlctlError(f"{where}: field {c!r} has unknown value {label[c]!r} (expected one of {list(VALUES[c])})")


def load_shapes(path: str | Path, verify: bool = False) -> dict:
    """Load a shapes directory: {"images": (N, H, W, 3) uint8 read-only memmap, "labels", "meta", "path"}.

    Same checks as `vlctl.data.mad.load_mad` (which reads this format too; both are
    `vlctl.data.imageset.load_image_set`); refuses a directory of another format.
    """
    if not Path(path).is_dir():
        recover_dir(path)  # a rewrite killed between its two renames
    meta = read_json(Path(path) / "meta.json", "shapes meta.json") if Path(path).is_dir() else None
    if meta is not None and (not isinstance(meta, dict) or meta.get("format") != FORMAT):
        found = meta.get("format") if isinstance(meta, dict) else None
        raise VlctlError(f"{Path(path) / 'meta.json'}: format {found!r}, expected {FORMAT!r} (a shapes directory)")
    return load_image_set(path, verify, {FORMAT: check_label})


def label_indices(labels: list[dict], category: str) -> np.ndarray:
    """(N,) int64: index of each label's `category` value in VALUES[category]."""
    if category not in VALUES:
        raise VlctlError(f"label_indices: unknown category {category!r} (expected one of {list(CATEGORIES)})")
    where = {v: k for k, v in enumerate(VALUES[category])}
    return np.array([where[str(lab[category])] for lab in labels], dtype=np.int64)


def load_clevr4(root: str | Path, image_size: int | None = None, annotations: str | Path | None = None,
                split: str | None = None, limit: int | None = None) -> dict:
    """Load a Clevr-4 folder: {"images": (N, S, S, 3) uint8, "labels", "path"}.

    The folder holds an annotation JSON in Clevr-4's schema, {filename: {color, texture, count,
    shape, split}} (`annotations`, default: clevr_4_annots.json, else the only *.json file in
    `root`), and the images at root/images/<filename> (or root/<filename>). Images are converted
    to RGB and, with `image_size`, resized to S x S (area averaging; images must then be square
    or they are centre-cropped to a square first). `split` keeps one split; `limit` the first
    images in filename order. Labels get count as an int and the filename.
    """
    from PIL import Image

    from vlctl.images import read_image

    root = Path(root)
    if not root.is_dir():
        raise VlctlError(f"{root}: Clevr-4 folder not found")
    if annotations is None:
        candidates = [root / CLEVR4_ANNOTATIONS] if (root / CLEVR4_ANNOTATIONS).is_file() else sorted(root.glob("*.json"))
        candidates = [c for c in candidates if c.name != "meta.json"]
        if len(candidates) != 1:
            raise VlctlError(f"{root}: expected one annotation JSON ({CLEVR4_ANNOTATIONS}), found "
                             f"{[c.name for c in candidates]}; pass annotations=")
        annotations = candidates[0]
    ann_path = Path(annotations)
    ann = read_json(ann_path, "Clevr-4 annotations")
    if not isinstance(ann, dict):
        raise VlctlError(f"{ann_path}: expected a JSON object {{filename: {{color, texture, count, shape, split}}}}")
    labels, images = [], []
    for filename in sorted(ann):
        entry = ann[filename]
        where = f"{ann_path}: entry {filename!r}"
        if isinstance(entry, dict) and isinstance(entry.get("count"), str) and entry["count"].isdigit():
            entry = {**entry, "count": int(entry["count"])}
        check_label(entry, where, need_caption=False)
        if split is not None and entry.get("split") != split:
            continue
        if limit is not None and len(labels) >= limit:
            break
        file = next((f for f in (root / "images" / filename, root / filename) if f.is_file()), None)
        if file is None:
            raise VlctlError(f"{where}: image file not found (looked for images/{filename} and {filename} in {root})")
        im = read_image(file)  # the one reader: EXIF, 16-bit, palette and alpha read as everywhere
        if image_size is not None and im.size != (image_size, image_size):
            side = min(im.size)
            left, top = (im.size[0] - side) // 2, (im.size[1] - side) // 2
            im = im.crop((left, top, left + side, top + side)).resize((image_size, image_size), Image.BOX)
        images.append(np.asarray(im, dtype=np.uint8))
        labels.append({**entry, "filename": filename})
    if not labels:
        raise VlctlError(f"{ann_path}: no images{f' of split {split!r}' if split else ''}")
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        raise VlctlError(f"{root}: images differ in size ({sorted(shapes)[:3]}...); pass image_size=")
    return {"images": np.stack(images), "labels": labels, "path": root}

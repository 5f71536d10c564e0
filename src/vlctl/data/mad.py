"""MAD: coloured Morpho-MNIST digits with six attribute categories and attribute captions.

The synthetic data set of the TEVI paper (Schrodi et al. 2025; docs/methods.md §1.4). Every image has a
digit, a colour, a thickness change, a swelling, a fracture and a size, each drawn uniformly, and
a caption naming the digit and 3 of the 5 other attribute values, e.g. "thinning - 7 - red - no
swelling".

Each image is made as Morpho-MNIST does (Castro et al. 2019): the glyph is drawn on a 4x
upsampled binary canvas (112x112 for 28 px), the morphology is applied there with sizes measured
relative to the glyph's own stroke thickness, and the result is area-downsampled and tinted.
Glyphs come from scikit-learn's bundled 8x8 digits (offline; train and test use disjoint glyphs)
or from MNIST IDX files. Image i is drawn from its own RNG seeded with (seed, split, i), so the
output does not depend on how many worker processes made it.

On disk: images.npy (N, H, W, 3) uint8, labels.jsonl (one JSON object per image) and meta.json.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import ndimage
from skimage.morphology import reconstruction, skeletonize
from skimage.transform import resize

from vlctl.config import config_to_dict
from vlctl.data.imageset import load_image_set, write_image_set
from vlctl.data.mad_config import SPLITS, MadConfig
from vlctl.data.shapes import check_label as check_shapes_label
from vlctl.fsops import VlctlError
from vlctl.io import read_json, sha256_json

CATEGORIES = ("digit", "color", "thickthinning", "swelling", "fracture", "scaling")
VALUES: dict[str, tuple[str, ...]] = {
    "digit": tuple(str(d) for d in range(10)),
    "color": ("gray", "red", "green", "blue", "cyan", "magenta", "yellow"),
    "thickthinning": ("thickening", "thinning", "no thickthinning"),
    "swelling": ("swelling", "no swelling"),
    "fracture": ("fracture", "no fracture"),
    "scaling": ("large", "small"),
}
COLORS = {
    "gray": (0.5, 0.5, 0.5), "red": (1, 0, 0), "green": (0, 1, 0), "blue": (0, 0, 1),
    "cyan": (0, 1, 1), "magenta": (1, 0, 1), "yellow": (1, 1, 0),
}
FORMAT_VERSION = 1
SCALE = 4  # Morpho-MNIST's upsampling factor: the morphology runs on a 4x finer binary canvas
CANVAS = 28 * SCALE  # all lengths below are in 28 px units and multiplied by SCALE on the canvas
SKLEARN_TEST_FRACTION = 0.2  # of each digit's glyphs; fixed so train and test never share a glyph
DIGIT_SIZE = 20.0  # px at 28 px: the longer side of a (large) digit's bounding box, as in MNIST
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


# --- stroke measurements ---------------------------------------------------------------------


def skeleton_and_thickness(binary: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Skeleton, distance map and mean stroke thickness (px at 28 px) of a binary canvas.

    As Morpho-MNIST: thickness is twice the mean distance-to-background along the skeleton.
    """
    skel = skeletonize(binary)
    dist = ndimage.distance_transform_edt(binary)
    thickness = 2 * dist[skel].mean() / SCALE if skel.any() else 0.0
    return skel, dist, float(thickness)


# --- morphology on the binary canvas --------------------------------------------------------


def thicken(binary: np.ndarray, amount: float) -> np.ndarray:
    """Dilate by a disk so the stroke grows by `amount` x its measured thickness (Morpho-MNIST)."""
    radius = amount * skeleton_and_thickness(binary)[2] * SCALE / 2
    return ndimage.distance_transform_edt(~binary) <= radius  # exact Euclidean disk dilation


def thin(binary: np.ndarray, amount: float) -> np.ndarray:
    """Erode by a disk so the stroke shrinks by `amount` x its measured thickness (Morpho-MNIST)."""
    radius = amount * skeleton_and_thickness(binary)[2] * SCALE / 2
    return ndimage.distance_transform_edt(binary) > radius  # exact Euclidean disk erosion


def swell(binary: np.ndarray, rng: np.random.Generator, strength: float, radius: float) -> np.ndarray:
    """Inflate the stroke around a random skeleton point with a radial power warp (Morpho-MNIST).

    A canvas pixel at distance d < R from the centre samples the glyph at distance d (d/R)^(s-1),
    which magnifies the neighbourhood of the centre; R grows with sqrt(stroke thickness).
    """
    skel, _, thickness = skeleton_and_thickness(binary)
    if not skel.any():
        return binary
    points = np.argwhere(skel)
    centre = points[rng.integers(len(points))].astype(float)
    r = radius * np.sqrt(thickness) / 2 * SCALE
    offset = np.indices(binary.shape, dtype=float).reshape(2, -1) - centre[:, None]
    weight = np.minimum(np.hypot(*offset) / r, 1.0) ** (strength - 1)
    src = centre[:, None] + weight * offset
    return ndimage.map_coordinates(binary.astype(np.float32), src, order=1).reshape(binary.shape) >= 0.5


def fracture(binary: np.ndarray, rng: np.random.Generator, count: int, width: float,
             prune: float = 2.0, spacing: float = 4.0) -> np.ndarray:
    """Cut the stroke across, perpendicular to the skeleton, at `count` random points (Morpho-MNIST).

    Cut centres avoid the `prune` px near stroke tips and forks, where a cut would only shorten a
    stroke or be ambiguous, and lie `spacing` px apart so that cuts do not merge into one; each
    cut is `width` px wide and spans the local stroke width plus 0.5 px on either side.
    """
    skel, dist, _ = skeleton_and_thickness(binary)
    neighbours = ndimage.convolve(skel.astype(int), np.array([[1, 1, 1], [1, 0, 1], [1, 1, 1]]), mode="constant")
    ends = skel & ((neighbours == 1) | (neighbours >= 3))
    allowed = skel & (ndimage.distance_transform_edt(~ends) > prune * SCALE) if ends.any() else skel
    points = np.argwhere(allowed if allowed.any() else skel)  # fall back when pruning ate the skeleton
    grid = np.indices(binary.shape, dtype=float)
    out = binary.copy()
    for _ in range(count):
        if len(points) == 0:
            break
        centre = points[rng.integers(len(points))]
        points = points[np.hypot(*(points - centre).T) > spacing * SCALE]
        tangent = _skeleton_direction(skel, centre, 2 * SCALE)
        offset = grid - centre[:, None, None]
        along = tangent[0] * offset[0] + tangent[1] * offset[1]
        across = tangent[1] * offset[0] - tangent[0] * offset[1]
        half_length = dist[tuple(centre)] + 0.5 * SCALE
        out &= ~((np.abs(along) <= width * SCALE / 2) & (np.abs(across) <= half_length))
    return out


def _skeleton_direction(skel: np.ndarray, centre: np.ndarray, r: int) -> np.ndarray:
    """Unit (row, col) direction of the skeleton near `centre`: principal axis of nearby skeleton pixels."""
    i, j = centre
    pts = np.argwhere(skel[max(i - r, 0): i + r + 1, max(j - r, 0): j + r + 1]).astype(float)
    _, vecs = np.linalg.eigh(np.cov(pts.T) if len(pts) > 1 else np.eye(2))
    return vecs[:, -1]


# --- drawing a glyph -------------------------------------------------------------------------


def draw_glyph(glyph: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Warp a grayscale glyph (values in [0, 1]) onto the binary canvas with random jitter.

    As in MNIST, the longer side of the glyph's bounding box spans DIGIT_SIZE px, centred on the
    canvas (so 'large' and 'small' differ in size by the attribute, not by the source glyph); a
    small random affine map (rotation, shear, scale, translation) and a smooth elastic field make
    every image of a glyph different. Cubic interpolation, then binarized at 0.5.
    """
    rows, cols = np.nonzero(glyph >= 0.5)
    centre = np.array([[rows.min() + rows.max()], [cols.min() + cols.max()]]) / 2
    pixel = (max(np.ptp(rows), np.ptp(cols)) + 1) / DIGIT_SIZE  # glyph pixels per 28 px unit
    angle, shear = rng.uniform(-0.2, 0.2), rng.uniform(-0.25, 0.25)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    affine = rot @ np.array([[1.0, 0.0], [shear, 1.0]]) @ np.diag(rng.uniform(0.93, 1.07, 2))
    # canvas pixel -> centred 28 px coordinates -> undo jitter -> glyph pixel coordinates
    pos = (np.indices((CANVAS, CANVAS), dtype=float).reshape(2, -1) - (CANVAS - 1) / 2) / SCALE
    pos = pos - rng.uniform(-1.5, 1.5, (2, 1)) + _elastic_field(rng, amplitude=0.6)
    src = np.linalg.inv(affine) @ pos * pixel + centre
    pad = 2  # zero border so the cubic spline fades to background outside the glyph
    img = ndimage.map_coordinates(np.pad(glyph, pad), src + pad, order=3, mode="constant")
    return img.reshape(CANVAS, CANVAS) >= 0.5


def _elastic_field(rng: np.random.Generator, amplitude: float, knots: int = 4) -> np.ndarray:
    """A smooth random displacement field (2, CANVAS*CANVAS), in 28 px units: Gaussian bumps on a knot grid."""
    x = np.linspace(0, 1, CANVAS)[:, None]
    basis = np.exp(-0.5 * ((x - np.linspace(0, 1, knots)[None]) * knots) ** 2)  # (CANVAS, knots)
    basis /= basis.sum(1, keepdims=True)
    coef = rng.normal(0, amplitude, (2, knots, knots))
    return (basis @ coef @ basis.T).reshape(2, -1)


def shrink(img: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
    """Rescale the canvas by `factor` and paste it at a random position (the 'small' attribute)."""
    size = round(img.shape[0] * factor)
    small = resize(img, (size, size), order=1, anti_aliasing=True)
    oy, ox = rng.integers(0, img.shape[0] - size + 1, 2)
    out = np.zeros_like(img)
    out[oy:oy + size, ox:ox + size] = small
    return out


def tint(v: np.ndarray, color: str) -> np.ndarray:
    """Stroke intensity v in [0, 1] -> uint8 RGB on black: v times the colour's RGB tint."""
    rgb = v[..., None] * np.asarray(COLORS[color], dtype=np.float32)
    return np.round(255 * np.clip(rgb, 0, 1)).astype(np.uint8)


def render(glyph: np.ndarray, attrs: dict, rng: np.random.Generator, cfg: MadConfig) -> np.ndarray:
    """One MAD image (H, W, 3) uint8 from a source glyph and its attribute values."""
    binary = draw_glyph(glyph, rng)
    if attrs["thickthinning"] == "thickening":
        binary = thicken(binary, cfg.thicken_amount)
    elif attrs["thickthinning"] == "thinning":
        binary = thin(binary, cfg.thin_amount)
    if attrs["swelling"] == "swelling":
        binary = swell(binary, rng, cfg.swell_strength, cfg.swell_radius)
    if attrs["fracture"] == "fracture":  # last: a later dilation would close the cuts
        binary = fracture(binary, rng, cfg.fracture_count, cfg.fracture_thickness)
    img = binary.astype(np.float32)
    if attrs["scaling"] == "small":
        img = shrink(img, cfg.small_scale, rng)
    v = resize(img, (cfg.image_size, cfg.image_size), order=1, anti_aliasing=True)  # area-like averaging
    return tint(v, attrs["color"])


# --- glyph sources ---------------------------------------------------------------------------


class Glyphs(NamedTuple):
    images: np.ndarray  # (K, h, w) uint8 grayscale, white on black
    ids: np.ndarray  # (K,) id of each glyph in its source (row of load_digits / of the IDX file)
    by_digit: list[np.ndarray]  # positions into `images` of each digit 0..9


def _glyphs(images: np.ndarray, labels: np.ndarray, ids: np.ndarray, source: str) -> Glyphs:
    by_digit = [np.flatnonzero(labels == d) for d in range(10)]
    missing = [d for d in range(10) if len(by_digit[d]) == 0]
    if missing:
        raise VlctlError(f"{source}: no glyphs of digit(s) {missing}")
    return Glyphs(images, ids, by_digit)


def sklearn_glyph(glyph: np.ndarray, thickness: float, depth: float = 0.05) -> np.ndarray:
    """An 8x8 glyph (values in [0, 1]) redrawn 4x finer with MNIST-like strokes `thickness` px thick.

    Upsampled 8x8 digits are blobs 4-6 px thick, so the blob is skeletonized and the skeleton
    redrawn as a smooth stroke, sized so that it is `thickness` px thick once draw_glyph scales
    the digit to DIGIT_SIZE. Before that, the loops are cut open: at 8x8 the hole of a 6, 8, 9 or
    0 is often one pixel that is darker than the stroke around it but far from black, so a plain
    threshold fills it; enclosed dark basins deeper than `depth` (grayscale hole filling by
    morphological reconstruction) count as background.
    """
    padded = np.pad(glyph, 1)
    pos = (np.arange(4 * padded.shape[0]) + 0.5) / 4 - 0.5  # pixel centres of the finer grid
    img = ndimage.map_coordinates(padded, np.meshgrid(pos, pos, indexing="ij"), order=3, mode="constant")
    seed = img.copy()
    seed[1:-1, 1:-1] = img.max()  # flood from the (background) border inwards
    holes = reconstruction(seed, img, method="erosion") - img > depth
    skel = skeletonize((img >= 0.5) & ~holes)
    rows, cols = np.nonzero(skel)
    radius = thickness / 2 * max(np.ptp(rows), np.ptp(cols)) / (DIGIT_SIZE - thickness)  # in fine pixels
    return np.clip(radius + 0.5 - ndimage.distance_transform_edt(~skel), 0, 1)  # 0.5 at the stroke edge


def sklearn_split(split: str) -> np.ndarray:
    """Ids of the scikit-learn digit glyphs in `split`: a fixed per-digit permutation, so train and test are disjoint."""
    from sklearn.datasets import load_digits

    target = load_digits().target
    rng = np.random.default_rng(0)  # fixed on purpose: the split must not depend on the user's seed
    ids = []
    for d in range(10):
        idx = rng.permutation(np.flatnonzero(target == d))
        n_test = round(len(idx) * SKLEARN_TEST_FRACTION)
        ids.append(idx[:n_test] if split == "test" else idx[n_test:])
    return np.sort(np.concatenate(ids))


@functools.lru_cache(maxsize=4)
def sklearn_glyphs(split: str, thickness: float) -> Glyphs:
    """The scikit-learn digit glyphs of `split`, prepared once per process (about 2 s)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    ids = sklearn_split(split)
    images = np.stack([np.round(255 * sklearn_glyph(g / 16.0, thickness)).astype(np.uint8) for g in digits.images[ids]])
    return _glyphs(images, digits.target[ids], ids, "sklearn digits")


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Read an MNIST IDX file of unsigned bytes (optionally gzipped); VlctlError naming the file if bad."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise VlctlError(f"{path}: cannot read MNIST IDX file ({e})") from None
    if len(data) < 4 + 4 * ndim or data[:4] != bytes([0, 0, 8, ndim]):
        raise VlctlError(f"{path}: not an IDX file of {ndim}-d unsigned bytes (bad header)")
    shape = tuple(int.from_bytes(data[4 + 4 * k: 8 + 4 * k], "big") for k in range(ndim))
    body = data[4 + 4 * ndim:]
    if len(body) != int(np.prod(shape)):
        raise VlctlError(f"{path}: truncated or oversized IDX file (header says {shape}, {len(body)} bytes of data)")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def mnist_glyphs(directory: Path, split: str) -> Glyphs:
    """MNIST digits of `split` from IDX files (train-* for train, t10k-* for test; .gz accepted)."""
    files = []
    for name in MNIST_FILES[split]:
        found = [f for f in (directory / name, directory / (name + ".gz")) if f.is_file()]
        if not found:
            raise VlctlError(f"{directory / name}: MNIST IDX file not found (nor {name}.gz)")
        files.append(found[0])
    images, labels = read_idx(files[0], 3), read_idx(files[1], 1)
    if len(images) != len(labels) or labels.max(initial=0) > 9:
        raise VlctlError(f"{files[1]}: {len(labels)} labels (max {labels.max(initial=0)}) do not fit "
                         f"{len(images)} images of digits 0-9 in {files[0].name}")
    return _glyphs(images, labels, np.arange(len(images)), str(directory))


def load_glyphs(cfg: MadConfig) -> Glyphs:
    """The source glyphs of cfg.split: MNIST IDX files if cfg.mnist_dir is set, else scikit-learn's digits."""
    if cfg.mnist_dir is None:
        return sklearn_glyphs(cfg.split, cfg.stroke_thickness)
    return mnist_glyphs(Path(cfg.mnist_dir), cfg.split)


# --- sampling --------------------------------------------------------------------------------


def caption(attrs: dict, rng: np.random.Generator) -> str:
    """The digit's numeral and 3 of the 5 other attribute values, in random order, joined by ' - '."""
    others = [c for c in CATEGORIES if c != "digit"]
    parts = [attrs["digit"]] + [attrs[others[k]] for k in rng.choice(len(others), size=3, replace=False)]
    return " - ".join(parts[k] for k in rng.permutation(len(parts)))


def prompt_captions(category: str, value: str, n: int, seed: int = 0) -> list[str]:
    """`n` MAD-style captions that name `value` of `category`, the rest drawn at random: a
    text-only prompt ensemble (like CLIP's prompt templates) for zero-shot classification.

    Each caption is distributed as a real MAD caption conditioned on naming `value`: the digit
    always appears; a non-digit category is one of the 3 named among the other 5.
    """
    if value not in VALUES.get(category, ()):
        raise VlctlError(f"prompt_captions: {value!r} is not a value of category {category!r}")
    rng = np.random.default_rng([seed, CATEGORIES.index(category), VALUES[category].index(value)])
    others = [c for c in CATEGORIES if c != "digit"]
    out = []
    for _ in range(n):
        attrs = {c: VALUES[c][rng.integers(len(VALUES[c]))] for c in CATEGORIES}
        attrs[category] = value
        pool = [c for c in others if c != category]
        named = list(rng.choice(pool, size=3 if category == "digit" else 2, replace=False))
        parts = [attrs["digit"]] + [attrs[c] for c in named] + ([value] if category != "digit" else [])
        out.append(" - ".join(parts[k] for k in rng.permutation(len(parts))))
    return out


def _draw_label(i: int, cfg: MadConfig, glyphs: Glyphs) -> tuple[dict, int, str, np.random.Generator]:
    """Sample i's attributes, glyph and caption, and the RNG (seed, split, i) left where rendering
    continues: the label is drawn before the image."""
    rng = np.random.default_rng([cfg.seed, SPLITS.index(cfg.split), i])
    attrs = {c: VALUES[c][rng.integers(len(VALUES[c]))] for c in CATEGORIES}
    pool = glyphs.by_digit[int(attrs["digit"])]
    g = pool[rng.integers(len(pool))]
    return attrs, g, caption(attrs, rng), rng


def captions(cfg: MadConfig) -> list[str]:
    """The captions of the cfg.n samples `generate_mad(cfg)` writes, drawn without rendering an image."""
    glyphs = load_glyphs(cfg)
    return [_draw_label(i, cfg, glyphs)[2] for i in range(cfg.n)]


def make_sample(i: int, cfg: MadConfig, glyphs: Glyphs) -> tuple[np.ndarray, dict]:
    """Image i and its label, from an RNG that depends only on (seed, split, i)."""
    attrs, g, text, rng = _draw_label(i, cfg, glyphs)
    image = render(glyphs.images[g] / 255.0, attrs, rng, cfg)
    return image, {**attrs, "digit": int(attrs["digit"]), "caption": text, "glyph": int(glyphs.ids[g])}


def make_range(bounds: tuple[int, int], cfg: MadConfig, glyphs: Glyphs) -> tuple[np.ndarray, list[dict]]:
    samples = [make_sample(i, cfg, glyphs) for i in range(*bounds)]
    return np.stack([s[0] for s in samples]), [s[1] for s in samples]


_worker: tuple[MadConfig, Glyphs] | None = None  # set once in each worker process


def _init_worker(cfg: MadConfig, glyphs: Glyphs) -> None:
    global _worker
    _worker = (cfg, glyphs)


def _worker_range(bounds: tuple[int, int]) -> tuple[np.ndarray, list[dict]]:
    return make_range(bounds, *_worker)


def generate_mad(cfg: MadConfig, out: str | Path) -> Path:
    """Generate cfg.n MAD images into directory `out` (replaced atomically); returns its path."""
    glyphs = load_glyphs(cfg)  # here, so a bad mnist_dir fails before anything is written
    meta = {
        "format": "vlctl-mad", "format_version": FORMAT_VERSION, "config": config_to_dict(cfg),
        "n": cfg.n, "image_shape": [cfg.image_size, cfg.image_size, 3],
        "source": "mnist" if cfg.mnist_dir else "sklearn-digits",
        "categories": list(CATEGORIES), "values": {c: list(v) for c, v in VALUES.items()},
    }
    return write_image_set(out, n=cfg.n, image_size=cfg.image_size, workers=cfg.workers, chunk_max=250,
                           make_range=_worker_range, meta=meta, initializer=_init_worker, initargs=(cfg, glyphs))


# --- loading ---------------------------------------------------------------------------------


def load_mad(path: str | Path, verify: bool = False) -> dict:
    """Load a MAD directory: {"images": (N, H, W, 3) uint8 read-only memmap, "labels", "meta", "path"}.

    Checks the counts, the image shape and dtype and every label value; `verify=True` also
    re-hashes the files against meta.json (a full read of the images). Reads the directories of
    the shapes generator too (same on-disk layout, its own label checks): the TinyCLIP trainer's
    one loader.
    """
    return load_image_set(path, verify, {"vlctl-mad": _check_label, "vlctl-shapes": check_shapes_label})


def _check_label(label: object, where: str) -> None:
    if not isinstance(label, dict):
        raise VlctlError(f"{where}: expected a JSON object, got {type(label).__name__}")
    for c in (*CATEGORIES, "caption"):
        if c not in label:
            raise VlctlError(f"{where}: missing field {c!r}")
    if not isinstance(label["caption"], str):
        raise VlctlError(f"{where}: field 'caption' must be a string, got {label['caption']!r}")
    digit = label["digit"]
    if not (isinstance(digit, int) and not isinstance(digit, bool) and 0 <= digit <= 9):
        raise VlctlError(f"{where}: field 'digit' has unknown value {digit!r} (expected an int 0-9)")
    for c in CATEGORIES[1:]:
        if label[c] not in VALUES[c]:
            raise VlctlError(f"{where}: field {c!r} has unknown value {label[c]!r} (expected one of {list(VALUES[c])})")


def mad_dataset_id(path: str | Path) -> str:
    """A stable id of a MAD directory's content (from the hashes in meta.json), for cache keys."""
    meta = read_json(Path(path) / "meta.json", "MAD meta.json")
    try:
        key = {"format_version": meta["format_version"], "images": meta["sha256"]["images.npy"],
               "labels": meta["sha256"]["labels.jsonl"]}
    except (KeyError, TypeError):
        raise VlctlError(f"{Path(path) / 'meta.json'}: no format_version / sha256 entries to identify the data") from None
    # Prefix by format ("mad-", "shapes-"): the ids of existing MAD caches stay as they were.
    return meta.get("format", "vlctl-mad").removeprefix("vlctl-") + "-" + sha256_json(key)[:16]

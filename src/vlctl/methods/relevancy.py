"""3VL relevancy maps: HilaCAM, token removal, Anchor and DiRe maps (docs/methods.md §3.3).

HilaCAM (Chefer et al. 2021, "Generic attention-model explainability"), for an image-text pair:

    s      = cos(image_emb, text_emb)                        the text embedding is a constant
    A_b    = attention probabilities of ViT block b           (heads, T, T), T = 1 + n_patches
    G_b    = ds / dA_b
    R      = I (T x T);  for b in the chosen blocks:  R <- R + mean_heads(relu(G_b * A_b)) @ R
    map    = R[0, 1:] (+ mean_i R[i, 1:] if patches are pooled too) on the patch grid (gh, gw)

Token removal (3VL §IV-A): re-encode the image from the class token plus the most relevant
patches (`SupportsTokenRemoval.encode_images_keep`). With P patches and a removed fraction f,
n_keep(P, f) = max(1, round((1 - f) P)) for f < 1 (at least one patch survives any f < 1), and
f = 1 keeps no patch: the class token alone.

Anchor (§IV-B): one HilaCAM map from the anchor text "AP or AN" (built by the caller with
`vlctl.methods.anchor.anchor_text`). DiRe (§IV-C): relevancy(P) - relevancy(N), then divided by
its largest absolute value so each map lies in [-1, 1] (0 where both maps agree everywhere);
DiRe uses the label, so it is for interpretability, not inference.

Evaluation: `token_removal_curve` (the negative-perturbation test of 3VL Fig. 5) and
`deletion_test` (removing the most relevant patches must hurt the score more than removing as
many random ones). `explain_maps` computes the maps of `vlctl explain` over the whole image
(letterboxed); `vlctl.report.overlays` draws them.

Maps are float32 (n, gh, gw). Encoders: TinyCLIP, OpenCLIP ViTs, HF CLIP (class-token ViT
attention from `vision_attentions`); towers without a class token (SigLIP) are refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.io import VlctlError

FRACTIONS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
Blocks = str | int | slice


# --------------------------------------------------------------------------------------------
# Encoder geometry and input checks
# --------------------------------------------------------------------------------------------


class PatchGeometry(NamedTuple):
    """What relevancy maps need to know about an image tower.

    image_size: input side S the tower expects; patch_size: pixels per patch side in that input
    (for TinyCLIP with a convolutional stem, patch_size x the stem's downsampling); grid: (gh, gw);
    has_class_token: whether token 0 is a class token whose output is the embedding.
    patch_mean: the embedding also reads the patch tokens' mean (TinyCLIP vision_pool 'cls_mean').
    """

    image_size: int
    patch_size: int
    grid: tuple[int, int]
    has_class_token: bool
    patch_mean: bool = False

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]


def patch_geometry(encoder: Any) -> PatchGeometry | None:
    """The patch geometry of a TinyCLIP, OpenCLIP or HF encoder; None for an unknown encoder
    (callers then infer the grid from the attention shape, assuming a class token)."""
    from vlctl.encoders.tiny_clip import TinyCLIPConfig

    cfg = getattr(encoder, "config", None)
    if isinstance(cfg, TinyCLIPConfig):
        p = cfg.patch_size * 2 ** len(cfg.stem_channels)
        g = cfg.image_size // p
        return PatchGeometry(cfg.image_size, p, (g, g), True, cfg.vision_pool == "cls_mean")
    model = getattr(encoder, "model", None)
    hf_cfg = getattr(getattr(model, "config", None), "vision_config", None)
    if hf_cfg is not None and hasattr(encoder, "model_type"):  # HFEncoder
        s, p = int(hf_cfg.image_size), int(hf_cfg.patch_size)
        return PatchGeometry(s, p, (s // p, s // p), encoder.model_type == "clip")
    visual = getattr(model, "visual", None)
    if visual is not None and hasattr(visual, "grid_size") and hasattr(visual, "class_embedding"):  # open_clip ViT
        size = visual.image_size
        s = int(size[0] if isinstance(size, (tuple, list)) else size)
        ps = visual.patch_size
        p = int(ps[0] if isinstance(ps, (tuple, list)) else ps)
        pooled_cls = getattr(visual, "pool_type", "tok") == "tok" and getattr(visual, "attn_pool", None) is None
        return PatchGeometry(s, p, tuple(int(v) for v in visual.grid_size), pooled_cls)
    trunk = getattr(visual, "trunk", None)
    pe = getattr(trunk, "patch_embed", None)
    if pe is not None and hasattr(pe, "grid_size"):  # timm tower (OpenCLIP SigLIP)
        s = int(pe.img_size[0]) if hasattr(pe, "img_size") else int(pe.grid_size[0] * pe.patch_size[0])
        has_cls = getattr(trunk, "cls_token", None) is not None and getattr(trunk, "global_pool", "") == "token"
        return PatchGeometry(s, int(pe.patch_size[0]), tuple(int(v) for v in pe.grid_size), has_cls)
    return None


def _check_images(encoder: Any, images: Any, what: str) -> tuple[torch.Tensor, PatchGeometry | None]:
    if not torch.is_tensor(images):
        images = torch.as_tensor(np.asarray(images))
    if images.ndim != 4 or images.shape[1] != 3:
        raise VlctlError(f"{what}: expected preprocessed images (n, 3, S, S), got shape {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise VlctlError(f"{what}: empty batch (no images)")
    if not images.dtype.is_floating_point:
        raise VlctlError(f"{what}: expected float images (encoder.preprocess output), got dtype {images.dtype}")
    geo = patch_geometry(encoder)
    if geo is not None:
        h, w = images.shape[-2:]
        if h < geo.patch_size or w < geo.patch_size:
            raise VlctlError(
                f"{what}: image size {h}x{w} is smaller than one patch ({geo.patch_size}x{geo.patch_size} pixels)"
            )
        if (h, w) != (geo.image_size, geo.image_size):
            raise VlctlError(
                f"{what}: image size {h}x{w} is not the encoder's input size {geo.image_size}x{geo.image_size} "
                "(use encoder.preprocess)"
            )
    return images, geo


def _check_fraction(fraction: float, what: str = "fraction_removed") -> float:
    f = float(fraction)
    if not (0.0 <= f <= 1.0) or math.isnan(f):
        raise VlctlError(f"{what} must lie in [0, 1], got {fraction!r}")
    return f


def text_embeddings(encoder: Any, texts: Any, n: int, what: str = "texts") -> torch.Tensor:
    """Texts (a list of n strings) or text embeddings (n, d) -> unit-norm float32 (n, d), no grad."""
    if isinstance(texts, str):
        raise VlctlError(f"{what}: expected a list of {n} texts, got a single string")
    if torch.is_tensor(texts) or isinstance(texts, np.ndarray):
        emb = torch.as_tensor(texts).detach().float()
        if emb.ndim != 2:
            raise VlctlError(f"{what}: text embeddings must be (n, d), got shape {tuple(emb.shape)}")
    else:
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise VlctlError(f"{what}: expected strings or a (n, d) embedding array")
        if len(texts) != n:
            raise VlctlError(f"{what}: {len(texts)} texts for {n} images (need one per image)")
        with torch.no_grad():
            emb = encoder.encode_texts(encoder.tokenize(texts)).float()
    if emb.shape[0] != n:
        raise VlctlError(f"{what}: {emb.shape[0]} text embeddings for {n} images (need one per image)")
    return F.normalize(emb, dim=-1).cpu()


def select_blocks(n_blocks: int, blocks: Blocks) -> list[int]:
    """Which ViT blocks HilaCAM accumulates over.

    "all": every block; "last": the last one; an int k: blocks k, k+1, ..., last (Chefer et al.'s
    `start_layer`; negative counts from the end, so -1 is "last"); a slice: those blocks.
    """
    idx = list(range(n_blocks))
    if isinstance(blocks, str):
        if blocks == "all":
            sel = idx
        elif blocks == "last":
            sel = idx[-1:]
        else:
            raise VlctlError(f"blocks must be 'all', 'last', an int or a slice, got {blocks!r}")
    elif isinstance(blocks, bool):
        raise VlctlError(f"blocks must be 'all', 'last', an int or a slice, got {blocks!r}")
    elif isinstance(blocks, (int, np.integer)):
        if not -n_blocks <= int(blocks) < n_blocks:
            raise VlctlError(
                f"blocks={int(blocks)}: the tower has {n_blocks} blocks (valid: {-n_blocks}..{n_blocks - 1})"
            )
        sel = idx[int(blocks) :]
    elif isinstance(blocks, slice):
        sel = idx[blocks]
    else:
        raise VlctlError(f"blocks must be 'all', 'last', an int or a slice, got {type(blocks).__name__}")
    if not sel:
        raise VlctlError(f"blocks={blocks!r} selects none of the tower's {n_blocks} blocks")
    return sel


# --------------------------------------------------------------------------------------------
# HilaCAM, Anchor, DiRe
# --------------------------------------------------------------------------------------------


def hila_cam(encoder: Any, images: Any, texts: Any, blocks: Blocks = "all", batch_size: int = 64) -> np.ndarray:
    """HilaCAM relevancy of each image's patches for its own text (formula in the module docstring).

    Args:
        encoder: an Encoder with `vision_attentions` over a class-token ViT.
        images: preprocessed images (n, 3, S, S).
        texts: n texts (image i is paired with text i) or their embeddings (n, d).
        blocks: "all" | "last" | int (start block) | slice; see `select_blocks`.
        batch_size: images per forward; each chunk takes one backward pass (the scores are summed:
            rows never interact, so each image's gradient is its own).

    Returns: float32 (n, gh, gw), >= 0; row-major over the patch grid like the tokens.
    """
    images, geo = _check_images(encoder, images, "hila_cam")
    n = images.shape[0]
    if not callable(getattr(encoder, "vision_attentions", None)):
        raise VlctlError(f"hila_cam: encoder {type(encoder).__name__} gives no access to its attention")
    if geo is not None and not geo.has_class_token:
        raise VlctlError(
            f"hila_cam: {getattr(encoder, 'id', type(encoder).__name__)} has no class token (e.g. SigLIP pools with "
            "an attention head); HilaCAM reads the class-token row of the relevancy matrix"
        )
    text = text_embeddings(encoder, texts, n)
    out = []
    for i in range(0, n, batch_size):
        out.append(_hila_cam_chunk(encoder, images[i : i + batch_size], text[i : i + batch_size], blocks, geo))
    return np.concatenate(out)


def _hila_cam_chunk(encoder, images, text, blocks, geo) -> np.ndarray:
    emb, atts = encoder.vision_attentions(images)
    if not atts:
        raise VlctlError(f"hila_cam: encoder {type(encoder).__name__} returned no attention tensors (not a ViT?)")
    n, t = images.shape[0], atts[0].shape[-1]
    grid = geo.grid if geo is not None else _square_grid(t - 1)
    if t != 1 + grid[0] * grid[1]:
        raise VlctlError(f"hila_cam: attention over {t} tokens, expected 1 class token + {grid[0]}x{grid[1]} patches")
    sel = [atts[b] for b in select_blocks(len(atts), blocks)]
    if text.shape[1] != emb.shape[1]:
        raise VlctlError(f"hila_cam: text embeddings have dimension {text.shape[1]}, the images {emb.shape[1]}")
    score = (F.normalize(emb.float(), dim=-1) * text.to(emb.device)).sum(-1)  # (n,) cosine
    grads = torch.autograd.grad(score.sum(), sel)
    with torch.no_grad():
        r = torch.eye(t, dtype=sel[0].dtype, device=sel[0].device).expand(n, t, t).clone()
        for a, g in zip(sel, grads):
            cam = (g * a).clamp(min=0).mean(dim=1)  # (n, T, T), mean over heads
            r = r + cam @ r
        patch_rows = r[:, 1:, 1:].mean(dim=1) if geo is not None and geo.patch_mean else 0  # both pooled rows
        return (r[:, 0, 1:] + patch_rows).reshape(n, *grid).float().cpu().numpy()


def _square_grid(p: int) -> tuple[int, int]:
    g = math.isqrt(p)
    if g * g != p:
        raise VlctlError(f"hila_cam: {p} patch tokens do not form a square grid; unknown encoder geometry")
    return g, g


def anchor_map(encoder: Any, images: Any, anchor_texts: Any, blocks: Blocks = "all") -> np.ndarray:
    """Anchor relevancy (3VL §IV-B): HilaCAM with the anchor text "AP or AN" of each pair, built by
    the caller with `vlctl.methods.anchor.anchor_text(positive, negative)`. (n, gh, gw)."""
    return hila_cam(encoder, images, anchor_texts, blocks=blocks)


def dire_from_maps(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """DiRe from two relevancy maps: D = R(P) - R(N), divided by max |D| over each map, so it lies
    in [-1, 1] with the sign kept (> 0: more relevant for the positive text); an all-zero D stays 0.
    Shapes (gh, gw) or (n, gh, gw)."""
    p, q = np.asarray(positive, dtype=np.float64), np.asarray(negative, dtype=np.float64)
    if p.shape != q.shape:
        raise VlctlError(f"dire: positive map {p.shape} and negative map {q.shape} differ in shape")
    d = p - q
    scale = np.abs(d).max(axis=(-2, -1), keepdims=True)
    return np.divide(d, scale, out=np.zeros_like(d), where=scale > 0).astype(np.float32)


def dire_map(encoder: Any, images: Any, positives: Any, negatives: Any, blocks: Blocks = "all") -> np.ndarray:
    """Differential relevance (3VL §IV-C): HilaCAM(P) - HilaCAM(N) per image, scaled to [-1, 1]
    (see `dire_from_maps`). (n, gh, gw). Uses the label: interpretability only."""
    rp = hila_cam(encoder, images, positives, blocks=blocks)
    rn = hila_cam(encoder, images, negatives, blocks=blocks)
    return dire_from_maps(rp, rn)


def normalize_map(relevancy: np.ndarray) -> np.ndarray:
    """Min-max scale each map (gh, gw) -- or each of (n, gh, gw) -- to [0, 1]; a constant map -> 0."""
    r = np.asarray(relevancy, dtype=np.float64)
    lo = r.min(axis=(-2, -1), keepdims=True)
    span = r.max(axis=(-2, -1), keepdims=True) - lo
    return np.divide(r - lo, span, out=np.zeros_like(r), where=span > 0).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Token removal
# --------------------------------------------------------------------------------------------


def n_keep(n_patches: int, fraction_removed: float) -> int:
    """Patches kept when removing `fraction_removed` of `n_patches`: max(1, round((1 - f) P)) for
    f < 1 (halves round up), 0 for f = 1 (the class token alone)."""
    f = _check_fraction(fraction_removed)
    if f == 1.0:
        return 0
    return max(1, min(n_patches, math.floor((1.0 - f) * n_patches + 0.5 + 1e-9)))


def keep_most_relevant(relevancy: np.ndarray, fraction_removed: float) -> torch.Tensor:
    """Indices (n, m) long of the m = n_keep(P, f) most relevant patches of each map (n, gh, gw),
    ascending. Ties keep the lower patch index (a stable sort), so the result is deterministic."""
    r = np.asarray(relevancy, dtype=np.float64)
    if r.ndim != 3:
        raise VlctlError(f"relevancy maps must be (n, gh, gw), got shape {r.shape}")
    flat = r.reshape(r.shape[0], -1)
    m = n_keep(flat.shape[1], fraction_removed)
    order = np.argsort(-flat, axis=1, kind="stable")[:, :m]
    return torch.from_numpy(np.sort(order, axis=1)).long()


def random_keep(n: int, n_patches: int, m: int, seed: int = 0) -> torch.Tensor:
    """Indices (n, m) long: per row a uniformly random m-subset of the patches, ascending (the
    deletion test's baseline). Deterministic given `seed`."""
    if not 0 <= m <= n_patches:
        raise VlctlError(f"random_keep: cannot keep {m} of {n_patches} patches")
    rng = np.random.default_rng(seed)
    rows = [np.sort(rng.permutation(n_patches)[:m]) for _ in range(n)]
    return torch.from_numpy(np.array(rows, dtype=np.int64).reshape(n, m))


def _keep_encoder(encoder: Any, what: str) -> Any:
    if not callable(getattr(encoder, "encode_images_keep", None)):
        raise VlctlError(
            f"{what}: encoder {type(encoder).__name__} does not support token removal (encode_images_keep)"
        )
    return encoder


def _check_maps(maps: Any, n: int, geo: PatchGeometry | None, what: str) -> np.ndarray:
    m = np.asarray(maps, dtype=np.float64)
    if m.ndim != 3 or m.shape[0] != n:
        raise VlctlError(f"{what}: relevancy maps must be (n={n}, gh, gw), got shape {m.shape}")
    if geo is not None and m.shape[1:] != geo.grid:
        raise VlctlError(f"{what}: relevancy maps have grid {m.shape[1:]}, the encoder's patch grid is {geo.grid}")
    return m


def remove_tokens(
    encoder: Any, images: Any, relevancy: np.ndarray, fraction_removed: float, normalize: bool = True
) -> torch.Tensor:
    """Token removal: re-encode each image (n, 3, S, S) from the class token plus its
    n_keep(P, f) most relevant patches by `relevancy` (n, gh, gw) -> embeddings (n, d)."""
    images, geo = _check_images(encoder, images, "remove_tokens")
    f = _check_fraction(fraction_removed)
    maps = _check_maps(relevancy, images.shape[0], geo, "remove_tokens")
    return _keep_encoder(encoder, "remove_tokens").encode_images_keep(
        images, keep_most_relevant(maps, f), normalize=normalize
    )


def token_removal_curve(
    encoder: Any,
    images: Any,
    pos_texts: Any,
    neg_texts: Any,
    maps: Any,
    fractions: Sequence[float] = FRACTIONS,
) -> np.ndarray:
    """Accuracy after token removal, per removed fraction (3VL Fig. 5, negative perturbation).

    acc(f) = mean_i [cos(e_i(f), t_pos_i) > cos(e_i(f), t_neg_i)], e_i(f) the image re-encoded
    from its n_keep(P, f) most relevant patches. `maps`: one array (n, gh, gw) used for both texts
    (Anchor, DiRe), or a pair (maps_pos, maps_neg): the positive score uses the image kept by
    maps_pos, the negative score the image kept by maps_neg (HilaCAM with one map per text).
    At f = 0 this is the plain accuracy; at f = 1 only the class token remains. Texts: lists of
    strings or embeddings (n, d). Returns float64 (len(fractions),).
    """
    images, geo = _check_images(encoder, images, "token_removal_curve")
    n = images.shape[0]
    _keep_encoder(encoder, "token_removal_curve")
    if isinstance(maps, (tuple, list)) and len(maps) == 2:
        m_pos = _check_maps(maps[0], n, geo, "token_removal_curve (positive maps)")
        m_neg = _check_maps(maps[1], n, geo, "token_removal_curve (negative maps)")
    else:
        m_pos = m_neg = _check_maps(maps, n, geo, "token_removal_curve")
    fr = [_check_fraction(f, "fractions") for f in fractions]
    tp = text_embeddings(encoder, pos_texts, n, "pos_texts")
    tn = text_embeddings(encoder, neg_texts, n, "neg_texts")
    acc = []
    for f in fr:
        e_pos = encoder.encode_images_keep(images, keep_most_relevant(m_pos, f)).float().cpu()
        e_neg = (
            e_pos if m_neg is m_pos else encoder.encode_images_keep(images, keep_most_relevant(m_neg, f)).float().cpu()
        )
        acc.append(float(((e_pos * tp).sum(-1) > (e_neg * tn).sum(-1)).double().mean()))
    return np.array(acc, dtype=np.float64)


def deletion_test(
    encoder: Any, images: Any, texts: Any, maps: Any, fraction: float = 0.5, seed: int = 0
) -> dict[str, Any]:
    """Do the maps find the patches the score depends on? Remove the k = P - n_keep(P, f) MOST
    relevant patches, and separately k random ones, and compare the drop of the image-text cosine.

    drop_rel_i = s_i - s_i(without the top-k), drop_rand_i = s_i - s_i(without k random patches),
    s_i = cos(image_i, text_i) with all patches. Returns n_removed, mean_drop_relevant,
    mean_drop_random, share_relevant_larger = mean_i [drop_rel_i > drop_rand_i], and the per-item
    arrays drop_relevant / drop_random (float64 (n,)).
    """
    images, geo = _check_images(encoder, images, "deletion_test")
    n = images.shape[0]
    f = _check_fraction(fraction, "fraction")
    m = _check_maps(maps, n, geo, "deletion_test")
    _keep_encoder(encoder, "deletion_test")
    t = text_embeddings(encoder, texts, n)
    p = m.shape[1] * m.shape[2]
    kept = n_keep(p, f)
    # Keeping the `kept` least relevant patches = removing the P - kept most relevant ones.
    least = np.argsort(m.reshape(n, -1), axis=1, kind="stable")[:, :kept]
    keep_rel = torch.from_numpy(np.sort(least, axis=1)).long()
    keep_rand = random_keep(n, p, kept, seed)
    all_idx = torch.arange(p).expand(n, p)

    def score(keep: torch.Tensor) -> np.ndarray:
        e = encoder.encode_images_keep(images, keep).float().cpu()
        return (e * t).sum(-1).double().numpy()

    s0 = score(all_idx)
    d_rel, d_rand = s0 - score(keep_rel), s0 - score(keep_rand)
    return {
        "fraction": f,
        "n_removed": p - kept,
        "mean_drop_relevant": float(d_rel.mean()),
        "mean_drop_random": float(d_rand.mean()),
        "share_relevant_larger": float((d_rel > d_rand).mean()),
        "drop_relevant": d_rel,
        "drop_random": d_rand,
    }


# --- The whole image: letterboxing, and maps back onto the image (drawing: vlctl.report.overlays)

# CLIP's mean pixel (0.481, 0.458, 0.408) x 255: padding that normalises to ~0 for CLIP towers.
LETTERBOX_FILL: tuple[int, int, int] = (123, 117, 104)
FULL_REGION: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)
FITS = ("letterbox", "crop")


def center_square(image: np.ndarray) -> np.ndarray:
    """The central min(H, W) square of an image (H, W, 3): what encoders' own preprocessing shows."""
    h, w = image.shape[:2]
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    return image[top : top + s, left : left + s]


def _rgb(image: Any, what: str) -> np.ndarray:
    img = np.asarray(image)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise VlctlError(f"{what}: expected a uint8 image (H, W, 3), got {img.dtype} {img.shape}")
    return img


class Letterbox(NamedTuple):
    """An image padded to a square: `image` (S, S, 3) uint8 with S = max(H, W), the original at
    rows top..top+height, columns left..left+width; the rest is `LETTERBOX_FILL`."""

    image: np.ndarray
    top: int
    left: int
    height: int
    width: int

    @property
    def region(self) -> tuple[float, float, float, float]:
        """(y0, x0, y1, x1): where the original lies in the square, as fractions of its side."""
        s = self.image.shape[0]
        return self.top / s, self.left / s, (self.top + self.height) / s, (self.left + self.width) / s


def letterbox(image: np.ndarray, fill: Sequence[int] = LETTERBOX_FILL) -> Letterbox:
    """Pad a uint8 image (H, W, 3) to a max(H, W) square, centred. Every supported encoder's
    preprocessing (resize the shorter side, centre crop) then shows the model the whole image:
    nothing is cropped. A square image comes back unchanged."""
    img = _rgb(image, "letterbox")
    h, w = img.shape[:2]
    s = max(h, w)
    top, left = (s - h) // 2, (s - w) // 2
    sq = np.empty((s, s, 3), np.uint8)
    sq[...] = np.asarray(fill, np.uint8)
    sq[top : top + h, left : left + w] = img
    return Letterbox(sq, top, left, h, w)


def _lerp_axis(a: np.ndarray, pos: np.ndarray, axis: int) -> np.ndarray:
    """Linear interpolation of `a` along `axis` at positions `pos` (in index units), clamped."""
    n = a.shape[axis]
    p = np.clip(pos, 0.0, n - 1.0)
    i0 = np.floor(p).astype(np.int64)
    i1 = np.minimum(i0 + 1, n - 1)
    t = (p - i0).reshape([-1 if k == axis else 1 for k in range(a.ndim)])
    return np.take(a, i0, axis=axis) * (1.0 - t) + np.take(a, i1, axis=axis) * t


def map_onto_image(
    relevancy: np.ndarray,
    size: tuple[int, int],
    region: Sequence[float] = FULL_REGION,
    smooth: bool = True,
) -> np.ndarray:
    """A relevancy map (gh, gw) over the model's square input -> float32 (H, W) over the image.

    region (y0, x0, y1, x1): the part of the model input that the image fills, as fractions of
    the input's side (`Letterbox.region`; FULL_REGION when the input is the image itself); the
    rest (the padding) is left out. Output pixel (i, j) reads the map at input position
    y = y0 + (i + 0.5) / H * (y1 - y0) (x likewise): bilinearly between patch centres, clamped at
    the border (torch's bilinear upsampling, align_corners=False), or with smooth=False the
    patch it falls in (nearest: patches stay visible as blocks).
    """
    r = np.asarray(relevancy, dtype=np.float64)
    if r.ndim != 2 or 0 in r.shape:
        raise VlctlError(f"map_onto_image: expected one relevancy map (gh, gw), got shape {r.shape}")
    (h, w), (y0, x0, y1, x1) = (int(v) for v in size), (float(v) for v in region)
    if h < 1 or w < 1 or not (0.0 <= y0 < y1 <= 1.0 and 0.0 <= x0 < x1 <= 1.0):
        raise VlctlError(f"map_onto_image: need a positive size and a region in [0, 1], got {size}, {region}")
    ys = y0 + (np.arange(h) + 0.5) / h * (y1 - y0)  # fractions of the input side
    xs = x0 + (np.arange(w) + 0.5) / w * (x1 - x0)
    gh, gw = r.shape
    if smooth:
        out = _lerp_axis(_lerp_axis(r, ys * gh - 0.5, 0), xs * gw - 0.5, 1)
    else:
        iy = np.clip(np.floor(ys * gh).astype(np.int64), 0, gh - 1)
        ix = np.clip(np.floor(xs * gw).astype(np.int64), 0, gw - 1)
        out = r[iy][:, ix]
    return out.astype(np.float32)


# --- vlctl explain


def load_image(path: str | Path, max_pixels: int | None = None) -> np.ndarray:
    """An image file -> uint8 RGB (H, W, 3), through the one image reader (`vlctl.images.read_image`):
    a missing or undecodable file, or one over the pixel limit (a decompression bomb, refused from
    its header before any pixel is decoded), is a VlctlError naming the file."""
    from vlctl.images import DEFAULT_MAX_PIXELS, read_image

    p = Path(path)
    if not p.is_file():
        raise VlctlError(f"{p}: image file not found")
    return np.asarray(read_image(p, max_pixels or DEFAULT_MAX_PIXELS), dtype=np.uint8).copy()


def explain_maps(
    encoder: Any,
    image: np.ndarray,
    positive: str,
    negative: str | None = None,
    blocks: Blocks = "all",
    anchor: str | None = None,
    fit: str = "letterbox",
) -> dict[str, Any]:
    """The relevancy maps of `vlctl explain` for one image (uint8 (H, W, 3)) and its texts.

    fit="letterbox" (default): the image is padded to a square (`letterbox`) before the encoder's
    preprocessing, so the model sees all of it and the maps cover the whole image; "crop": the
    encoder's own preprocessing (its central square only; the sides are never seen).

    Returns {"maps": {"hilacam_positive"[, "hilacam_negative", "anchor", "dire"]: (gh, gw)}, "shown":
    the image the maps cover (whole, or its central square for "crop"), "region": where it lies in
    the model input (`map_onto_image`), "texts", "scores" (image-text cosines), "encoder_id",
    "positive_score"[, "negative_score", "anchor_text": `anchor` or
    `vlctl.methods.anchor.anchor_text(positive, negative)`], "fit", "input_size"}.
    """
    if fit not in FITS:
        raise VlctlError(f"explain: fit must be one of {', '.join(FITS)}, got {fit!r}")
    img = _rgb(image, "explain")  # any size: the encoder's preprocessing scales it, as for `embed`
    if not positive or (negative is not None and not negative):
        raise VlctlError("explain: the positive and negative texts must be non-empty")
    if fit == "letterbox":
        box = letterbox(img)
        x, shown, region = encoder.preprocess(box.image)[None], img, box.region
    else:
        x, shown, region = encoder.preprocess(img)[None], center_square(img), FULL_REGION
    texts = [positive] if negative is None else [positive, negative]
    with torch.no_grad():
        e = encoder.encode_images(x).float().cpu()
        t = encoder.encode_texts(encoder.tokenize(texts)).float().cpu()
    scores = (F.normalize(e, dim=-1) @ F.normalize(t, dim=-1).T)[0].tolist()
    maps: dict[str, np.ndarray] = {"hilacam_positive": hila_cam(encoder, x, [positive], blocks=blocks)[0]}
    result: dict[str, Any] = {"encoder_id": getattr(encoder, "id", None), "positive_score": scores[0]}
    if negative is not None:
        if anchor is None:
            try:
                from vlctl.methods.anchor import anchor_text
            except ImportError as e:
                raise VlctlError(f"explain: no --anchor text given and vlctl.methods.anchor cannot be imported ({e})")
            anchor = anchor_text(positive, negative)
        maps["hilacam_negative"] = hila_cam(encoder, x, [negative], blocks=blocks)[0]
        maps["anchor"] = hila_cam(encoder, x, [anchor], blocks=blocks)[0]
        maps["dire"] = dire_from_maps(maps["hilacam_positive"], maps["hilacam_negative"])
        result.update(negative_score=scores[1], anchor_text=anchor)
        texts.append(anchor)
    result.update(maps=maps, shown=shown, region=region, texts=texts, scores=scores, fit=fit,
                  input_size=int(x.shape[-1]))
    return result

"""3VL's relevancy maps over a whole image, for `vlctl explain` (docs/methods.md §3.3): the image
letterboxed (or cropped) to the model's square input, the maps of `vlctl.methods.threevl.relevancy`
computed on it, and each map carried back onto the image's own pixels (`map_onto_image`). Drawing
them is `vlctl.report.overlays`.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.fsops import VlctlError
from vlctl.methods.threevl.relevancy import Blocks, dire_from_maps, hila_cam

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
    `vlctl.captions.anchor.anchor_text(positive, negative)`], "fit", "input_size"}.
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
                from vlctl.captions.anchor import anchor_text
            except ImportError as e:
                raise VlctlError(f"explain: no --anchor text given and vlctl.captions.anchor cannot be imported ({e})")
            anchor = anchor_text(positive, negative)
        maps["hilacam_negative"] = hila_cam(encoder, x, [negative], blocks=blocks)[0]
        maps["anchor"] = hila_cam(encoder, x, [anchor], blocks=blocks)[0]
        maps["dire"] = dire_from_maps(maps["hilacam_positive"], maps["hilacam_negative"])
        result.update(negative_score=scores[1], anchor_text=anchor)
        texts.append(anchor)
    result.update(maps=maps, shown=shown, region=region, texts=texts, scores=scores, fit=fit,
                  input_size=int(x.shape[-1]))
    return result

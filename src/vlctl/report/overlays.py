"""Relevancy-map figures a person can read: overlays with their text, a colour bar and shared scales.

    from vlctl.report.overlays import ColourScale, Panel, save_figure
    scale = ColourScale.sequential([m_pos, m_neg], "HilaCAM relevancy (one scale for P and N)")
    save_figure("p.png", [[Panel(image, m_pos, "P: a cat", scale), Panel(image, m_neg, "N: a dog", scale)]])

A figure is a grid of panels. Each panel is the whole image (H, W, 3) scaled so its shorter side is
at least MIN_SIDE (384) pixels, with a relevancy map (gh, gw) over it (`map_onto_image`: the map
covers `region` of the model's input, the padding of a letterboxed input left out), its title
above, and under each column the colour bar of that column's scale. Maps drawn with one
`ColourScale` object are directly comparable: the scale's label says which maps share it.

Sequential maps (HilaCAM, Anchor) use "turbo" (blue: low, red: high) blended half over the photo.
Diverging maps (DiRe) use "seismic" (blue - white - red) with symmetric limits +-max|v|, so 0 is the
colour map's neutral centre (red: more relevant for the positive text, blue: for the negative),
over a grey version of the photo so that only the map carries colour, with an opacity growing with
|v| (`ColourScale.alpha`): where v = 0 the grey photo shows, unchanged and hue-free. `pixelated`
figures (the 32 px scenes) are upscaled by a whole factor with nearest-neighbour, for image and map.

`write_explain` is `vlctl explain`: the maps of `vlctl.methods.threevl.relevancy.explain_maps`, one PNG per
map and maps.npz.
"""

from __future__ import annotations

import dataclasses
import io
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_bytes
from vlctl.methods.threevl.explain import FULL_REGION, map_onto_image

MIN_SIDE = 384  # the shorter side of every drawn image, in pixels (unless that makes the longer over MAX_SIDE)
MAX_SIDE = 1024
SEQUENTIAL_CMAP = "turbo"
DIVERGING_CMAP = "seismic"
SEQUENTIAL_ALPHA = 0.5
DIVERGING_ALPHA = 0.9  # at |v| = max; sqrt(|v| / max) times this below
_DPI = 100
_MARGIN, _GAP = 14, 16  # pixels: figure border, between panels
_TITLE_PT, _TEXT_PT, _SMALL_PT = 13, 11, 9.5


@dataclasses.dataclass(frozen=True)
class ColourScale:
    """How map values become colours: [vmin, vmax] through the matplotlib colour map `cmap`.
    `label` is printed under the colour bar: say what the maps are and which share the scale."""

    vmin: float
    vmax: float
    label: str
    cmap: str = SEQUENTIAL_CMAP
    centred: bool = False  # a diverging scale, symmetric about 0

    @classmethod
    def sequential(cls, maps: Sequence[np.ndarray], label: str, cmap: str = SEQUENTIAL_CMAP) -> ColourScale:
        """One scale for all `maps`: min to max over all of them (a constant set: [v, v + 1])."""
        vals = np.concatenate([np.asarray(m, np.float64).ravel() for m in maps])
        lo, hi = float(vals.min()), float(vals.max())
        return cls(lo, hi if hi > lo else lo + 1.0, label, cmap)

    @classmethod
    def diverging(cls, maps: Sequence[np.ndarray], label: str, cmap: str = DIVERGING_CMAP) -> ColourScale:
        """A scale centred at 0: +-max|v| over all `maps` (all zero: +-1)."""
        a = max(float(np.abs(np.asarray(m, np.float64)).max()) for m in maps)
        a = a if a > 0 else 1.0
        return cls(-a, a, label, cmap, centred=True)

    def colours(self, values: np.ndarray) -> np.ndarray:
        """float RGB in [0, 1], shape values.shape + (3,)."""
        import matplotlib

        t = (np.asarray(values, np.float64) - self.vmin) / (self.vmax - self.vmin)
        rgba = np.asarray(matplotlib.colormaps[self.cmap](np.clip(t, 0.0, 1.0).reshape(-1)))
        return rgba[:, :3].reshape(t.shape + (3,))

    def alpha(self, values: np.ndarray) -> np.ndarray:
        """The opacity of the map's colour over the image: SEQUENTIAL_ALPHA everywhere, or for a
        centred scale DIVERGING_ALPHA * sqrt(|v| / vmax): 0 at v = 0, where the (grey) photo shows."""
        v = np.asarray(values, np.float64)
        if not self.centred:
            return np.full(v.shape, SEQUENTIAL_ALPHA)
        return DIVERGING_ALPHA * np.sqrt(np.clip(np.abs(v) / self.vmax, 0.0, 1.0))

    def bar_cmap(self) -> Any:
        """The colour bar's colour map: the colours themselves, or for a centred scale the colours
        as drawn over a mid-grey photo (so the bar shows what the overlay shows)."""
        import matplotlib
        from matplotlib.colors import ListedColormap

        if not self.centred:
            return matplotlib.colormaps[self.cmap]
        v = np.linspace(self.vmin, self.vmax, 256)
        a = self.alpha(v)[:, None]
        return ListedColormap((1.0 - a) * 0.5 + a * self.colours(v))


@dataclasses.dataclass
class Panel:
    """One image of a figure: `image` uint8 (H, W, 3), the whole picture; `relevancy` (gh, gw) over
    `region` of the model input (None: the plain image); `title` above it; `scale` its colours
    (default: a sequential scale of this map alone)."""

    image: np.ndarray
    relevancy: np.ndarray | None = None
    title: str = ""
    scale: ColourScale | None = None
    region: Sequence[float] = FULL_REGION


def display_size(h: int, w: int, min_side: int = MIN_SIDE, max_side: int = MAX_SIDE,
                 pixelated: bool = False) -> tuple[int, int]:
    """(H', W') an image of h x w pixels is drawn at: the shorter side min_side (up or down), unless
    the longer would exceed max(max_side, min_side), then the longer side is that. Pixelated: a
    whole upscaling factor (ceil), so every source pixel becomes the same square."""
    s = min_side / min(h, w)
    if max(h, w) * s > max(max_side, min_side):
        s = max(max_side, min_side) / max(h, w)
    if pixelated and s > 1:
        s = math.ceil(s - 1e-9)
    return max(1, round(h * s)), max(1, round(w * s))


def _resize(image: np.ndarray, size: tuple[int, int], nearest: bool) -> np.ndarray:
    from PIL import Image

    if image.shape[:2] == tuple(size):
        return image
    pil = Image.fromarray(image)
    method = Image.Resampling.NEAREST if nearest else Image.Resampling.LANCZOS
    return np.asarray(pil.resize((size[1], size[0]), method))


def overlay_rgb(image: np.ndarray, relevancy: np.ndarray | None, scale: ColourScale | None = None,
                region: Sequence[float] = FULL_REGION, size: tuple[int, int] | None = None,
                pixelated: bool = False, alpha: float | None = None) -> np.ndarray:
    """The panel picture, uint8 (H', W', 3): the image at `size` (default `display_size`) with the
    map's colours blended over it (`ColourScale.alpha`; a centred scale draws over the photo's grey
    version, so that only the map has colour). relevancy None: the image alone."""
    img = np.asarray(image)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise VlctlError(f"overlay: expected a uint8 image (H, W, 3), got {img.dtype} {img.shape}")
    size = tuple(size) if size is not None else display_size(*img.shape[:2], pixelated=pixelated)
    base = _resize(img, size, nearest=pixelated).astype(np.float64)
    if relevancy is None:
        return base.round().astype(np.uint8)
    r = np.asarray(relevancy, dtype=np.float32)
    if r.ndim != 2:
        raise VlctlError(f"overlay: expected one relevancy map (gh, gw), got shape {r.shape}")
    scale = scale or ColourScale.sequential([r], "relevancy")
    up = map_onto_image(r, size, region, smooth=not pixelated)
    if scale.centred:
        base = np.repeat(base @ np.array([0.299, 0.587, 0.114])[:, None], 3, axis=-1)
    a = (scale.alpha(up) if alpha is None else np.full(up.shape, float(alpha)))[..., None]
    out = (1.0 - a) * base + a * 255.0 * scale.colours(up)
    return np.clip(out, 0, 255).round().astype(np.uint8)


def _wrap(text: str, width_px: int, pt: float) -> list[str]:
    """Lines of `text` no wider than about width_px at `pt` points (DejaVu Sans: ~0.6 em per char)."""
    chars = max(8, int(width_px / (0.6 * pt * _DPI / 72)))
    return [ln for para in text.splitlines() for ln in (textwrap.wrap(para, chars) or [""])] if text else []


def _line_px(pt: float) -> int:
    return math.ceil(1.45 * pt * _DPI / 72)


def render_figure(panels: Sequence[Sequence[Panel]], title: str = "", note: str = "", pixelated: bool = False,
                  min_side: int = MIN_SIDE, max_side: int = MAX_SIDE) -> np.ndarray:
    """A grid of panels (rows of panels; every image drawn at the size of the first one's) as
    uint8 RGB: `title` on top, each panel's title above it, under each column the colour bar of
    its scale (the panels of a column share one scale, or VlctlError), `note` at the bottom."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    rows = [list(r) for r in panels]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise VlctlError("render_figure: panels must be a non-empty grid (rows of equal length)")
    h, w = display_size(*np.asarray(rows[0][0].image).shape[:2], min_side, max_side, pixelated)
    pics = [[overlay_rgb(p.image, p.relevancy, p.scale, p.region, (h, w), pixelated) for p in r] for r in rows]
    n_cols = len(rows[0])
    scales: list[ColourScale | None] = []
    for c in range(n_cols):
        col = [r[c].scale or (ColourScale.sequential([r[c].relevancy], "relevancy (this map's min to max)")
                              if r[c].relevancy is not None else None) for r in rows]
        used = [s for s in col if s is not None]
        if any(s != used[0] for s in used):
            raise VlctlError(f"render_figure: the panels of column {c} use different colour scales")
        scales.append(used[0] if used else None)
    width = 2 * _MARGIN + n_cols * w + (n_cols - 1) * _GAP
    head = _wrap(title, width - 2 * _MARGIN, _TITLE_PT)
    titles = [[_wrap(p.title, w, _TEXT_PT) for p in r] for r in rows]
    bar_labels = [_wrap(s.label, w, _SMALL_PT) if s else [] for s in scales]
    foot = _wrap(note, width - 2 * _MARGIN, _SMALL_PT)
    bar_h = 14
    bar_band = (10 + bar_h + _line_px(_SMALL_PT) + len(max(bar_labels, key=len)) * _line_px(_SMALL_PT)
                if any(scales) else 0)
    y = _MARGIN + len(head) * _line_px(_TITLE_PT) + (6 if head else 0)
    layout = []  # (y of the title band, y of the images) per row
    for r in titles:
        band = max(len(t) for t in r) * _line_px(_TEXT_PT) + 4
        layout.append((y, y + band))
        y += band + h + 8
    bar_y = y
    height = bar_y + bar_band + (len(foot) * _line_px(_SMALL_PT) + 6 if foot else 0) + _MARGIN

    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI, facecolor="white")
    canvas = FigureCanvasAgg(fig)

    def text(x: float, y_top: float, s: str, pt: float, **kw: Any) -> None:
        fig.text(x / width, 1 - y_top / height, s, fontsize=pt, va="top", **kw)

    for i, ln in enumerate(head):
        text(_MARGIN, _MARGIN + i * _line_px(_TITLE_PT), ln, _TITLE_PT, weight="bold")
    for r, (t_y, i_y) in enumerate(layout):
        for c in range(n_cols):
            x = _MARGIN + c * (w + _GAP)
            for k, ln in enumerate(titles[r][c]):
                text(x, t_y + k * _line_px(_TEXT_PT), ln, _TEXT_PT)
            fig.figimage(pics[r][c], xo=x, yo=height - i_y - h, origin="upper")
    for c, s in enumerate(scales):
        if s is None:
            continue
        x = _MARGIN + c * (w + _GAP)
        cax = fig.add_axes(((x + 0.05 * w) / width, 1 - (bar_y + 10 + bar_h) / height, 0.9 * w / width,
                            bar_h / height))
        cb = fig.colorbar(ScalarMappable(Normalize(s.vmin, s.vmax), s.bar_cmap()), cax=cax, orientation="horizontal")
        cb.ax.tick_params(labelsize=_SMALL_PT)
        if s.centred:
            cb.set_ticks([s.vmin, s.vmin / 2, 0.0, s.vmax / 2, s.vmax])
        else:
            cb.set_ticks(np.linspace(s.vmin, s.vmax, 3))
        tiny = 1e-6 * (s.vmax - s.vmin)
        cb.ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _, t=tiny: "0" if abs(v) < t else f"{v:.3g}"))
        labels = cb.ax.get_xticklabels()  # the end labels inside the bar's width: no overlap with the next
        labels[0].set_horizontalalignment("left")
        labels[-1].set_horizontalalignment("right")
        for k, ln in enumerate(bar_labels[c]):
            text(x, bar_y + 10 + bar_h + _line_px(_SMALL_PT) + 4 + k * _line_px(_SMALL_PT), ln, _SMALL_PT)
    for i, ln in enumerate(foot):
        text(_MARGIN, bar_y + bar_band + 6 + i * _line_px(_SMALL_PT), ln, _SMALL_PT, color="0.3")
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def save_figure(path: str | Path, panels: Sequence[Sequence[Panel]], title: str = "", note: str = "",
                pixelated: bool = False, **kw: Any) -> Path:
    """`render_figure` written as a PNG, atomically."""
    return atomic_write_bytes(path, _png(render_figure(panels, title, note, pixelated, **kw)))


def save_overlay(path: str | Path, image: np.ndarray, relevancy: np.ndarray, title: str = "",
                 scale: ColourScale | None = None, region: Sequence[float] = FULL_REGION, note: str = "",
                 pixelated: bool = False) -> Path:
    """One overlay with its title and colour bar as a PNG (a 1 x 1 `save_figure`)."""
    return save_figure(path, [[Panel(image, relevancy, title, scale, region)]], note=note, pixelated=pixelated)


METHOD_TITLES = {"hilacam": "HilaCAM of P", "anchor": "Anchor map (\u201cAP or AN\u201d)", "dire": "DiRe (P - N)"}


def save_map_grid(path: str | Path, image: np.ndarray, maps: dict[str, dict[str, np.ndarray]], positive: str = "",
                  negative: str = "", title: str = "", note: str = "", pixelated: bool = True) -> Path:
    """One image's maps from several models: a row per model (`maps[model][method]`, (gh, gw) over
    the whole image), the plain image first, then a column per method. Each column has one colour
    scale shared by its models (DiRe, method "dire": centred at 0), so the rows compare directly.
    Pixelated (default): the small scene images and their maps upscaled with nearest-neighbour."""
    models = list(maps)
    if not models:
        raise VlctlError("save_map_grid: no maps")
    methods = list(maps[models[0]])
    scales = {}
    for m in methods:
        vals = [maps[name][m] for name in models]
        who = " and ".join(models)
        if m == "dire":
            scales[m] = ColourScale.diverging(vals, f"DiRe (\u00b1max|D|), one scale for {who}: red = P, blue = N")
        else:
            scales[m] = ColourScale.sequential(vals, f"{METHOD_TITLES.get(m, m)}: one scale for {who}")
    rows = [[Panel(image, None, f"{name}: the image"),
             *[Panel(image, maps[name][m], f"{name}: {METHOD_TITLES.get(m, m)}", scales[m]) for m in methods]]
            for name in models]
    if not title and (positive or negative):
        title = f"P: \u201c{positive}\u201d  vs  N: \u201c{negative}\u201d"
    return save_figure(path, rows, title=title, note=note, pixelated=pixelated)


def write_explain(encoder: Any, image: np.ndarray, positive: str, negative: str | None, out: str | Path,
                  blocks: Any = "all", anchor: str | None = None, fit: str = "letterbox",
                  note: str = "") -> dict[str, Any]:
    """`vlctl explain`: relevancy overlays for one image (uint8 (H, W, 3)) and its text(s).

    Writes to `out`: hilacam_positive.png; with a negative also hilacam_negative.png, anchor.png
    and dire.png; plus maps.npz (the raw maps (gh, gw), the texts, the scores, the region the
    image fills in the model input). The maps come from `explain_maps` (fit: "letterbox", the
    whole image; "crop", its central square). The HilaCAM maps of P and N and the Anchor map share
    one colour scale; DiRe has its own, centred at 0.
    """
    from vlctl.methods.threevl.explain import explain_maps

    res = explain_maps(encoder, image, positive, negative, blocks=blocks, anchor=anchor, fit=fit)
    maps, shown, region = res.pop("maps"), res.pop("shown"), res.pop("region")
    texts, scores = res.pop("texts"), res.pop("scores")
    hila = [maps[k] for k in ("hilacam_positive", "hilacam_negative", "anchor") if k in maps]
    shared = ("HilaCAM relevancy; one scale for the P, N and Anchor maps (min to max over the three)"
              if negative is not None else "HilaCAM relevancy (min to max of this map)")
    seq = ColourScale.sequential(hila, shared)
    div = ColourScale.diverging([maps["dire"]] if "dire" in maps else [np.zeros(1)],
                                "DiRe = (R(P) - R(N)) / max|R(P) - R(N)|: red = more relevant to P, "
                                "blue = to N, grey photo = no difference")
    titles = {"hilacam_positive": f"HilaCAM of P: \u201c{positive}\u201d (cosine {scores[0]:.3f})",
              "hilacam_negative": f"HilaCAM of N: \u201c{negative}\u201d (cosine {scores[1]:.3f})"
              if negative is not None else "",
              "anchor": f"Anchor map, text \u201c{res.get('anchor_text')}\u201d",
              "dire": f"DiRe: HilaCAM(P) - HilaCAM(N); P: \u201c{positive}\u201d, N: \u201c{negative}\u201d"}
    h, w = np.asarray(image).shape[:2]
    how = (f"letterboxed to the model's {res['input_size']} px square input; the whole image is shown"
           if fit == "letterbox" else f"centre-cropped to the model's {res['input_size']} px input; only that "
           "square is shown")
    note = f"encoder {res.get('encoder_id')} \u00b7 image {w} x {h} px, {how}" + (f". {note}" if note else "")
    out = Path(out)
    files = [str(save_overlay(out / f"{name}.png", shown, m, titles[name], div if name == "dire" else seq,
                              region, note)) for name, m in maps.items()]
    extra = {"texts": np.array(texts), "scores": np.array(scores), "region": np.array(region)}
    files.append(str(atomic_save_npz(out / "maps.npz", **maps, **extra)))
    res["files"] = files
    return res

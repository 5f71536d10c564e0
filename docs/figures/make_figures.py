"""Regenerate the README's example figures (one of each kind vlctl draws) into docs/figures/.

    .venv/bin/python docs/figures/make_figures.py                     # random-weight encoders (~1 min, CPU)
    .venv/bin/python docs/figures/make_figures.py --encoder SPEC --scenes-model base=SPEC --scenes-model tree=SPEC

explain_hilacam.png, explain_dire.png  `vlctl explain` on skimage's 451 x 300 `chelsea` photo
                                       (letterboxed: the whole photo is explained and shown)
scenes_overlay.png                     the 3vl-scenes report's map grid for one 32 px test scene
contact_sheet.png                      a `vlctl cluster` contact sheet of skimage photo crops

By default the encoders have random weights (OpenCLIP ViT-S-32, TinyCLIP scenes-quick, seeds 0
and 1): the maps then show how the figures look, not what a trained model attends to, and every
figure says so. Pass trained encoders (specs as for `vlctl explain --encoder`) to show real maps.
PNGs over 200 KB (the photos) are saved with a dithered 256-colour palette.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
POSITIVE, NEGATIVE = "a photo of a tabby cat", "a photo of a tabby dog"
MAX_BYTES = 200_000


def _random_note(encoder_id: str | None) -> str:
    return ("RANDOM-WEIGHT encoder: this map shows the figure's layout, not what a trained model attends to"
            if "random" in str(encoder_id) else "")


def _save_small(src: Path, dst: Path) -> None:
    """Copy a PNG; one over MAX_BYTES (a photo) as a dithered 256-colour palette PNG (~2.5x smaller)."""
    from PIL import Image

    with Image.open(src) as im:
        rgb = im.convert("RGB")
    rgb.save(dst, optimize=True)
    if dst.stat().st_size > MAX_BYTES:
        palette = rgb.quantize(256, method=Image.Quantize.FASTOCTREE)
        rgb.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG).save(dst, optimize=True)
    size = dst.stat().st_size
    print(f"{dst}  {Image.open(dst).size[0]} x {Image.open(dst).size[1]} px  {size / 1000:.0f} KB")
    if size > MAX_BYTES:
        print(f"warning: {dst.name} is over {MAX_BYTES // 1000} KB", file=sys.stderr)


def explain_figures(out: Path, spec: str, tmp: Path) -> dict:
    import skimage.data

    from vlctl.encoders.factory import create
    from vlctl.report.overlays import write_explain

    enc = create(spec)
    res = write_explain(enc, skimage.data.chelsea(), POSITIVE, NEGATIVE, tmp / "explain", anchor="cat or dog",
                        note=_random_note(enc.id))
    _save_small(tmp / "explain" / "hilacam_positive.png", out / "explain_hilacam.png")
    _save_small(tmp / "explain" / "dire.png", out / "explain_dire.png")
    return res


def _scene_item(category: str = "relation_spatial"):
    from vlctl.data.scenes import ScenesConfig, checklist_items, make_sample

    cfg = ScenesConfig(split="test")
    for i in range(100):
        image, label = make_sample(i, cfg)
        items = checklist_items([label], category)
        if items:
            return i, image, items[0]
    raise RuntimeError("no scene with a checklist item in the first 100")


def scenes_figure(out: Path, models: dict[str, str] | None, tmp: Path) -> None:
    from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
    from vlctl.encoders.factory import create
    from vlctl.encoders.tiny_model import create_model
    from vlctl.methods.threevl import relevancy as rel
    from vlctl.report.overlays import save_map_grid

    index, image, item = _scene_item()
    if models:
        encoders = {name: create(spec) for name, spec in models.items()}
        note = ""
    else:
        encoders = {f"random seed {s}": TinyCLIPEncoder(create_model("scenes-quick", seed=s)) for s in (0, 1)}
        note = "RANDOM-WEIGHT TinyCLIPs (scenes-quick) stand in for the report's base and tree models"
    try:
        from vlctl.captions.anchor import anchor_text

        anchor = anchor_text(item["pos"], item["neg"])
    except Exception:  # noqa: BLE001 -- spaCy missing: the plain "P or N"
        anchor = f"{item['pos']} or {item['neg']}"
    maps = {}
    for name, enc in encoders.items():
        x = enc.preprocess(image)[None]
        mp = rel.hila_cam(enc, x, [item["pos"]])[0]
        mn = rel.hila_cam(enc, x, [item["neg"]])[0]
        ma = rel.hila_cam(enc, x, [anchor])[0]
        maps[name] = {"hilacam": mp, "anchor": ma, "dire": rel.dire_from_maps(mp, mn)}
    where = (f"relation_spatial, test scene {index} ({image.shape[1]} px, shown with nearest-neighbour "
             f"upscaling); anchor text \u201c{anchor}\u201d")
    note = f"{where}; {note}" if note else where
    save_map_grid(tmp / "scenes.png", image, maps, item["pos"], item["neg"], note=note)
    _save_small(tmp / "scenes.png", out / "scenes_overlay.png")


def contact_sheet(out: Path, tmp: Path) -> None:
    import skimage.data
    from PIL import Image

    from vlctl.report.contact_sheet import write_contact_sheet

    rng = np.random.default_rng(0)
    photos = tmp / "photos"
    photos.mkdir()
    paths = []
    for subject in ("chelsea", "astronaut", "coffee", "rocket"):
        img = getattr(skimage.data, subject)()
        h, w = img.shape[:2]
        for i in range(3):
            ch, cw = int(rng.integers(h // 2, h)), int(rng.integers(w // 2, w))
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            p = photos / f"{subject}_{i:02d}.jpg"
            Image.fromarray(img[y : y + ch, x : x + cw]).save(p, quality=90)
            paths.append(p)
    paths.insert(5, photos / "holiday_2019_broken_download.jpg")  # unreadable: a marked tile, still named
    paths[5].write_bytes(b"not a jpeg")
    write_contact_sheet(paths[:12], tmp / "sheet.png", cols=6,
                        title="subject: cluster 0 of 4 \u00b7 12 images \u00b7 nearest subclass: chelsea "
                        "(example sheet: skimage photos, not a real clustering)")
    _save_small(tmp / "sheet.png", out / "contact_sheet.png")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output directory (default: docs/figures)")
    ap.add_argument("--encoder", default="open_clip:ViT-S-32", help="encoder spec for the explain figures "
                    "(default: a random-weight OpenCLIP ViT-S-32)")
    ap.add_argument("--scenes-model", action="append", default=[], metavar="NAME=SPEC",
                    help="a row of the scenes figure (repeat; default: two random-weight scenes-quick TinyCLIPs)")
    ap.add_argument("--only", choices=("explain", "scenes", "contact"), action="append", default=None)
    args = ap.parse_args(argv)
    models = dict(m.split("=", 1) for m in args.scenes_model) or None
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="vlctl-figures-"))
    try:
        only = args.only or ["explain", "scenes", "contact"]
        if "explain" in only:
            explain_figures(args.out, args.encoder, tmp)
        if "scenes" in only:
            scenes_figure(args.out, models, tmp)
        if "contact" in only:
            contact_sheet(args.out, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

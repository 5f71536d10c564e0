"""Figures a person can read (issue 17): relevancy overlays over the whole (letterboxed) image at
>= 384 px with a title, a colour bar and shared scales; DiRe on a colour map centred at 0; the
3VL scenes grid upscaled with nearest-neighbour; contact sheets with file names under 128 px tiles."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vlctl.encoders.tiny_config import TinyCLIPConfig
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.encoders.tiny_model import create_model
from vlctl.fsops import VlctlError
from vlctl.methods.threevl import explain
from vlctl.methods.threevl import relevancy as rel
from vlctl.report import overlays as ov
from vlctl.report.contact_sheet import DEFAULT_THUMB, _fit_name, write_contact_sheet

VOCAB = ("red", "blue", "green", "circle", "square", "or")


@pytest.fixture(scope="module")
def tiny():
    cfg = TinyCLIPConfig(name="fig-test", image_size=16, patch_size=4, vision_width=32, vision_layers=2,
                         vision_heads=2, text_width=32, text_layers=1, text_heads=2, context_length=8, vocab=VOCAB,
                         embed_dim=16)
    return TinyCLIPEncoder(create_model(cfg, seed=0))


def _wide(h: int = 30, w: int = 90) -> np.ndarray:
    """A wide image: red at the left edge, blue at the right, grey between."""
    img = np.full((h, w, 3), 128, np.uint8)
    img[:, : w // 6] = (220, 20, 20)
    img[:, -(w // 6) :] = (20, 20, 220)
    return img


# --- letterbox and the map back onto the image ---------------------------------------------------


def test_letterbox_keeps_the_whole_image(tiny):
    img = _wide()
    box = explain.letterbox(img)
    assert box.image.shape == (90, 90, 3) and (box.top, box.left, box.height, box.width) == (30, 0, 30, 90)
    assert np.array_equal(box.image[30:60], img) and (box.image[:30] == explain.LETTERBOX_FILL).all()
    assert box.region == (1 / 3, 0.0, 2 / 3, 1.0)
    assert np.array_equal(explain.letterbox(img[:, :30]).image, img[:, :30])  # a square image: unchanged
    # The model input of the letterboxed image has the red and blue edges; the centre crop has neither.
    x_box = tiny.preprocess(box.image)
    x_crop = tiny.preprocess(img)
    mid = x_box.shape[-2] // 2
    assert x_box[0, mid, 0] > 0.5 and x_box[2, mid, -1] > 0.5  # red at the left, blue at the right
    assert abs(float(x_crop[0, mid, 0])) < 0.1 and abs(float(x_crop[2, mid, -1])) < 0.1  # grey only


def test_map_onto_image_matches_bilinear_upsampling_and_drops_the_padding():
    r = np.random.default_rng(0).random((4, 4)).astype(np.float32)
    full = F.interpolate(torch.from_numpy(r)[None, None], size=(90, 90), mode="bilinear", align_corners=False)[0, 0]
    np.testing.assert_allclose(explain.map_onto_image(r, (90, 90)), full.numpy(), atol=1e-6)
    box = explain.letterbox(_wide())
    on_image = explain.map_onto_image(r, (30, 90), box.region)
    np.testing.assert_allclose(on_image, full.numpy()[30:60], atol=1e-6)  # the square's image rows
    # Relevancy on the padding rows only (grid rows 0 and 3) is not drawn on the image (nearest).
    pad_only = np.zeros((4, 4), np.float32)
    pad_only[[0, 3]] = 1.0
    assert (explain.map_onto_image(pad_only, (30, 90), box.region, smooth=False) == 0).all()
    # A map hot at its left column is hot at the image's left side: the sides are drawn.
    left = np.zeros((4, 4), np.float32)
    left[:, 0] = 1.0
    m = explain.map_onto_image(left, (30, 90), box.region)
    assert m[:, :5].min() > 0.9 and m[:, -30:].max() == 0
    with pytest.raises(VlctlError, match="region"):
        explain.map_onto_image(r, (30, 90), (0.5, 0, 0.2, 1))


def test_explain_sees_the_sides_of_a_wide_image(tiny):
    """Changing the image's outer sixths changes the letterboxed map; the centre crop never sees them."""
    img = _wide(48, 144)
    other = img.copy()
    other[:, :24] = (20, 220, 20)
    other[:, -24:] = (240, 240, 0)
    a = explain.explain_maps(tiny, img, "red circle", fit="letterbox")
    b = explain.explain_maps(tiny, other, "red circle", fit="letterbox")
    assert a["shown"].shape == img.shape and a["region"] == (1 / 3, 0.0, 2 / 3, 1.0)
    assert not np.allclose(a["maps"]["hilacam_positive"], b["maps"]["hilacam_positive"])
    c = explain.explain_maps(tiny, img, "red circle", fit="crop")
    d = explain.explain_maps(tiny, other, "red circle", fit="crop")
    assert c["shown"].shape == (48, 48, 3)
    np.testing.assert_allclose(c["maps"]["hilacam_positive"], d["maps"]["hilacam_positive"])
    # the map drawn over the whole image is non-zero at both sides
    m = explain.map_onto_image(a["maps"]["hilacam_positive"], img.shape[:2], a["region"])
    assert m[:, :10].max() > 0 and m[:, -10:].max() > 0
    with pytest.raises(VlctlError, match="fit must be"):
        explain.explain_maps(tiny, img, "red", fit="stretch")


# --- colour scales and overlays -------------------------------------------------------------------


def test_dire_scale_is_centred_and_a_zero_map_is_neutral():
    s = ov.ColourScale.diverging([np.array([[0.2, -0.5]])], "DiRe")
    assert (s.vmin, s.vmax) == (-0.5, 0.5) and s.centred
    zero = ov.ColourScale.diverging([np.zeros((4, 4))], "DiRe")
    assert (zero.vmin, zero.vmax) == (-1.0, 1.0)
    centre = s.colours(np.array(0.0))
    assert np.ptp(centre) < 0.02 and centre.min() > 0.95  # the colour map's neutral centre (white)
    img = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)  # colourful
    out = ov.overlay_rgb(img, np.zeros((4, 4)), zero).astype(int)
    assert out.shape == (384, 576, 3) and (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
    d = np.zeros((4, 4))
    d[:, 0], d[:, -1] = 1.0, -1.0
    vis = ov.overlay_rgb(np.full((32, 32, 3), 128, np.uint8), d, ov.ColourScale.diverging([d], "DiRe")).astype(int)
    left, right = vis[:, :40].mean((0, 1)), vis[:, -40:].mean((0, 1))
    assert left[0] - left[2] > 60 and right[2] - right[0] > 60  # clearly red (P) and blue (N)


def test_shared_scale_keeps_maps_comparable():
    img = np.full((32, 32, 3), 100, np.uint8)
    m = np.linspace(0, 1, 16).reshape(4, 4)
    own = [ov.overlay_rgb(img, x) for x in (m, 0.5 * m)]  # each map min-max scaled alone: look the same
    assert np.array_equal(own[0], own[1])
    shared = ov.ColourScale.sequential([m, 0.5 * m], "one scale for both")
    assert (shared.vmin, shared.vmax) == (0.0, 1.0)
    assert not np.array_equal(ov.overlay_rgb(img, m, shared), ov.overlay_rgb(img, 0.5 * m, shared))
    grid = [[ov.Panel(img, m, "a", shared), ov.Panel(img, m, "b", ov.ColourScale.sequential([m], "x"))],
            [ov.Panel(img, m, "c", ov.ColourScale.sequential([m], "y")), ov.Panel(img, m, "d")]]
    with pytest.raises(VlctlError, match="column 0 use different colour scales"):
        ov.render_figure(grid)


def test_explain_figures_share_a_scale_and_are_large(tiny, tmp_path, monkeypatch):
    seen = {}
    real = ov.save_overlay

    def spy(path, image, relevancy, title="", scale=None, region=explain.FULL_REGION, note="", pixelated=False):
        seen[path.stem] = (scale, title, image.shape, region)
        return real(path, image, relevancy, title, scale, region, note, pixelated)

    monkeypatch.setattr(ov, "save_overlay", spy)
    img = _wide(45, 68)
    res = ov.write_explain(tiny, img, "red circle", "blue circle", tmp_path / "out", anchor="red or blue")
    z = np.load(tmp_path / "out" / "maps.npz")
    hila = [seen[k][0] for k in ("hilacam_positive", "hilacam_negative", "anchor")]
    assert hila[0] is hila[1] is hila[2] and "one scale" in hila[0].label
    lo = min(float(z[k].min()) for k in ("hilacam_positive", "hilacam_negative", "anchor"))
    hi = max(float(z[k].max()) for k in ("hilacam_positive", "hilacam_negative", "anchor"))
    assert hila[0].vmin == pytest.approx(lo) and hila[0].vmax == pytest.approx(hi)
    dire = seen["dire"][0]
    assert dire.centred and dire.vmin == -dire.vmax and dire.cmap == ov.DIVERGING_CMAP
    assert "red circle" in seen["hilacam_positive"][1] and "blue circle" in seen["hilacam_negative"][1]
    assert all(v[2] == img.shape for v in seen.values())  # drawn over the whole image
    assert ov.display_size(45, 68) == (384, 580)
    for f in res["files"][:4]:
        with Image.open(f) as im:
            assert im.size[0] >= 580 and im.size[1] >= 384 + 60  # panel + title + colour bar


def test_scenes_grid_is_upscaled_with_nearest(tmp_path):
    img = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert ov.display_size(32, 32, pixelated=True) == (384, 384)  # a whole factor: 12 x
    m = np.random.default_rng(2).random((8, 8))
    pic = ov.overlay_rgb(img, None, pixelated=True)
    assert np.array_equal(pic, np.kron(img, np.ones((12, 12, 1), np.uint8)))  # crisp pixels
    blocks = ov.overlay_rgb(img * 0, m, pixelated=True)
    assert np.array_equal(blocks, np.kron(blocks[::48, ::48], np.ones((48, 48, 1), np.uint8)))  # one block a patch
    maps = {name: {"hilacam": m, "anchor": m[::-1], "dire": rel.dire_from_maps(m, m.T)} for name in ("base", "tree")}
    p = ov.save_map_grid(tmp_path / "g.png", img, maps, "a red circle", "a blue circle")
    with Image.open(p) as im:
        assert im.size[0] >= 4 * 384 and im.size[1] >= 2 * 384 + 100


# --- contact sheets -------------------------------------------------------------------------------


def test_contact_sheet_names_under_thumbnails(tmp_path):
    paths = []
    for i, colour in enumerate([(200, 0, 0), (0, 200, 0), (0, 0, 200)]):
        p = tmp_path / f"photo_{i}_with_a_rather_long_file_name.png"
        Image.fromarray(np.full((40, 60, 3), colour, np.uint8)).save(p)
        paths.append(p)
    assert DEFAULT_THUMB >= 128
    named = write_contact_sheet(paths, tmp_path / "named.png", title="cluster 0", cols=3)
    plain = write_contact_sheet(paths, tmp_path / "plain.png", title="cluster 0", cols=3, names=[None] * 3)
    assert named.size[0] == plain.size[0] == 3 * 128 + 4 * 2
    assert named.size[1] == plain.size[1] + 15  # one line of names per row of tiles
    im = np.asarray(Image.open(named.path).convert("RGB")).astype(int)
    band = im[-17:-2]  # the name line under the tiles
    for c in range(3):
        cell = band[:, 2 + c * 130 : 2 + c * 130 + 128]
        assert (cell.min(axis=2) < 120).sum() > 30  # text is drawn under every tile
    width = __import__("PIL.ImageFont", fromlist=["x"]).load_default(size=11).getlength
    short = _fit_name("photo_0_with_a_rather_long_file_name.png", 126, width)
    assert "\u2026" in short and short.startswith("photo_") and short.endswith(".png") and width(short) <= 126
    assert _fit_name("a.png", 126, width) == "a.png"
    tiny_tiles = write_contact_sheet(paths, tmp_path / "t.png", cols=3, thumb=16)
    assert tiny_tiles.size[1] == 16 + 2 * 2  # tiles under MIN_NAMED_THUMB carry no name
    with pytest.raises(VlctlError, match="2 names for 3 images"):
        write_contact_sheet(paths, tmp_path / "x.png", names=["a", "b"])


def test_cluster_and_explain_cli_defaults(tmp_path):
    from vlctl.cli.explain import explain_args
    from vlctl.cli.methods import cluster_args

    p = argparse.ArgumentParser()
    cluster_args(p)
    assert p.parse_args([str(tmp_path), "--controlembed", str(tmp_path), "--attribute", "a"]).thumb >= 128
    img = tmp_path / "i.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(img)
    p = argparse.ArgumentParser()
    explain_args(p)
    assert p.parse_args(["--encoder", "e", str(img), "red", "--out", str(tmp_path / "o")]).fit == "letterbox"

"""The Clevr-4-like shapes generator (vlctl.data.shapes), its on-disk format and loaders."""

import json

import numpy as np
import pytest
from scipy import ndimage

from vlctl.data import shapes
from vlctl.data.mad import load_mad, mad_dataset_id
from vlctl.data.shapes import (
    CATEGORIES,
    COLORS,
    VALUES,
    ShapesConfig,
    caption,
    generate_shapes,
    load_clevr4,
    load_shapes,
    place_objects,
    render,
    shape_mask,
    texture_maps,
)
from vlctl.fsops import VlctlError


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes") / "d"
    generate_shapes(ShapesConfig(n=60, seed=3, image_size=48, workers=2, write_png=True), out)
    return out


def test_clevr4_taxonomies_exactly():
    assert VALUES["color"] == ("gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow", "pink", "orange")
    assert VALUES["texture"] == ("rubber", "metal", "checkered", "emojis", "wave", "brick", "star", "circles",
                                 "zigzag", "chessboard")
    assert VALUES["count"] == tuple(str(k) for k in range(1, 11))
    assert VALUES["shape"] == ("cube", "sphere", "monkey", "cone", "torus", "star", "teapot", "diamond", "gear",
                               "cylinder")
    assert COLORS == {"gray": (87, 87, 87), "red": (173, 35, 35), "blue": (42, 75, 215), "green": (29, 105, 20),
                      "brown": (129, 74, 25), "purple": (129, 38, 192), "cyan": (41, 208, 208),
                      "yellow": (255, 238, 51), "orange": (255, 146, 51), "pink": (255, 205, 243)}


def test_output_format_and_annotations(small):
    data = load_shapes(small, verify=True)
    assert data["images"].shape == (60, 48, 48, 3) and data["images"].dtype == np.uint8
    lab = data["labels"][0]
    assert set(lab) == {"filename", *CATEGORIES, "split", "caption"} and isinstance(lab["count"], int)
    ann = json.loads((small / "clevr_4_annots.json").read_text())
    assert list(ann) == [x["filename"] for x in data["labels"]]
    assert ann[lab["filename"]] == {c: lab[c] for c in (*CATEGORIES, "split")}
    assert data["meta"]["format"] == "vlctl-shapes"
    assert mad_dataset_id(small).startswith("shapes-")
    assert len(load_mad(small)["labels"]) == 60  # the TinyCLIP trainer's loader reads it unchanged


def test_clevr4_loader_reads_the_png_export(small):
    data = load_shapes(small)
    c4 = load_clevr4(small)
    assert np.array_equal(c4["images"], np.asarray(data["images"]))
    assert [{k: v for k, v in x.items()} for x in c4["labels"]] == [
        {c: lab[c] for c in ("filename", *CATEGORIES, "split")} for lab in data["labels"]]
    small24 = load_clevr4(small, image_size=24, split="train", limit=5)
    assert small24["images"].shape == (5, 24, 24, 3)


def test_clevr4_loader_bad_input(small, tmp_path):
    with pytest.raises(VlctlError, match="Clevr-4 folder not found"):
        load_clevr4(tmp_path / "none")
    ann = {"a.png": {"color": "red", "texture": "metal", "count": "3", "shape": "cube", "split": "train"}}
    (tmp_path / "clevr_4_annots.json").write_text(json.dumps(ann))
    with pytest.raises(VlctlError, match=r"entry 'a.png': image file not found"):
        load_clevr4(tmp_path)
    ann["a.png"]["shape"] = "blob"
    (tmp_path / "clevr_4_annots.json").write_text(json.dumps(ann))
    with pytest.raises(VlctlError, match=r"clevr_4_annots.json: entry 'a.png': field 'shape' has unknown value 'blob'"):
        load_clevr4(tmp_path)


def test_deterministic_and_independent_of_workers(tmp_path):
    a = generate_shapes(ShapesConfig(n=20, seed=1, image_size=32, workers=1), tmp_path / "a")
    b = generate_shapes(ShapesConfig(n=20, seed=1, image_size=32, workers=2), tmp_path / "b")
    c = generate_shapes(ShapesConfig(n=20, seed=2, image_size=32, workers=1), tmp_path / "c")
    assert (a / "images.npy").read_bytes() == (b / "images.npy").read_bytes()
    assert (a / "labels.jsonl").read_text() == (b / "labels.jsonl").read_text()
    assert (a / "images.npy").read_bytes() != (c / "images.npy").read_bytes()
    test = shapes.make_sample(0, ShapesConfig(n=1, seed=1, split="test", image_size=32))
    assert not np.array_equal(test[0], load_shapes(a)["images"][0])  # the split is part of the seed


def test_flat_object_colour_is_exact():
    """Inside a rubber object (no outline there) the pixel is 0.85 x the CLEVR colour exactly."""
    for color in ("gray", "red", "pink"):
        (cy, cx, _), = place_objects(1, 64, np.random.default_rng(5))
        img = render({"color": color, "texture": "rubber", "count": 1, "shape": "cube"}, 64, np.random.default_rng(5))
        expected = np.round(0.85 * np.array(COLORS[color], dtype=float))
        assert np.array_equal(img[int(cy), int(cx)], expected)
        corner = max(((0, 0), (0, 63), (63, 0), (63, 63)), key=lambda p: np.hypot(p[0] - cy, p[1] - cx))
        assert np.array_equal(img[corner], [200, 200, 200])  # the background, away from the object


def test_objects_do_not_overlap_and_stay_inside():
    for seed in range(30):
        discs = place_objects(10, 32, np.random.default_rng(seed))
        assert len(discs) == 10
        for i, (y, x, r) in enumerate(discs):
            assert r <= y <= 32 - r and r <= x <= 32 - r
            for y2, x2, r2 in discs[:i]:
                assert np.hypot(y - y2, x - x2) >= r + r2 + 1 - 1e-9


def test_count_is_the_number_of_objects():
    """Connected components of non-background pixels = count, for every colour (pink's fill is
    close to the background, so the threshold is low; antialiased edges never bridge objects)."""
    for i in range(40):
        rng = np.random.default_rng(i)
        count = int(rng.integers(1, 11))
        img = render({"color": VALUES["color"][i % 10], "texture": "rubber", "count": count, "shape": "sphere"},
                     64, rng)
        fg = np.abs(img.astype(int) - 200).sum(-1) > 20
        assert ndimage.label(fg)[1] == count


def test_silhouettes_and_textures_are_distinct():
    u, v = np.meshgrid(np.linspace(-1, 1, 96), np.linspace(-1, 1, 96), indexing="ij")
    masks = {s: shape_mask(s, u, v) for s in VALUES["shape"]}
    for s, m in masks.items():
        assert 0.15 < m.mean() < 0.9, s
    names = list(masks)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            iou = (masks[a] & masks[b]).sum() / (masks[a] | masks[b]).sum()
            assert iou < 0.85, (a, b, iou)
    maps = {t: np.concatenate(texture_maps(t, u, v)) for t in VALUES["texture"]}
    for i, a in enumerate(VALUES["texture"]):
        for b in VALUES["texture"][i + 1:]:
            assert np.abs(maps[a] - maps[b]).mean() > 0.05, (a, b)


def test_caption_scheme():
    attrs = {"color": "red", "texture": "wave", "count": "3", "shape": "torus"}
    rng = np.random.default_rng(0)
    assert caption(attrs, rng, (1, 1, 1, 1)) == "three red wavy tori"
    assert caption({**attrs, "count": "1"}, rng, (1, 1, 1, 1)) == "one red wavy torus"
    assert caption(attrs, rng, (1, 0, 0, 0)) == "red object"  # no count named: singular, no leak
    assert caption(attrs, rng, (0, 0, 1, 0)) == "three objects"
    assert caption({**attrs, "texture": "star", "shape": "star"}, rng, (0, 1, 0, 1)) == "star-patterned star"
    one = [caption(attrs, np.random.default_rng(s), (0, 0, 0, 0)) for s in range(40)]
    assert all(len(c.split()) <= 2 for c in one) and len(set(one)) == 4  # exactly one attribute, each possible
    texts = [caption(attrs, np.random.default_rng(s), (0.9, 0.5, 0.5, 0.75)) for s in range(2000)]
    assert 0.86 < np.mean(["red" in t for t in texts]) < 0.94
    assert 0.45 < np.mean(["wavy" in t for t in texts]) < 0.55


def test_uniform_attributes(small):
    labels = load_shapes(small)["labels"]
    big = [shapes.make_sample(i, ShapesConfig(n=1, image_size=16))[1] for i in range(500)]
    for c in CATEGORIES:
        counts = np.bincount(shapes.label_indices(big, c), minlength=10)
        assert counts.min() > 25, (c, counts)  # 50 expected each
    assert {lab["split"] for lab in labels} == {"train"}


def test_bad_config_and_labels(small, tmp_path):
    with pytest.raises(VlctlError, match="ShapesConfig.split: 'val'"):
        ShapesConfig(split="val")
    with pytest.raises(VlctlError, match="ShapesConfig.caption_probs: expected 4 probabilities"):
        ShapesConfig(caption_probs=(0.5, 0.5))
    with pytest.raises(VlctlError, match="ShapesConfig.image_size"):
        ShapesConfig(image_size=8)
    bad = tmp_path / "bad"
    generate_shapes(ShapesConfig(n=3, image_size=16, workers=1), bad)
    lines = (bad / "labels.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["count"] = 11
    (bad / "labels.jsonl").write_text("\n".join([lines[0], json.dumps(row), lines[2]]) + "\n")
    with pytest.raises(VlctlError, match=r"labels.jsonl: line 2: field 'count' has unknown value 11"):
        load_shapes(bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "format": "vlctl-mad"}))
    with pytest.raises(VlctlError, match=r"meta.json: format 'vlctl-mad', expected 'vlctl-shapes'"):
        load_shapes(bad)
    (bad / "meta.json").write_text(json.dumps({**meta, "format": "vlctl-other"}))
    with pytest.raises(VlctlError, match="unknown dataset format 'vlctl-other'"):
        load_mad(bad)


def test_cli_generates(tmp_path):
    from vlctl.cli import main

    assert main(["data", "shapes", "--n", "4", "--image-size", "16", "--workers", "1", "--out", str(tmp_path / "s")]) == 0
    assert load_shapes(tmp_path / "s")["images"].shape == (4, 16, 16, 3)

import argparse
import gzip
import json
import shutil

import numpy as np
import pytest
from scipy import ndimage

from vlctl.config import add_config_args, config_from_args
from vlctl.data import mad
from vlctl.data.mad import CATEGORIES, VALUES, generate_mad, load_mad, mad_dataset_id
from vlctl.data.mad_config import MadConfig
from vlctl.fsops import VlctlError

CATEGORY_OF = {v: c for c, vals in VALUES.items() for v in vals}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A small generated data set shared by the read-only tests."""
    return generate_mad(MadConfig(n=200, seed=3, workers=2), tmp_path_factory.mktemp("mad") / "train")


def _copy(dataset, tmp_path):
    return shutil.copytree(dataset, tmp_path / "copy")


def _bar(width=10, length=72):
    """A vertical bar on the 112x112 canvas: a stroke `width / 4` px thick at 28 px."""
    b = np.zeros((mad.CANVAS, mad.CANVAS), bool)
    top, left = (mad.CANVAS - length) // 2, (mad.CANVAS - width) // 2
    b[top:top + length, left:left + width] = True
    return b


# --- constants and config ----------------------------------------------------------------


def test_values():
    assert CATEGORIES == ("digit", "color", "thickthinning", "swelling", "fracture", "scaling")
    assert VALUES["digit"] == tuple("0123456789")
    assert sum(len(VALUES[c]) for c in CATEGORIES) == 26
    assert len(CATEGORY_OF) == 26  # every value names its category unambiguously


def test_config_cli_roundtrip():
    parser = argparse.ArgumentParser()
    add_config_args(parser, MadConfig)
    args = parser.parse_args(["--n", "7", "--seed", "5", "--split", "test", "--mnist-dir", "/x", "--workers", "1"])
    cfg = config_from_args(MadConfig, args)
    assert (cfg.n, cfg.seed, cfg.split, cfg.mnist_dir, cfg.workers, cfg.image_size) == (7, 5, "test", "/x", 1, 28)


@pytest.mark.parametrize("bad", [{"split": "val"}, {"n": 0}, {"seed": -1}, {"workers": 0}, {"small_scale": 1.5}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(VlctlError):
        MadConfig(**bad)


# --- generation --------------------------------------------------------------------------


def test_deterministic_and_independent_of_workers(tmp_path):
    a = generate_mad(MadConfig(n=40, seed=1, workers=1), tmp_path / "a")
    b = generate_mad(MadConfig(n=40, seed=1, workers=2), tmp_path / "b")
    c = generate_mad(MadConfig(n=40, seed=1, workers=1), tmp_path / "c")
    for name in ("images.npy", "labels.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes() == (c / name).read_bytes()
    assert mad_dataset_id(a) == mad_dataset_id(b) == mad_dataset_id(c)


def test_different_seeds_differ(tmp_path):
    a = load_mad(generate_mad(MadConfig(n=40, seed=1, workers=1), tmp_path / "a"))
    b = load_mad(generate_mad(MadConfig(n=40, seed=2, workers=1), tmp_path / "b"))
    assert not np.array_equal(a["images"], b["images"])
    assert [x["caption"] for x in a["labels"]] != [x["caption"] for x in b["labels"]]
    assert mad_dataset_id(tmp_path / "a") != mad_dataset_id(tmp_path / "b")


def test_labels_cover_values(dataset):
    labels = load_mad(dataset)["labels"]
    for c in CATEGORIES:
        seen = {str(x[c]) for x in labels}
        assert seen == set(VALUES[c]), c  # 200 uniform draws hit every value


def test_caption_format(dataset):
    digit_positions = set()
    for label in load_mad(dataset)["labels"]:
        parts = label["caption"].split(" - ")
        assert len(parts) == 4
        cats = [CATEGORY_OF[p] for p in parts]
        assert sorted(cats).count("digit") == 1 and len(set(cats)) == 4
        for part, cat in zip(parts, cats):
            assert part == str(label[cat])
        digit_positions.add(cats.index("digit"))
    assert digit_positions == {0, 1, 2, 3}  # random order


def test_colour_tints(dataset):
    data = load_mad(dataset)
    for img, label in zip(data["images"], data["labels"]):
        r, g, b = (img[..., k].astype(int) for k in range(3))
        assert img.max() > 0
        on = {"gray": "rgb", "red": "r", "green": "g", "blue": "b", "cyan": "gb", "magenta": "rb", "yellow": "rg"}[label["color"]]
        for name, ch in zip("rgb", (r, g, b)):
            assert (ch.max() > 0) == (name in on), (label["color"], name)
        lit = [ch for name, ch in zip("rgb", (r, g, b)) if name in on]
        assert all(np.array_equal(lit[0], ch) for ch in lit)  # same intensity v in every lit channel
        if label["color"] == "gray":
            assert r.max() <= 128


def test_train_test_disjoint(tmp_path):
    train, test = set(mad.sklearn_split("train")), set(mad.sklearn_split("test"))
    assert not train & test and len(train | test) == 1797
    assert 0.15 < len(test) / 1797 < 0.25
    labels = load_mad(generate_mad(MadConfig(n=60, split="test", workers=1), tmp_path / "t"))["labels"]
    assert {x["glyph"] for x in labels} <= test


def test_image_size(tmp_path):
    data = load_mad(generate_mad(MadConfig(n=4, image_size=32, workers=1), tmp_path / "s"))
    assert data["images"].shape == (4, 32, 32, 3)


# --- morphology --------------------------------------------------------------------------


def test_sklearn_glyphs_are_mnist_like():
    """The thick 8x8 glyphs are redrawn with thin strokes and drawn at MNIST's 20 px digit size."""
    glyphs = mad.load_glyphs(MadConfig(stroke_thickness=2.5))
    thickness, size = [], []
    for k in range(0, len(glyphs.ids), 40):
        binary = mad.draw_glyph(glyphs.images[k] / 255.0, np.random.default_rng(k))
        thickness.append(mad.skeleton_and_thickness(binary)[2])
        rows, cols = np.nonzero(binary)
        size.append((max(np.ptp(rows), np.ptp(cols)) + 1) / mad.SCALE)
    assert np.median(thickness) == pytest.approx(2.5, abs=0.4)
    assert np.median(size) == pytest.approx(mad.DIGIT_SIZE, abs=1.5) and np.ptp(size) < 6


def test_thicken_and_thin():
    bar = _bar()
    t0 = mad.skeleton_and_thickness(bar)[2]
    thick, thin = mad.thicken(bar, 0.7), mad.thin(bar, 0.7)
    assert 1.5 < mad.skeleton_and_thickness(thick)[2] / t0 < 2.0
    assert 0.1 < mad.skeleton_and_thickness(thin)[2] / t0 < 0.6
    assert thin.sum() < bar.sum() < thick.sum()
    assert (thin <= bar).all() and (bar <= thick).all()


def test_swell():
    bar = _bar()
    swollen = mad.swell(bar, np.random.default_rng(0), strength=3, radius=7)
    assert swollen.sum() > 1.2 * bar.sum()
    assert ndimage.distance_transform_edt(swollen).max() > 1.5 * ndimage.distance_transform_edt(bar).max()
    assert np.array_equal(mad.swell(bar, np.random.default_rng(0), strength=1, radius=7), bar)  # power 1 = identity


def test_fracture():
    bar = _bar(length=100)  # long enough that 3 cuts 4 px apart always fit between the tips
    rows = np.flatnonzero(bar.any(1))
    for seed in range(10):
        broken = mad.fracture(bar, np.random.default_rng(seed), count=3, width=1.5)
        assert broken.sum() < bar.sum() and (broken <= bar).all()
        assert ndimage.label(broken, np.ones((3, 3)))[1] == 4  # 3 separate cuts through the stroke
        cut_rows = np.flatnonzero((bar & ~broken).any(1))
        assert len(cut_rows) == 3 * 7  # each cut is 1.5 px (7 canvas rows) wide, straight across
        assert cut_rows.min() > rows[0] + 8 and cut_rows.max() < rows[-1] - 8  # away from the tips
    # a cut spans its own stroke only, not a parallel stroke 2.5 px away
    pair = bar | np.roll(bar, 20, axis=1)
    for seed in range(5):
        broken = mad.fracture(pair, np.random.default_rng(seed), count=3, width=1.5)
        assert (pair & ~broken).sum() == 3 * 7 * 10


def test_small_scale():
    glyphs = mad.load_glyphs(MadConfig())
    attrs = {"digit": "1", "color": "gray", "thickthinning": "no thickthinning", "swelling": "no swelling",
             "fracture": "no fracture"}
    heights = []
    for scaling in ("large", "small"):
        img = mad.render(glyphs.images[0] / 255.0, {**attrs, "scaling": scaling}, np.random.default_rng(0), MadConfig())
        rows = np.flatnonzero(img.max(axis=(1, 2)) > 64)
        heights.append(rows[-1] - rows[0] + 1)
    assert 0.65 < heights[1] / heights[0] < 0.85


# --- loading and bad input ---------------------------------------------------------------


def test_load_roundtrip(dataset):
    data = load_mad(dataset, verify=True)
    assert isinstance(data["images"], np.memmap) and not data["images"].flags.writeable
    assert data["images"].shape == (200, 28, 28, 3) and data["images"].dtype == np.uint8
    assert len(data["labels"]) == data["meta"]["n"] == 200
    assert isinstance(data["labels"][0]["digit"], int)
    assert data["meta"]["values"] == {c: list(v) for c, v in VALUES.items()}
    assert data["path"] == dataset


def test_load_missing(tmp_path, dataset):
    with pytest.raises(VlctlError, match="nowhere"):
        load_mad(tmp_path / "nowhere")
    for name in ("images.npy", "labels.jsonl", "meta.json"):
        d = shutil.copytree(dataset, tmp_path / name)
        (d / name).unlink()
        with pytest.raises(VlctlError, match=name.replace(".", r"\.")):
            load_mad(d)


def test_load_corrupt_json_line(tmp_path, dataset):
    d = _copy(dataset, tmp_path)
    lines = (d / "labels.jsonl").read_text().splitlines()
    lines[4] = lines[4][:-3]
    (d / "labels.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(VlctlError, match=r"labels\.jsonl: line 5"):
        load_mad(d)


def test_load_count_mismatch(tmp_path, dataset):
    d = _copy(dataset, tmp_path)
    lines = (d / "labels.jsonl").read_text().splitlines()
    (d / "labels.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(VlctlError, match="count mismatch"):
        load_mad(d)


def test_load_wrong_images(tmp_path, dataset):
    d = _copy(dataset, tmp_path)
    np.save(d / "images.npy", np.zeros((200, 28, 28, 3), np.float32))
    with pytest.raises(VlctlError, match=r"images\.npy.*float32"):
        load_mad(d)
    np.save(d / "images.npy", np.zeros((200, 28, 28), np.uint8))
    with pytest.raises(VlctlError, match=r"images\.npy"):
        load_mad(d)
    (d / "images.npy").write_bytes(b"not a npy file")
    with pytest.raises(VlctlError, match=r"images\.npy: corrupt"):
        load_mad(d)


def test_load_unknown_value(tmp_path, dataset):
    d = _copy(dataset, tmp_path)
    lines = (d / "labels.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["color"] = "purple"
    lines[2] = json.dumps(bad)
    (d / "labels.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(VlctlError, match=r"labels\.jsonl: line 3: field 'color' has unknown value 'purple'"):
        load_mad(d)


def test_load_verify_detects_changed_file(tmp_path, dataset):
    d = _copy(dataset, tmp_path)
    images = np.load(d / "images.npy")
    images[0, 0, 0, 0] ^= 1
    np.save(d / "images.npy", images)
    # The first pixel is in a sampled block of the fast hash, so even the cheap open refuses it.
    with pytest.raises(VlctlError, match=r"images\.npy"):
        load_mad(d)
    with pytest.raises(VlctlError, match=r"images\.npy: sha256"):
        load_mad(d, verify=True)


# --- MNIST IDX source --------------------------------------------------------------------


def _write_idx(path, arr, gz):
    data = bytes([0, 0, 8, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def _fake_mnist(directory, prefix, n=30, gz=False):
    """IDX files holding scikit-learn glyphs upscaled to 28x28, as MNIST would store them."""
    glyphs = mad.load_glyphs(MadConfig())
    labels = np.arange(n, dtype=np.uint8) % 10
    idx = [glyphs.by_digit[d][i] for i, d in enumerate(labels)]
    images = np.zeros((n, 28, 28), np.uint8)
    images[:, 2:26, 2:26] = np.stack([np.kron(glyphs.images[k][::5, ::5], np.ones((3, 3), np.uint8)) for k in idx])
    ext = ".gz" if gz else ""
    _write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", images, gz)
    _write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", labels, gz)


def test_mnist_source(tmp_path):
    _fake_mnist(tmp_path, "train", gz=True)
    _fake_mnist(tmp_path, "t10k", n=20)
    for split, n_src in (("train", 30), ("test", 20)):
        data = load_mad(generate_mad(MadConfig(n=30, split=split, mnist_dir=str(tmp_path), workers=1), tmp_path / split))
        assert data["meta"]["source"] == "mnist"
        assert all(0 <= x["glyph"] < n_src for x in data["labels"])
        assert data["images"].max() > 0


def test_bad_mnist_dir_writes_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(VlctlError, match="train-images-idx3-ubyte"):
        generate_mad(MadConfig(n=5, mnist_dir=str(tmp_path / "missing")), out)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01junk")
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x00")
    with pytest.raises(VlctlError, match="train-images-idx3-ubyte"):
        generate_mad(MadConfig(n=5, mnist_dir=str(tmp_path)), out)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp leftovers


def test_failure_keeps_previous_output(tmp_path, dataset, monkeypatch):
    out = _copy(dataset, tmp_path)
    before = (out / "images.npy").read_bytes()

    def boom(*args):
        raise RuntimeError("render failed")

    monkeypatch.setattr(mad, "make_range", boom)
    with pytest.raises(RuntimeError):
        generate_mad(MadConfig(n=5, workers=1), out)
    assert (out / "images.npy").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

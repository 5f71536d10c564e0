"""`vlctl cluster GALLERY`: ControlEmbed k-means over a `vlctl index` gallery, contact sheets per
cluster; and `vlctl.report.contact_sheet` itself."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vlctl.cli import main
from vlctl.embeddings.store import open_gallery
from vlctl.encoders.tiny_model import create_model
from vlctl.encoders.tiny_pretrained import save_pretrained
from vlctl.fsops import VlctlError
from vlctl.methods.controlembed.estimator import ControlEmbed, normalize_rows
from vlctl.report.contact_sheet import write_contact_sheet

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
COND = {"color": np.array([1.0, 0.0, 0.0, 0.0]), "size": np.array([0.0, 1.0, 0.0, 0.0])}


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in argv else out), err


# --- contact sheets ------------------------------------------------------------------------------


def test_contact_sheet_grid_title_and_unreadable_tiles(tmp_path):
    good = tmp_path / "good.png"
    Image.fromarray(np.full((10, 20, 3), (0, 0, 255), np.uint8)).save(good)
    (tmp_path / "junk.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    buf = tmp_path / "b.png"
    Image.fromarray(np.full((5, 5, 3), (0, 255, 0), np.uint8)).save(buf)
    items = [good, tmp_path / "missing.png", np.full((8, 8, 3), 255, np.uint8), tmp_path / "junk.jpg",
             buf.read_bytes(), Image.new("L", (4, 4), 0)]
    sheet = write_contact_sheet(items, tmp_path / "out" / "s.png", title="cluster 3", thumb=16, cols=4)
    assert [p for p, _ in sheet.unreadable] == [1, 3] and "missing.png" in sheet.unreadable[0][1]
    assert sheet.n_images == 6
    im = np.asarray(Image.open(tmp_path / "out" / "s.png").convert("RGB"))
    # 4 columns x 16 px + 5 x 2 px padding; title band (18 px + 2) above 2 rows of tiles.
    assert im.shape == (20 + 2 * 16 + 3 * 2, 4 * 16 + 5 * 2, 3) == (sheet.size[1], sheet.size[0], 3)
    top = 20 + 2
    # tile 0: the 20 x 10 blue image scaled to 16 x 8, centred vertically (rows 4..11 of the tile)
    assert tuple(im[top + 8, 2 + 8]) == (0, 0, 255) and tuple(im[top + 1, 2 + 8]) == (255, 255, 255)
    # tile 1 (missing file): grey with a red cross through its centre
    x1 = 2 + 16 + 2
    assert tuple(im[top + 2, x1 + 12]) == (160, 160, 160) and im[top + 8, x1 + 8, 0] == 200
    assert tuple(im[top + 16 + 2 + 8, 2 + 8]) == (0, 255, 0)  # tile 4: encoded bytes, second row
    assert (im[:20].min(axis=2) < 100).any()  # the title was drawn
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s.png"]  # no temp file left
    # A title wider than the sheet wraps onto more lines, each inside the sheet.
    long = write_contact_sheet(items, tmp_path / "l.png", title="cluster 3 · 6 images · nearest: red", thumb=16,
                               cols=4)
    extra = long.size[1] - sheet.size[1]
    assert extra >= 2 * 18 and extra % 18 == 0 and long.size[0] == sheet.size[0]
    band = np.asarray(Image.open(long.path).convert("RGB"))[: 20 + extra]
    assert (band[:, -2:] == 255).all() and (band.min(axis=2) < 100).sum() > 50
    empty = write_contact_sheet([], tmp_path / "e.png", title="")
    assert empty.n_images == 0 and Image.open(empty.path).size == (128 + 4, 2)  # the default thumb: 128 px
    with pytest.raises(VlctlError, match="thumb must be"):
        write_contact_sheet(items, tmp_path / "x.png", thumb=2)


# --- vlctl cluster on a vlctl index gallery ----------------------------------------------------


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """12 PNGs in three colours, two sizes; a gallery from `vlctl index` with a tiny TinyCLIP."""
    root = tmp_path_factory.mktemp("cluster")
    save_pretrained(create_model("mad-quick", seed=0), root / "model")
    rng = np.random.default_rng(0)
    photos = root / "photos"
    photos.mkdir()
    color_of, size_of = [], []
    for i in range(12):
        color, big = list(COLORS)[i % 3], i % 2 == 0
        a = np.full((28, 28, 3), 245, np.uint8)
        r = 12 if big else 5
        a[14 - r : 14 + r, 14 - r : 14 + r] = COLORS[color]
        a = np.clip(a.astype(int) + rng.integers(-10, 10, a.shape), 0, 255).astype(np.uint8)
        Image.fromarray(a).save(photos / f"img{i:02d}.png")
        color_of.append(color)
        size_of.append("big" if big else "small")
    gal = root / "gallery"
    assert main(["index", str(photos), "--encoder", f"tiny:{root / 'model'}", "--out", str(gal),
                 "--no-progress", "--json"]) == 0
    g = open_gallery(gal)
    by_name = {m["relpath"]: r for r, m in enumerate(g.metadata())}
    order = [by_name[f"img{i:02d}.png"] for i in range(12)]  # gallery row of image i
    vecs = g.vectors(np.arange(12))
    labels = {"color": [None] * 12, "size": [None] * 12}
    for i, row in enumerate(order):
        labels["color"][row], labels["size"][row] = color_of[i], size_of[i]
    from vlctl.encoders.factory import create

    enc = create(f"tiny:{root / 'model'}")
    with torch.no_grad():
        text = {c: enc.encode_texts(enc.tokenize(sorted(set(labels[c])) if c == "color" else ["1", "9"]),
                                    normalize=True).numpy() for c in ("color", "size")}
    model = ControlEmbed(steps=20, align_weight=0.0, images_per_subclass=2, hidden=16).fit(
        vecs, labels, encoder_id=g.encoder_id, category_emb=COND, class_text_emb=text)
    model.save(root / "ce")
    other = ControlEmbed(steps=2, align_weight=0.0, images_per_subclass=2, hidden=16).fit(
        vecs, labels, encoder_id="other-encoder@0", category_emb=COND)
    other.save(root / "ce-other")
    return root, gal, model, vecs


def test_cluster_gallery_writes_json_and_one_sheet_per_cluster(indexed, tmp_path, capsys):
    root, gal, model, vecs = indexed
    out = tmp_path / "clusters"
    rc, res, _ = _run(["cluster", str(gal), "--attribute", "color", "--controlembed", str(root / "ce"),
                       "--out", str(out), "--per-sheet", "3", "--thumb", "16", "--json"], capsys)
    assert rc == 0 and res["k"] == 3 and res["contact_sheets"] == 3 and res["unreadable_images"] == 0
    doc = json.loads((out / "clusters.json").read_text())
    want = model.cluster(vecs, "color", seed=0)
    assert doc["cluster_of_image"] == want.tolist() and doc["attribute"] == "color" and doc["k"] == 3
    assert doc["store_kind"] == "files" and doc["model"] == str(root / "ce")
    g = open_gallery(gal)
    assert doc["images"] == [m["path"] for m in g.metadata()]
    assert {int(c): n for c, n in doc["cluster_sizes"].items()} == {
        c: int(n) for c, n in zip(*np.unique(want, return_counts=True))}
    z = normalize_rows(model.transform(vecs, "color"))
    sheets = sorted(p.name for p in out.glob("*.png"))
    assert sheets == ["cluster_00.png", "cluster_01.png", "cluster_02.png"]
    for info in doc["clusters"]:
        members = np.flatnonzero(want == info["id"])
        centre = z[members].mean(0)
        d = np.linalg.norm(z[members] - centre, axis=1)
        assert info["nearest"] == members[np.argsort(d, kind="stable")[:3]].tolist()
        t = model.class_text_emb_["color"] @ (centre / np.linalg.norm(centre))
        assert info["subclass"] == model.subclasses_["color"][int(np.argmax(t))]
        im = Image.open(out / info["sheet"])
        im.load()
        n = min(3, info["size"])
        assert im.size == (n * 16 + (n + 1) * 2, im.size[1]) and im.size[1] > 16
    # Fewer clusters on a re-run: the earlier run's extra sheets are removed.
    rc, res, _ = _run(["cluster", str(gal), "--attribute", "color", "--controlembed", str(root / "ce"),
                       "--out", str(out), "--k", "2", "--json"], capsys)
    assert rc == 0 and sorted(p.name for p in out.glob("*.png")) == ["cluster_00.png", "cluster_01.png"]
    assert json.loads((out / "clusters.json").read_text())["k"] == 2


def test_cluster_counts_unreadable_images_and_keeps_legacy_flags(indexed, tmp_path, capsys):
    root, gal, model, vecs = indexed
    # A copy of the gallery whose row 0 now points at a corrupt file: a grey tile, counted.
    import shutil

    gal2 = tmp_path / "gal2"
    shutil.copytree(gal, gal2)
    g = open_gallery(gal2)
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"junk")
    meta_file = gal2 / g.manifest["shards"][0]["metadata"]
    import pyarrow.parquet as pq

    table = pq.read_table(meta_file)
    paths = table.column("path").to_pylist()
    pq.write_table(table.set_column(table.column_names.index("path"), "path", [[str(bad)] + paths[1:]]), meta_file)
    manifest = json.loads((gal2 / "manifest.json").read_text())
    from vlctl.io import fast_hash_file, sha256_file

    shard = manifest["shards"][0]
    shard |= {"metadata_sha256": sha256_file(meta_file), "metadata_fast": fast_hash_file(meta_file),
              "metadata_bytes": meta_file.stat().st_size}
    (gal2 / "manifest.json").write_text(json.dumps(manifest))
    rc, res, _ = _run(["cluster", "--gallery", str(gal2), "--attribute", "color", "--model", str(root / "ce"),
                       "--out", str(tmp_path / "o"), "--json"], capsys)
    assert rc == 0 and res["unreadable_images"] == 1
    doc = json.loads((tmp_path / "o" / "clusters.json").read_text())
    assert [r for c in doc["clusters"] for r in c["unreadable"]] == [0]
    # --out X.json: the earlier form, the clusters only.
    rc, res, _ = _run(["cluster", "--model", str(root / "ce"), "--gallery", str(gal), "--attribute", "size",
                       "--out", str(tmp_path / "c.json"), "--json"], capsys)
    assert rc == 0 and res["k"] == 2
    assert json.loads((tmp_path / "c.json").read_text())["cluster_of_image"] == model.cluster(vecs, "size").tolist()


def test_cluster_refuses_a_model_of_another_encoder_and_bad_input(indexed, tmp_path, capsys):
    root, gal, _, _ = indexed
    rc, _, err = _run(["cluster", str(gal), "--attribute", "color", "--controlembed", str(root / "ce-other"),
                       "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "fitted on 'other-encoder@0'" in err and "embeddings come from encoder 'tinyclip" in err
    assert not (tmp_path / "o").exists()
    rc, _, err = _run(["cluster", str(tmp_path), "--attribute", "color", "--controlembed", str(root / "ce")], capsys)
    assert rc == 2 and "store manifest not found" in err
    rc, _, err = _run(["cluster", str(gal), "--gallery", str(gal), "--attribute", "color", "--controlembed",
                       str(root / "ce")], capsys)
    assert rc == 2 and "give the store once" in err
    rc, _, err = _run(["cluster", str(gal), "--attribute", "texture", "--controlembed", str(root / "ce")], capsys)
    assert rc == 2 and err.rstrip().endswith("it has no number of subclasses to cluster into: give --k")


def test_cluster_embedding_cache_with_its_dataset_images(tmp_path, capsys):
    """The synthetic sets: an embedding cache (vlctl embed) + --data for the images (its memmap)."""
    from vlctl.data.mad import load_mad, mad_dataset_id
    from vlctl.data.shapes import ShapesConfig, generate_shapes
    from vlctl.embeddings.cache import embed
    from vlctl.encoders.tiny_encoder import TinyCLIPEncoder

    data_dir = generate_shapes(ShapesConfig(n=24, image_size=28, workers=1), tmp_path / "shapes")
    data = load_mad(data_dir)
    enc = TinyCLIPEncoder(create_model("mad-quick", seed=0))
    cache = embed(enc, images=data["images"], data_id=mad_dataset_id(data_dir), root=tmp_path / "cache",
                  progress=False)
    model = ControlEmbed(steps=2, align_weight=0.0, images_per_subclass=2, hidden=16).fit(
        cache.image_emb, {"color": np.arange(24) % 3}, encoder_id=enc.id, category_emb={"color": COND["color"]})
    model.save(tmp_path / "ce")
    base = ["cluster", str(cache.path), "--attribute", "color", "--controlembed", str(tmp_path / "ce"), "--k", "3",
            "--json"]
    rc, res, _ = _run([*base, "--out", str(tmp_path / "o1")], capsys)
    assert rc == 0 and res["contact_sheets"] == 0 and "--data" in res["note"]
    rc, res, _ = _run([*base, "--out", str(tmp_path / "o2"), "--data", str(data_dir)], capsys)
    assert rc == 0 and res["contact_sheets"] == 3 and res["store_kind"] == "generated"
    assert len(list((tmp_path / "o2").glob("cluster_*.png"))) == 3
    other = generate_shapes(ShapesConfig(n=24, image_size=28, workers=1, seed=1), tmp_path / "shapes2")
    rc, _, err = _run([*base, "--out", str(tmp_path / "o3"), "--data", str(other)], capsys)
    assert rc == 2 and "not the data the store" in err


def test_contact_sheet_names_draw_non_ascii_letters(tmp_path):
    """Issue 43: 'Zürich' and 'café' were drawn with boxes (PIL's default font is ASCII only). Each
    letter is drawn as its own glyph, not as the font's box for a missing one (U+E000 has none)."""
    from PIL import Image, ImageDraw

    from vlctl.report.contact_sheet import _font, font_file

    assert font_file() is not None and font_file().endswith("DejaVuSans.ttf")
    font = _font(12)

    def drawn(text):
        im = Image.new("L", (40, 24))
        ImageDraw.Draw(im).text((2, 2), text, font=font, fill=255)
        return np.asarray(im)

    missing = drawn("\ue000")
    for letter in "üéж–ß":
        assert not np.array_equal(drawn(letter), missing), letter

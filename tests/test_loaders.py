"""Loaders on the real caption files in ../shared/data and on fixtures built in their formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlctl.data.loaders.compositional import load_sugarcrepe, load_vl_checklist
from vlctl.data.loaders.folder import list_images, load_caption_table, load_image_folder
from vlctl.data.loaders.retrieval import load_karpathy, load_long_captions, load_rococo
from vlctl.eval.metrics import recall_at_k
from vlctl.fsops import VlctlError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
COCO_TEST = SHARED / "coco_karpathy_test.json"
needs_shared = pytest.mark.skipif(not COCO_TEST.is_file(), reason="needs the real caption files in ../shared/data, a folder beside the clone (not in the repository)")


def _png(path: Path, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(path)


@needs_shared
def test_coco_karpathy_test_keeps_every_caption():
    raw = json.loads(COCO_TEST.read_text())
    data = load_karpathy(COCO_TEST)
    assert data.n_images == 5000 and len(data.captions) == 25010 and data.root is None
    counts = np.bincount(data.image_of_text)
    assert sorted(set(counts.tolist())) == [5, 6] and (counts == 6).sum() == 10
    assert data.images[0] == raw[0]["image"] and data.captions_of(0) == raw[0]["caption"]
    six = int(np.flatnonzero(counts == 6)[0])
    assert data.captions_of(six) == raw[six]["caption"]
    # The map is what recall_at_k takes: the oracle score matrix scores 100 everywhere.
    sub = data.image_of_text < 50
    oracle = (np.arange(50)[:, None] == data.image_of_text[sub][None, :]).astype(np.float32)
    assert set(recall_at_k(oracle, data.image_of_text[sub]).values()) == {100.0}


def _karpathy_fixture(tmp_path: Path, raw: list[dict], flickr: bool = False) -> Path:
    """Karpathy's dataset_coco.json / dataset_flickr30k.json layout for the given items."""
    images = []
    for i, item in enumerate(raw):
        folder, name = item["image"].split("/")
        im = {
            "filename": name,
            "imgid": i,
            "split": ["test", "train", "val", "restval"][i % 4],
            "sentids": list(range(5 * i, 5 * i + len(item["caption"]))),
            "sentences": [
                {"raw": c, "tokens": c.lower().split(), "imgid": i, "sentid": 5 * i + j}
                for j, c in enumerate(item["caption"])
            ],
        }
        if not flickr:
            im.update(filepath=folder, cocoid=int(name.split("_")[-1].split(".")[0]))
        images.append(im)
    path = tmp_path / ("dataset_flickr30k.json" if flickr else "dataset_coco.json")
    path.write_text(json.dumps({"images": images, "dataset": "flickr30k" if flickr else "coco"}))
    return path


@needs_shared
def test_karpathy_original_format_and_splits(tmp_path):
    raw = json.loads(COCO_TEST.read_text())[:20]
    coco = _karpathy_fixture(tmp_path, raw)
    test = load_karpathy(coco, split="test")
    assert test.images == [raw[i]["image"] for i in range(0, 20, 4)]
    assert test.captions == [c for i in range(0, 20, 4) for c in raw[i]["caption"]]
    assert test.image_fields[1] == {
        "split": "test",
        "imgid": 4,
        "cocoid": int(raw[4]["image"][-16:-4]),
        "sentids": list(range(20, 20 + len(raw[4]["caption"]))),
    }
    assert load_karpathy(coco, split=None).n_images == 20
    assert load_karpathy(coco, split="restval").images == [raw[i]["image"] for i in range(3, 20, 4)]
    flickr = load_karpathy(_karpathy_fixture(tmp_path, raw, flickr=True), split="val")
    assert flickr.images == [raw[i]["image"].split("/")[1] for i in range(2, 20, 4)]  # no filepath in Flickr30k
    with pytest.raises(VlctlError, match=r"no images in split 'tset'; the file has splits \['restval', 'test'"):
        load_karpathy(coco, split="tset")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"images": [{"filename": "x.jpg", "split": "test"}]}))
    with pytest.raises(VlctlError, match=r"bad.json: images\[0\] lacks field 'sentences'"):
        load_karpathy(bad)
    bad.write_text(json.dumps([{"image": "a.jpg", "caption": [1, 2]}]))
    with pytest.raises(VlctlError, match="item 0: 'caption' must be a list of strings"):
        load_karpathy(bad)


def test_missing_images_are_reported_or_skipped(tmp_path):
    items = [{"image": f"val/{i:03d}.jpg", "caption": [f"cap {i} a", f"cap {i} b"]} for i in range(15)]
    ann = tmp_path / "test.json"
    ann.write_text(json.dumps(items))
    root = tmp_path / "images"
    for i in range(15):
        if i not in (2, 7, 8):
            _png(root / f"val/{i:03d}.jpg")
    with pytest.raises(VlctlError) as e:
        load_karpathy(ann, root=root)
    msg = str(e.value)
    assert "3 of 15 image files not found under" in msg and str(root.resolve()) in msg
    assert "val/002.jpg, val/007.jpg, val/008.jpg" in msg
    data = load_karpathy(ann, root=root, on_missing="skip")
    assert data.missing == ["val/002.jpg", "val/007.jpg", "val/008.jpg"]
    assert data.n_images == 12 and len(data.captions) == 24
    assert [data.captions[j].split()[1] for j in range(0, 24, 2)] == [str(i) for i in range(15) if i not in (2, 7, 8)]
    assert all(p.is_file() for p in data.image_paths())
    # More than 10 missing: the first 10 are named, then the count of the rest.
    with pytest.raises(VlctlError, match=r"15 of 15 image files .*val/009.jpg, \.\.\. \(5 more\)"):
        load_karpathy(ann, root=tmp_path)
    with pytest.raises(VlctlError, match="image root directory not found"):
        load_karpathy(ann, root=tmp_path / "nope")


def test_caption_table_csv_and_tsv(tmp_path):
    for i in range(3):
        _png(tmp_path / f"{i}.png")
    tsv = tmp_path / "train.tsv"  # OpenCLIP's default: tab-separated, filepath / title
    tsv.write_text('filepath\ttitle\n0.png\ta cat, sitting\n1.png\ta dog\n0.png\tthe same cat\n2.png\t"quoted"\n')
    data = load_caption_table(tsv)
    assert data.images == ["0.png", "1.png", "2.png"] and data.root == tmp_path
    assert data.captions == ["a cat, sitting", "the same cat", "a dog", "quoted"]
    assert data.image_of_text.tolist() == [0, 0, 1, 2]
    csv_path = tmp_path / "pairs.csv"
    csv_path.write_text('image,caption,extra\n0.png,"a, b",x\n9.png,lost,y\n')
    with pytest.raises(VlctlError, match=r"1 of 2 image files not found .*: 9.png"):
        load_caption_table(csv_path)
    assert load_caption_table(csv_path, on_missing="skip").captions == ["a, b"]
    assert load_caption_table(csv_path, image_column="image", caption_column="extra", on_missing="skip").captions == [
        "x"
    ]
    with pytest.raises(
        VlctlError, match=r"no column 'img' for the image path; columns are \['image', 'caption', 'extra'\]"
    ):
        load_caption_table(csv_path, image_column="img")
    odd = tmp_path / "odd.csv"
    odd.write_text("name,label\na.png,x\n")
    with pytest.raises(VlctlError, match="cannot tell which column holds the image path"):
        load_caption_table(odd)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("filepath,title\n0.png,a,b\n")
    with pytest.raises(VlctlError, match="ragged.csv:2: more fields than the header's 2"):
        load_caption_table(ragged)


def test_image_folder_with_attributes(tmp_path):
    root = tmp_path / "photos"
    for name in ("a/1.jpg", "a/2.png", "b/3.webp", "b/.hidden.jpg", "notes.txt"):
        if name.endswith(".txt"):
            (root / name).write_text("x")
        else:
            _png(root / name)
    assert list_images(root) == ["a/1.jpg", "a/2.png", "b/3.webp"]
    plain = load_image_folder(root)
    assert plain.images == ["a/1.jpg", "a/2.png", "b/3.webp"] and plain.captions == []

    ann = tmp_path / "labels.csv"
    ann.write_text(
        "filename,caption,color,mood\nb/3.webp,a blue thing,blue,calm\na/1.jpg,red one,red,angry\n"
        "a/1.jpg,another red one,red,angry\n"
    )
    data = load_image_folder(root, ann)
    assert data.images == ["b/3.webp", "a/1.jpg", "a/2.png"]
    assert data.image_fields == [{"color": "blue", "mood": "calm"}, {"color": "red", "mood": "angry"}, {}]
    assert data.captions_of(1) == ["red one", "another red one"] and data.captions_of(2) == []

    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text(
        json.dumps({"image": "a/2.png", "captions": ["x", "y"], "size": 3})
        + "\n"
        + json.dumps({"image": "c/gone.jpg", "size": 1})
        + "\n"
    )
    with pytest.raises(VlctlError, match=r"labels.jsonl: 1 of the 2 images it names are not in .*photos \(its "
                       r"paths are relative to that folder: 'c/gone.jpg' was looked for at .*photos/c/gone.jpg\): "
                       r"c/gone.jpg; the image column is 'image'$"):
        load_image_folder(root, jsonl)
    data = load_image_folder(root, jsonl, on_missing="skip")
    assert data.missing == ["c/gone.jpg"] and data.captions == ["x", "y"] and data.image_fields[0] == {"size": 3}
    conflict = tmp_path / "conflict.csv"
    conflict.write_text("path,color\na/1.jpg,red\na/1.jpg,blue\n")
    with pytest.raises(VlctlError, match="two values for attribute 'color'"):
        load_image_folder(root, conflict)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"image": "a/1.jpg"}\n{oops\n')
    with pytest.raises(VlctlError, match=r"broken.jsonl:2: invalid JSON"):
        load_image_folder(root, broken)


@needs_shared
def test_compositional_and_long_caption_files():
    items, missing = load_sugarcrepe(SHARED / "sugarcrepe" / "replace_att.json")
    raw = json.loads((SHARED / "sugarcrepe" / "replace_att.json").read_text())
    assert len(items) == len(raw) and missing == []
    first = next(iter(raw))
    assert (items[0].image, items[0].positives, items[0].negatives) == (
        raw[first]["filename"],
        [raw[first]["caption"]],
        [raw[first]["negative_caption"]],
    )

    items, _ = load_vl_checklist(SHARED / "vl_checklist" / "Attribute_vg_color.json")
    assert len(items) == 400 and items[0].positives == ["brown knob"] and items[0].negatives == ["teal knob"]

    original, altered = load_rococo(SHARED / "rococo" / "same_concept_first300.json")
    assert original.n_images == altered.n_images == 300 and original.images == altered.images
    assert len(altered.captions) == 1500 and len(original.captions) == 1501  # one image has 6 originals
    assert altered.captions[0] == "a catchers with a red helmet on a small moped on a dirt road"

    iiw = load_long_captions(SHARED / "long_captions" / "iiw_docci_test.jsonl", field="IIW")
    docci = load_long_captions(SHARED / "long_captions" / "iiw_docci_test.jsonl", field="DOCCI")
    assert iiw.n_images == docci.n_images == 100 and iiw.images == docci.images
    assert min(len(c.split()) for c in iiw.captions) > 20
    with pytest.raises(VlctlError, match="no field 'PaLI'"):
        load_long_captions(SHARED / "long_captions" / "iiw_docci_test.jsonl", field="PaLI")


def test_format_errors(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"0": {"filename": "a.jpg", "caption": "c"}}))
    with pytest.raises(VlctlError, match=r"item '0' lacks field 'negative_caption'"):
        load_sugarcrepe(p)
    p.write_text(json.dumps([["a.jpg", {"POS": ["x"]}]]))
    with pytest.raises(VlctlError, match="item 0 is not"):
        load_vl_checklist(p)
    p.write_text(json.dumps([{"image": "a.jpg", "caption": ["a"] * 7}]))
    with pytest.raises(VlctlError, match="item 0 has 7 captions"):
        load_rococo(p)
    with pytest.raises(VlctlError, match="not found"):
        load_karpathy(tmp_path / "none.json")


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards_stream_in_order(tmp_path):
    import io

    from vlctl.data.loaders.webdataset import expand_shards, iter_webdataset
    from vlctl.images import ImageDecodeError, read_image

    def jpg(v: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.full((8, 6, 3), v, np.uint8)).save(buf, format="JPEG")
        return buf.getvalue()

    # img2dataset's layout: <key>.jpg, <key>.txt, <key>.json per sample, samples adjacent.
    _tar(tmp_path / "00000.tar", [
        ("000000000.jpg", jpg(10)), ("000000000.txt", b"a grey square"),
        ("000000000.json", json.dumps({"url": "http://x/0.jpg", "width": 6}).encode()),
        ("000000001.jpg", b"not a jpeg"), ("000000001.txt", "caf\u00e9 \u2615".encode()),
    ])  # fmt: skip
    _tar(tmp_path / "00001.tar", [("sub/000000002.txt", b"caption only"), ("sub/000000002.png", jpg(200))])
    assert expand_shards(str(tmp_path / "{00000..00001}.tar")) == [tmp_path / "00000.tar", tmp_path / "00001.tar"]
    assert expand_shards(str(tmp_path / "*.tar")) == [tmp_path / "00000.tar", tmp_path / "00001.tar"]
    samples = list(iter_webdataset(str(tmp_path / "{00000..00001}.tar")))
    assert [s.key for s in samples] == ["000000000", "000000001", "sub/000000002"]
    assert [s.caption for s in samples] == ["a grey square", "caf\u00e9 \u2615", "caption only"]
    assert samples[0].meta == {"url": "http://x/0.jpg", "width": 6} and samples[1].meta == {}
    assert [s.image_ext for s in samples] == ["jpg", "jpg", "png"]
    assert read_image(io.BytesIO(samples[0].image)).size == (6, 8)
    with pytest.raises(ImageDecodeError, match="cannot decode image"):
        read_image(io.BytesIO(samples[1].image))

    with pytest.raises(VlctlError, match=r"1 of 3 WebDataset shards not found: .*00002.tar"):
        list(iter_webdataset(str(tmp_path / "{00000..00002}.tar")))
    with pytest.raises(VlctlError, match="no WebDataset shards match"):
        expand_shards(str(tmp_path / "nothing-*.tar"))
    broken = tmp_path / "broken.tar"
    broken.write_bytes((tmp_path / "00000.tar").read_bytes()[:1200])
    with pytest.raises(VlctlError, match=r"broken.tar: corrupt WebDataset shard after sample '000000000'"):
        list(iter_webdataset([broken]))
    _tar(tmp_path / "badjson.tar", [("k.jpg", jpg(1)), ("k.json", b"{oops")])
    with pytest.raises(VlctlError, match=r"badjson.tar: member k.json is not valid JSON"):
        list(iter_webdataset([tmp_path / "badjson.tar"]))


def test_unpacked_shards_are_keyed_by_shard_resumed_and_never_mixed(tmp_path):
    """Issue 45's scale rehearsal: CC12M-size shards unpack once per shard (a manifest written last), a
    killed unpack redoes only the shard without one, and another shard set of the same size never
    reuses the first one's images (the old single unpack folder named images by position)."""
    import os

    from vlctl.data.loaders.webdataset import unpack_webdataset

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for d, tag in ((a, b"A"), (b, b"B")):
        for s in range(2):
            _tar(d / f"{s:05d}.tar", [m for i in range(3) for m in ((f"{s}{i}.jpg", tag + bytes([s, i])),
                                                                     (f"{s}{i}.txt", f"caption {s}{i}".encode()))]
                 + [(f"{s}9.txt", b"no image")])
    out = tmp_path / "unpacked"
    paths, caps, manifests = unpack_webdataset(str(a / "{00000..00001}.tar"), out)
    assert caps == ["caption 00", "caption 01", "caption 02", "caption 10", "caption 11", "caption 12"]
    assert [p.read_bytes() for p in paths[:2]] == [b"A\x00\x00", b"A\x00\x01"] and len(manifests) == 2
    # a kill mid-unpack: the second shard's manifest is missing; only that shard is read again
    manifests[1].unlink()
    st = os.stat(a / "00000.tar")  # the finished first shard is not opened again: garbage there goes unread
    (a / "00000.tar").write_bytes(b"\0" * st.st_size)
    os.utime(a / "00000.tar", ns=(st.st_atime_ns, st.st_mtime_ns))
    again = unpack_webdataset(str(a / "{00000..00001}.tar"), out)
    assert again[0] == paths and again[1] == caps and manifests[1].is_file()
    # the same names and sizes in other shards: other folders, their own images
    other, _, _ = unpack_webdataset(str(b / "{00000..00001}.tar"), out)
    assert not set(other) & set(paths) and other[0].read_bytes() == b"B\x00\x00"
    assert paths[0].read_bytes() == b"A\x00\x00"


def test_aro_items_carry_their_crop(tmp_path):
    from vlctl.data.loaders.compositional import load_aro

    rel = [  # ARO's visual_genome_relation.json layout
        {"image_id": "2315375", "bbox_x": 10, "bbox_y": 20, "bbox_w": 100, "bbox_h": 50,
         "relation_name": "sitting on", "true_caption": "the cat is sitting on the mat",
         "false_caption": "the mat is sitting on the cat", "image_path": "2315375.jpg"},
    ]  # fmt: skip
    att = [{"image_id": "1", "bbox_x": 0, "bbox_y": 0, "bbox_w": 4, "bbox_h": 3, "attributes": ["white", "open"],
            "true_caption": "the white door and the open window", "false_caption": "the open door and the white window",
            "image_path": "1.jpg"}]  # fmt: skip
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(rel))
    (tmp_path / "visual_genome_attribution.json").write_text(json.dumps(att))
    items, missing = load_aro(tmp_path / "visual_genome_relation.json")
    assert missing == [] and items[0].box == (10, 20, 110, 70) and items[0].label == "sitting on"
    assert items[0].positives == ["the cat is sitting on the mat"]
    assert items[0].negatives == ["the mat is sitting on the cat"]
    _png(tmp_path / "images" / "1.jpg")
    items, _ = load_aro(tmp_path / "visual_genome_attribution.json", root=tmp_path / "images")
    assert items[0].label == "white / open" and items[0].box == (0, 0, 4, 3)
    assert Image.open(tmp_path / "images" / items[0].image).crop(items[0].box).size == (4, 3)
    with pytest.raises(VlctlError, match=r"1 of 1 image files not found .*: 2315375.jpg"):
        load_aro(tmp_path / "visual_genome_relation.json", root=tmp_path / "images")
    (tmp_path / "bad.json").write_text(json.dumps([{"image_path": "x.jpg", "bbox_x": 1}]))
    with pytest.raises(VlctlError, match=r"item 0 lacks or has a bad field 'bbox_y'"):
        load_aro(tmp_path / "bad.json")


def test_clevr4_annotations(tmp_path):
    from vlctl.data.loaders.folder import load_clevr4

    annots = {
        f"CLEVR_4_{i:06d}": {"split": "train" if i % 3 else "val", "color": ["red", "blue"][i % 2],
                             "shape": "cube", "texture": "metal", "count": i % 4 + 1}
        for i in (5, 0, 3, 1)
    }  # fmt: skip
    (tmp_path / "clevr_4_annots.json").write_text(json.dumps(annots))
    for name in annots:
        _png(tmp_path / "images" / f"{name}.png")
    val = load_clevr4(tmp_path, split="val")
    assert val.images == ["images/CLEVR_4_000000.png", "images/CLEVR_4_000003.png"]
    assert [f["color"] for f in val.image_fields] == ["red", "blue"] and val.captions == []
    everything = load_clevr4(tmp_path)
    assert everything.n_images == 4 and [f["count"] for f in everything.image_fields] == [1, 2, 4, 2]
    (tmp_path / "images" / "CLEVR_4_000005.png").unlink()
    with pytest.raises(VlctlError, match=r"1 of 2 image files not found .*: images/CLEVR_4_000005.png"):
        load_clevr4(tmp_path, split="train")
    assert load_clevr4(tmp_path, split="train", check_images=False).n_images == 2
    with pytest.raises(VlctlError, match=r"no images in split 'test'; the file has splits \['train', 'val'\]"):
        load_clevr4(tmp_path, split="test")


def test_clevr4_reads_a_vlctl_data_shapes_folder(tmp_path):
    """`vlctl data shapes --write-png` names its images with the extension ("shapes_train_000000.png");
    the loader finds images/<name> then, images/<name>.png for the release's bare names."""
    from vlctl.data.loaders.folder import load_clevr4
    from vlctl.data.shapes import ShapesConfig, generate_shapes

    out = generate_shapes(ShapesConfig(n=3, seed=0, split="train", image_size=16, write_png=True, workers=1),
                          tmp_path / "shapes")
    data = load_clevr4(out, split="train")
    assert data.images == [f"images/shapes_train_00000{i}.png" for i in range(3)]
    assert all((out / p).is_file() for p in data.images) and {"color", "shape", "texture", "count"} <= set(
        data.image_fields[0])

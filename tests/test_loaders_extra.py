"""Stanford 40 Actions (+ location / mood labels) and ShotBench loaders, on fixtures built in the
upstream layouts."""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlctl.data.loaders.labelled import LabelledImages, load_shotbench, load_stanford40, stanford40_action
from vlctl.eval.metrics import cluster_accuracy
from vlctl.fsops import VlctlError

TRAIN = ["applauding_001.jpg", "blowing_bubbles_001.jpg", "riding_a_bike_001.jpg", "riding_a_bike_002.jpg"]
TEST = ["applauding_002.jpg", "blowing_bubbles_002.jpg", "blowing_bubbles_003.jpg", "riding_a_bike_003.jpg"]


def _jpeg_bytes(seed: int, size=(12, 10)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture()
def stanford(tmp_path):
    """The upstream layout: JPEGImages/, ImageSplits/{actions,train,test}.txt."""
    root = tmp_path / "Stanford40"
    (root / "JPEGImages").mkdir(parents=True)
    for i, name in enumerate(TRAIN + TEST):
        (root / "JPEGImages" / name).write_bytes(_jpeg_bytes(i))
    splits = root / "ImageSplits"
    splits.mkdir()
    (splits / "actions.txt").write_text("action_name\tnumber_of_images\napplauding\t2\nblowing_bubbles\t3\n"
                                        "riding_a_bike\t3\nwriting_on_a_book\t0\n")
    (splits / "train.txt").write_text("\n".join(TRAIN) + "\n")
    (splits / "test.txt").write_text("\n".join(TEST) + "\n\n")
    labels = tmp_path / "stanford40_labels.csv"
    labels.write_text("image,action,location,mood\n"
                      "applauding_002.jpg,applauding,indoor,happy\n"
                      "JPEGImages/blowing_bubbles_002.jpg,blowing_bubbles,outdoor,happy\n"
                      "blowing_bubbles_003.jpg,,outdoor,calm\n"
                      "riding_a_bike_001.jpg,riding_a_bike,outdoor,excited\n")
    return root, labels


def test_stanford40_actions_from_file_names_and_extra_labels(stanford):
    root, labels = stanford
    data = load_stanford40(root, split="test", labels=labels)
    assert isinstance(data, LabelledImages) and data.images == [f"JPEGImages/{n}" for n in TEST]
    assert data.attributes == ["action", "location", "mood"]
    assert data.labels["action"] == ["applauding", "blowing_bubbles", "blowing_bubbles", "riding_a_bike"]
    assert data.labels["location"] == ["indoor", "outdoor", "outdoor", None]  # riding_a_bike_003: not labelled
    assert data.labels["mood"] == ["happy", "happy", "calm", None]
    values, idx = data.label_indices("mood")
    assert values == ["calm", "happy"] and idx.tolist() == [1, 1, 0, -1]
    assert data.image_fields == [{"split": "test"}] * 4 and data.missing == []
    assert data.image_source(0) == root / "JPEGImages" / TEST[0] and data.read_image(1).size == (10, 12)
    # The integer labels feed the clustering metrics directly.
    assert cluster_accuracy(data.label_indices("action")[1], [5, 7, 7, 9]) == 100.0
    both = load_stanford40(root, split=None)
    assert both.images == [f"JPEGImages/{n}" for n in TRAIN + TEST] and both.attributes == ["action"]
    assert [f["split"] for f in both.image_fields] == ["train"] * 4 + ["test"] * 4
    assert stanford40_action("riding_a_horse_118.jpg") == "riding_a_horse"


def test_stanford40_json_label_file_equals_csv(stanford, tmp_path):
    root, labels = stanford
    rows = list(csv.DictReader(labels.open()))
    doc = {Path(r["image"]).name: {k: v for k, v in r.items() if k != "image" and v} for r in rows}
    (tmp_path / "l.json").write_text(json.dumps(doc))
    (tmp_path / "l.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    a = load_stanford40(root, labels=labels)
    assert load_stanford40(root, labels=tmp_path / "l.json").labels == a.labels
    assert load_stanford40(root, labels=tmp_path / "l.jsonl").labels == a.labels


def test_stanford40_bad_input(stanford, tmp_path):
    root, labels = stanford
    (tmp_path / "bad.csv").write_text("image,action,mood\napplauding_002.jpg,blowing_bubbles,happy\n")
    with pytest.raises(VlctlError, match=r"image 'applauding_002.jpg' has action 'blowing_bubbles', its file name"):
        load_stanford40(root, labels=tmp_path / "bad.csv")
    (tmp_path / "dup.csv").write_text("image,mood\napplauding_002.jpg,happy\napplauding_002.jpg,sad\n")
    with pytest.raises(VlctlError, match=r"dup.csv: row 2: image 'applauding_002.jpg' has two values for 'mood'"):
        load_stanford40(root, labels=tmp_path / "dup.csv")
    with pytest.raises(VlctlError, match="split must be one of"):
        load_stanford40(root, split="val")
    (root / "JPEGImages" / TEST[1]).unlink()
    with pytest.raises(VlctlError, match=r"1 of 4 image files not found under .*JPEGImages/blowing_bubbles_002.jpg"):
        load_stanford40(root)
    skipped = load_stanford40(root, on_missing="skip", labels=labels)
    assert skipped.missing == [f"JPEGImages/{TEST[1]}"] and len(skipped.images) == 3
    assert skipped.labels["mood"] == ["happy", "calm", None]
    (root / "ImageSplits" / "test.txt").write_text("applauding_002.jpg\njumping.jpg\n")
    with pytest.raises(VlctlError, match=r"test.txt:2: 'jumping.jpg': not a Stanford 40 image name"):
        load_stanford40(root)
    (root / "ImageSplits" / "test.txt").write_text("dancing_001.jpg\n")
    (root / "JPEGImages" / "dancing_001.jpg").write_bytes(_jpeg_bytes(0))
    with pytest.raises(VlctlError, match=r"actions.txt: actions \['dancing'\] of the split files are not listed"):
        load_stanford40(root)
    (root / "ImageSplits" / "train.txt").unlink()
    with pytest.raises(VlctlError, match=r"ImageSplits/train.txt: Stanford 40 split file not found"):
        load_stanford40(root, split="train")


# --- ShotBench -----------------------------------------------------------------------------------


def _write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(header)
        w.writerows(rows)


def _shotbench(tmp_path: Path) -> Path:
    """ShotBench's own form: options as a dict literal, `type` / `path` as list literals."""
    d = tmp_path / "ShotBench"
    for name in ("a.jpg", "b.jpg"):
        (d / "images").mkdir(parents=True, exist_ok=True)
        (d / "images" / name).write_bytes(_jpeg_bytes(len(name)))
    opts = json.dumps({"A": "wide shot", "B": "close-up", "C": "medium shot", "D": "extreme close-up"})
    angle = "{'A': 'low angle', 'B': 'high angle', 'C': 'eye level'}"  # a Python literal, not JSON
    header = ["index", "question", "options", "answer", "category", "type", "path"]
    rows = [
        ["0", "What is the shot size?", opts, "B", "shot size", "['image']", "['images/a.jpg']"],
        ["1", "What is the camera angle?", angle, "A", "camera angle", "['image']", "['images/a.jpg']"],
        ["2", "What is the shot size?", opts, "C", "shot size", "['image']", "['images/b.jpg']"],
        ["3", "How does the camera move?", "{'A': 'pan left', 'B': 'dolly in'}", "B", "camera movement",
         "['video']", "['videos/c.mp4']"],
        ["4", "Shot size again?", opts, "A", "shot size", "['image']", "['images/b.jpg']"],  # conflicts row 2
        ["5", "Angle?", angle, "C", "camera angle", "['image']", "['images/b.jpg']"],
    ]
    _write_tsv(d / "test.tsv", header, rows)
    return d / "test.tsv"


def test_shotbench_labels_are_the_correct_options_text(tmp_path):
    tsv = _shotbench(tmp_path)
    data = load_shotbench(tsv)
    assert data.images == ["images/a.jpg", "images/b.jpg"] and data.root == tsv.parent
    assert data.attributes == ["shot size", "camera angle"]
    assert data.labels["shot size"] == ["close-up", None]  # image b: answered "medium shot" and "wide shot"
    assert data.labels["camera angle"] == ["low angle", "eye level"]
    assert data.image_fields[1] == {"rows": ["2", "4", "5"], "conflicts": ["shot size"]}
    assert len(data.skipped) == 1 and "'camera movement' question about a video" in data.skipped[0]
    assert data.read_image(0).size == (10, 12)


def test_shotbench_mmbench_style_base64_and_letter_columns(tmp_path):
    big = _jpeg_bytes(7, size=(500, 500))  # > 128 KiB of base64: beyond csv's default field limit
    small = _jpeg_bytes(8)
    assert len(base64.b64encode(big)) > 131072
    header = ["index", "question", "A", "B", "C", "D", "answer", "category", "image"]
    rows = [
        ["10", "Lighting?", "hard light", "soft light", "", "", "B", "lighting type", base64.b64encode(big).decode()],
        ["11", "Shot size?", "close-up", "wide", "medium", "", "C", "shot size", "10"],  # the image of row 10
        ["12", "Shot size?", "close-up", "wide", "medium", "", "A. close-up", "shot size",
         base64.b64encode(small).decode()],
    ]
    _write_tsv(tmp_path / "mm.tsv", header, rows)
    data = load_shotbench(tmp_path / "mm.tsv")
    assert len(data.images) == 2 and all(k.startswith("embedded:") for k in data.images)
    assert data.labels == {"lighting type": ["soft light", None], "shot size": ["medium", "close-up"]}
    assert data.image_fields[0]["rows"] == ["10", "11"]
    assert data.image_source(0) == big and data.read_image(0).size == (500, 500)
    files = data.write_images(tmp_path / "out")
    assert [p.suffix for p in files] == [".jpg", ".jpg"] and files[1].read_bytes() == small


def test_shotbench_errors_name_file_row_and_column(tmp_path):
    tsv = _shotbench(tmp_path)
    lines = tsv.read_text().splitlines()
    header = lines[0].split("\t")

    def variant(row_edit=None, drop=None):
        rows = [ln.split("\t") for ln in lines[1:]]
        if row_edit:
            row_edit(rows)
        keep = [i for i, c in enumerate(header) if c != drop]
        out = tmp_path / "ShotBench" / "v.tsv"
        out.write_text("\n".join("\t".join(r[i] for i in keep) for r in [header, *rows]) + "\n")
        return out

    def bad_answer(rows):
        rows[2][3] = "E"

    with pytest.raises(VlctlError, match=r"v.tsv:4: column 'answer' is 'E', not one of the options \['A', 'B', 'C', 'D'\]"):
        load_shotbench(variant(bad_answer))

    def bad_options(rows):
        rows[0][2] = "{'A': "

    with pytest.raises(VlctlError, match=r"v.tsv:2: column 'options' is not a dict literal"):
        load_shotbench(variant(bad_options))
    with pytest.raises(VlctlError, match=r"v.tsv: no column 'category'"):
        load_shotbench(variant(drop="category"))
    with pytest.raises(VlctlError, match=r"no image column \('path', 'image_path' or 'image'\)"):
        load_shotbench(variant(drop="path"))
    (tmp_path / "ShotBench" / "images" / "b.jpg").unlink()
    with pytest.raises(VlctlError, match=r"test.tsv: 1 of 2 image files not found under .*ShotBench: images/b.jpg"):
        load_shotbench(tsv)
    part = load_shotbench(tsv, on_missing="skip")
    assert part.images == ["images/a.jpg"] and part.missing == ["images/b.jpg"]
    _write_tsv(tmp_path / "x.tsv", ["index", "A", "B", "answer", "category", "image"],
               [["0", "a", "b", "A", "shot size", "not an image"]])
    with pytest.raises(VlctlError, match=r"x.tsv:2: column 'image' holds neither a base64-encoded image"):
        load_shotbench(tmp_path / "x.tsv")


def test_vl_checklist_corpus_yaml_resolves_anno_path_and_img_root(tmp_path):
    """A checkout laid out like om-ai-lab/VL-CheckList: corpus/v1/<type>/<name>.yaml pointing at
    data/... with IMG_ROOT under the user's image folder; the real color file from shared/data."""
    import json
    import shutil

    from PIL import Image

    from vlctl.data.loaders.compositional import load_vl_checklist_corpus
    from vlctl.fsops import VlctlError

    src = Path(__file__).resolve().parents[2] / "shared" / "data" / "vl_checklist" / "Attribute_vg_color.json"
    if not src.is_file():
        pytest.skip("needs the real caption files in ../shared/data, a folder beside the clone (not in the repository)")
    checkout = tmp_path / "VL-CheckList"
    (checkout / "data" / "Attribute" / "vg").mkdir(parents=True)
    items, seen = [], set()
    for it in json.loads(src.read_text()):  # five items with five different images
        if it[0] not in seen and len(items) < 5:
            items.append(it)
            seen.add(it[0])
    (checkout / "data" / "Attribute" / "vg" / "color.json").write_text(json.dumps(items))
    yml = checkout / "corpus" / "v1" / "Attribute" / "color" / "vg.yaml"
    yml.parent.mkdir(parents=True)
    yml.write_text('ANNO_PATH: "data/Attribute/vg/color.json"\nIMG_ROOT: "vg"\nTYPE: "TUPLE_JSON"\n')
    images = tmp_path / "images"
    for im, _ in items[:4]:  # the fifth image is missing
        (images / "vg" / im).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(images / "vg" / im, format="JPEG")
    with pytest.raises(VlctlError, match=r"color.json: 1 of 5 image files not found under .*vg: VG_100K_2/2407590.jpg$"):
        load_vl_checklist_corpus(checkout / "corpus", image_root=images)
    got = load_vl_checklist_corpus(checkout / "corpus", image_root=images, on_missing="skip")
    assert list(got) == ["Attribute/color/vg"]
    loaded, missing = got["Attribute/color/vg"]
    assert [it.image for it in loaded] == [im for im, _ in items[:4]] and missing == [items[4][0]]
    assert loaded[0].positives == items[0][1]["POS"] and loaded[0].negatives == items[0][1]["NEG"]
    yml.write_text("IMG_ROOT: vg\n")
    with pytest.raises(VlctlError, match="ANNO_PATH"):
        load_vl_checklist_corpus(yml)
    shutil.rmtree(checkout / "corpus")
    with pytest.raises(VlctlError, match="no VL-CheckList corpus"):
        load_vl_checklist_corpus(tmp_path)

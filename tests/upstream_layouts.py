"""Datasets in the upstream layouts the real recipes read, at any size: the fixtures of
tests/test_recipes_real.py (a few dozen images) and the scale rehearsal's synthetic datasets at
the papers' sizes (benchmarks/rehearsal/make_datasets.py) are the same code.

Images are generated (random blocks, each file different, so no two rows embed alike); captions
come from the real files in ../shared/data, cycled where a dataset has more captions than they do.
Every builder skips the image files that exist already, so an interrupted generation resumes.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/data")
SIZE = (36, 40)  # (height, width); the ARO boxes below fit inside

STANFORD40_ACTIONS = (
    "applauding", "blowing_bubbles", "brushing_teeth", "cleaning_the_floor", "climbing", "cooking", "cutting_trees",
    "cutting_vegetables", "drinking", "feeding_a_horse", "fishing", "fixing_a_bike", "fixing_a_car", "gardening",
    "holding_an_umbrella", "jumping", "looking_through_a_microscope", "looking_through_a_telescope", "playing_guitar",
    "playing_violin", "pouring_liquid", "pushing_a_cart", "reading", "phoning", "riding_a_bike", "riding_a_horse",
    "rowing_a_boat", "running", "shooting_an_arrow", "smoking", "taking_photos", "texting_message", "throwing_frisby",
    "using_a_computer", "walking_the_dog", "washing_dishes", "watching_TV", "waving_hands", "writing_on_a_board",
    "writing_on_a_book")
# SugarCrepe's seven files and their item counts (7,511 in all).
SUGARCREPE_SIZES = {"replace_obj": 1652, "replace_att": 788, "replace_rel": 1406, "swap_obj": 245, "swap_att": 666,
                    "add_obj": 2062, "add_att": 692}


def image_bytes(rng: np.random.Generator, size=SIZE, fmt: str = "JPEG") -> bytes:
    """A small image of random 4x4-pixel blocks, encoded."""
    h, w = size
    a = np.kron(rng.integers(0, 256, (-(-h // 4), -(-w // 4), 3), dtype=np.uint8), np.ones((4, 4, 1), np.uint8))
    buf = io.BytesIO()
    Image.fromarray(a[:h, :w]).save(buf, fmt)
    return buf.getvalue()


def write_image(path: Path, rng: np.random.Generator, size=SIZE) -> None:
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fmt = "PNG" if path.suffix.lower() == ".png" else "JPEG"
        path.write_bytes(image_bytes(rng, size, fmt))


def coco_captions() -> list[list[str]]:
    """The real COCO Karpathy test captions, 5 a image (5,000 images)."""
    return [it["caption"][:5] for it in json.loads((SHARED / "coco_karpathy_test.json").read_text())]


def _flat_captions() -> list[str]:
    return [c for caps in coco_captions() for c in caps]


def coco(root: Path, n_train: int = 12, n_test: int = 6, n_val: int = 0, size=SIZE) -> Path:
    """Karpathy's dataset_coco.json (train / val / test splits) and the images under train2014/ and
    val2014/. The test split is the real Karpathy test (names and captions) up to 5,000 images;
    train and val get COCO-style names and the real captions cycled."""
    real = json.loads((SHARED / "coco_karpathy_test.json").read_text())
    rng = np.random.default_rng(0)
    images = []
    for i in range(n_train + n_val + n_test):
        split = "train" if i < n_train else "val" if i < n_train + n_val else "test"
        j = i - n_train - n_val
        if split == "test" and j < len(real):
            folder, name = real[j]["image"].split("/")
            caps = real[j]["caption"][:5]
        else:
            folder = "train2014" if split == "train" else "val2014"
            name = f"COCO_{folder}_{1_000_000 + i:012d}.jpg"
            caps = real[i % len(real)]["caption"][:5]
        write_image(root / folder / name, rng, size)
        images.append({"filepath": folder, "filename": name, "split": split, "imgid": i, "cocoid": i,
                       "sentences": [{"raw": c, "tokens": c.lower().split()} for c in caps]})
    (root / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    return root / "dataset_coco.json"


def rococo(coco_root: Path, ann: Path) -> Path:
    """RoCOCO's form: the COCO test images, 5 originals + 5 altered captions (from the real file, cycled)."""
    test = [im for im in json.loads(ann.read_text())["images"] if im["split"] == "test"]
    altered = json.loads((SHARED / "rococo" / "same_concept_first300.json").read_text())
    doc = [{"image": f"{im['filepath']}/{im['filename']}",
            "caption": [s["raw"] for s in im["sentences"]][:5] + altered[i % len(altered)]["caption"][-5:]}
           for i, im in enumerate(test)]
    path = coco_root / "same_concept.json"
    path.write_text(json.dumps(doc))
    return path


def flickr(root: Path, n_train: int, n_val: int, n_test: int, size=SIZE) -> Path:
    """Karpathy's dataset_flickr30k.json (no filepath: images directly under ROOT)."""
    caps = coco_captions()
    rng = np.random.default_rng(4)
    images = []
    for i in range(n_train + n_val + n_test):
        split = "train" if i < n_train else "val" if i < n_train + n_val else "test"
        name = f"{1_000_000 + i}.jpg"
        write_image(root / name, rng, size)
        images.append({"filename": name, "split": split, "imgid": i,
                       "sentences": [{"raw": c, "tokens": c.lower().split()} for c in caps[i % len(caps)]]})
    (root / "dataset_flickr30k.json").write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    return root / "dataset_flickr30k.json"


def long_captions(root: Path, n: int, field: str, size=SIZE) -> Path:
    """A DOCCI / IIW descriptions JSONL ({"image", field}) from the real IIW-DOCCI file, cycled."""
    real = [json.loads(line) for line in (SHARED / "long_captions" / "iiw_docci_test.jsonl").read_text().splitlines()]
    rng = np.random.default_rng(5)
    lines = []
    for i in range(n):
        name = f"{field.lower()}_{i:06d}.jpg"
        write_image(root / name, rng, size)
        lines.append(json.dumps({"image": name, field: real[i % len(real)][field]}))
    path = root / f"{field.lower()}_test.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def webdataset(out: Path, n_pairs: int, per_shard: int = 10_000, size=SIZE) -> str:
    """img2dataset's WebDataset output: `{00000..N}.tar` shards of <key>.jpg + <key>.txt; returns the
    brace pattern. A shard that exists is kept (each is written under a temporary name, then renamed)."""
    caps = _flat_captions()
    out.mkdir(parents=True, exist_ok=True)
    n_shards = -(-n_pairs // per_shard)
    for s in range(n_shards):
        path = out / f"{s:05d}.tar"
        if path.is_file():
            continue
        rng = np.random.default_rng(1000 + s)
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w") as tar:
            for i in range(s * per_shard, min(n_pairs, (s + 1) * per_shard)):
                for ext, data in (("jpg", image_bytes(rng, size)), ("txt", caps[i % len(caps)].encode())):
                    info = tarfile.TarInfo(f"{i:09d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        tmp.replace(path)
    return str(out / f"{{00000..{n_shards - 1:05d}}}.tar")


def clevr4(tmp: Path, n_train: int = 150, n_test: int = 40) -> Path:
    """A Clevr-4 folder (clevr_4_annots.json + images/) from `vlctl data shapes --write-png`."""
    from vlctl.cli import main

    out = tmp / "clevr4"
    (out / "images").mkdir(parents=True, exist_ok=True)
    ann = {}
    for split, n in (("train", n_train), ("test", n_test)):
        d = tmp / f"shapes-{split}"
        if not (d / "clevr_4_annots.json").is_file():
            assert main(["data", "shapes", "--out", str(d), "--n", str(n), "--split", split, "--image-size", "32",
                         "--write-png", "--workers", "1"]) == 0
        ann.update(json.loads((d / "clevr_4_annots.json").read_text()))
        for p in (d / "images").iterdir():
            if not (out / "images" / p.name).is_file():
                shutil.copy(p, out / "images" / p.name)
        shutil.rmtree(d)  # the copy under clevr4/ is the dataset
    (out / "clevr_4_annots.json").write_text(json.dumps(ann))
    return out


def stanford40(tmp: Path, n_actions: int = 3, n_train: int = 6, n_test: int = 3) -> tuple[Path, Path]:
    """Stanford 40 Actions (JPEGImages/, ImageSplits/) with `n_train` + `n_test` images per action, and a
    location / mood label CSV."""
    root = tmp / "Stanford40"
    rng = np.random.default_rng(1)
    actions = STANFORD40_ACTIONS[:n_actions]
    train = [f"{a}_{k:03d}.jpg" for a in actions for k in range(1, n_train + 1)]
    test = [f"{a}_{k:03d}.jpg" for a in actions for k in range(n_train + 1, n_train + n_test + 1)]
    for name in train + test:
        write_image(root / "JPEGImages" / name, rng)
    (root / "ImageSplits").mkdir(exist_ok=True)
    (root / "ImageSplits" / "actions.txt").write_text("action_name\tnumber_of_images\n"
                                                      + "".join(f"{a}\t{n_train + n_test}\n" for a in actions))
    (root / "ImageSplits" / "train.txt").write_text("\n".join(train) + "\n")
    (root / "ImageSplits" / "test.txt").write_text("\n".join(test) + "\n")
    labels = tmp / "stanford40_labels.csv"
    rows = [f"{n},{['indoor', 'outdoor'][i % 2]},{['happy', 'calm'][(i // 2) % 2]}" for i, n in enumerate(train + test)]
    labels.write_text("image,location,mood\n" + "\n".join(rows) + "\n")
    return root, labels


def shotbench(tmp: Path, n_images: int = 24) -> Path:
    """ShotBench's test.tsv (two questions an image, options as dict literals, type / path as list
    literals) and one video row, which the loader leaves out."""
    d = tmp / "ShotBench"
    rng = np.random.default_rng(2)
    sizes = "{'A': 'wide shot', 'B': 'close-up', 'C': 'medium shot'}"
    angles = "{'A': 'low angle', 'B': 'high angle'}"
    rows = []
    for i in range(n_images):
        write_image(d / "images" / f"{i}.jpg", rng)
        rows.append([str(2 * i), "What is the shot size?", sizes, "AB"[i % 2], "shot size", "['image']",
                     f"['images/{i}.jpg']"])
        rows.append([str(2 * i + 1), "What is the camera angle?", angles, "AB"[(i // 2) % 2], "camera angle",
                     "['image']", f"['images/{i}.jpg']"])
    rows.append([str(2 * n_images + 1), "How does the camera move?", "{'A': 'pan', 'B': 'dolly'}", "A",
                 "camera movement", "['video']", "['videos/x.mp4']"])
    with open(d / "test.tsv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["index", "question", "options", "answer", "category", "type", "path"])
        w.writerows(rows)
    return d / "test.tsv"


def _cycle(items: list, n: int) -> list:
    return [items[i % len(items)] for i in range(n)]


def compositional(tmp: Path, n: int = 5, sugarcrepe_sizes: dict[str, int] | None = None, n_aro_relation: int | None = None,
                  n_aro_attribution: int = 0) -> list[str]:
    """VL-CheckList files (`n` items each, cut from or cycled over the real ones), SugarCrepe files (the
    real replace_att's first `n`, or `sugarcrepe_sizes` items per file cycled over the three real ones),
    ARO VG-Relation (and VG-Attribution) files; the `vlctl reproduce 3vl-coco` flags naming them."""
    rng = np.random.default_rng(3)
    vl = tmp / "vl"
    vl.mkdir(parents=True, exist_ok=True)
    flags = ["--vl-checklist-root", str(vl / "images")]
    src = {"attribute": "Attribute_vg_color.json", "object": "Object_Location_vg_location_vg_subj_margin.json"}
    for cat, name in src.items():
        items = _cycle(json.loads((SHARED / "vl_checklist" / name).read_text()), n)
        for im, _ in items:
            write_image(vl / "images" / im, rng)
        (vl / name).write_text(json.dumps(items))
        flags += [f"--vl-checklist-{cat}", str(vl / name)]
    base = json.loads((SHARED / "vl_checklist" / src["object"]).read_text())
    rel = [[im, {"POS": [p], "NEG": [p.replace(" ON ", " UNDER ")]}] for im, t in base for p in t["POS"] if " ON " in p]
    rel = _cycle(rel, n)
    for im, _ in rel:
        write_image(vl / "images" / im, rng)
    (vl / "Relation_vg_spatial.json").write_text(json.dumps(rel))
    flags += ["--vl-checklist-relation", str(vl / "Relation_vg_spatial.json")]
    sc = tmp / "sugarcrepe"
    real = [v for f in ("replace_att", "replace_obj", "swap_att")
            for v in json.loads((SHARED / "sugarcrepe" / f"{f}.json").read_text()).values()]
    flags += ["--sugarcrepe-root", str(sc / "val2017"), "--sugarcrepe"]
    for name, size in (sugarcrepe_sizes or {"replace_att": n}).items():
        d = {str(i): v for i, v in enumerate(_cycle(real, size))}
        for v in d.values():
            write_image(sc / "val2017" / v["filename"], rng)
        (sc / f"{name}.json").write_text(json.dumps(d))
        flags.append(str(sc / f"{name}.json"))
    box = {"bbox_x": 2, "bbox_y": 3, "bbox_w": 30, "bbox_h": 25}
    pairs = _cycle(real, n_aro_relation if n_aro_relation is not None else n)
    aro = [{"image_path": v["filename"], **box, "true_caption": v["caption"], "false_caption": v["negative_caption"],
            "relation_name": "on"} for v in pairs]
    for v in aro:
        write_image(sc / "val2017" / v["image_path"], rng)
    (sc / "visual_genome_relation.json").write_text(json.dumps(aro))
    flags += ["--aro-root", str(sc / "val2017"), "--aro-relation", str(sc / "visual_genome_relation.json")]
    if n_aro_attribution:
        att = [{"image_path": v["filename"], **box, "true_caption": v["caption"], "false_caption": v["negative_caption"],
                "attributes": ["white", "tan"]} for v in _cycle(real, n_aro_attribution)]
        for v in att:
            write_image(sc / "val2017" / v["image_path"], rng)
        (sc / "visual_genome_attribution.json").write_text(json.dumps(att))
        flags += ["--aro-attribution", str(sc / "visual_genome_attribution.json")]
    return flags

"""Compositional scenes: determinism, captions, disjoint splits, VL-CheckList files, load errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlctl.cli import main
from vlctl.data.loaders.compositional import load_vl_checklist
from vlctl.data.scenes import (
    ATTRIBUTES,
    CHECKLIST_CATEGORIES,
    OPPOSITE_RELATION,
    ScenesConfig,
    caption_holds,
    generate_scenes,
    load_checklist,
    load_scenes,
    make_sample,
    relation_holds,
    render_caption,
    scene_key,
    split_of_key,
    vocabulary,
)
from vlctl.fsops import VlctlError


@pytest.fixture(scope="module")
def test_dir(tmp_path_factory):
    return generate_scenes(ScenesConfig(n=60, split="test", workers=2, seed=3), tmp_path_factory.mktemp("sc") / "test")


def test_generation_deterministic_and_worker_independent(tmp_path, test_dir):
    again = generate_scenes(ScenesConfig(n=60, split="test", workers=1, seed=3), tmp_path / "t1")
    a, b = load_scenes(test_dir), load_scenes(again)
    assert np.array_equal(np.asarray(a["images"]), np.asarray(b["images"]))
    assert a["labels"] == b["labels"]
    assert a["meta"]["sha256"] == b["meta"]["sha256"]
    img, lab = make_sample(5, ScenesConfig(n=60, split="test", seed=3))
    assert np.array_equal(img, np.asarray(a["images"][5])) and lab == a["labels"][5]
    other, _ = make_sample(5, ScenesConfig(n=60, split="test", seed=4))
    assert not np.array_equal(other, img)


def test_captions_true_with_margin_and_in_vocabulary(test_dir):
    d = load_scenes(test_dir)
    vocab = set(vocabulary())
    counts = {2: 0, 3: 0}
    for lab in d["labels"]:
        st = lab["structure"]
        counts[len(lab["objects"])] += 1
        assert render_caption(st) == lab["caption"] and len(st["nps"]) == len(lab["objects"])
        assert caption_holds(st, lab["objects"], margin=0.1)
        assert set(lab["caption"].split()) <= vocab
        # the opposite relation is false: the generated relation holds with a margin
        assert not caption_holds({**st, "rel": OPPOSITE_RELATION[st["rel"]]}, lab["objects"])
    assert counts[2] and counts[3]
    # images differ from the background where objects are
    assert np.asarray(d["images"]).std() > 10


def test_relation_and_truth_semantics():
    a = {"cx": 0.2, "cy": 0.5, "size": "small", "color": "red", "texture": "plain", "shape": "circle"}
    b = {"cx": 0.7, "cy": 0.3, "size": "large", "color": "blue", "texture": "dotted", "shape": "square"}
    assert relation_holds("left of", a, b) and relation_holds("below", a, b) and not relation_holds("above", a, b)
    st = {"nps": [{k: a[k] for k in ATTRIBUTES}, {k: b[k] for k in ATTRIBUTES}], "rel": "left of"}
    assert caption_holds(st, [a, b]) and caption_holds(st, [b, a])  # order of objects does not matter
    assert not caption_holds({**st, "rel": "right of"}, [a, b])
    wrong = {**st, "nps": [{**st["nps"][0], "color": "blue"}, st["nps"][1]]}
    assert not caption_holds(wrong, [a, b])
    # with a third object that makes the changed caption true, it is not a negative
    c = {**a, "color": "blue", "cx": 0.1}
    assert caption_holds(wrong, [a, b, c])


def test_splits_disjoint_by_configuration(tmp_path):
    keys = {}
    for split in ("train", "finetune", "test"):
        d = load_scenes(generate_scenes(ScenesConfig(n=80, split=split, workers=1), tmp_path / split))
        keys[split] = {lab["key"] for lab in d["labels"]}
        for lab in d["labels"]:
            assert lab["split"] == split and split_of_key(lab["key"]) == split
            assert lab["key"] == scene_key(lab["objects"], lab["structure"])
    assert not keys["train"] & keys["finetune"] and not keys["train"] & keys["test"] and not keys["finetune"] & keys["test"]
    # the key is canonical: "A right of B" is "B left of A"
    a = {"size": "small", "color": "red", "texture": "plain", "shape": "circle", "cx": 0.8, "cy": 0.5}
    b = {"size": "large", "color": "blue", "texture": "dotted", "shape": "star", "cx": 0.2, "cy": 0.5}
    pa, pb = ({k: o[k] for k in ATTRIBUTES} for o in (a, b))
    assert scene_key([a, b], {"nps": [pa, pb], "rel": "right of"}) == scene_key([b, a], {"nps": [pb, pa], "rel": "left of"})


def test_checklist_format_one_word_and_negatives_false(test_dir):
    d = load_scenes(test_dir)
    for cat in CHECKLIST_CATEGORIES:
        raw = json.loads((test_dir / "checklist" / f"{cat}.json").read_text())
        assert isinstance(raw, list) and raw and all(
            isinstance(e, list) and len(e) == 2 and set(e[1]) == {"POS", "NEG"} and len(e[1]["POS"]) == 1 for e in raw)
        items, _ = load_vl_checklist(test_dir / "checklist" / f"{cat}.json", root=test_dir)  # every PNG exists
        meta = load_checklist(test_dir, cat)
        assert len(items) == len(meta) >= 50
        for it in meta:
            lab = d["labels"][it["index"]]
            assert it["pos"] == lab["caption"]
            pw, nw = it["pos"].split(), it["neg"].split()
            changed = [(p, n) for p, n in zip(pw, nw) if p != n]
            assert len(pw) == len(nw) and len(changed) == 1
            assert changed[0] == (it["from"].split()[0], it["to"].split()[0])
            assert it["pos_tag"] == {"relation_spatial": "ADP", "object": "NOUN"}.get(cat, "ADJ")
            # NEG is false for the image, checked against the scene labels
            neg_structure = json.loads(json.dumps(lab["structure"]))
            if cat == "relation_spatial":
                neg_structure["rel"] = it["to"]
            else:
                attr = {"attribute_color": "color", "attribute_size": "size", "attribute_material": "texture",
                        "object": "shape"}[cat]
                assert neg_structure["nps"][it["np"]][attr] == it["from"]
                neg_structure["nps"][it["np"]][attr] = it["to"]
            assert render_caption(neg_structure) == it["neg"]
            assert not caption_holds(neg_structure, lab["objects"])
        if cat == "object":
            assert {it["object_size"] for it in meta} <= {"small", "large"}
            assert {it["object_location"] for it in meta} <= {"center", "margin"}


def test_load_errors(tmp_path, test_dir):
    with pytest.raises(VlctlError, match="not found"):
        load_scenes(tmp_path / "missing")
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(test_dir, bad)
    (bad / "labels.jsonl").write_text((bad / "labels.jsonl").read_text().replace('"shape": "circle"', '"shape": "blob"', 1))
    with pytest.raises(VlctlError, match="labels.jsonl: line"):
        load_scenes(bad)
    lines = (test_dir / "labels.jsonl").read_text().splitlines()
    (bad / "labels.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(VlctlError, match="count mismatch"):
        load_scenes(bad)
    (bad / "labels.jsonl").write_text("{not json\n")
    with pytest.raises(VlctlError, match="corrupt JSON"):
        load_scenes(bad)
    (bad / "images.npy").write_bytes(b"garbage")
    with pytest.raises(VlctlError, match="corrupt .npy"):
        load_scenes(bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "format": "vlctl-shapes"}))
    with pytest.raises(VlctlError, match="expected 'vlctl-scenes'"):
        load_scenes(bad)
    with pytest.raises(VlctlError, match="split"):
        ScenesConfig(split="val")


def test_cli_data_scenes(tmp_path, capsys):
    assert main(["data", "scenes", "--out", str(tmp_path / "s"), "--n", "6", "--split", "finetune", "--workers", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 6
    assert len(load_scenes(tmp_path / "s")["labels"]) == 6

"""`vlctl audit`: the 3VL compositional audit on generated scenes (TinyCLIP), on a CSV of image
files (random-weight OpenCLIP, for the mechanics), missing images, bootstrap intervals, --repair."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlctl.audit import AuditConfig, bootstrap_accuracy, generator_for, load_pairs, tree_items
from vlctl.cli import main


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    from vlctl.data.scenes import ScenesConfig, generate_scenes
    from vlctl.encoders import tiny_model, tiny_pretrained

    d = tmp_path_factory.mktemp("audit_scenes")
    data = generate_scenes(ScenesConfig(n=24, split="test", workers=1), d / "test")
    base = tiny_model.create_model("scenes-quick", seed=0, vision_layers=1, text_layers=1)
    tiny_pretrained.save_pretrained(base, d / "base")
    return Path(data), d / "base"


def test_bootstrap_interval():
    correct = np.array([1, 1, 1, 1], bool)
    assert bootstrap_accuracy(correct, np.array([0, 0, 1, 2]), 3, 200, 0) == (100.0, 100.0, 100.0)
    correct = np.array([1, 0, 1, 0, 1, 1], bool)
    cap = np.array([0, 0, 1, 1, 2, 3])
    acc, lo, hi = bootstrap_accuracy(correct, cap, 4, 500, 0)
    assert acc == pytest.approx(100 * 4 / 6) and 0 <= lo < acc < hi <= 100
    # resampling whole captions: a caption of one wrong and one right item moves as a pair
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 4, size=(500, 4))
    hits = np.array([1, 1, 1, 1.0])[idx].sum(1) / np.array([2, 2, 1, 1.0])[idx].sum(1) * 100
    assert (lo, hi) == tuple(np.percentile(hits, [2.5, 97.5]))
    assert bootstrap_accuracy(correct, cap, 4, 500, 0) == (acc, lo, hi)  # seeded


def test_audit_scenes_tinyclip_numbers_match_the_saved_arrays(scenes, tmp_path, capsys):
    data, base = scenes
    out = tmp_path / "audit"
    assert main(["audit", "--encoder", f"tiny:{base}", "--pairs", str(data), "--out", str(out), "--n-boot", "50",
                 "--n-worst", "2", "--blocks", "last", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    s = json.loads((out / "summary.json").read_text())
    arrays = np.load(out / "arrays.npz")
    items = [json.loads(ln) for ln in (out / "items.jsonl").read_text().splitlines()]
    assert res["items"] == s["items"] == len(items) == len(arrays["correct"]) > 24
    # every item is a tree negative of the scenes generator (with the scenes' POS), recomputed here
    pairs = load_pairs(data)
    want, _ = tree_items(pairs.captions, generator_for(pairs, None, 0), scenes=True)
    assert [(it["positive"], it["negative"]) for it in items] == [(w["positive"], w["negative"]) for w in want]
    assert set(arrays["pos"]) <= {"ADJ", "ADP", "NOUN"}  # "striped", "left" are not verbs here
    assert np.array_equal(arrays["correct"], arrays["s_pos"] > arrays["s_neg"])
    assert s["accuracy"] == pytest.approx(100 * arrays["correct"].mean())
    by_pos = {r[0]: r for r in s["groups"]["pos"]}
    for pos, row in by_pos.items():
        m = arrays["pos"] == pos
        assert row[1] == m.sum() and row[2] == pytest.approx(100 * arrays["correct"][m].mean())
        assert row[3] <= row[2] <= row[4]
    assert {r[0] for r in s["groups"]["category"]} <= {"attribute_color", "attribute_size", "attribute_material",
                                                        "relation_spatial", "object", "other"}
    assert s["missing_images"] == 0
    # the worst items, with their maps, in the report
    assert len(s["worst"]) == 2 and s["worst"][0]["s_neg"] - s["worst"][0]["s_pos"] >= \
        s["worst"][1]["s_neg"] - s["worst"][1]["s_pos"]
    for name in ("anchor", "dire", "hilacam_positive"):
        assert (out / s["worst"][0]["maps"][name]).is_file()
    md = (out / "report.md").read_text()
    assert "By part of speech" in md and "Worst items" in md and (out / "report.html").is_file()


@pytest.mark.slow
def test_audit_repair_refuses_or_keeps_by_retrieval(scenes, tmp_path):
    from vlctl.audit import run_audit
    from vlctl.encoders.factory import create

    data, base = scenes
    enc = create(f"tiny:{base}")
    cfg = AuditConfig(n_boot=20, n_worst=0, repair=True, repair_epochs=1, repair_batch_size=8, max_drop=100)
    res = run_audit(enc, load_pairs(data), tmp_path / "keep", cfg)
    s = json.loads((tmp_path / "keep" / "summary.json").read_text())
    r = s["repair"]
    assert res["repair"] == r["verdict"] == "kept" and (tmp_path / "keep" / "repair" / "adapters").is_dir()
    assert r["held_out_captions"] + r["repair_captions"] == 24 and r["steps"] >= 1
    assert r["r1_drop"]["i2t@1"] == pytest.approx(r["r1_before"]["i2t@1"] - r["r1_after"]["i2t@1"])
    # max_drop 0 with any drop refuses; with none it keeps: the verdict follows the rule
    cfg0 = AuditConfig(n_boot=20, n_worst=0, repair=True, repair_epochs=1, repair_batch_size=8, max_drop=0)
    r0 = json.loads(json.dumps(run_audit(enc, load_pairs(data), tmp_path / "strict", cfg0)))
    s0 = json.loads((tmp_path / "strict" / "summary.json").read_text())["repair"]
    assert r0["repair"] == ("refused" if max(s0["r1_drop"].values()) > 0 else "kept")
    assert (tmp_path / "strict" / "repair" / "adapters").is_dir() == (r0["repair"] == "kept")


def _png(path: Path, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)


def test_audit_csv_open_clip_random_weights_and_missing_images(tmp_path, capsys):
    import open_clip

    cfg_dir = tmp_path / "oc"
    cfg_dir.mkdir()
    (cfg_dir / "vlctl-audit-vit.json").write_text(json.dumps({
        "embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 8},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}))
    open_clip.add_model_config(cfg_dir)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    rows = ["filepath,title"]
    caps = ["a man riding a horse behind a truck", "two dogs playing with a red ball", "a cat sitting on a wooden table",
            "a woman holding an umbrella in the rain"]
    for k, c in enumerate(caps):
        if k != 2:
            _png(imgs / f"{k}.png", k)
        rows.append(f"imgs/{k}.png,{c}")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "audit"
    assert main(["audit", "--encoder", "open_clip:vlctl-audit-vit", "--pairs", str(tmp_path / "pairs.csv"),
                 "--out", str(out), "--n-boot", "30", "--n-worst", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    s = json.loads((out / "summary.json").read_text())
    assert res["missing_images"] == s["missing_images"] == 1 and s["missing_examples"] == ["imgs/2.png"]
    assert s["looked_in"] == str(tmp_path.resolve()) and s["captions"] == 3
    assert {"NOUN", "ADP"} <= {r[0] for r in s["groups"]["pos"]}
    md = (out / "report.md").read_text()
    assert "1 images were not found" in md and str(tmp_path.resolve()) in md
    assert (out / s["worst"][0]["maps"]["dire"]).is_file()
    # bad input: one line, exit 2
    (tmp_path / "nocap.csv").write_text("filepath,title\nimgs/0.png,\n")
    assert main(["audit", "--encoder", "open_clip:vlctl-audit-vit", "--pairs", str(tmp_path / "nocap.csv"),
                 "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlctl: error:") and err.count("\n") == 1

"""The trained checkpoints shipped for `make demo` (checkpoints/) and the full MAD CLIP.

They must be exactly what the `--quick` presets' (and FULL_PRESETS') own training stages produce today (so the demo
evaluates the models `--from-scratch` would train), their encoder ids must name their weights, and
`--from-scratch` must never read them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlctl.fsops import VlctlError
from vlctl.io import read_json, sha256_file, sha256_json
from vlctl.recipes import RECIPES
from vlctl.recipes import shipped as shipped_mod
from vlctl.recipes.runner import Runner
from vlctl.recipes.shipped import SHIPPED, expected_stages, shipped_manifest, shipped_trees_digest, stage_dir_name

MAX_BYTES = 10 * 1024 * 1024  # per stage; the full MAD CLIP is 9.7 MB, tevi-mad's quick train embeddings 7.4 MB


def _shipped_trees_digest(manifest: dict) -> str:
    """The trees digest the shipped 3VL fine-tunes were trained on (one for all three)."""
    digest = shipped_trees_digest()
    assert digest is not None and manifest
    return digest


def _architecture(recipe: str, key: dict) -> dict:
    """The TinyCLIP config a trained stage's key stands for: in the key itself (a fine-tune: its
    base's), or for 3vl-lit, built from the preset's fields the key holds (the LiT base)."""
    if recipe == "3vl-lit":
        from vlctl.config import config_to_dict
        from vlctl.recipes.threevl import lit

        base = key.get("base", key)
        cfg = lit.load_preset(True)
        assert all(getattr(cfg, f) == v for f, v in base.items() if f not in ("data", "seed"))
        return config_to_dict(lit.lit_config(cfg))
    return key["base"]["architecture"] if "base" in key else key["architecture"]


def test_every_shipped_training_stage_is_there_with_its_presets_key():
    manifest = shipped_manifest()
    expected = expected_stages(trees=_shipped_trees_digest(manifest))
    assert sorted(manifest) == sorted(expected), (
        "the shipped checkpoints are not the presets' training stages (a preset or an architecture "
        "changed?): refresh them as src/vlctl/recipes/shipped.py says")
    for name, (recipe, stage, key) in expected.items():
        entry, done = manifest[name], read_json(SHIPPED / name / "done.json")
        assert (entry["recipe"], entry["stage"]) == (recipe, stage)
        assert done["key"] == json.loads(json.dumps(key)) and done["stage"] == stage  # tuples as JSON lists
        assert stage_dir_name(stage, done["key"]) == name
        if (SHIPPED / name / "model").is_dir():  # a trained model: its key names its architecture
            assert _architecture(recipe, done["key"]) == read_json(SHIPPED / name / "model/config.json")["config"]
        assert not any("checkpoint" in rel.split("/")[:-1] for rel in entry["files"])  # no resume state
        for rel, digest in entry["files"].items():
            assert sha256_file(SHIPPED / name / rel) == digest, rel


@pytest.mark.slow
def test_the_shipped_fine_tunes_were_trained_on_the_trees_the_generator_makes_today(tmp_path):
    """Regenerates the --quick preset's fine-tuning trees (spaCy, WordNet; the data stage first):
    a change to the tree generator must come with refreshed fine-tunes, or the demo retrains them."""
    from vlctl.recipes.threevl import scenes as tvl

    cfg = tvl.load_preset(True)
    runner = Runner(tmp_path, verbose=False, from_scratch=True)
    keys = tvl.stage_keys(cfg)
    data_dir = runner.stage("data", keys["data"], lambda w: tvl._data(cfg, w))
    trees_dir = runner.stage("trees", keys["trees"], lambda w: tvl._trees(cfg, data_dir, w))
    assert tvl.trees_digest(trees_dir) == _shipped_trees_digest(shipped_manifest())


# The trees 3vl-lit's shipped quick fine-tunes were trained on: sha256_json of trees.json's "trees" and "negatives".
# Their keys name the tree generator by GENERATOR_VERSION, not by its output, so this is what catches a change.
LIT_QUICK_TREES = "70f425740cc5c1cd4637686dcf993cb2f0234f3bf9b7d42b27a3d23077d72050"


@pytest.mark.slow
def test_the_shipped_3vl_lit_fine_tunes_were_trained_on_the_trees_the_generator_makes_today(tmp_path):
    """A change to the trees of 3vl-lit's quick preset must bump trees.GENERATOR_VERSION (new keys:
    the fine-tunes retrain) and refresh the shipped ones, or the recipe reuses stale fine-tunes."""
    from vlctl.recipes.threevl import lit

    cfg = lit.load_preset(True)
    runner = Runner(tmp_path, verbose=False, from_scratch=True)
    keys = lit.stage_keys(cfg)
    ft = runner.stage("data-finetune", keys["data_finetune"], lambda w: lit._data_finetune(cfg, w))
    trees = read_json(runner.stage("trees", keys["trees"], lambda w: lit._trees(cfg, ft, w)) / "trees.json")
    assert sha256_json({"trees": trees["trees"], "negatives": trees["negatives"]}) == LIT_QUICK_TREES


def test_each_shipped_checkpoint_is_small_and_its_id_names_its_weights():
    from vlctl.encoders.factory import load_encoder
    from vlctl.encoders.tiny_model import encoder_id

    manifest = shipped_manifest()
    for name, entry in manifest.items():
        size = sum(p.stat().st_size for p in (SHIPPED / name).rglob("*") if p.is_file())
        assert size <= MAX_BYTES, f"{name}: {size} bytes"
        if (SHIPPED / name / "model").is_dir():
            enc = load_encoder(f"tiny:{SHIPPED / name / 'model'}")
            assert enc.id == entry["encoder_id"] == read_json(SHIPPED / name / "model/config.json")["id"]
            assert encoder_id(enc.model) == enc.id  # recomputed from the loaded weights
    # Embeddings are shipped only beside the CLIP that computed them.
    clips = {e["encoder_id"] for e in manifest.values() if e["stage"] == "train"}
    assert all(e["encoder_id"] in clips for e in manifest.values() if e["stage"].startswith("embed"))
    # 27 MB for the demo's recipes, 8.4 MB for 3vl-lit's quick preset (3 seeds x base + 3 fine-tunes)
    assert sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file()) <= 40 * 1024 * 1024


def _poisoned_shipped(tmp_path: Path, key: dict) -> Path:
    """A shipped directory naming a stage whose file is corrupt: reading it raises."""
    shipped = tmp_path / "shipped"
    name = stage_dir_name("train", key)
    (shipped / name).mkdir(parents=True)
    (shipped / name / "done.json").write_text(json.dumps({"stage": "train", "key": key, "seconds": 1.0}))
    (shipped / name / "weights.bin").write_bytes(b"not what the manifest says")
    (shipped / "manifest.json").write_text(json.dumps({"stages": {name: {
        "recipe": "r", "stage": "train", "seconds": 1.0,
        "files": {"done.json": sha256_file(shipped / name / "done.json"), "weights.bin": "0" * 64}}}}))
    return shipped


def test_from_scratch_never_reads_the_shipped_checkpoints(tmp_path):
    key = {"epochs": 3}
    shipped = _poisoned_shipped(tmp_path, key)
    ran = []
    # Control: without --from-scratch the runner does read the shipped stage (and refuses the bad file).
    with pytest.raises(VlctlError, match="weights.bin: shipped checkpoint file missing or modified"):
        Runner(tmp_path / "a", shipped=shipped, verbose=False).stage("train", key, lambda w, r: ran.append(w),
                                                                    resumable=True)
    assert ran == []
    for kw in ({"from_scratch": True}, {"force": True}):
        Runner(tmp_path / "b", shipped=shipped, verbose=False, **kw).stage(
            "train", key, lambda w, r: ran.append(w), resumable=True)
    assert len(ran) == 2


def test_a_good_shipped_stage_is_copied_and_recorded_as_shipped(tmp_path):
    key = {"epochs": 3, "pos": [("red", ("ADJ", "JJ"))]}  # a tuple in the key: a list in done.json
    shipped = tmp_path / "shipped"
    name = stage_dir_name("train", key)
    (shipped / name / "model").mkdir(parents=True)
    (shipped / name / "done.json").write_text(json.dumps({"stage": "train", "key": key, "seconds": 7.0}))
    (shipped / name / "model" / "w.bin").write_bytes(b"weights")
    files = {rel: sha256_file(shipped / name / rel) for rel in ("done.json", "model/w.bin")}
    (shipped / "manifest.json").write_text(json.dumps({"stages": {name: {"recipe": "r", "stage": "train",
                                                                            "seconds": 7.0, "files": files}}}))
    runner = Runner(tmp_path / "run", shipped=shipped, verbose=False)
    got = runner.stage("train", key, lambda w, r: pytest.fail("trained although a checkpoint is shipped"),
                       resumable=True)
    assert (got / "model" / "w.bin").read_bytes() == b"weights" and (got / "done.json").is_file()
    assert runner.timings["train"] == {"seconds": 7.0, "cached": True, "shipped": True}
    other = Runner(tmp_path / "run2", shipped=shipped, verbose=False)  # another key: trains
    other.stage("train", {**key, "epochs": 4}, lambda w, r: (w / "model").mkdir(), resumable=True)
    assert other.timings["train"]["cached"] is False


class _Stop(Exception):
    pass


@pytest.mark.parametrize("from_scratch", [False, True])
def test_every_recipe_passes_from_scratch_to_its_runner(tmp_path, monkeypatch, from_scratch):
    """run_recipe(from_scratch=...) reaches each recipe's Runner (stopped there, before any stage)."""
    from vlctl.recipes import run_recipe

    seen = []

    def record(self, *args, **kwargs):
        seen.append(kwargs.get("from_scratch"))
        raise _Stop

    monkeypatch.setattr(Runner, "__init__", record)
    for name in RECIPES:
        with pytest.raises(_Stop):
            run_recipe(name, tmp_path / name, quick=True, from_scratch=from_scratch)
    assert seen == [from_scratch] * len(RECIPES)


def test_the_shipped_mad_train_embeddings_and_values_are_what_the_shipped_clip_computes(tmp_path):
    """tevi-mad's shipped train-split embeddings (and mad-clip's train label values) stand in for
    rendering and embedding 30,000 images: recompute the first 32 and compare."""
    import numpy as np

    from vlctl.data.mad import load_glyphs, make_range
    from vlctl.data.mad_config import MadConfig
    from vlctl.embeddings.cache import embed
    from vlctl.encoders.factory import load_encoder
    from vlctl.recipes.tevi import mad_clip

    cfg = mad_clip.load_preset(True)
    key = mad_clip.split_key(cfg, "train")
    mad = MadConfig(n=key["n"], seed=key["seed"], split="train")
    images, labels = make_range((0, 32), mad, load_glyphs(mad))
    manifest = shipped_manifest()
    by_stage = {entry["stage"]: name for name, entry in manifest.items()}
    clip = next(n for n, e in manifest.items() if (e["recipe"], e["stage"]) == ("mad-clip", "train"))
    encoder = load_encoder(SHIPPED / clip / "model")
    got = embed(encoder, images=images, texts=[lab["caption"] for lab in labels], data_id="first-32",
                root=tmp_path / "cache")
    shipped = np.load(SHIPPED / by_stage["embed-train"] / "embeddings.npz")
    np.testing.assert_allclose(np.asarray(got.image_emb), shipped["image_emb"][:32], atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.text_emb), shipped["text_emb"][:32], atol=1e-5)
    values = np.load(SHIPPED / by_stage["values-train"] / "values.npz")
    np.testing.assert_array_equal(values["image_values"][:32], mad_clip.image_values(labels))
    np.testing.assert_array_equal(values["caption_values"][:32], mad_clip.caption_values(labels))
    assert len(values["image_values"]) == len(shipped["image_emb"]) == cfg.n_train


def test_ship_takes_each_stage_from_the_first_folder_that_has_it_and_keeps_the_shipped_ones(tmp_path, monkeypatch):
    def stage(folder: Path, name: str, payload: bytes) -> None:
        (folder / name / "model").mkdir(parents=True)
        (folder / name / "done.json").write_text(json.dumps({"stage": name, "key": {}, "seconds": 2.0}))
        (folder / name / "model" / "weights.bin").write_bytes(payload)
        (folder / name / "checkpoint").mkdir()
        (folder / name / "checkpoint" / "state.json").write_text("{}")  # resume state: never shipped

    shipped, fresh = tmp_path / "shipped", tmp_path / "fresh"
    stage(shipped, "train-a", b"quick")
    stage(fresh, "train-b", b"full")
    stage(fresh, "train-a", b"a newer run that the shipped folder wins over")
    (shipped / "stale-c").mkdir()
    monkeypatch.setattr(shipped_mod, "expected_stages", lambda _stages: {
        "train-a": ("r", "train", {}), "train-b": ("r", "train", {})})
    manifest = shipped_mod.ship([shipped, fresh], shipped)
    assert sorted(manifest) == ["train-a", "train-b"] and not (shipped / "stale-c").exists()
    assert (shipped / "train-a/model/weights.bin").read_bytes() == b"quick"
    assert (shipped / "train-b/model/weights.bin").read_bytes() == b"full"
    assert sorted(manifest["train-b"]["files"]) == ["done.json", "model/weights.bin"]
    assert shipped_manifest(shipped)["train-b"]["files"]["model/weights.bin"] == sha256_file(
        shipped / "train-b/model/weights.bin")
    monkeypatch.setattr(shipped_mod, "MAX_FILE_BYTES", 4)
    with pytest.raises(VlctlError, match="too large to ship"):
        shipped_mod.ship([shipped], shipped)
    monkeypatch.setattr(shipped_mod, "expected_stages", lambda _stages: {"train-x": ("r", "train", {})})
    with pytest.raises(VlctlError, match="no finished r train stage in"):
        shipped_mod.ship([shipped, fresh], shipped)

"""The trained checkpoints shipped for `make demo` (src/vlctl/recipes/checkpoints/).

They must be exactly what the `--quick` presets' own training stages produce today (so the demo
evaluates the models `--from-scratch` would train), their encoder ids must name their weights, and
`--from-scratch` must never read them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlctl.io import VlctlError, read_json, sha256_file
from vlctl.recipes import RECIPES
from vlctl.recipes.runner import Runner
from vlctl.recipes.shipped import SHIPPED, expected_stages, shipped_manifest, stage_dir_name

MAX_BYTES = 5 * 1024 * 1024


def test_every_quick_training_stage_is_shipped_with_its_presets_key():
    manifest = shipped_manifest()
    expected = expected_stages()
    assert sorted(manifest) == sorted(expected), (
        "the shipped checkpoints are not the --quick presets' training stages (a preset or an architecture "
        "changed?): refresh them as src/vlctl/recipes/shipped.py says")
    for name, (recipe, stage, key) in expected.items():
        entry, done = manifest[name], read_json(SHIPPED / name / "done.json")
        assert (entry["recipe"], entry["stage"]) == (recipe, stage)
        assert done["key"] == key and done["stage"] == stage
        assert stage_dir_name(stage, done["key"]) == name
        assert done["key"]["architecture"] == read_json(SHIPPED / name / "model/config.json")["config"]
        for rel, digest in entry["files"].items():
            assert sha256_file(SHIPPED / name / rel) == digest, rel


def test_each_shipped_checkpoint_is_small_and_its_id_names_its_weights():
    from vlctl.encoders import load_encoder
    from vlctl.encoders.tiny_model import encoder_id

    for name, entry in shipped_manifest().items():
        size = sum(p.stat().st_size for p in (SHIPPED / name).rglob("*") if p.is_file())
        assert size <= MAX_BYTES, f"{name}: {size} bytes"
        enc = load_encoder(f"tiny:{SHIPPED / name / 'model'}")
        assert enc.id == entry["encoder_id"] == read_json(SHIPPED / name / "model/config.json")["id"]
        assert encoder_id(enc.model) == enc.id  # recomputed from the loaded weights


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
    key = {"epochs": 3}
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
    other.stage("train", {"epochs": 4}, lambda w, r: (w / "model").mkdir(), resumable=True)
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

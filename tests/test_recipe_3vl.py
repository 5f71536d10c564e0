"""Recipe 3vl-scenes end to end on a miniature preset (real data, training, relevancy, report; ~20 s)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlctl.data.scenes import CHECKLIST_CATEGORIES
from vlctl.recipes import RECIPES
from vlctl.recipes.threevl.scenes import ThreeVLScenesRecipe, load_preset, run
from vlctl.recipes.threevl.scenes_report import MODELS

MINI = ThreeVLScenesRecipe(n_train=256, n_finetune=128, n_test=24, base_epochs=1, base_batch_size=64,
                           base_warmup_steps=2, ft_epochs=1, ft_batch_size=32, ft_warmup_steps=1, n_relevancy=4,
                           n_expansion=2, threads=1, workers=1)


def test_presets_load_and_registry():
    assert RECIPES["3vl-scenes"] == "vlctl.recipes.threevl.scenes:run"
    quick, full = load_preset(True), load_preset(False)
    assert quick.n_train < full.n_train and quick.alpha == 0.5 and quick.level_reduction in ("sum", "mean")


def test_recipe_miniature_end_to_end(tmp_path):
    report = run(tmp_path / "out", cfg=MINI)
    out = tmp_path / "out"
    assert report.is_file() and (out / "report.html").is_file()
    r = json.loads((out / "results.json").read_text())
    for c in [*CHECKLIST_CATEGORIES, "average"]:
        assert set(r["checklist"][c]) == set(MODELS)
        assert all(0 <= v <= 100 for v in r["checklist"][c].values())
    arr = np.load(out / "arrays" / "checklist.npz")
    for m in MODELS:
        for c in CHECKLIST_CATEGORIES:
            s = arr[f"scores_{m}__{c}"]
            assert s.ndim == 2 and s.shape[1] == 2 and len(s) == r["n_items"][c]
            # the reported number is recomputable from the array
            assert r["checklist"][c][m] == pytest.approx(100 * np.mean(s[:, 0] > s[:, 1]))
    for m in ("base", "tree"):
        for method in ("hilacam", "anchor", "dire"):
            c = r["token_removal"][m][method]
            assert len(c["accuracy"]) == 11 and c["fractions"][0] == 0.0
        assert set(r["deletion"][m]) >= {"mean_drop_relevant", "mean_drop_random", "holds"}
    assert set(r["failures_by_pos"]["base"]) >= {"NOUN", "ADJ", "ADP"}
    assert (out / "arrays" / "README.md").is_file() and (out / "figures" / "checklist.png").is_file()
    assert r["timings"]["data"]["cached"] is False
    # a second run reuses every stage
    run(tmp_path / "out", cfg=MINI)
    again = json.loads((out / "results.json").read_text())
    assert all(v["cached"] for k, v in again["timings"].items() if isinstance(v, dict))
    assert again["checklist"] == r["checklist"]

"""Recipe 3vl-lit: MiniLM LoRA, scene-checked negatives, extra checklist items, statistics, and a
miniature run end to end (real data, LiT base, three LoRA fine-tunes, Anchor removal, report)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from vlctl.data.scenes import (
    ATTRIBUTES,
    CHECKLIST_CATEGORIES,
    RELATION_MARGIN,
    ScenesConfig,
    alt_text_caption,
    alt_text_captions,
    caption_holds,
    make_sample,
    place_caption,
    place_captions,
)
from vlctl.fsops import VlctlError
from vlctl.recipes import DEMO, RECIPES
from vlctl.recipes.threevl.lit import (
    ThreeVLLitRecipe,
    base_pairs,
    checked_tree,
    lit_config,
    load_preset,
    phrase_structure,
    run,
    scene_tree_generator,
    stage_keys,
    with_relation_negatives,
)
from vlctl.recipes.threevl.lit_eval import extra_items
from vlctl.recipes.threevl.lit_report import BASE_MODELS, CATEGORIES, bootstrap_interval, items_for_difference

MINI = ThreeVLLitRecipe(n_train=64, alt_per_scene=1, n_finetune=32, n_test=12, base_epochs=1, base_batch_size=32,
                        base_warmup_steps=1, ft_epochs=1, ft_batch_size=16, ft_warmup_steps=1, n_relevancy=3,
                        n_bootstrap=20, seeds=(0,), threads=1, workers=1, max_levels=2, max_negatives=2)


def _labels(n: int, split: str = "test") -> list[dict]:
    cfg = ScenesConfig(n=n, split=split, workers=1)
    return [make_sample(i, cfg)[1] for i in range(n)]


def test_presets_registry_and_not_in_demo():
    assert RECIPES["3vl-lit"] == "vlctl.recipes.threevl.lit:run"
    assert "3vl-lit" not in DEMO
    quick, full = load_preset(True), load_preset(False)
    assert quick.n_test < full.n_test and quick.alpha == full.alpha == 0.5 and len(quick.seeds) == 3
    assert lit_config(quick).text_tower == "minilm"
    with pytest.raises(VlctlError, match="seeds"):
        ThreeVLLitRecipe(seeds=(1, 1))


def test_minilm_lora_exact_at_init_trains_and_round_trips(tmp_path):
    from vlctl.encoders import tiny_model
    from vlctl.methods.threevl.lora import add_lora_lit, load_minilm_lora, minilm_lora_parameters, save_minilm_lora

    model = tiny_model.create_model(lit_config(MINI), seed=0)
    texts = ["a large red striped circle left of a small blue dotted square", "a red circle", "blue, star"]
    tok = model.tokenize(texts)
    with torch.no_grad():
        frozen = model.encode_text(tok)
    add_lora_lit(model, rank=2, alpha=4.0, towers="both", minilm_layers=2, seed=0)
    params = minilm_lora_parameters(model)
    # 2 layers x (query, key, value, attention.output.dense) x (A, B); nothing else trains
    assert len(params) == 16 and all("layer.4" in k or "layer.5" in k for k in params)
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    out = model.encode_text(tok)
    assert torch.allclose(out, frozen, atol=1e-5)  # LoRA B = 0: the frozen tower exactly
    out.pow(2).sum().backward()
    assert all(p.grad is not None for k, p in params.items() if "lora_B" in k)
    with torch.no_grad():
        for k, p in params.items():
            if "lora_B" in k:
                p.add_(0.05)
        tuned = model.encode_text(tok)
    assert (tuned - frozen).abs().max() > 1e-3
    save_minilm_lora(model, tmp_path / "a")
    fresh = tiny_model.create_model(lit_config(MINI), seed=0)
    load_minilm_lora(fresh, tmp_path / "a")
    with torch.no_grad():
        assert torch.allclose(fresh.encode_text(tok), tuned, atol=1e-5)
    doc = json.loads((tmp_path / "a" / "minilm_lora.json").read_text())
    doc["backbone"]["weights_sha256"] = "0" * 64
    (tmp_path / "a" / "minilm_lora.json").write_text(json.dumps(doc))
    with pytest.raises(VlctlError, match="refusing"):
        load_minilm_lora(tiny_model.create_model(lit_config(MINI), seed=0), tmp_path / "a")


def test_phrase_structure_and_checked_negatives():
    assert phrase_structure("a small red plain circle left of a large blue dotted star and a small green cross") == {
        "nps": [{"size": "small", "color": "red", "texture": "plain", "shape": "circle"},
                {"size": "large", "color": "blue", "texture": "dotted", "shape": "star"},
                {"size": "small", "color": "green", "shape": "cross"}], "rel": "left of"}
    assert phrase_structure("a small purple") == {"nps": [{"size": "small", "color": "purple"}], "rel": None}
    assert phrase_structure("a red blue circle") is None and phrase_structure("a red dog") is None
    objects = [{"size": "small", "color": "red", "texture": "plain", "shape": "circle", "cx": 0.2, "cy": 0.5},
               {"size": "large", "color": "blue", "texture": "dotted", "shape": "star", "cx": 0.8, "cy": 0.5}]
    tree = [{"positive": "a small red plain circle",
             "negatives": ["a small blue plain circle", "a large red plain circle", "a small red plain star"],
             "negative_pos": ["ADJ", "ADJ", "NOUN"]},
            {"positive": "a small red plain circle left of a large blue dotted star",
             "negatives": ["a small red plain circle right of a large blue dotted star",
                           "a small red plain circle left of a large blue dotted circle",
                           "a small red plain circle left of a large dog"],
             "negative_pos": ["ADP", "NOUN", "NOUN"]}]
    out, stats = checked_tree(tree, objects)
    # the partial "a large red plain circle" is false; every one-word change above is false except none true here
    assert out[0]["negatives"] == tree[0]["negatives"]
    assert out[1]["negatives"] == tree[1]["negatives"][:2] and stats["unparsed"] == 1
    # "a blue shape ..." style partial negatives that describe the other object are dropped
    out, stats = checked_tree([{"positive": "a small red", "negatives": ["a large blue", "a small blue"],
                                "negative_pos": ["ADJ", "ADJ"]}], objects)
    assert out[0]["negatives"] == ["a small blue"] and stats["true_of_scene"] == 1


def test_every_relation_level_gets_its_relation_negative():
    # spaCy never parses "left of" as one preposition: the generator alone gives left/right
    # relation levels no relation negative (above/below get one)
    gen = scene_tree_generator(0)
    caps = ["a small yellow plain cross left of a small red striped triangle",
            "a large blue dotted star right of a small red plain square and a small green plain circle",
            "a large yellow dotted star above a small blue plain square"]
    for cap, raw in zip(caps, gen.trees(caps)):
        tree = with_relation_negatives(raw)
        rel_levels = [lv for lv in tree if (phrase_structure(lv["positive"]) or {}).get("rel")]
        assert rel_levels
        for lv in rel_levels:
            rel = phrase_structure(lv["positive"])["rel"].split()[0]
            opposite = {"left": "right", "right": "left", "above": "below", "below": "above"}[rel]
            want = lv["positive"].replace(f" {rel} ", f" {opposite} ")
            assert lv["negatives"].count(want) == 1
            assert lv["negative_pos"][lv["negatives"].index(want)] == "ADP"
            assert len(lv["negative_pos"]) == len(lv["negatives"])
    # levels without a relation are unchanged; a level that has it already gets no second copy
    tree = [{"positive": "a small red circle", "negatives": ["a large red circle"], "negative_pos": ["ADJ"]},
            {"positive": "a small red circle right of a blue star",
             "negatives": ["a small red circle left of a blue star"], "negative_pos": ["VERB"]}]
    out = with_relation_negatives(tree)
    assert out[0] == tree[0]
    assert out[1]["negatives"] == tree[1]["negatives"] and out[1]["negative_pos"] == ["ADP"]


def test_finetune_scenes_are_their_own_stage():
    two = ThreeVLLitRecipe(ft_p_three=0.0)
    keys, keys2 = stage_keys(ThreeVLLitRecipe()), stage_keys(two)
    assert keys["data"] == keys2["data"]  # the bases do not retrain when only the fine-tuning scenes change
    assert keys["data_finetune"] != keys2["data_finetune"] and keys["trees"] != keys2["trees"]
    with pytest.raises(VlctlError, match="ft_p_three"):
        ThreeVLLitRecipe(ft_p_three=1.5)


def test_extra_items_are_false_and_test_what_they_say():
    labels = _labels(40)
    swap = extra_items(labels, "attribute_swap")
    single = extra_items(labels, "single_object")
    assert len(swap) > 20 and len(single) > 30
    for it in swap:
        lab = labels[it["index"]]
        assert sorted(it["pos"].split()) == sorted(it["neg"].split()) and it["pos"] != it["neg"]
        assert not caption_holds(phrase_structure(it["neg"]), lab["objects"])
    for it in single:
        objs = labels[it["index"]]["objects"]
        assert caption_holds(phrase_structure(it["pos"]), objs)
        assert all(it["to"] not in {o[a] for a in ATTRIBUTES} for o in objs)  # the new value is nowhere
    assert extra_items(labels, "single_object") == single  # deterministic
    with pytest.raises(VlctlError):
        extra_items(labels, "nope")


def test_alt_text_true_of_the_scene_and_deterministic():
    labels = _labels(30, "train")
    caps = alt_text_captions(labels, seed=0, per_scene=2)
    assert caps == alt_text_captions(labels, seed=0, per_scene=2) and len(caps[0]) == 2
    assert caps != alt_text_captions(labels, seed=1, per_scene=2)
    values = {v for lab in labels for o in lab["objects"] for v in o.values() if isinstance(v, str)}
    for lab, per in zip(labels, caps):
        present = {o[a] for o in lab["objects"] for a in ATTRIBUTES}
        for c in per:
            words = set(c.replace(",", " ").replace(":", " ").split())
            assert words & values <= present  # names only what the scene has
    rng = np.random.default_rng(0)
    assert isinstance(alt_text_caption(labels[0]["objects"], rng), str)


def test_place_caption_names_an_object_where_it_is():
    labels = _labels(40, "train")
    caps = place_captions(labels, seed=0)
    assert caps == place_captions(labels, seed=0) and caps != place_captions(labels, seed=1)
    side = {"on the left": ("cx", False), "on the right": ("cx", True), "at the top": ("cy", False),
            "at the bottom": ("cy", True)}
    for lab, c in zip(labels, caps):
        if c is None:  # no object lies off the middle by the margin on either axis
            assert all(abs(o[a] - 0.5) <= RELATION_MARGIN for o in lab["objects"] for a in ("cx", "cy"))
            continue
        _, color, shape, *place = c.split()
        axis, high = side[" ".join(place)]
        assert any(o["color"] == color and o["shape"] == shape and abs(o[axis] - 0.5) > RELATION_MARGIN
                   and (o[axis] > 0.5) == high for o in lab["objects"])
    centred = [{"cx": 0.5, "cy": 0.55, "color": "red", "shape": "circle"}]
    assert place_caption(centred, np.random.default_rng(0)) is None
    # the base's pairs: the full captions, then each placed scene's place caption beside its image
    images = np.arange(len(labels) * 12, dtype=np.uint8).reshape(len(labels), 2, 2, 3)
    full_caps, full_imgs = base_pairs(dataclasses.replace(MINI, base_captions="full"), labels, images)
    assert full_caps == [lab["caption"] for lab in labels] and full_imgs is images
    caps_p, imgs_p = base_pairs(dataclasses.replace(MINI, base_captions="full+place"), labels, images)
    placed = [i for i, c in enumerate(caps) if c is not None]
    assert caps_p == full_caps + [caps[i] for i in placed]
    assert np.array_equal(imgs_p, np.concatenate([images, images[placed]]))


def test_statistics():
    correct = np.array([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=bool)
    lo, hi = bootstrap_interval(correct, 200)
    assert 0 <= lo <= 50 <= hi <= 100
    assert bootstrap_interval(np.ones((3, 10), bool), 50) == (100.0, 100.0)
    # var of the per-item difference 1 (in points^2 scaled): n = var * (1.96 / (2 * 1))^2
    d = {"c": np.array([10.0, -10.0] * 50)}
    assert items_for_difference(d) == int(np.ceil(np.var(d["c"], ddof=1) * (1.96 / 2) ** 2))


def test_recipe_miniature_end_to_end(tmp_path):
    report = run(tmp_path / "out", cfg=MINI)
    out = tmp_path / "out"
    assert report.is_file()
    r = json.loads((out / "results.json").read_text())
    arr = np.load(out / "arrays" / "checklist.npz")
    for m in BASE_MODELS:
        for c in CATEGORIES:
            s = arr[f"scores_{m}_s0__{c}"]
            assert s.ndim == 2 and s.shape[1] == 2 and len(s) == r["n_items"][c]
            assert r["accuracy"][m][c]["mean"] == pytest.approx(100 * np.mean(s[:, 0] > s[:, 1]))
        avg = np.mean([100 * np.mean(arr[f"scores_{m}_s0__{c}"][:, 0] > arr[f"scores_{m}_s0__{c}"][:, 1])
                       for c in CHECKLIST_CATEGORIES])
        assert r["accuracy"][m]["average"]["mean"] == pytest.approx(avg)
    assert set(r["failures_by_pos"]["tree"]) == {"NOUN", "ADJ", "ADP"}
    assert r["anchor_token_removal"]["object"]["n"] == 3
    assert 0.5 < r["minilm_text_cosine"]["attribute_swap"] <= 1.0
    assert r["negative_checks"]["kept"] > 0
    # paired differences recomputed from the arrays: per seed, the difference of the category averages
    acc = {m: np.mean([100 * np.mean(arr[f"scores_{m}_s0__{c}"][:, 0] > arr[f"scores_{m}_s0__{c}"][:, 1])
                       for c in CHECKLIST_CATEGORIES]) for m in BASE_MODELS}
    assert r["paired"]["contrastive_minus_base"]["mean"] == pytest.approx(acc["contrastive"] - acc["base"])
    swap = {m: 100 * np.mean(arr[f"scores_{m}_s0__attribute_swap"][:, 0] > arr[f"scores_{m}_s0__attribute_swap"][:, 1])
            for m in BASE_MODELS}
    ps = r["paired_swap"]
    assert ps["best_baseline"] == max(("contrastive", "negclip"), key=swap.get)
    assert ps["tree_minus_best_baseline"]["mean"] == pytest.approx(swap["tree"] - swap[ps["best_baseline"]])
    assert ps["tree_minus_base"]["ci95"][0] <= swap["tree"] - swap["base"] <= ps["tree_minus_base"]["ci95"][1]
    lo, hi = r["paired"]["tree_minus_base"]["ci95"]
    assert lo <= acc["tree"] - acc["base"] <= hi
    rel = arr["train_relation_tree_s0"]
    assert len(rel) == r["n_train_relation"] > 0
    assert r["train_relation"]["tree"] == pytest.approx(100 * np.mean(rel[:, 0] > rel[:, 1]))
    assert r["hard_negatives"]["batch_size"] == MINI.ft_batch_size
    two = arr["n_objects__relation_spatial"] == 2
    assert len(two) == r["n_items"]["relation_spatial"] and r["n_relation_two_objects"] == int(two.sum())
    if two.any():
        s = arr["scores_tree_s0__relation_spatial"][two]
        assert r["relation_two_objects"]["tree"] == pytest.approx(100 * np.mean(s[:, 0] > s[:, 1]))
    # the relation probe: every accuracy recomputed from its arrays, every model and the pixel control probed
    pa = np.load(out / "arrays" / "relation_probe.npz")
    pb = r["relation_probe"]
    assert {"pixels", "base_s0", "tree_s0", "base", "tree"} <= set(pb)
    for p in ("relation_x", "relation_y", "color_present", "color_left"):
        y = pa[f"y__{p}"]
        assert len(pa[f"pred_base_s0__{p}"]) == pb["n_test"][p] == int((y >= 0).sum())
        if pb["n_test"][p]:
            assert pb["tree_s0"][p] == pytest.approx(100 * np.mean(pa[f"pred_tree_s0__{p}"] == y[y >= 0]))
            assert pb["tree"][p] == pb["tree_s0"][p]
    assert "What the image embedding holds" in report.read_text()
    assert r["answer"]["cause"] in ("tree_wins", "premise_not_reached", "hard_negatives_in_batches",
                                    "relations_not_learnable", "loss_does_not_help")
    text = report.read_text()
    # the answer, then the premise's two checks, before any comparison
    assert text.index("**Answer:") < text.index("contrastive fine-tuning − base") < text.index("Checklist accuracy")
    # the fine-tuned models differ from their base (LoRA trained), and a rerun reuses every stage
    assert not np.array_equal(arr["scores_base_s0__object"], arr["scores_tree_s0__object"])
    run(tmp_path / "out", cfg=MINI)
    again = json.loads((out / "results.json").read_text())
    assert all(v["cached"] for v in again["timings"].values() if isinstance(v, dict))
    assert again["accuracy"] == r["accuracy"]


def test_base_key_names_the_pooling_only_when_it_is_not_the_class_token():
    """Base stages cached before `vision_pool` existed keep their key (config_fields leaves an
    `added` field out at its default); a patch-pooling base gets a key of its own."""
    import dataclasses

    from vlctl.recipes.threevl import lit as three_vl_lit

    cfg = dataclasses.replace(three_vl_lit.load_preset(True), vision_pool="cls")
    key = three_vl_lit.base_stage_key(cfg, 0)
    assert "vision_pool" not in key
    pooled = three_vl_lit.base_stage_key(dataclasses.replace(cfg, vision_pool="cls_mean"), 0)
    assert pooled == {**key, "vision_pool": "cls_mean"}


def _results(base=70.0, contrastive=70.5, tree=72.0, swap=50.0, relation=50.0, per_batch=0.05, train_rel=50.0,
             tree_rel=50.0, lo=0.5):
    cell = (lambda v: {"mean": v})
    acc = {m: {**{c: cell(80.0) for c in CHECKLIST_CATEGORIES}, "attribute_swap": cell(swap),
               "relation_spatial": cell(relation), "average": cell(v)}
           for m, v in (("base", base), ("contrastive", contrastive), ("negclip", contrastive), ("tree", tree))}
    acc["tree"]["relation_spatial"] = cell(tree_rel)

    def d(x, lo_=None):
        return {"mean": x, "per_seed": [x], "ci95": [x - 1 if lo_ is None else lo_, x + 1]}

    return {"accuracy": acc, "best_baseline": "contrastive", "train_relation": {"base": 50.0, "tree": train_rel},
            "paired": {"contrastive_minus_base": d(contrastive - base), "tree_minus_base": d(tree - base),
                       "tree_minus_best_baseline": d(tree - contrastive, lo)},
            "hard_negatives": {"one_word_per_batch": per_batch, "rebound_per_batch": 0.0, "batch_size": 32},
            "fits": {"tree_s0": {"steps": 1000}}}


def test_answer_names_the_first_measured_cause():
    from vlctl.recipes.threevl.lit_report import answer, premise

    cfg = MINI
    assert answer(cfg, _results(base=60, contrastive=61, tree=75, lo=13))[0] == "tree_wins"
    # contrastive gains 1 point or more: the base had not converged, whatever the tree does
    r = _results(base=70, contrastive=72, tree=74)
    assert premise(r)["contrastive_gains_under_1"] is False
    assert answer(cfg, r)[0] == "premise_not_reached"
    cause, text = answer(cfg, _results(swap=70, tree=71))  # the base binds already
    assert cause == "premise_not_reached"
    # what was measured is still said, after the premise
    assert text.endswith("does not test the paper's claim. Measured anyway: tree − contrastive +0.5 [+0.5, +1.5], "
                         "tree − base +1.0, tree relation 50.0.")
    assert answer(cfg, _results(per_batch=1.5))[0] == "hard_negatives_in_batches"
    cause, text = answer(cfg, _results())
    assert cause == "relations_not_learnable" and "1000 steps" in text and "loses" not in text
    r = _results()
    r["accuracy"]["tree"]["attribute_size"] = {"mean": 75.0}  # 5 points below the base: named
    assert answer(cfg, r)[1].endswith("Against the base the tree loss loses 5.0 points on attribute_size.")
    # the probe's sentence: the relation missing from the base's embedding but read from the pixels
    r = _results()
    cell = (lambda x, y: {"relation_x": x, "relation_y": y, "color_present": 100.0, "color_left": 60.0})
    r["relation_probe"] = {"base": cell(55.0, 52.0), "tree": cell(54.0, 53.0), "pixels": cell(72.0, 74.0),
                           "majority": cell(51.0, 57.0)}
    text = answer(cfg, r)[1]
    assert "base's image embedding at 55.0 / 52.0" in text and "8 x 8 pixels at 72.0 / 74.0" in text
    assert "missing from the image embedding" in text
    r["relation_probe"]["pixels"] = cell(60.0, 58.0)  # the pixels read it little better: not named missing
    assert "missing" not in answer(cfg, r)[1]
    assert answer(cfg, _results(train_rel=80.0))[0] == "loss_does_not_help"
    assert answer(cfg, _results(tree_rel=70.0))[0] == "loss_does_not_help"
    # binding: the tree's paired gain on attribute swap, and the headroom the base leaves on the average
    r = _results(base=88.0, swap=64.0)
    r["paired_swap"] = {"best_baseline": "negclip", "tree_minus_base": {"mean": 20.5},
                        "tree_minus_best_baseline": {"mean": 7.5, "ci95": [5.25, 9.75]}}
    text = answer(cfg, r)[1]
    assert ("On attribute swap (the same words bound differently, outside the five-category average), base 64.0, "
            "the tree loss gains +20.5 over the base and +7.5 [+5.2, +9.8] over negclip. The base leaves 12.0 points "
            "of headroom on the average, 10.0 of them on relation.") in text


def test_probe_labels_name_the_relation_by_identity():
    from vlctl.data.scenes import RELATION_MARGIN, probe_labels

    def obj(color, shape, cx, cy):
        return {"size": "small", "color": color, "texture": "plain", "shape": shape, "cx": cx, "cy": cy}

    far = 0.2 + RELATION_MARGIN
    labs = [{"objects": [obj("red", "circle", 0.2, 0.5), obj("blue", "square", 0.2 + far, 0.5)]},
            {"objects": [obj("blue", "square", 0.2, 0.2), obj("red", "circle", 0.2 + far, 0.2 + far)]},
            {"objects": [obj("blue", "square", 0.3, 0.3), obj("green", "circle", 0.35, 0.7)]},
            {"objects": [obj("red", "circle", 0.1, 0.1), obj("red", "star", 0.9, 0.9), obj("blue", "star", .5, .5)]}]
    y = probe_labels(labs)
    # the pair sorted by (size, color, texture, shape): the blue object comes first in every scene
    assert list(y["relation_x"]) == [0, 1, -1, -1]  # blue right of / left of red; third: within the margin
    assert list(y["relation_y"]) == [-1, 1, 1, -1]  # first: same height; then blue above red, blue above green
    assert list(y["color_present"]) == [1, 1, 0, -1] and list(y["color_left"]) == [1, 0, -1, -1]


def test_linear_probe_reads_a_linear_label_and_degenerate_training_sets():
    from vlctl.eval.probe import linear_probe

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6))
    y = (x[:, 2] - 0.5 * x[:, 4] > 0).astype(np.int64)
    assert np.mean(linear_probe(x[:200], y[:200], x[200:]) == y[200:]) >= 0.95
    assert np.mean(linear_probe(x[:200], rng.integers(0, 2, 200), x[200:]) == y[200:]) < 0.8  # labels unrelated
    assert list(linear_probe(x[:4], np.array([1, 1, 1, 1]), x[4:7])) == [1, 1, 1]  # one class: that class
    assert len(linear_probe(x[:6], np.array([0, 1, 0, 1, 1, 0]), x[:0])) == 0
    assert set(linear_probe(x[:5], np.array([0, 1, 1, 1, 1]), x[5:20])) <= {0, 1}  # one row of a class: C = 1

"""`vlctl serve --demo`: the stores and models `make demo` (`vlctl reproduce all --quick --out DIR`)
leaves in DIR, found by the recipes' own stage keys and read only (nothing is written there).

    shapes   the controlembed-shapes test set's store (DIR/stages/embed-*/cache/<key>), its TinyCLIP
             (train-*/model) and the ControlEmbed model ("ours", fit-*/ours): search, steer, cluster
    mad      the mad-clip test set's store with captions, its TinyCLIP and TEVI (tevi-learned): search
             and the TEVI rerank
    explain  the 3vl-scenes test images with their captions, the base TinyCLIP and the tree-tuned one
             (finetune_tree-*/model), and the scenes caption trees
    reports  DIR/<recipe>/report.html

A stage is the directory its recipe would use for the --quick preset: the data and training stages
by their key (`stage_keys`), the later stages by the key they record in done.json, which holds
the training stage's key. A recipe that has not finished leaves its part out, saying so.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.io import read_json
from vlctl.serve.state import Collection, ExplainSet, ServeState, find_reports, label_text


def _contains(small: dict, big: Any) -> bool:
    """Whether dict `small` is `big` or part of it (top level, or nested in one of its values)."""
    if not isinstance(big, dict):
        return False
    if all(k in big and big[k] == v for k, v in small.items()):
        return True
    return any(_contains(small, v) for v in big.values())


def find_stage(stages: Path, name: str, key: dict, exact: bool = False) -> Path:
    """The finished stage `name` whose key is `key` (exact) or holds it."""
    from vlctl.recipes.shipped import stage_dir_name

    if exact:
        d = stages / stage_dir_name(name, key)
        if (d / "done.json").is_file():
            return d
        raise VlctlError(f"{d}: stage {name!r} of the demo is not there (run `make demo` first)")
    found = [p for p in sorted(stages.glob(f"{name}-*")) if len(p.name) == len(name) + 13
             and (p / "done.json").is_file() and _contains(key, read_json(p / "done.json", "stage marker").get("key"))]
    if len(found) != 1:
        raise VlctlError(f"{stages}: expected one finished {name!r} stage of the demo's preset, found "
                         f"{[p.name for p in found]} (run `make demo` first)")
    return found[0]


def _store_of(embed_dir: Path, data_id: str):
    from vlctl.embeddings.store import open_store

    for entry in sorted((embed_dir / "cache").iterdir()):
        if (entry / "manifest.json").is_file():
            st = open_store(entry)
            if st.info.get("data_id") == data_id:
                return st
    raise VlctlError(f"{embed_dir / 'cache'}: no store of the data {data_id!r}")


def shapes_collection(stages: Path) -> Collection:
    from vlctl.data.mad import mad_dataset_id
    from vlctl.data.shapes import CATEGORIES, VALUES, load_shapes
    from vlctl.encoders.factory import load_encoder
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.recipes.controlembed import shapes as recipe

    keys = recipe.stage_keys(recipe.load_preset(True))
    data = find_stage(stages, "data", keys["data"], exact=True) / "test"
    train = find_stage(stages, "train", keys["train"], exact=True)
    store = _store_of(find_stage(stages, "embed", keys["train"]), mad_dataset_id(data))
    fit = find_stage(stages, "fit", keys["train"])
    test = load_shapes(data)
    labels = test["labels"]
    return Collection("shapes", store, load_encoder(train / "model"), lambda r: np.asarray(test["images"][r]),
                      lambda r: " \u00b7 ".join(str(labels[r][c]) for c in CATEGORIES),
                      ControlEmbed.load(fit / "ours", encoder_id=store.encoder_id), pixelated=True,
                      subclass_names={c: list(VALUES[c]) for c in CATEGORIES},
                      description=f"controlembed-shapes test set: {len(store)} images (color, texture, count, shape); "
                      "ControlEmbed \u201cours\u201d")


def mad_collection(stages: Path) -> Collection:
    from vlctl.data.mad import load_mad, mad_dataset_id
    from vlctl.encoders.factory import load_encoder
    from vlctl.methods.tevi.estimator import TEVI
    from vlctl.recipes.tevi import mad_clip

    cfg = mad_clip.load_preset(True)
    keys = mad_clip.stage_keys(cfg)
    # The test split is a stage of its own (`MadData`): the demo never renders the train split.
    data = find_stage(stages, "data-test", mad_clip.split_key(cfg, "test"), exact=True) / "test"
    train = find_stage(stages, "train", keys["train"], exact=True)
    store = _store_of(find_stage(stages, "embed", keys["train"]), mad_dataset_id(data))
    tevi = None
    for stage in ("tevi-learned-fused", "tevi-learned", "tevi-cg"):  # the fused one knows its held-out figures
        try:
            tevi = TEVI.load(find_stage(stages, stage, keys["train"]) / "tevi", encoder_id=store.encoder_id)
            break
        except VlctlError:
            continue
    test = load_mad(data)
    labels = test["labels"]
    return Collection("mad", store, load_encoder(train / "model"), lambda r: np.asarray(test["images"][r]),
                      lambda r: label_text(labels[r]), tevi=tevi, pixelated=True,
                      description=f"MAD test set: {len(store)} digits with captions" +
                      ("; TEVI rerank" if tevi is not None else " (TEVI not trained yet)"))


def _tree_tuned(stages: Path, recipe: Any, base_key: dict) -> Path:
    """The tree fine-tune of the base: the stage the current code would ship (its key holds the
    digest of the current trees stage); when the trees were regenerated since (another generator
    version), the newest finished tree fine-tune of this same base, said on stderr."""
    from vlctl.recipes.shipped import stage_dir_name

    try:
        key = recipe.shipped_stage_keys(recipe.load_preset(True), stages)["finetune_tree"]
        return find_stage(stages, "finetune_tree", key, exact=True)
    except VlctlError:
        pass
    found = [p for p in sorted(stages.glob("finetune_tree-*")) if len(p.name) == len("finetune_tree") + 13
             and (p / "done.json").is_file()
             and _contains(base_key, read_json(p / "done.json", "stage marker").get("key"))]
    if not found:
        raise VlctlError(f"{stages}: no finished 'finetune_tree' stage of the demo's base "
                         f"{stage_dir_name('base', base_key)} (run `make demo` first)")
    newest = max(found, key=lambda p: (p / "done.json").stat().st_mtime)
    if len(found) > 1:
        print(f"[vlctl] serve --demo: the trees changed since the tree fine-tunes ran; explaining with the newest "
              f"of {len(found)}, {newest.name}", file=sys.stderr)
    return newest


def scenes_explain(stages: Path) -> ExplainSet:
    from vlctl.captions.trees import TreeGenerator
    from vlctl.data.scenes import SCENE_OPPOSITES, load_scenes, vocabulary
    from vlctl.encoders import tiny_encoder
    from vlctl.recipes.threevl import scenes as recipe

    keys = recipe.stage_keys(recipe.load_preset(True))
    data = find_stage(stages, "data", keys["data"], exact=True) / "test"
    base = find_stage(stages, "base", keys["base"], exact=True)
    tree = _tree_tuned(stages, recipe, keys["base"])
    test = load_scenes(data)
    labels = test["labels"]
    models = {"base": tiny_encoder.load_tiny_encoder(base / "model"), "tree-tuned": tiny_encoder.load_tiny_encoder(tree / "model")}
    gen = TreeGenerator(seed=0, opposites=SCENE_OPPOSITES, vocabulary=set(vocabulary()))
    return ExplainSet("scenes", len(labels), lambda r: np.asarray(test["images"][r]), models,
                      lambda r: labels[r]["caption"], gen, pixelated=True)


def demo_state(demo_dir: str | Path) -> ServeState:
    """Everything of the demo that is there; VlctlError when none of it is."""
    root = Path(demo_dir)
    stages = root / "stages"
    if not stages.is_dir():
        raise VlctlError(f"{root}: no demo here (no stages/ directory); run `make demo` first, or give --demo-dir")
    collections, explain, missing = {}, None, []
    for name, make in (("shapes", shapes_collection), ("mad", mad_collection)):
        try:
            collections[name] = make(stages)
        except VlctlError as e:
            missing.append(f"{name}: {e}")
    try:
        explain = scenes_explain(stages)
    except VlctlError as e:
        missing.append(f"explain: {e}")
    for m in missing:
        print(f"[vlctl] serve --demo: left out {m}", file=sys.stderr)
    if not collections and explain is None:
        raise VlctlError(f"{root}: none of the demo's stores and models are there; run `make demo` first")
    return ServeState(collections, explain, find_reports(root), title="vlctl demo")

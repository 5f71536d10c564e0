"""Recipe `3vl-lit`: 3VL (docs/methods.md §3) where the paper's premise holds, on the scenes set.

The base is LiT-style: TinyCLIP with the frozen all-MiniLM-L6-v2 text tower plus a trainable
projection, and a ViT trained from scratch, pre-trained on alt-text-like captions of the train
scenes (`vlctl.data.scenes.alt_text_captions`: random subsets of objects and attributes, mostly
unbound). MiniLM barely tells "a red cube and a blue sphere" from its swap, so the base is
bag-of-words by construction; the fine-tuning on the full captions of the finetune split then
adds LoRA to MiniLM's attention (peft; the last `minilm_layers` layers) and the ViT, with the
contrastive, NegCLIP and tree losses under the same data, steps and ranks (alpha = 0.5).

Negatives are checked against the scene at every level: each tree level's positive and
negatives are parsed back into noun phrases and a relation (`phrase_structure`) and kept only if
the positive holds and the negative does not hold under any matching of its noun phrases to the
scene's objects (`vlctl.data.scenes.caption_holds`), so a one-word change that is true of another
object is never used; NegCLIP's negative is drawn from the same checked whole-caption negatives.
The tree generator tags the scene vocabulary by the grammar (`SCENE_POS`: "striped" / "dotted"
are ADJ, shapes NOUN, relation words ADP).

Evaluation on the test split: the five VL-CheckList-style categories of 3vl-scenes, plus
`attribute_swap` (the values of one attribute exchanged between two named objects: the same bag
of words) and `single_object` (one object's noun phrase against one whose changed attribute no
object has: attribute perception without binding). Every model is trained for each of `seeds`;
accuracies are mean +- std over seeds with a bootstrap 95% interval over test items. Anchor token
removal (3VL) at `removal_fraction` on the tree models reuses 3vl-scenes' relevancy machinery.
Stages: data -> trees -> base_s<seed> -> finetune_<mode>_s<seed> -> evaluate_s<seed> ->
relation_probe_s<seed> (lit_probe: what each model's image embedding holds of the relation) -> report.
Test items and scores: vlctl.recipes.threevl.lit_eval; statistics, targets, figure, arrays/README.md and
report.md: vlctl.recipes.threevl.lit_report.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from vlctl.config import config_fields, config_from_dict, config_to_dict, opt, validate_config
from vlctl.data.scenes import (
    OPPOSITE_RELATION,
    RELATIONS,
    SCENE_OPPOSITES,
    SHAPES,
    VALUES,
    ScenesConfig,
    alt_text_captions,
    caption_holds,
    checklist_items,
    generate_scenes,
    load_scenes,
    place_captions,
    vocabulary,
)
from vlctl.eval.metrics import in_batch_hard_negatives
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, merged_npz, read_json
from vlctl.recipes.runner import Runner
from vlctl.recipes.threevl import lit_eval, lit_probe
from vlctl.recipes.threevl.lit_eval import (
    _SHARED_SENTENCE_CACHE,
    TRAIN_RELATION_ITEMS,
    load_tuned,
    test_items,
)
from vlctl.recipes.threevl.lit_report import (
    ARRAYS_README,
    _figure,
    _report,
    _targets,
    answer,
    results_from_arrays,
)
from vlctl.recipes.threevl.scenes_report import PAPER

FT_MODES = ("contrastive", "negclip", "tree")
# The grammar's part of speech of every scene word (spaCy tags "striped"/"dotted" as VERB, "plain" as ADV).
SCENE_POS: dict[str, tuple[str, str]] = {
    **{w: ("ADJ", "JJ") for a in ("size", "color", "texture") for w in VALUES[a]},
    **{w: ("NOUN", "NN") for w in SHAPES},
    **{w: ("ADP", "IN") for w in ("left", "right", "above", "below", "of")},
}
_WORD_ATTR = {v: a for a, vals in VALUES.items() for v in vals}


@dataclasses.dataclass(frozen=True)
class ThreeVLLitRecipe:
    n_train: int = opt(3000, "train-split scenes (base pre-training on their alt-texts)", ge=1, le=10**7)
    alt_per_scene: int = opt(2, "alt-text captions per train scene (base_captions 'alt')", ge=1, le=100)
    base_captions: str = opt("alt", "what the base is pre-trained on: the train scenes' 'full' captions (the "
                             "fine-tuning split's caption distribution: the paper's premise, a base already "
                             "converged on it), 'alt' texts (random unbound subsets of objects and attributes) or "
                             "'full+place': the full captions and one object per scene named with its absolute "
                             "place ('a red circle on the left', so the image embedding keeps where things are)",
                             choices=("full", "alt", "full+place"), added=True)
    n_finetune: int = opt(1500, "finetune-split scenes (LoRA fine-tuning on their full captions)", ge=1, le=10**7)
    ft_p_three: float = opt(0.4, "probability that a finetune-split scene has 3 objects (0: two-object scenes only, "
                            "where a relation names the only two objects; docs/findings.md)", ge=0, le=1)
    n_test: int = opt(600, "test-split scenes (one checklist item per scene and category at most)", ge=1, le=10**7)
    image_size: int = opt(32, "image side", ge=24, le=1024)
    vision_model: str = opt("scenes-quick", "TinyCLIP config whose image tower (and embed_dim) the base uses; its "
                            "text tower is replaced by the frozen MiniLM")
    # The choices are TinyCLIPConfig's VISION_POOLS, written out: importing vlctl.encoders would
    # import torch with the recipe.
    vision_pool: str = opt("cls", "what the base's ViT embedding reads: the class token ('cls') or also the mean "
                           "of its patch tokens ('cls_mean'; TinyCLIPConfig.vision_pool)", choices=("cls", "cls_mean"),
                           added=True)
    context_length: int = opt(48, "MiniLM WordPiece context", ge=8, le=512)
    base_epochs: int = opt(8, "base pre-training epochs", ge=1, le=100_000)
    base_batch_size: int = opt(128, "base pre-training batch size", ge=1, le=65536)
    base_lr: float = opt(1e-3, "base pre-training peak lr", gt=0, le=10)
    temperature_lr: float = opt(1e-2, "base pre-training temperature lr", ge=0, le=10)
    base_warmup_steps: int = opt(50, "base pre-training warmup steps", ge=0, le=10**9)
    ft_epochs: int = opt(1, "fine-tuning epochs (same for every loss)", ge=1, le=100_000)
    ft_batch_size: int = opt(32, "fine-tuning batch size", ge=1, le=4096)
    ft_lr: float = opt(2e-3, "LoRA learning rate (same for every loss)", gt=0, le=10)
    ft_warmup_steps: int = opt(5, "fine-tuning warmup steps", ge=0, le=10**9)
    ft_patch_dropout: float = opt(0.0, "probability that a fine-tuning batch sees a random subset of its patches "
                                  "(the same for every loss; what token removal then asks of the model)", ge=0, le=1)
    rank: int = opt(4, "LoRA rank (MiniLM attention and ViT)", ge=1, le=1024)
    lora_alpha: float = opt(8.0, "LoRA alpha", gt=0, le=10_000)
    minilm_layers: int = opt(2, "MiniLM layers (the last ones) whose attention gets LoRA", ge=1, le=6)
    towers: str = opt("both", "adapters on 'both' towers, the 'text' (MiniLM) or the 'visual' one",
                      choices=("both", "visual", "text"))
    alpha: float = opt(0.5, "3VL weight of L_tree", ge=0, le=1)
    level_reduction: str = opt("sum", "tree levels: 'sum' (paper) or 'mean' (authors' code)", choices=("sum", "mean"))
    max_levels: int = opt(3, "tree levels kept per caption (the finest; 0: all, as the paper)", ge=0, le=1000)
    max_negatives: int = opt(3, "negatives kept per tree level (0: all, as the paper)", ge=0, le=1000)
    n_relevancy: int = opt(100, "items per category for Anchor token removal", ge=1, le=10**6)
    removal_fraction: float = opt(0.65, "Anchor token removal fraction", ge=0, le=1)
    n_bootstrap: int = opt(1000, "bootstrap resamples of the test items", ge=10, le=10**6)
    seeds: tuple[int, ...] = opt((0, 1, 2), "training seeds (every model is trained once per seed)", ge=0,
                                   le=2**32 - 1, min_len=1)
    data_seed: int = opt(0, "seed of the scenes, alt-texts, trees and checklist (fixed across training seeds)",
                         ge=0, le=2**32 - 1)
    threads: int = opt(2, "torch threads (0 = leave as is)", ge=0, le=1024)
    workers: int = opt(2, "data generation processes", ge=1, le=256)

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or any(s < 0 for s in self.seeds):
            raise VlctlError(f"ThreeVLLitRecipe.seeds: distinct non-negative integers, got {list(self.seeds)}")
        validate_config(self)  # every field in its declared range (the opt() above), from Python as from JSON


def load_preset(quick: bool) -> ThreeVLLitRecipe:
    path = Path(__file__).with_name("3vl-lit.json")
    doc = dict(read_json(path)["quick" if quick else "full"])
    if "seeds" in doc:
        doc["seeds"] = tuple(doc["seeds"])
    return config_from_dict(ThreeVLLitRecipe, doc, source=str(path))


def lit_config(cfg: ThreeVLLitRecipe):
    """The base's TinyCLIP config: `vision_model`'s image tower, the MiniLM text tower."""
    from vlctl.encoders.tiny_config import get_config

    return dataclasses.replace(get_config(cfg.vision_model), name=f"{cfg.vision_model}-lit", text_tower="minilm",
                               vocab=(), context_length=cfg.context_length, image_size=cfg.image_size,
                               vision_pool=cfg.vision_pool)


# --- negatives checked against the scene ---------------------------------------------------------


def phrase_structure(text: str) -> dict | None:
    """A tree level's text in the scenes grammar -> {"nps": [partial attribute dicts], "rel":
    REL or None} (REL between the first two noun phrases), or None when it is not one (then it
    cannot be checked and is not used). Noun phrases may be partial ("a small purple")."""
    words = text.split()
    nps: list[dict] = []
    rel = None
    i = 0
    while i < len(words):
        w = words[i]
        if w == "a":
            nps.append({})
            i += 1
        elif w in _WORD_ATTR:
            if not nps or _WORD_ATTR[w] in nps[-1]:
                return None
            nps[-1][_WORD_ATTR[w]] = w
            i += 1
        elif w == "and":
            i += 1
        else:
            two = " ".join(words[i:i + 2])
            r = two if two in RELATIONS else (w if w in RELATIONS else None)
            if r is None or rel is not None or len(nps) != 1:
                return None
            rel = r
            i += len(r.split())
    if not nps or any(not p for p in nps) or (rel is not None and len(nps) < 2):
        return None
    return {"nps": nps, "rel": rel}


_RELATION_WORDS = frozenset(r.split()[0] for r in RELATIONS)  # left, right, above, below


def with_relation_negatives(tree: list[dict]) -> list[dict]:
    """The tree with the one-word relation negative ("left" <-> "right", "above" <-> "below") on
    every level that names a relation and lacks it, and every relation-word negative tagged ADP.
    spaCy parses "left of" / "right of" as a verb, noun or adverb with "of" under it, never as
    one preposition, and the generator then leaves the level without its relation negative: only
    above/below got one, so no loss ever saw a left/right contrast."""
    out = []
    for lv in tree:
        words = lv["positive"].split()
        negs = list(lv["negatives"])
        tags = list(lv.get("negative_pos", [None] * len(negs)))
        for j, neg in enumerate(negs):
            changed = [a for a, b in zip(words, neg.split()) if a != b]
            if len(neg.split()) == len(words) and len(changed) == 1 and changed[0] in _RELATION_WORDS:
                tags[j] = "ADP"
        st = phrase_structure(lv["positive"])
        if st is not None and st["rel"] is not None:
            word, opposite = st["rel"].split()[0], OPPOSITE_RELATION[st["rel"]].split()[0]
            neg = " ".join(opposite if w == word else w for w in words)
            if words.count(word) == 1 and neg not in negs:
                negs.append(neg)
                tags.append("ADP")
        out.append({**lv, "negatives": negs, "negative_pos": tags})
    return out


def checked_tree(tree: list[dict], objects: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The tree with every level whose positive is true of the scene, each keeping only the
    negatives false for the scene under every matching (counts of what was dropped and why)."""
    out, stats = [], {"kept": 0, "true_of_scene": 0, "unparsed": 0, "levels_dropped": 0}
    for lv in tree:
        st = phrase_structure(lv["positive"])
        if st is None or not caption_holds(st, objects):
            stats["levels_dropped"] += 1
            continue
        negs, pos_tags = [], []
        for neg, tag in zip(lv["negatives"], lv.get("negative_pos", [None] * len(lv["negatives"]))):
            ns = phrase_structure(neg)
            if ns is None:
                stats["unparsed"] += 1
            elif caption_holds(ns, objects):
                stats["true_of_scene"] += 1
            else:
                negs.append(neg)
                pos_tags.append(tag)
                stats["kept"] += 1
        out.append({"positive": lv["positive"], "negatives": negs, "negative_pos": pos_tags})
    return out, stats


def scene_tree_generator(seed: int):
    """TreeGenerator with the scenes' opposites, vocabulary and the grammar's POS tags, without WordNet."""
    from vlctl.captions.trees import TreeGenerator

    # The opposites table covers every scene word, so WordNet (slow to load) adds nothing in vocabulary.
    return TreeGenerator(seed=seed, opposites=SCENE_OPPOSITES, vocabulary=set(vocabulary()), use_wordnet=False,
                         pos_overrides={w: p for w, (p, _) in SCENE_POS.items()})


# --- stages --------------------------------------------------------------------------------------


def _data(cfg: ThreeVLLitRecipe, work: Path) -> None:
    for split, n in (("train", cfg.n_train), ("test", cfg.n_test)):
        generate_scenes(ScenesConfig(n=n, seed=cfg.data_seed, split=split, image_size=cfg.image_size,
                                     workers=cfg.workers), work / split)
    labels = load_scenes(work / "train")["labels"]
    atomic_write_json(work / "alt_text.json", alt_text_captions(labels, cfg.data_seed, cfg.alt_per_scene))


def _data_finetune(cfg: ThreeVLLitRecipe, work: Path) -> None:
    # A stage of its own: the fine-tuning scenes can change (ft_p_three) without retraining the bases.
    generate_scenes(ScenesConfig(n=cfg.n_finetune, seed=cfg.data_seed, split="finetune", image_size=cfg.image_size,
                                 p_three=cfg.ft_p_three, workers=cfg.workers), work / "finetune")


def _trees(cfg: ThreeVLLitRecipe, data_dir: Path, work: Path) -> None:
    labels = load_scenes(data_dir / "finetune")["labels"]
    caps = [lab["caption"] for lab in labels]
    gen = scene_tree_generator(cfg.data_seed)
    t0 = time.perf_counter()
    uniq = sorted(set(caps))
    raw = dict(zip(uniq, gen.trees(uniq)))
    trees, negatives = [], []
    totals = {"kept": 0, "true_of_scene": 0, "unparsed": 0, "levels_dropped": 0}
    for i, (cap, lab) in enumerate(zip(caps, labels)):
        tree, stats = checked_tree(with_relation_negatives(raw[cap]), lab["objects"])
        for k, v in stats.items():
            totals[k] += v
        trees.append(tree)
        last = tree[-1]["negatives"] if tree and tree[-1]["positive"] == cap else []
        negatives.append(last[int(np.random.default_rng([cfg.data_seed, 0xC1, i]).integers(len(last)))]
                         if last else None)
    atomic_write_json(work / "trees.json", {"trees": trees, "negatives": negatives, "checks": totals,
                                            "seconds": time.perf_counter() - t0, "n_unique": len(uniq)})


def base_pairs(cfg: ThreeVLLitRecipe, labels: list[dict], images: np.ndarray,
               alt: list[list[str]] | None = None) -> tuple[list[str], np.ndarray]:
    """The base's pre-training pairs from the train scenes, as `cfg.base_captions` says (`alt`: the
    data stage's alt_text.json, for 'alt'): captions (n_pairs,) and images (n_pairs, H, W, 3)."""
    if cfg.base_captions == "alt":
        return [c for per in alt for c in per], np.repeat(images, cfg.alt_per_scene, axis=0)
    captions = [lab["caption"] for lab in labels]  # the fine-tuning split's caption distribution
    if cfg.base_captions == "full+place":
        place = place_captions(labels, cfg.data_seed)
        keep = [i for i, c in enumerate(place) if c is not None]
        return captions + [place[i] for i in keep], np.concatenate([images, images[keep]])
    return captions, images


def _base(cfg: ThreeVLLitRecipe, seed: int, data_dir: Path, work: Path, resume: bool) -> None:
    import torch

    from vlctl.encoders import tiny_model, tiny_pretrained
    from vlctl.methods.threevl.tree_tune import trim_padding
    from vlctl.train.clip import train_clip_arrays
    from vlctl.train.config import LoopConfig

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    d = load_scenes(data_dir / "train")
    alt = read_json(data_dir / "alt_text.json", "alt_text.json") if cfg.base_captions == "alt" else None
    captions, images = base_pairs(cfg, d["labels"], np.asarray(d["images"]), alt)
    model = tiny_model.create_model(lit_config(cfg), seed=seed)
    model.text.share_cache(_SHARED_SENTENCE_CACHE)
    loop = LoopConfig(epochs=cfg.base_epochs, batch_size=cfg.base_batch_size, lr=cfg.base_lr, weight_decay=0.1,
                      warmup_steps=cfg.base_warmup_steps, seed=seed, threads=cfg.threads, progress=False,
                      log_every=20, checkpoint_every=200)
    t0 = time.perf_counter()
    train_clip_arrays(model, images, model.tokenize(captions), work, loop, temperature_lr=cfg.temperature_lr,
                      text_batch=trim_padding, resume=resume, device="cpu",
                      run_config={"model": config_to_dict(model.config), "n": len(captions), "seed": seed})
    model.eval()
    tiny_pretrained.save_pretrained(model, work / "model")
    atomic_write_json(work / "fit.json", {"seconds": time.perf_counter() - t0, "n_pairs": len(captions)})


def _finetune(cfg: ThreeVLLitRecipe, mode: str, seed: int, base_dir: Path, data_dir: Path, trees_dir: Path,
              work: Path, resume: bool = False) -> None:
    import torch

    from vlctl.encoders import tiny_pretrained
    from vlctl.methods.threevl.tree_tune import TreeTuner

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    d = load_scenes(data_dir / "finetune")
    t = read_json(trees_dir / "trees.json", "trees")
    model = tiny_pretrained.load_pretrained(base_dir / "model")
    t0 = time.perf_counter()
    tuner = TreeTuner(mode=mode, alpha=cfg.alpha, level_reduction=cfg.level_reduction, rank=cfg.rank,
                      lora_alpha=cfg.lora_alpha, lr=cfg.ft_lr, epochs=cfg.ft_epochs, batch_size=cfg.ft_batch_size,
                      warmup_steps=cfg.ft_warmup_steps, max_levels=cfg.max_levels, max_negatives=cfg.max_negatives,
                      seed=seed, threads=cfg.threads, towers=cfg.towers, minilm_layers=cfg.minilm_layers,
                      patch_dropout=cfg.ft_patch_dropout)
    # checkpoints: a killed fine-tune (the full preset's tree loss takes about an hour) continues
    tuner.fit(d["images"], [lab["caption"] for lab in d["labels"]], model=model, out_dir=work / "run",
              trees=t["trees"], negatives=t["negatives"], checkpoint_every=100, resume=resume)
    tuner.save(work)
    atomic_write_json(work / "fit.json", {"seconds": time.perf_counter() - t0, "steps": tuner.result_.steps,
                                          "final_loss": tuner.result_.final_loss})


def stage_keys(cfg: ThreeVLLitRecipe) -> dict:
    data_key = {"recipe": "3vl-lit", **{f: getattr(cfg, f) for f in ("n_train", "alt_per_scene", "n_test",
                                                                       "image_size", "data_seed")},
                "scenes": config_to_dict(ScenesConfig())}
    ft_data_key = {"recipe": "3vl-lit", **{f: getattr(cfg, f) for f in ("n_finetune", "ft_p_three", "image_size",
                                                                          "data_seed")},
                   "scenes": config_to_dict(ScenesConfig())}
    from vlctl.captions import trees

    # "pos_via": how the POS overrides reach the generator (a cache-key literal: its keyword, since it has one)
    via = "pos_overrides"
    # "generator": a cache-key literal (the module's name when the key was made), kept so cached trees stay found
    trees_key = {"data": ft_data_key, "vocabulary": list(vocabulary()), "pos": sorted(SCENE_POS.items()),
                 "generator": "vlctl.methods.trees+checked", "generator_version": trees.GENERATOR_VERSION,
                 "pos_via": via, "use_wordnet": False,
                 "relation_negatives": "with_relation_negatives"}
    return {"data": data_key, "data_finetune": ft_data_key, "trees": trees_key}


def base_stage_key(cfg: ThreeVLLitRecipe, seed: int, keys: dict | None = None) -> dict:
    """The key of stage base_s<seed> (`keys`: `stage_keys(cfg)`, when already computed)."""
    fields = ("vision_model", "context_length", "base_epochs", "base_batch_size", "base_lr", "temperature_lr",
              "base_warmup_steps", "vision_pool", "base_captions")
    return {"data": (keys or stage_keys(cfg))["data"], "seed": seed, **config_fields(cfg, fields)}


def finetune_stage_key(cfg: ThreeVLLitRecipe, mode: str, base_key: dict, keys: dict) -> dict:
    """The key of stage finetune_<mode>_s<seed> on the base of key `base_key` (`keys`: `stage_keys(cfg)`)."""
    # the contrastive loss reads no trees: a new generator retrains only NegCLIP and the tree loss
    data = {"data_finetune": keys["data_finetune"]} if mode == "contrastive" else {"trees": keys["trees"]}
    fields = ("ft_epochs", "ft_batch_size", "ft_lr", "ft_warmup_steps", "ft_patch_dropout", "rank", "lora_alpha",
              "minilm_layers", "towers", *(("alpha", "level_reduction", "max_levels", "max_negatives")
                                           if mode == "tree" else ()))
    return {"base": base_key, **data, "mode": mode, **{f: getattr(cfg, f) for f in fields}}


def shipped_stage_keys(cfg: ThreeVLLitRecipe, stages: Path | None = None, **_: object) -> dict[str, dict]:
    """The stages shipped (vlctl.recipes.shipped): each seed's base and three fine-tunes, about 34 min of
    training for the quick preset; the keys need no stage output (`stages` is unused)."""
    keys, out = stage_keys(cfg), {}
    for seed in cfg.seeds:
        out[f"base_s{seed}"] = base_key = base_stage_key(cfg, seed, keys)
        out.update({f"finetune_{m}_s{seed}": finetune_stage_key(cfg, m, base_key, keys) for m in FT_MODES})
    return out


def run(out: Path, quick: bool = False, force: bool = False, cfg: ThreeVLLitRecipe | None = None,
        stages: str | Path | None = None, from_scratch: bool = False) -> Path:
    cfg = cfg or load_preset(quick)
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch)
    t_start = time.perf_counter()
    keys = stage_keys(cfg)
    data_dir = runner.stage("data", keys["data"], lambda w: _data(cfg, w))
    ft_data_dir = runner.stage("data-finetune", keys["data_finetune"], lambda w: _data_finetune(cfg, w))
    trees_dir = runner.stage("trees", keys["trees"], lambda w: _trees(cfg, ft_data_dir, w))
    base_dirs, ft_dirs = {}, {}
    for seed in cfg.seeds:
        base_key = base_stage_key(cfg, seed, keys)
        base_dirs[seed] = runner.stage(f"base_s{seed}", base_key,
                                       lambda w, r, seed=seed: _base(cfg, seed, data_dir, w, r), resumable=True)
        for mode in FT_MODES:
            ft_dirs[(mode, seed)] = runner.stage(
                f"finetune_{mode}_s{seed}", finetune_stage_key(cfg, mode, base_key, keys),
                lambda w, r, mode=mode, seed=seed: _finetune(cfg, mode, seed, base_dirs[seed], ft_data_dir, trees_dir,
                                                             w, r), resumable=True)
    # One evaluation and one probe stage per seed, so a seed added later leaves the others' cached.
    probe_dirs, eval_dirs = [], []
    for s in cfg.seeds:
        mine = {m: d for (m, seed), d in ft_dirs.items() if seed == s}
        eval_key = {"models": {f"{m}_s{s}": d.name for m, d in mine.items()}, "bases": {s: base_dirs[s].name},
                    "train_relation_items": TRAIN_RELATION_ITEMS,
                    **{f: getattr(cfg, f) for f in ("n_relevancy", "removal_fraction")}}
        eval_dirs.append(runner.stage(f"evaluate_s{s}", eval_key, lambda w, s=s: lit_eval.evaluate(
            cfg, s, data_dir, ft_data_dir, base_dirs, ft_dirs, w)))
        # What each model's image embedding holds of the relation (lit_probe): why relations do or do not move.
        probe_models = {f"base_s{s}": base_dirs[s], **{f"{m}_s{s}": d for m, d in mine.items()}}
        probe_key = {"data": data_dir.name, "models": {k: d.name for k, d in probe_models.items()},
                     "probes": list(lit_probe.PROBES), "pixel_grid": lit_probe.PIXEL_GRID,
                     "probe": "logistic, C by 5-fold CV"}
        probe_dirs.append(runner.stage(f"relation_probe_s{s}", probe_key, lambda w, pm=probe_models: (
            lit_probe.relation_probe(data_dir, pm, load_tuned, w))))

    arr = merged_npz([d / "eval.npz" for d in eval_dirs])  # the seeds' shared arrays (MiniLM's) from the first
    arrays = out / "arrays"
    atomic_save_npz(arrays / "relation_probe.npz", **merged_npz([d / "relation_probe.npz" for d in probe_dirs]))
    # objects in each item's scene: relations are learnable where their two objects are the only ones
    test_labels = load_scenes(data_dir / "test")["labels"]
    n_objects = {f"n_objects__{c}": np.array([len(test_labels[it["index"]]["objects"]) for it in its], dtype=np.int64)
                 for c, its in test_items(data_dir, cfg.data_seed).items()}
    atomic_save_npz(arrays / "checklist.npz", **arr, **n_objects)
    atomic_write_text(arrays / "README.md", ARRAYS_README + "\n" + lit_probe.ARRAYS_README)
    # The report's numbers come from the saved arrays, not from the stage's memory.
    ev = read_json(eval_dirs[0] / "eval.json", "eval.json")
    r = results_from_arrays(np.load(arrays / "checklist.npz"), cfg, ev["pos_tags"])
    tinfo = read_json(trees_dir / "trees.json", "trees")
    fits = {f"{m}_s{s}": read_json(d / "fit.json", "fit.json") for (m, s), d in ft_dirs.items()}
    fits.update({f"base_s{s}": read_json(d / "fit.json", "fit.json") for s, d in base_dirs.items()})
    results = {"recipe": "3vl-lit", "quick": quick, "config": config_to_dict(cfg), "paper": PAPER, **r,
               "fits": fits, "negative_checks": tinfo["checks"],
               "trees": {"seconds": tinfo["seconds"], "mean_levels": float(np.mean([len(t) for t in tinfo["trees"]])),
                         "mean_negatives": float(np.mean([sum(len(lv["negatives"]) for lv in t)
                                                          for t in tinfo["trees"]])),
                         "negclip_coverage": float(np.mean([n is not None for n in tinfo["negatives"]]))}}
    ft_labels = load_scenes(ft_data_dir / "finetune")["labels"]
    results["hard_negatives"] = in_batch_hard_negatives([lab["caption"] for lab in ft_labels], cfg.ft_batch_size)
    results["n_train_relation"] = len(checklist_items(ft_labels[:TRAIN_RELATION_ITEMS], "relation_spatial"))
    results["relation_probe"] = lit_probe.probe_results(np.load(arrays / "relation_probe.npz"))
    results["targets"] = _targets(results)
    cause, text = answer(cfg, results)
    results["answer"] = {"cause": cause, "text": text}
    _figure(out, results)
    results["timings"] = {**runner.timings, "total_seconds": time.perf_counter() - t_start}
    atomic_write_json(out / "results.json", results)
    _report(cfg, results, quick).write(out)
    return out / "report.md"

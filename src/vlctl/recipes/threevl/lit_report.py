"""Report of recipe `3vl-lit` (vlctl.recipes.threevl.lit): its numbers recomputed from the
checklist arrays the recipe saved (accuracies, bootstrap intervals, failures per POS tag,
targets), figures/, arrays/README.md and report.md.

The constants the report shares with the recipe (models, categories, POS tags) are defined here
and imported by it: this module cannot import the recipe (tests/test_layout.py forbids import
cycles).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlctl.data.scenes import CHECKLIST_CATEGORIES
from vlctl.eval.metrics import checklist_accuracy
from vlctl.recipes.threevl.scenes_report import PAPER, checklist_bars
from vlctl.report.writer import Report

BASE_MODELS = ("base", "contrastive", "negclip", "tree")
EXTRA_CATEGORIES = ("attribute_swap", "single_object")
CATEGORIES = (*CHECKLIST_CATEGORIES, *EXTRA_CATEGORIES)
POS_TAGS = ("NOUN", "ADJ", "ADP")


# --- statistics ----------------------------------------------------------------------------------


def bootstrap_interval(correct: np.ndarray, n_boot: int, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of 100 * mean(correct) over items resampled with replacement.

    correct (n_seeds, n) bool: the same item resample is used for every seed, and the statistic
    is the mean over seeds and items (the seed-averaged accuracy)."""
    n = correct.shape[1]
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng([seed, n])
    idx = rng.integers(0, n, size=(n_boot, n))
    stats = 100.0 * correct[:, idx].mean(axis=(0, 2))
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def average_interval(corrects: dict[str, np.ndarray], n_boot: int, seed: int = 0) -> tuple[float, float]:
    """95% interval of the category-averaged, seed-averaged accuracy (items resampled per category)."""
    stats = np.zeros(n_boot)
    for k, c in enumerate(sorted(corrects)):
        x = corrects[c]
        idx = np.random.default_rng([seed, k, x.shape[1]]).integers(0, x.shape[1], size=(n_boot, x.shape[1]))
        stats += 100.0 * x[:, idx].mean(axis=(0, 2))
    stats /= len(corrects)
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def items_for_difference(diffs: dict[str, np.ndarray], delta: float = 2.0) -> int:
    """Items per category at which the 95% interval of a paired difference of category-averaged
    accuracies has half-width `delta` points: diffs[c] (n,) the per-item difference of two models
    (seed-averaged correct, in points); half-width 1.96 * sqrt(sum_c var_c / n) / n_categories."""
    var = sum(float(np.var(d, ddof=1)) for d in diffs.values() if len(d) > 1)
    return int(np.ceil(var * (1.96 / (delta * len(diffs))) ** 2))


def results_from_arrays(arr, cfg, pos_tags: dict[str, list[str]]) -> dict:
    """Every figure of the report, recomputed from the checklist arrays (`cfg`: the run's
    ThreeVLLitRecipe; its seeds and n_bootstrap)."""
    seeds = list(cfg.seeds)
    acc = {m: {c: [checklist_accuracy(arr[f"scores_{m}_s{s}__{c}"]) for s in seeds] for c in CATEGORIES}
           for m in BASE_MODELS}
    correct = {m: {c: np.stack([arr[f"scores_{m}_s{s}__{c}"][:, 0] > arr[f"scores_{m}_s{s}__{c}"][:, 1]
                                for s in seeds]) for c in CATEGORIES} for m in BASE_MODELS}
    table: dict = {}
    for m in BASE_MODELS:
        table[m] = {}
        for c in CATEGORIES:
            lo, hi = bootstrap_interval(correct[m][c], cfg.n_bootstrap)
            table[m][c] = {"mean": float(np.mean(acc[m][c])), "std": float(np.std(acc[m][c])), "per_seed": acc[m][c],
                           "ci95": [lo, hi]}
        per_seed_avg = [float(np.mean([acc[m][c][k] for c in CHECKLIST_CATEGORIES])) for k in range(len(seeds))]
        lo, hi = average_interval({c: correct[m][c] for c in CHECKLIST_CATEGORIES}, cfg.n_bootstrap)
        table[m]["average"] = {"mean": float(np.mean(per_seed_avg)), "std": float(np.std(per_seed_avg)),
                               "per_seed": per_seed_avg, "ci95": [lo, hi]}
    anchor = {}
    for c in CHECKLIST_CATEGORIES:
        tr = [checklist_accuracy(arr[f"anchor_tr_s{s}__{c}"]) for s in seeds]
        n = len(arr[f"anchor_tr_s{seeds[0]}__{c}"])
        full = [checklist_accuracy(arr[f"scores_tree_s{s}__{c}"][:n]) for s in seeds]
        anchor[c] = {"anchor_tr": float(np.mean(tr)), "no_removal": float(np.mean(full)), "n": n}
    anchor["average"] = {k: float(np.mean([anchor[c][k] for c in CHECKLIST_CATEGORIES])) for k in
                         ("anchor_tr", "no_removal")}
    failures = {}
    for m in BASE_MODELS:
        counts = {t: 0.0 for t in POS_TAGS}
        for c in CHECKLIST_CATEGORIES:
            tags = pos_tags[c]
            for s in seeds:
                wrong = ~(arr[f"scores_{m}_s{s}__{c}"][:, 0] > arr[f"scores_{m}_s{s}__{c}"][:, 1])
                for t, w in zip(tags, wrong):
                    if w and t in counts:
                        counts[t] += 1.0 / len(seeds)
        failures[m] = counts
    n_by_pos = {t: sum(tags.count(t) for c, tags in pos_tags.items() if c in CHECKLIST_CATEGORIES) for t in POS_TAGS}
    best = max(("contrastive", "negclip"), key=lambda m: table[m]["average"]["mean"])
    diffs = {c: 100.0 * (correct["tree"][c].mean(0) - correct[best][c].mean(0)) for c in CHECKLIST_CATEGORIES}
    text_cos = {c: float(np.mean(arr[f"minilm_cosine__{c}"])) for c in CATEGORIES}

    def paired(a: str, b: str, cat: str = "average") -> dict:
        """a − b on the checklist average (or one category `cat`): per seed, and a bootstrap interval of
        the paired per-item differences."""
        d = {c: correct[a][c].astype(float) - correct[b][c] for c in (CHECKLIST_CATEGORIES if cat == "average"
                                                                       else (cat,))}
        lo, hi = average_interval(d, cfg.n_bootstrap)
        per_seed = [x - y for x, y in zip(table[a][cat]["per_seed"], table[b][cat]["per_seed"])]
        return {"mean": float(np.mean(per_seed)), "per_seed": per_seed, "ci95": [lo, hi]}

    # Binding: attribute swap (the same words bound differently) is the category where the base fails by
    # construction (bag-of-words text side) and the one the tree's one-word negatives teach; it is not in
    # the five-category average, so its paired difference is reported beside it.
    best_swap = max(("contrastive", "negclip"), key=lambda m: table[m]["attribute_swap"]["mean"])

    train_rel = {m: float(np.mean([checklist_accuracy(arr[f"train_relation_{m}_s{s}"]) for s in seeds]))
                 for m in BASE_MODELS if f"train_relation_{m}_s{seeds[0]}" in arr}
    two = arr["n_objects__relation_spatial"] == 2 if "n_objects__relation_spatial" in arr else None
    rel_two = {m: float(np.mean([checklist_accuracy(arr[f"scores_{m}_s{s}__relation_spatial"][two]) for s in seeds]))
               for m in BASE_MODELS} if two is not None else {}
    return {"accuracy": table, "anchor_token_removal": anchor, "failures_by_pos": failures,
            "n_items_by_pos": n_by_pos, "n_items": {c: int(correct["base"][c].shape[1]) for c in CATEGORIES},
            "minilm_text_cosine": text_cos, "best_baseline": best,
            "paired": {"contrastive_minus_base": paired("contrastive", "base"), "negclip_minus_base":
                       paired("negclip", "base"), "tree_minus_base": paired("tree", "base"),
                       "tree_minus_best_baseline": paired("tree", best)},
            "paired_swap": {"best_baseline": best_swap, "tree_minus_base": paired("tree", "base", "attribute_swap"),
                            "tree_minus_best_baseline": paired("tree", best_swap, "attribute_swap")},
            "train_relation": train_rel, "relation_two_objects": rel_two,
            "n_relation_two_objects": int(two.sum()) if two is not None else 0,
            "items_per_category_for_2_points": items_for_difference(diffs)}


# In random batches, fewer hard pairs (one-word or rebound captions, `in_batch_hard_negatives`)
# than this per batch leave plain contrastive fine-tuning without hard negatives (COCO: ~0).
MATERIAL_HARD_PAIRS_PER_BATCH = 1.0
PREMISE_GAIN = 1.0  # contrastive − base below this: more contrastive training teaches the base nothing
BAG_OF_WORDS = 65.0  # base attribute swap and relation at most this: the base does not bind
MISSING_FROM_EMBEDDING = 10.0  # probe on pixels − on the base's embedding, mean of both axes: the embedding lost it


def premise(r: dict) -> dict[str, bool]:
    """The paper's premise, both checks: more contrastive training gains nothing, the base does not bind."""
    b = r["accuracy"]["base"]
    return {"contrastive_gains_under_1": r["paired"]["contrastive_minus_base"]["mean"] < PREMISE_GAIN,
            "base_swap_and_relation_at_most_65": max(b["attribute_swap"]["mean"],
                                                     b["relation_spatial"]["mean"]) <= BAG_OF_WORDS}


def _targets(r: dict) -> dict:
    a = r["accuracy"]
    f_base, f_tree = r["failures_by_pos"]["base"], r["failures_by_pos"]["tree"]

    def cut(tag):
        return 1.0 - f_tree[tag] / f_base[tag] if f_base[tag] else 0.0

    best = r["paired"]["tree_minus_best_baseline"]
    return {
        **{f"premise: {k}": v for k, v in premise(r).items()},
        "tree_beats_base_by_10": r["paired"]["tree_minus_base"]["mean"] >= 10,
        "tree_beats_best_baseline_by_2_paired_interval_above_0": best["mean"] >= 2 and best["ci95"][0] > 0,
        "tree_relation_at_least_65": a["tree"]["relation_spatial"]["mean"] >= 65,
        "adj_failures_cut_30pct": cut("ADJ") >= 0.3,
        "adp_failures_cut_30pct": cut("ADP") >= 0.3,
    }


def _losses(r: dict) -> str:
    """' It loses X on A, ...' for the checklist categories where tree − base < −1 point ('' if none)."""
    a = r["accuracy"]
    lost = [(a["tree"][c]["mean"] - a["base"][c]["mean"], c) for c in CHECKLIST_CATEGORIES]
    lost = sorted((d, c) for d, c in lost if d < -1)
    return (" Against the base the tree loss loses " + ", ".join(f"{-d:.1f} points on {c}" for d, c in lost) + "."
            if lost else "")


def _probe(r: dict) -> str:
    """' A linear probe reads ...': what the base's and the tree model's image embeddings hold of the
    relation (lit_probe), against 8 x 8 pixels and the colour control ('' without the probe)."""
    pb = r.get("relation_probe")
    if not pb or "base" not in pb:
        return ""

    def xy(m: str) -> str:
        return f"{pb[m]['relation_x']:.1f} / {pb[m]['relation_y']:.1f}"

    gap = [pb["pixels"][p] - pb["base"][p] for p in ("relation_x", "relation_y")]
    missing = float(np.mean(gap)) >= MISSING_FROM_EMBEDDING
    return (f" A linear probe reads the relation (left-right / above-below) of the two-object test scenes from the "
            f"base's image embedding at {xy('base')}, the tree model's at {xy('tree') if 'tree' in pb else 'n/a'} "
            f"(majority {pb['majority']['relation_x']:.1f} / {pb['majority']['relation_y']:.1f}), from 8 x 8 pixels "
            f"at {xy('pixels')}; the colour control reads {pb['base']['color_present']:.1f} from the base."
            + (" The relation is missing from the image embedding the text side reads, not from the images."
               if missing else ""))


def _binding(r: dict) -> str:
    """' On attribute swap ...': the tree loss's paired gain where the base does not bind, and the
    headroom the base leaves on the checklist average ('' for results without it)."""
    ps = r.get("paired_swap")
    if not ps:
        return ""
    a = r["accuracy"]
    tb, tbest = ps["tree_minus_base"], ps["tree_minus_best_baseline"]
    room = 100.0 - a["base"]["average"]["mean"]
    rel_room = (100.0 - a["base"]["relation_spatial"]["mean"]) / len(CHECKLIST_CATEGORIES)
    return (f" On attribute swap (the same words bound differently, outside the five-category average), base "
            f"{a['base']['attribute_swap']['mean']:.1f}, the tree loss gains {tb['mean']:+.1f} over the base and "
            f"{tbest['mean']:+.1f} [{tbest['ci95'][0]:+.1f}, {tbest['ci95'][1]:+.1f}] over {ps['best_baseline']}. "
            f"The base leaves {room:.1f} points of headroom on the average, {rel_room:.1f} of them on relation.")


def answer(cfg, r: dict) -> tuple[str, str]:
    """(cause, sentence): whether the tree loss wins, or the first measured cause, in the issue's order:
    premise not reached, hard negatives in batches anyway, relations not learnable in the budget,
    the loss itself."""
    a, pr = r["accuracy"], r["paired"]
    tb, tbest, cb = pr["tree_minus_base"], pr["tree_minus_best_baseline"], pr["contrastive_minus_base"]
    best = r["best_baseline"]
    hard = r.get("hard_negatives", {})
    per_batch = hard.get("one_word_per_batch", 0.0) + hard.get("rebound_per_batch", 0.0)
    steps = r.get("fits", {}).get(f"tree_s{cfg.seeds[0]}", {}).get("steps", "?")
    trel = r.get("train_relation", {})
    if tbest["mean"] >= 2 and tbest["ci95"][0] > 0 and tb["mean"] >= 10:
        return "tree_wins", (f"The tree loss wins: tree − base {tb['mean']:+.1f} points, tree − {best} "
                             f"{tbest['mean']:+.1f} [{tbest['ci95'][0]:+.1f}, {tbest['ci95'][1]:+.1f}].")
    b = a["base"]
    # what every answer but the win says of the comparison, then of binding, the probe and the losses
    versus = (f"tree − {best} {tbest['mean']:+.1f} [{tbest['ci95'][0]:+.1f}, {tbest['ci95'][1]:+.1f}], tree − base "
              f"{tb['mean']:+.1f}")
    measured = _binding(r) + _probe(r) + _losses(r)
    if not all(premise(r).values()):
        return "premise_not_reached", (
            f"Premise not reached: contrastive fine-tuning gains {cb['mean']:+.1f} points over the base "
            f"[{cb['ci95'][0]:+.1f}, {cb['ci95'][1]:+.1f}] (needs < {PREMISE_GAIN:g}), base attribute swap "
            f"{b['attribute_swap']['mean']:.1f} and relation {b['relation_spatial']['mean']:.1f} (need ≤ "
            f"{BAG_OF_WORDS:g}): a comparison of the losses on this base does not test the paper's claim. Measured "
            f"anyway: {versus}, tree relation {a['tree']['relation_spatial']['mean']:.1f}." + measured)
    if per_batch >= MATERIAL_HARD_PAIRS_PER_BATCH:
        return "hard_negatives_in_batches", (
            f"Hard negatives present in batches anyway: {per_batch:.2f} one-word or rebound caption pairs per "
            f"batch of {hard.get('batch_size')}, so plain contrastive training sees what the tree adds.")
    if a["tree"]["relation_spatial"]["mean"] < BAG_OF_WORDS and trel.get("tree", 100.0) < BAG_OF_WORDS:
        return "relations_not_learnable", (
            f"Relations not learnable by LoRA in the budget: after {steps} steps the tree model reads the relation "
            f"of its own fine-tuning scenes at {trel['tree']:.1f} (base {trel.get('base', float('nan')):.1f}) and "
            f"of the test scenes at {a['tree']['relation_spatial']['mean']:.1f}; the premise holds (contrastive "
            f"{cb['mean']:+.1f}) and batches hold {per_batch:.2f} hard pairs each. {versus[0].upper()}{versus[1:]}."
            + measured)
    return "loss_does_not_help", (
        f"The loss itself does not help once the premise holds (contrastive {cb['mean']:+.1f}), batches hold "
        f"{per_batch:.2f} hard pairs each and relations are learnable (tree on its own scenes "
        f"{trel.get('tree', float('nan')):.1f}): {versus}." + measured)


ARRAYS_README = """# arrays/

`checklist.npz`: `scores_<model>_s<seed>__<category>` (n, 2) float64, per test item of the
category [cosine(image, POS), cosine(image, NEG)], model in base, contrastive, negclip, tree,
seed in the run's seeds; categories: the five of checklist/<category>.json (same order) plus
attribute_swap and single_object (vlctl.recipes.threevl.lit_eval.extra_items of the test labels).
accuracy = 100 * mean(scores[:, 0] > scores[:, 1]); the report's mean +- std is over seeds, its
95% interval a bootstrap over items (the same resample for every seed); "average" = mean over
the five VL-CheckList categories.
`anchor_tr_s<seed>__<category>` (n_relevancy, 2): the tree model's scores with its image
re-encoded from the (1 - removal_fraction) most relevant patches of the Anchor map; compare with
the first n_relevancy rows of scores_tree_s<seed>__<category>.
`train_relation_<model>_s<seed>` (n, 2): [cosine(image, caption), cosine(image, caption with its
relation reversed)] on the first fine-tuning scenes (vlctl.data.scenes.checklist_items, relation_spatial):
whether a model fits the relations of the scenes it was fine-tuned on.
`n_objects__<category>` (n,): objects in each item's test scene (2 or 3; the report's relation on
two-object scenes is relation_spatial over the items with 2).
`minilm_cosine__<category>` (n,): cosine between the positive and the negative text in the
frozen MiniLM's normalised sentence embeddings (text only).
"""


# --- report --------------------------------------------------------------------------------------


def _figure(out: Path, r: dict) -> None:
    (out / "figures").mkdir(parents=True, exist_ok=True)
    cats = [*CATEGORIES, "average"]
    acc = r["accuracy"]
    checklist_bars(out / "figures" / "checklist.png", cats, {m: [acc[m][c]["mean"] for c in cats] for m in BASE_MODELS},
                   figsize=(10, 3.6), errors={m: [acc[m][c]["std"] for c in cats] for m in BASE_MODELS})


def _fmt_ci(cell: dict) -> str:
    return f"{cell['mean']:.1f} [{cell['ci95'][0]:.1f}, {cell['ci95'][1]:.1f}]"


def _fmt(cell: dict) -> str:
    return f"{cell['mean']:.1f} ± {cell['std']:.1f} [{cell['ci95'][0]:.1f}, {cell['ci95'][1]:.1f}]"


def _report(cfg, r: dict, quick: bool) -> Report:
    """report.md of a run: `cfg` its ThreeVLLitRecipe, `r` its results.json."""
    rep = Report(f"3vl-lit{' (--quick)' if quick else ''}: 3VL on a LiT base (frozen MiniLM) over compositional scenes")
    pr, b = r["paired"], r["accuracy"]["base"]
    held = premise(r)
    cb = pr["contrastive_minus_base"]
    rep.text(f"**Answer: {r['answer']['text']}**")
    rep.table(["premise check (the paper's: a base converged on the captions, that does not bind)", "measured",
               "needed", "holds"],
              [["contrastive fine-tuning − base, checklist average (paired 95% interval)",
                f"{cb['mean']:+.1f} [{cb['ci95'][0]:+.1f}, {cb['ci95'][1]:+.1f}]", f"< {PREMISE_GAIN:g}",
                str(held["contrastive_gains_under_1"])],
               ["base attribute swap / relation (bootstrap 95% interval)",
                f"{_fmt_ci(b['attribute_swap'])} / {_fmt_ci(b['relation_spatial'])}",
                f"≤ {BAG_OF_WORDS:g}", str(held["base_swap_and_relation_at_most_65"])]])
    if not all(held.values()):
        rep.text("The premise does not hold on this run: the comparison below does not test the paper's claim.")
    h = r["hard_negatives"]
    base_src = (f"{cfg.alt_per_scene} alt-text captions of each of {cfg.n_train:,} train scenes"
                if cfg.base_captions == "alt" else
                f"the full captions of {cfg.n_train:,} train scenes (the fine-tuning split's caption distribution, "
                f"configurations disjoint)")
    if cfg.base_captions == "full+place":
        base_src += " and one object of each named with its absolute place ('a red circle on the left')"
    cap = (lambda v, what: f"every {what}" if v == 0 else f"at most {v} {what}s")
    rep.text(f"Base: ViT of `{cfg.vision_model}` ({cfg.image_size} px) from scratch + frozen all-MiniLM-L6-v2 + "
             f"trainable projection, trained contrastively on {base_src} for {cfg.base_epochs} epochs. Fine-tuning on "
             f"the full captions of {cfg.n_finetune:,} finetune scenes: LoRA rank {cfg.rank} (alpha {cfg.lora_alpha}) "
             f"on the attention of MiniLM's last {cfg.minilm_layers} layers (peft) and on the ViT ({cfg.towers}), "
             f"{cfg.ft_epochs} epoch(s) at batch {cfg.ft_batch_size} ({r['fits'].get(f'tree_s{cfg.seeds[0]}', {}).get('steps', '?')} "
             f"steps), lr {cfg.ft_lr}, the same for every loss; tree alpha {cfg.alpha}, levels reduced by "
             f"{cfg.level_reduction}, {cap(cfg.max_levels, 'level')} and {cap(cfg.max_negatives, 'negative')} of each tree"
             f"{' (no cap, as the paper)' if cfg.max_levels == cfg.max_negatives == 0 else ''}. In-batch hard negatives of the fine-tuning captions (random batches of {h['batch_size']}): "
             f"{h['one_word_per_batch']:.3f} one-word pairs and {h['rebound_per_batch']:.3f} rebound pairs (the same "
             f"words bound differently) per batch, {h['one_word_share']:.4f}% and {h['rebound_share']:.4f}% of all "
             f"pairs. Test: {cfg.n_test} scenes whose configurations are in no training split. Seeds "
             f"{list(cfg.seeds)}: cells are mean ± std over seeds [bootstrap 95% interval over items of the "
             "seed-averaged accuracy].")
    def diff_row(label: str, v: dict) -> list[str]:
        return [label.replace("_minus_", " − ").replace("_", " "), f"{v['mean']:+.1f}",
                ", ".join(f"{x:+.1f}" for x in v["per_seed"]), f"[{v['ci95'][0]:+.1f}, {v['ci95'][1]:+.1f}]"]

    swap = {k: v for k, v in r.get("paired_swap", {}).items() if k != "best_baseline"}
    rep.table(["paired difference, checklist average (attribute swap: that category alone)", "mean", "per seed",
               "95% interval"],
              [diff_row(k, v) for k, v in pr.items()]
              + [diff_row(k.replace("best_baseline", r["paired_swap"]["best_baseline"]) + ", attribute swap", v)
                 for k, v in swap.items()])
    if r.get("relation_two_objects"):
        rep.text(f"Relation on the {r['n_relation_two_objects']} two-object test scenes (where the relation's objects "
                 "are the only ones: learnable from scratch, docs/findings.md), mean over seeds: " +
                 ", ".join(f"{m} {v:.1f}" for m, v in r["relation_two_objects"].items()) + ".")
    if r.get("train_relation"):
        rep.text("Relation on the fine-tuning scenes themselves (caption vs. its relation reversed, first "
                 f"{r['n_train_relation']} scenes, mean over seeds): " +
                 ", ".join(f"{m} {v:.1f}" for m, v in r["train_relation"].items()) + ".")
    pb = r.get("relation_probe")
    if pb:
        rep.heading("What the image embedding holds (linear probe, two-object scenes)")
        rep.text("Logistic regression (C by 5-fold CV) fitted on the train split's scenes, accuracy on the test "
                 "split's; relation: which of the two objects (sorted by attributes) is left of / above the other; "
                 "controls: an object is red (identity), the one red object is in the left half (position). Models: "
                 "pooled image embedding, mean over seeds; pixels: the image average-pooled to 8 x 8 x 3.")
        models = [m for m in ("pixels", *BASE_MODELS) if m in pb]
        rep.table(["probe", *models, "majority", "test items"],
                  [[p, *[pb[m][p] for m in models], pb["majority"][p], pb["n_test"][p]] for p in pb["majority"]],
                  digits=1)
    rep.heading("Checklist accuracy")
    a = r["accuracy"]
    rows = [[c, *[_fmt(a[m][c]) for m in BASE_MODELS], r["n_items"].get(c, ""),
             f"{r['minilm_text_cosine'][c]:.3f}" if c in r["minilm_text_cosine"] else ""]
            for c in [*CATEGORIES, "average"]]
    rep.table(["category", *BASE_MODELS, "items", "MiniLM cos(pos, neg)"], rows)
    rep.figure("figures/checklist.png", "Checklist accuracy (mean ± std over seeds)")
    rep.text("Paper (CLIP ViT-B/32 fine-tuned on COCO, VL-CheckList VG, real images):")
    prow = [[c, *[PAPER[c].get(m) for m in ("base", "contrastive", "negclip", "tree", "tree_anchor_tr")]]
            for c in ("attribute_color", "attribute_size", "attribute_material", "relation_spatial")]
    prow.append(["VL-CheckList avg (attr/rel)", *[PAPER["checklist_avg"].get(m) for m in
                                                  ("base", "contrastive", "negclip", "tree", "tree_anchor_tr")]])
    prow.append(["object avg", *[PAPER["object_avg"].get(m) for m in
                                 ("base", "contrastive", "negclip", "tree", "tree_anchor_tr")]])
    rep.table(["paper", "CLIP", "contrastive", "NegCLIP", "3VL", "3VL + Anchor TR 65%"], prow)
    rep.heading("Targets")
    rep.table(["target", "met"], [[k, str(v)] for k, v in r["targets"].items()])
    best = r["best_baseline"]
    rep.text(f"Best baseline: {best}. Items per category for a 95% interval of ±2 points on the paired difference "
             f"tree − {best} of the average (from this run's per-item differences): "
             f"{r['items_per_category_for_2_points']} (this run: {min(r['n_items'][c] for c in CHECKLIST_CATEGORIES)}). "
             "Non-overlapping per-model intervals are stricter: they need each average's interval half-width <= 1 "
             "point; this run's half-widths: " + ", ".join(
                 f"{m} {(a[m]['average']['ci95'][1] - a[m]['average']['ci95'][0]) / 2:.2f}" for m in BASE_MODELS) + ".")
    rep.heading("Failures per POS tag of the replaced word (five categories, mean over seeds)")
    rep.table(["model", *POS_TAGS], [[m, *[r["failures_by_pos"][m][t] for t in POS_TAGS]] for m in BASE_MODELS]
              + [["items", *[r["n_items_by_pos"][t] for t in POS_TAGS]]], digits=1)
    rep.heading(f"Anchor token removal at {cfg.removal_fraction:.0%} (tree model, first {cfg.n_relevancy} items)")
    an = r["anchor_token_removal"]
    rep.table(["category", "no removal", "Anchor TR", "items"],
              [[c, an[c]["no_removal"], an[c]["anchor_tr"], an[c].get("n", "")] for c in [*CHECKLIST_CATEGORIES,
                                                                                          "average"]])
    ch = r["negative_checks"]
    rep.heading("Negatives checked against the scene")
    rep.text(f"Tree negatives kept {ch['kept']}, dropped as true of the scene {ch['true_of_scene']}, unparsed "
             f"{ch['unparsed']}; levels dropped {ch['levels_dropped']}. Mean levels {r['trees']['mean_levels']:.2f}, "
             f"negatives per tree {r['trees']['mean_negatives']:.2f}; NegCLIP coverage "
             f"{100 * r['trees']['negclip_coverage']:.1f}%.")
    rep.timings(r["timings"], heading="Timings (seconds; measured on a shared machine)")
    return rep

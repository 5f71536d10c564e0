"""Report of recipe `3vl-scenes` (vlctl.recipes.threevl.scenes): its targets, figures/,
arrays/README.md and report.md, drawn from the results and arrays the recipe saved.

The constants the report shares with the recipe (the paper's numbers, the models and maps
compared) are defined here and imported by it: this module cannot import the recipe
(tests/test_layout.py forbids import cycles).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlctl.data.scenes import CHECKLIST_CATEGORIES, load_checklist, load_scenes
from vlctl.report.writer import Report

# 3VL paper (CLIP ViT-B/32, VL-CheckList VG; Tables I-III).
PAPER = {
    "checklist_avg": {"base": 66.13, "negclip": 69.75, "tree": 78.25, "tree_anchor_tr": 79.18},
    "object_avg": {"base": 79.01, "contrastive": 81.18, "negclip": 81.54, "tree": 89.28},
    "attribute_color": {"base": 66.68, "negclip": 73.62, "tree": 75.29, "tree_anchor_tr": 76.18},
    "attribute_size": {"base": 67.90, "negclip": 66.12, "tree": 70.90, "tree_anchor_tr": 71.36},
    "attribute_material": {"base": 67.25, "negclip": 75.83, "tree": 82.63, "tree_anchor_tr": 82.51},
    "relation_spatial": {"base": 55.90, "negclip": 60.87, "tree": 81.14, "tree_anchor_tr": 84.29},
}
MODELS = ("base", "contrastive", "negclip", "tree", "tree_anchor_tr")
# What the tuning runs behind the quick preset measured, printed when targets are missed.
SHORTFALL = (
    "Where ours falls short, and why (measured while tuning the quick preset): only the last tree level (the "
    "whole caption and its one-word negatives) helped, by 1-3 points; the partial levels hurt, even on the "
    "fine-tuning split. spaCy mis-tags the scene grammar's words (dotted/striped as VERB, plain as ADV, square as "
    "ADJ), which truncates levels (e.g. 'a small purple'), and in a multi-object scene a one-word change at a "
    "partial level can describe another object and be true. The small base barely binds attributes or "
    "relations (relation ~52% even on its fine-tuning split; NegCLIP with full fine-tuning reaches ~71). "
    "Token removal by HilaCAM/Anchor maps collapses both models to chance although the deletion test holds: the "
    "model never saw object-only token sets (random patch dropout keeps background), and size and color are "
    "judged against that context. Relations are not learned by any model here, and not for want of hard "
    "negatives: trained from random weights with the relation swap as the only objective, scenes-quick stays "
    "at loss ln 2 and 50.6% on its own training scenes for 12 epochs (experiments/relation_learnability.py, "
    "results in experiments/relation_learnability_*.json). Telling 'A left of B' from 'A right of B' needs the "
    "text to multiply the relation's sign into both noun phrases and the image to multiply each object's "
    "attributes into its position; at the start, every relation word is as often the positive as the negative, "
    "so the gradient averages to zero. What unlocks it is the scenes, not the loss alone: on two-object scenes "
    "(6,000, 30 epochs) InfoNCE plus the relation-swap loss reaches 74.3% on the test split's relations, while "
    "the same run on scenes with a 40% share of three objects stays at 50.5%, and InfoNCE alone on two-object "
    "scenes at 50.3% (experiments/relation_levers/). A longer, higher-lr LoRA fine-tuning of the quick base (lr 1e-2, rank "
    "16, 16 epochs, no patch dropout) lifts tree and contrastive alike (75.3 vs 74.6 average): on this base the "
    "hard negatives add little beyond more training. The paper's model is CLIP ViT-B/32 pre-trained on 400M pairs."
)
MAP_METHODS = ("hilacam", "anchor", "dire")


def _targets(r: dict) -> dict:
    avg = r["checklist"]["average"]
    tr = r["token_removal"]["tree"]["anchor"]
    return {
        "tree_beats_base_by_15": avg["tree"] - avg["base"] >= 15.0,
        "tree_beats_contrastive": avg["tree"] > avg["contrastive"],
        "tree_beats_negclip": avg["tree"] > avg["negclip"],
        "anchor_tr_65_no_loss_vs_no_removal": tr["at_65"] >= tr["accuracy"][0],
        "anchor_tr_65_no_loss_full_checklist": avg["tree_anchor_tr"] >= avg["tree"],
        "deletion_holds_base": bool(r["deletion"]["base"]["holds"]),
        "deletion_holds_tree": bool(r["deletion"]["tree"]["holds"]),
    }


ARRAYS_README = """# arrays/

`checklist.npz`: `scores_<model>__<category>` (n, 2) float64, per test item of the category
(checklist/<category>.json, same order) [cosine(image, POS), cosine(image, NEG)], for models
base, contrastive, negclip, tree (embeddings of the full image) and tree_anchor_tr (the tree
model's image embedding re-encoded from the 35% most relevant patches of the Anchor map).
`checklist[category][model] = 100 * mean(scores[:, 0] > scores[:, 1])`;
`checklist["average"][model]` = mean over the five categories.

`token_removal.npz`: `removal_<model>__<method>` (11,) accuracy (%) after removing the least
relevant fraction `removal_fractions` of patches (vlctl.methods.threevl.relevancy.token_removal_curve),
for model in {base, tree} and method in {hilacam (map of the positive text), anchor, dire},
over the items listed by `relevancy_item_category` / `relevancy_item_index` (the first
n_relevancy items of each category); `maps_<model>__<method>` (n, gh, gw) the maps used.
`token_removal[model][method]["at_65"]` is the same curve evaluated at removal_fraction.

`deletion.npz`: `deletion_<model>__drop_relevant` / `__drop_random` (n,): cosine drop with
the positive text after removing the most relevant (HilaCAM of the positive) vs as many random
patches; `deletion[model]["mean_drop_*"]` are their means and "holds" is relevant > random.
"""


# --- figures and report --------------------------------------------------------------------------


def checklist_bars(path: Path, cats: list[str], accuracy: dict[str, list[float]], figsize: tuple[float, float],
                   errors: dict[str, list[float]] | None = None) -> None:
    """Grouped bars of checklist accuracy: one group per category, one bar per model (`accuracy`:
    model -> one value per category; `errors`: the same shape, drawn as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(cats))
    fig, ax = plt.subplots(figsize=figsize)
    w = 0.8 / len(accuracy)
    for i, (m, values) in enumerate(accuracy.items()):
        ax.bar(x + (i - (len(accuracy) - 1) / 2) * w, values, w, label=m,
               **({"yerr": errors[m], "capsize": 2} if errors else {}))
    ax.axhline(50, color="k", lw=0.8, ls=":")
    ax.set_xticks(x, [c.replace("_", "\n") for c in cats], fontsize=7)
    ax.set_ylabel("checklist accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=len(accuracy))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _figures(out: Path, r: dict, data_dir: Path, eval_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    cats = [*CHECKLIST_CATEGORIES, "average"]
    checklist_bars(fig_dir / "checklist.png", cats, {m: [r["checklist"][c][m] for c in cats] for m in MODELS},
                   figsize=(9, 3.6))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, ls in (("base", "--"), ("tree", "-")):
        for method in MAP_METHODS:
            c = r["token_removal"][name][method]
            ax.plot(c["fractions"], c["accuracy"], ls, marker="o", ms=3, label=f"{name} {method}")
    ax.set_xlabel("fraction of patches removed (least relevant first)")
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(fig_dir / "token_removal.png", dpi=120)
    plt.close(fig)

    from vlctl.report.overlays import save_map_grid

    arr = np.load(eval_dir / "eval.npz")
    test = load_scenes(data_dir / "test")
    overlays = []
    cats_rel = arr["relevancy_item_category"]
    for cat in ("relation_spatial", "attribute_color"):
        rows = np.flatnonzero(cats_rel == cat)
        if not len(rows):
            continue
        k = int(rows[0])
        index = int(arr["relevancy_item_index"][k])
        item = next((it for it in load_checklist(data_dir / "test", cat) if it["index"] == index), {})
        image = np.asarray(test["images"][index])
        maps = {name: {method: arr[f"maps_{name}__{method}"][k] for method in MAP_METHODS} for name in ("base", "tree")}
        path = fig_dir / f"overlay_{cat}.png"
        save_map_grid(path, image, maps, item.get("pos", ""), item.get("neg", ""),
                      note=f"{cat}, test scene {index} ({image.shape[1]} px, shown with nearest-neighbour upscaling)")
        overlays.append(path.name)
    return overlays


def _report(cfg, r: dict, quick: bool, overlays: list[str]) -> Report:
    """report.md of a run: `cfg` its ThreeVLScenesRecipe, `r` its results.json, `overlays` the
    relevancy-map figures `_figures` drew."""
    rep = Report(f"3vl-scenes{' (--quick)' if quick else ''}: caption trees + LoRA on compositional scenes")
    rep.text(f"Base: TinyCLIP `{cfg.model}` ({cfg.image_size} px, word-level text tower) trained contrastively on "
             f"{cfg.n_train} train scenes for {cfg.base_epochs} epochs. Fine-tuning: LoRA rank {cfg.rank} (alpha "
             f"{cfg.lora_alpha}) on {cfg.n_finetune} finetune scenes, {cfg.ft_epochs} epochs, lr {cfg.ft_lr}, the same "
             f"budget for every loss. Test: {cfg.n_test} scenes whose configurations appear in no training split. "
             "Paper: CLIP ViT-B/32 on COCO, evaluated on VL-CheckList VG (real images); numbers are percentages.")
    rep.heading("Checklist accuracy (positive scored above its one-word negative)")
    rows = [[c, *[r["checklist"][c][m] for m in MODELS], r["n_items"].get(c)] for c in CHECKLIST_CATEGORIES]
    rows.append(["average", *[r["checklist"]["average"][m] for m in MODELS], None])
    for c in ("attribute_color", "attribute_size", "attribute_material", "relation_spatial"):
        rows.append([f"paper: {c}", *[PAPER[c].get(m) for m in MODELS], None])
    rows.append(["paper: VL-CheckList avg (attr/rel)", *[PAPER["checklist_avg"].get(m) for m in MODELS], None])
    rows.append(["paper: object avg", *[PAPER["object_avg"].get(m) for m in MODELS], None])
    rep.table(["category", *MODELS, "items"], rows)
    rep.figure("figures/checklist.png", "Checklist accuracy per category and model")
    rep.text("Object items by the changed object's size and location (VL-CheckList's Object subsets):")
    rep.table(["subset", *MODELS], [[k, *[v[m] for m in MODELS]] for k, v in r["checklist_object_breakdown"].items()])
    rep.heading("Targets")
    rep.table(["target", "met"], [[k, str(v)] for k, v in r["targets"].items()])
    if not all(r["targets"].values()):
        rep.text(SHORTFALL)
    rep.heading("Token removal (least relevant patches first)")
    rep.text(f"Accuracy on the first {cfg.n_relevancy} items of each category after removing "
             "a fraction of the patches by each map (HilaCAM: map of the positive text; Anchor: map of 'AP or AN'; "
             "DiRe: positive minus negative map, uses the label).")
    fr = r["token_removal"]["base"]["hilacam"]["fractions"]
    rows = []
    for name in ("base", "tree"):
        for method in MAP_METHODS:
            c = r["token_removal"][name][method]
            rows.append([f"{name} {method}", *[c["accuracy"][k] for k in (0, 3, 5, 7, 9)], c["at_65"]])
    rep.table(["model / map", *[f"{fr[k]:.1f}" for k in (0, 3, 5, 7, 9)], f"{cfg.removal_fraction:.2f}"], rows)
    rep.figure("figures/token_removal.png", "Token-removal curves")
    rep.heading("Deletion test")
    rep.text(f"Removing the {cfg.deletion_fraction:.0%} most relevant patches (HilaCAM of the positive) vs as many "
             "random ones: mean drop of the image-text cosine.")
    rep.table(["model", "drop relevant", "drop random", "share relevant > random", "holds"],
              [[m, d["mean_drop_relevant"], d["mean_drop_random"], d["share_relevant_larger"], str(d["holds"])]
               for m, d in r["deletion"].items()], digits=3)
    rep.heading("Failures per POS tag of the replaced word")
    tags = ("NOUN", "ADJ", "ADP")
    rep.table(["model", *tags], [[m, *[r["failures_by_pos"][m][t] for t in tags]] for m in MODELS]
              + [["items", *[r["n_items_by_pos"].get(t, 0) for t in tags]]], digits=0)
    rep.text("Tree-node expansion (first failing tree level of failing items; the strongest negative's words "
             "expanded with co-hyponyms / synonyms / opposites; top texts by probability):")
    for name in ("base", "tree"):
        for e in r["tree_expansion"][name][:3]:
            ranked = "; ".join(f"{t} ({p:.2f})" for t, p in e.get("ranked", [])[:4])
            rep.text(f"[{name}] {e['category']}: '{e['pos']}' vs '{e['neg']}' -> level {e['failing_level']} "
                     f"('{e.get('level_positive', '')}' vs '{e.get('strongest_negative', '')}'): {ranked}")
    rep.heading("Relevancy maps")
    for name in overlays:
        rep.figure(f"figures/{name}", name.removesuffix(".png").replace("_", " "))
    rep.timings(r["timings"])
    return rep

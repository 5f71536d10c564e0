"""Report of recipe `tevi-mad` (vlctl.recipes.tevi.mad): figures/, arrays/README.md and report.md,
drawn from the results and arrays the recipe saved.

The constants the report shares with the recipe are defined here and imported by it: this module
cannot import the recipe (tests/test_layout.py forbids import cycles).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlctl.data.mad import CATEGORIES, VALUES, load_mad
from vlctl.eval.editing import top_activating
from vlctl.report.writer import Report

EDITED = [c for c in CATEGORIES if c != "digit"]  # every caption names the digit: nothing to edit
N_PURITY = 5000  # training images the per-latent purity (best-concept AUC) is measured on
# TEVI paper, MAD: Table A2 (learned SAE) and Table A1 (CG-SAE), mean of 5 runs.
PAPER_CONDITIONING = {
    "learned": {"thickthinning": (92.9, 99.1, 54.3), "swelling": (96.2, 98.3, 57.0), "fracture": (92.8, 93.5, 59.1),
                "scaling": (99.7, 95.2, 57.1), "color": (100.0, 96.3, 22.6)},
    "cg": {"thickthinning": (92.9, 97.8, 35.4), "swelling": (96.2, 96.6, 50.2), "fracture": (92.8, 97.5, 50.5),
           "scaling": (99.7, 99.9, 60.7), "color": (100.0, 100.0, 34.2)},
}  # category -> (original, in caption, not in caption)


# --- figures and report ------------------------------------------------------------------------


def _figures(out: Path, cos: dict, auc: np.ndarray, cg_latents: np.ndarray, test_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(cos), figsize=(5 * len(cos), 3.2), squeeze=False)
    for ax, (v, (before, after)) in zip(axes[0], cos.items()):
        bins = np.linspace(min(before.min(), after.min()), 1, 50)
        ax.hist(before, bins=bins, alpha=0.6, label=f"CLIP (mean {before.mean():.3f})")
        ax.hist(after, bins=bins, alpha=0.6, label=f"TEVI-edited (mean {after.mean():.3f})")
        ax.set_title(f"{v} SAE")
        ax.set_xlabel("cosine(image, its caption)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(fig_dir / "positive_cosine.png", dpi=120)
    plt.close(fig)

    names = [f"{c[:5]}:{v}" for c in CATEGORIES for v in VALUES[c]]
    fig, ax = plt.subplots(figsize=(9, 8))
    im = ax.imshow(auc / 100.0, vmin=0, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("concept (image has it)")
    ax.set_ylabel("CG-SAE latent")
    fig.colorbar(im, ax=ax, label="ROC-AUC")
    fig.tight_layout()
    fig.savefig(fig_dir / "cg_sae_auc.png", dpi=120)
    plt.close(fig)

    images = load_mad(test_dir)["images"]
    top = top_activating(cg_latents, 8)
    fig, axes = plt.subplots(len(names), 8, figsize=(8 * 0.9, len(names) * 0.95))
    for r, row in enumerate(top):
        for j, i in enumerate(row):
            ax = axes[r, j]
            ax.imshow(images[i])
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(names[r], fontsize=6, rotation=0, ha="right", va="center")
    fig.tight_layout(pad=0.1)
    fig.savefig(fig_dir / "cg_sae_top_images.png", dpi=100)
    plt.close(fig)


ARRAYS_README = """# arrays/

Every number in report.md / results.json is recomputed from these files with `vlctl.eval`:

- `conditioning_<variant>.npz` (variant = learned | cg; `conditioning.npz` is the headline one):
  `original_emb` (N, d) test-image embeddings, `edited_emb` (N, d) each image edited by its own
  caption, `swapped_emb` (N, d) image i edited by caption `swap_perm[i]`; per category c:
  `text_c` class embeddings, `label_c` true value, `in_caption_c` (bool), `caption_label_c` (value
  the caption names, -1 if none).
  `conditioning[c] = editing.conditioning_accuracy(original_emb, edited_emb, text_c, label_c, in_caption_c)`;
  `leakage[c] = editing.leakage_accuracy(swapped_emb, text_c, label_c, caption_label_c[swap_perm])`.
  Positive-pair cosine: `metrics.positive_pair_cosine(original_emb | edited_emb, text_emb)`.
- `retrieval_<variant>.npz`: `base_scores` (N, N) CLIP cosine image x caption, `tevi_scores` the
  exhaustive TEVI scores cos(e_{p|q}, t_q), `image_values`, `caption_values` (N, 6; -1 = not
  named). relevant[i, j] = the image has every value caption j names
  (`vlctl.eval.metrics.caption_relevance`); recall = `metrics.recall_at_k_relevant(scores, relevant)`.
  TEVI-rerank: `rerank_order_t2i` (N_images, N_texts; column j = text j's images, best first)
  and `rerank_order_i2t` (N_texts, N_images); recall = `vlctl.eval.metrics.recall_from_order(order,
  relevant)` (t2i) and `recall_from_order(order_i2t, relevant.T)` (i2t).
- Seeds after the first (`n_seeds` > 1): `conditioning_<variant>_seed<s>.npz` (the same fields)
  and `retrieval_<variant>_seed<s>.npz` with `top_order_t2i` (10, N_texts) / `top_order_i2t` (10,
  N_images), each query's 10 best by the exhaustive TEVI score: R@1/5/10 =
  `metrics.recall_from_order(top_order_t2i, relevant)` / `(top_order_i2t, relevant.T)`.
  `results.seeds[variant]` = mean and std over the seeds of these figures.
- `retrieval_fused.npz` (issue 41; the learned-SAE mask of stage tevi-learned-fused, fitted with
  `fusion_holdout` of the training images held out): `base_scores`, `tevi_scores`, `image_values`,
  `caption_values` as above; `rerank_order_t2i` / `rerank_order_i2t` the TEVI-rerank (alpha 0),
  `fused_order_t2i` / `fused_order_i2t` the rerank of CLIP's top `rerank_k` by alpha * base +
  (1 - alpha) * TEVI at the model's `alpha`; recall as for TEVI-rerank. The held-out figures
  (`results.fused.heldout`) are the model's own (its config.json), measured at fit.
- `cg_sae.npz`: `latents` (N, 26) CG-SAE codes, `concept_present` (N, 26), `auc` (26, 26) =
  `editing.concept_auc_matrix(latents, concept_present)` (percent), `reconstructed_emb`,
  `ablated_emb` (thickthinning latents zeroed), and `text_c`, `label_c` for zero-shot accuracy.
"""


def _pm(x: dict) -> str:
    """{"mean", "std"} -> "mean +- std" (one decimal)."""
    return f"{x['mean']:.1f} +- {x['std']:.1f}"


def _report(cfg, r: dict, quick: bool) -> Report:
    """report.md of a run: `cfg` its TeviMadRecipe, `r` its results.json."""
    rep = Report(f"tevi-mad{' (--quick)' if quick else ''}: TEVI's controlled experiments on MAD")
    rep.text(f"CLIP: `{r['encoder_id']}` (the mad-clip recipe's model). Test set: {r['n_test']} held-out images. "
             "Two SAE variants, as in the paper: a learned TopK SAE and a CLIP-guided SAE (CG-SAE: one latent per "
             "attribute value, decoder rows fixed to the value's text embedding, centred on the concepts' mean). "
             f"Mask: 3-layer MLP, {cfg.conditioning} conditioning, sigmoid temperature {cfg.mask_temperature}, "
             f"mask values below {cfg.mask_floor} zeroed at inference"
             + (f", mask-mass penalty {cfg.mask_mass_coef}" if cfg.mask_mass_coef else "")
             + (", batches holding contradicting captions" if cfg.contradicting_batches else "")
             + (", CG-SAE mask per attribute category" if cfg.cg_group_mask else "") + ". "
             "All numbers are percentages unless noted, recomputable from arrays/ (arrays/README.md).")
    n_seeds = len(r["seeds"]["cg"]["seeds"])
    learned = r["variants"]["learned"]["summary"]
    paper_learned = np.mean([PAPER_CONDITIONING["learned"][c][2] - 100 / len(VALUES[c]) for c in EDITED])
    if learned["not_in_caption_excess"] > paper_learned:
        # issue 41: a missed target is said at the top, with where the diagnosis is, not at the end
        rep.heading("Where ours falls short")
        rep.text(f"The learned-SAE TEVI (the paper's method, Table A2) does not reproduce: its not-in-caption excess "
                 f"is {learned['not_in_caption_excess']:.1f} points over chance (paper {paper_learned:.1f}), and under "
                 f"a foreign caption it follows the caption {learned['follows_caption_mean']:.1f}% of the time. The "
                 "diagnosis (docs/findings.md, 'TEVI as its paper specifies it'; experiments/tevi_paper_config.py) "
                 "finds the objective at fault, not the optimisation: on MAD, Eq. 10's loss on the training pairs is "
                 "lower for a mask that writes the caption in than for the category-selective (oracle) mask, and a "
                 "mask started at the oracle drifts away from it. The CG-SAE proof (Table A1) is below.")
    for v, title, table in (("cg", "CG-SAE", "A1"), ("learned", "learned SAE", "A2")):
        res = r["variants"][v]
        rep.heading(f"Conditioning effectiveness, {title} (paper Table {table})")
        rep.text("Zero-shot accuracy of attribute classification. original: unedited embeddings, all images. "
                 "in caption: each image edited by its own caption, images whose caption names the category "
                 "(should stay at original). not in caption: the others (should fall to chance).")
        rows = [[c, res["conditioning"][c]["original"], PAPER_CONDITIONING[v][c][0], res["conditioning"][c]["in_caption"],
                 PAPER_CONDITIONING[v][c][1], res["conditioning"][c]["not_in_caption"], PAPER_CONDITIONING[v][c][2],
                 res["conditioning"][c]["chance"]] for c in EDITED]
        rep.table(["category", "original", "paper", "in caption", "paper", "not in caption", "paper", "chance"], rows)
        s = res["summary"]
        paper_excess = np.mean([PAPER_CONDITIONING[v][c][2] - 100 / len(VALUES[c]) for c in EDITED])
        rep.text(f"Mean over the five categories: original - in caption = {s['in_caption_gap']:.1f} points "
                 f"(target: within 2); not in caption - chance = {s['not_in_caption_excess']:.1f} points "
                 f"(paper: {paper_excess:.1f}; target <= {paper_excess:.1f}).")
        if n_seeds > 1:
            ms = r["seeds"][v]
            rep.text(f"Mean +- std over seeds {ms['seeds']} (the paper: mean of 5 runs); the tables above are seed "
                     f"{ms['seeds'][0]}'s.")
            rows = [[c, _pm(ms["conditioning"][c]["original"]), PAPER_CONDITIONING[v][c][0],
                     _pm(ms["conditioning"][c]["in_caption"]), PAPER_CONDITIONING[v][c][1],
                     _pm(ms["conditioning"][c]["not_in_caption"]), PAPER_CONDITIONING[v][c][2],
                     _pm(ms["leakage"][c]["follows_image"])] for c in EDITED]
            rep.table(["category", "original", "paper", "in caption", "paper", "not in caption", "paper",
                       "follows image (foreign caption)"], rows)
            sm = ms["summary"]
            rep.text(f"Over the seeds: in-caption gap {_pm(sm['in_caption_gap'])}, not-in-caption excess "
                     f"{_pm(sm['not_in_caption_excess'])}, follows image (worst category) "
                     f"{_pm(sm['follows_image_min'])}, TEVI i2t@1 {_pm(ms['retrieval']['i2t@1'])}, t2i@1 "
                     f"{_pm(ms['retrieval']['t2i@1'])}.")
        rep.text("Leakage control: each test image edited by a random other image's caption. 'keeps image': "
                 "accuracy against the image's own labels where the foreign caption names the category; "
                 "on pairs where the caption names a different value, how often the prediction follows the image "
                 "and how often it follows the caption (a mask that writes the caption's labels in would follow "
                 "the caption).")
        rows = [[c, res["conditioning"][c]["original"], res["conditioning"][c]["in_caption"],
                 res["leakage"][c]["image_accuracy"], res["leakage"][c]["follows_image"],
                 res["leakage"][c]["follows_caption"], res["leakage"][c]["n_pairs"]] for c in EDITED]
        rep.table(["category", "original", "own caption", "foreign caption: keeps image", "follows image",
                   "follows caption", "pairs"], rows)
        rep.text(f"Follows image: worst category {s['follows_image_min']:.1f}, mean {s['follows_image_mean']:.1f} "
                 f"(target: >= 90 on every category; an edit only removes information, so a category's follows-image "
                 f"cannot exceed much its original accuracy); follows caption, mean {s['follows_caption_mean']:.1f}.")
        rep.text(f"Alignment: mean positive-pair cosine {res['alignment']['before']:.3f} (CLIP) -> "
                 f"{res['alignment']['after']:.3f} (TEVI-edited); paper, COCO: 0.417 -> 0.470.")
        rec = res["retrieval"]
        rows = [[k, rec["base"][k], rec["tevi"][k], rec["tevi_rerank"][k]] for k in rec["base"]]
        rep.text(f"Retrieval on the test set (a retrieved image is correct when it has every attribute value the "
                 f"caption names; an image's retrieved caption likewise). TEVI-rerank re-scores CLIP's top "
                 f"{cfg.rerank_k}. Exhaustive TEVI scoring of {r['n_test']}x{r['n_test']} pairs took "
                 f"{res['seconds']['tevi_scores_exhaustive']:.2f} s, rerank {res['seconds']['tevi_rerank']:.2f} s.")
        rep.table(["recall", "CLIP", "TEVI", "TEVI-rerank"], rows)
    rep.figure("figures/positive_cosine.png", "Positive-pair cosine before and after TEVI editing")
    if "fused" in r:
        f = r["fused"]
        rep.heading("Fused rerank, learned SAE (issue 41)")
        rep.text(f"The learned-SAE mask fitted again with {100 * cfg.fusion_holdout:g}% of the training images held "
                 f"out; the rerank of CLIP's top {cfg.rerank_k} by alpha * CLIP + (1 - alpha) * TEVI, alpha = "
                 f"{f['alpha']:g} chosen on the held-out pairs (a caption relevant to each image that has its text): "
                 f"{f['note']}. On the test set (relevance as above):")
        t = f["test"]
        rep.table(["recall", "CLIP", "TEVI", "TEVI-rerank", "fused rerank"],
                  [[k, t["base"][k], t["tevi"][k], t["tevi_rerank"][k], t["fused"][k]] for k in t["base"]])
    cg = r["cg_sae"]
    rep.heading("CG-SAE probe (R1, R2)")
    rep.text(f"R1: ROC-AUC of each latent's activation for 'the image has concept c'. Mean own-concept AUC "
             f"{cg['auc_own_mean']:.3f} (target >= 0.95; paper: ~1). CG-SAE reconstruction FVU {cg['fvu']:.3f}.")
    rep.figure("figures/cg_sae_auc.png", "ROC-AUC of every CG-SAE latent against every concept")
    rep.figure("figures/cg_sae_top_images.png", "Top-activating test images per CG-SAE latent")
    rep.text("R2: zero the three thickthinning latents, decode, classify all categories. The ablated category "
             "should fall to chance; the others should lose at most 3 points (against the un-ablated reconstruction).")
    zs = cg["zero_shot"]
    rows = [[c, zs["original"][c], zs["reconstructed"][c], zs["ablated"][c], 100 / len(VALUES[c])] for c in CATEGORIES]
    rep.table(["category", "original", "reconstructed", "thickthinning ablated", "chance"], rows)
    s = r["sae"]
    rep.heading("SAE")
    pur = "n/a" if s["purity_mean"] is None else f"{s['purity_mean']:.1f}"
    rep.text(f"Learned SAE: {s['n_latents']} latents, K={s['k']}: test FVU {s['fvu']:.4f}, dead latents "
             f"{s['dead_latents']} ({100 * s['dead_fraction']:.0f}%; target <= 10%). Purity (best-concept ROC-AUC of "
             f"each live latent on {N_PURITY} training images; 100 = fires exactly on one attribute value): mean {pur}.")
    rep.table(["category", "original", "reconstructed"],
              [[c, zs["original"][c], s["zero_shot_rec"][c]] for c in CATEGORIES])
    rep.text("Model-selection sweep: FVU on the training embeddings (what to choose by) and on the test set, dead "
             "latents, mean purity of the live latents (training images), zero-shot accuracy of the test "
             "reconstructions:")
    rep.table(["K", "expansion", "latents", "FVU train", "FVU test", "dead", "purity", *CATEGORIES],
              [[w["k"], w["expansion"], w["n_latents"], w["fvu_train"], w["fvu"], w["dead_latents"],
                "n/a" if w["purity_mean"] is None else w["purity_mean"], *[w["zero_shot_rec"][c] for c in CATEGORIES]]
               for w in r["sae_sweep"]], digits=3)
    rep.timings(r["timings"])
    return rep

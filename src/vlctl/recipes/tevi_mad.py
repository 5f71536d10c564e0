"""Recipe `tevi-mad`: TEVI's controlled experiments on MAD (docs/methods.md §1; paper Tables A1/A2).

Stages: mad-clip's data -> train -> embed (shared: the same CLIP, found in a shared stage cache)
-> embed-train (training images and captions) -> sae (learned TopK SAE) and cg-sae (CLIP-guided,
one fixed latent per attribute value) -> tevi-learned / tevi-cg (the caption-conditioned mask
over each) -> sae-sweep (K x expansion) -> evaluate -> report.

Reported, for both SAE variants as the paper does: conditioning effectiveness (accuracy of the
original embeddings, of edited embeddings when the caption names the category and when it does
not, chance), the leakage control (each caption applied to a random other image), positive-pair
alignment before/after, retrieval recall (base CLIP, exhaustive TEVI, TEVI-rerank of CLIP's top
k), CG-SAE concept AUCs and the thickthinning ablation, and the SAE sweep.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.data.mad import CATEGORIES, VALUES, load_mad
from vlctl.eval import metrics
from vlctl.eval.editing import concept_auc_matrix, conditioning_accuracy, leakage_accuracy, top_activating
from vlctl.eval.metrics import caption_relevance, recall_from_order
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, read_json
from vlctl.methods.sae import fraction_variance_unexplained
from vlctl.recipes import mad_clip
from vlctl.recipes.runner import Runner
from vlctl.report import Report

EDITED = [c for c in CATEGORIES if c != "digit"]  # every caption names the digit: nothing to edit
VARIANTS = ("learned", "cg")
# TEVI paper, MAD: Table A2 (learned SAE) and Table A1 (CG-SAE), mean of 5 runs.
PAPER_CONDITIONING = {
    "learned": {"thickthinning": (92.9, 99.1, 54.3), "swelling": (96.2, 98.3, 57.0), "fracture": (92.8, 93.5, 59.1),
                "scaling": (99.7, 95.2, 57.1), "color": (100.0, 96.3, 22.6)},
    "cg": {"thickthinning": (92.9, 97.8, 35.4), "swelling": (96.2, 96.6, 50.2), "fracture": (92.8, 97.5, 50.5),
           "scaling": (99.7, 99.9, 60.7), "color": (100.0, 100.0, 34.2)},
}  # category -> (original, in caption, not in caption)


@dataclasses.dataclass(frozen=True)
class TeviMadRecipe:
    sae_k: int = opt(12, "learned SAE: active latents K (paper, MAD: 12)", ge=1, le=2**24)
    sae_expansion: int = opt(4, "learned SAE: d1 = expansion * d (paper, MAD: 1-4)", ge=1, le=1024)
    sae_aux_k: int = opt(18, "learned SAE: AuxK dead latents (paper, MAD: 18)", ge=0, le=2**24)
    sae_epochs: int = opt(100, "learned SAE: epochs (paper, MAD: 200)", ge=1, le=100_000)
    sae_lr: float = opt(1e-2, "SAE learning rate (paper, MAD: 1e-2)", gt=0, le=10)
    sae_batch_size: int = opt(512, "SAE batch size", ge=1, le=2**20)
    cg_k: int = opt(8, "CG-SAE: active latents (6 categories; on MAD K=6 lost fracture in the reconstruction "
                    "and K=12 leaked color into not-in-caption edits, measured)", ge=1, le=2**24)
    cg_epochs: int = opt(30, "CG-SAE: epochs", ge=1, le=100_000)
    mask_hidden: int = opt(512, "mask MLP hidden width", ge=1, le=16384)
    mask_temperature: float = opt(0.2, "mask sigmoid temperature (1 = plain sigmoid)", gt=0, le=100)
    mask_floor: float = opt(0.2, "mask values below this are zeroed at inference; 0.2 is the smallest of 0, 0.1, "
                            "0.2, 0.3 that brings the not-in-caption excess under 10.5 on the TRAINING embeddings "
                            "of both presets' CLIPs (measured)", ge=0, lt=1)
    mask_epochs: int = opt(10, "mask training epochs", ge=1, le=100_000)
    mask_lr: float = opt(1e-3, "mask learning rate", gt=0, le=10)
    mask_batch_size: int = opt(256, "mask training batch size", ge=1, le=16384)
    conditioning: str = opt("positive", "positive (Eq. 10, the paper's MAD setting) | negative (Eq. 11)",
                            choices=("positive", "negative", "both"))
    headline: str = opt("cg", "the variant whose numbers fill results.conditioning and arrays/conditioning.npz",
                        choices=VARIANTS)
    rerank_k: int = opt(100, "TEVI-rerank: re-score CLIP's top k", ge=1, le=10**6)
    sweep_k: tuple[int, ...] = opt((4, 6, 12), "SAE sweep: values of K", ge=1, le=2**24)
    sweep_expansion: tuple[int, ...] = opt((1, 4), "SAE sweep: expansion factors", ge=1, le=1024)
    sweep_epochs: int = opt(30, "SAE sweep: epochs per fit", ge=1, le=100_000)
    seed: int = opt(0, "seed of the SAE/mask fits and of the leakage permutation", ge=0, le=2**32 - 1)

    def __post_init__(self):
        if self.headline not in VARIANTS:
            raise ValueError(f"headline must be one of {VARIANTS}, got {self.headline!r}")


def load_preset(quick: bool) -> TeviMadRecipe:
    path = Path(__file__).with_name("tevi-mad.json")
    return config_from_dict(TeviMadRecipe, read_json(path)["quick" if quick else "full"], source=f"{path}")


# --- stages ------------------------------------------------------------------------------------


def _embed_train(encoder_dir: Path, train_dir: Path, work: Path) -> None:
    encoder, cache = mad_clip.embed_split(encoder_dir, train_dir, work)
    atomic_save_npz(work / "embeddings.npz", image_emb=np.asarray(cache.image_emb), text_emb=np.asarray(cache.text_emb))
    atomic_write_json(work / "encoder.json", {"encoder_id": encoder.id})


def _concepts(test_emb) -> np.ndarray:
    """(26, d): the class embeddings of every attribute value, in CATEGORIES x VALUES order."""
    return np.concatenate([test_emb[f"text_{c}"] for c in CATEGORIES])


def _fit_sae(cfg: TeviMadRecipe, variant: str, x: np.ndarray, concepts: np.ndarray, encoder_id: str, work: Path,
             k: int | None = None, expansion: int | None = None, epochs: int | None = None):
    from vlctl.methods.sae import SparseAutoencoder

    common = {"lr": cfg.sae_lr, "batch_size": cfg.sae_batch_size, "seed": cfg.seed, "dead_after": 20 * len(x) // 30}
    if variant == "cg":
        sae = SparseAutoencoder.from_concepts(concepts, k=cfg.cg_k, aux_k=0, epochs=cfg.cg_epochs, **common)
    else:
        sae = SparseAutoencoder(k=k or cfg.sae_k, expansion=expansion or cfg.sae_expansion, aux_k=cfg.sae_aux_k,
                                epochs=epochs or cfg.sae_epochs, **common)
    sae.fit(x, encoder_id)
    if work is not None:
        sae.save(work / "sae")
    return sae


def _fit_tevi(cfg: TeviMadRecipe, sae_dir: Path, train: dict, work: Path) -> None:
    import torch

    from vlctl.methods.sae import SparseAutoencoder
    from vlctl.methods.tevi import TEVI

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    sae = SparseAutoencoder.load(sae_dir)
    tevi = TEVI(hidden=cfg.mask_hidden, conditioning=cfg.conditioning, mask_temperature=cfg.mask_temperature,
                mask_floor=cfg.mask_floor, lr=cfg.mask_lr, epochs=cfg.mask_epochs, batch_size=cfg.mask_batch_size,
                seed=cfg.seed, out_dir=work / "run")
    tevi.fit(train["image_emb"], train["text_emb"], sae=sae)
    tevi.save(work / "tevi")


def _sweep(cfg: TeviMadRecipe, train: dict, test_img: np.ndarray, test_emb, img_vals, encoder_id: str,
           work: Path) -> None:
    rows = []
    for k in cfg.sweep_k:
        for e in cfg.sweep_expansion:
            sae = _fit_sae(cfg, "learned", train["image_emb"], None, encoder_id, None, k=k, expansion=e,
                           epochs=cfg.sweep_epochs)
            rec = sae.reconstruct(test_img).numpy()
            zs = {c: metrics.zero_shot_accuracy(rec, test_emb[f"text_{c}"], img_vals[:, ci])
                  for ci, c in enumerate(CATEGORIES)}
            rows.append({"k": k, "expansion": e, "n_latents": sae.config_.n_latents,
                         "fvu": float(fraction_variance_unexplained(test_img, rec)), "dead_latents": sae.n_dead_, "zero_shot_rec": zs})
    atomic_write_json(work / "sweep.json", rows)


# --- evaluation --------------------------------------------------------------------------------


def _evaluate_variant(cfg: TeviMadRecipe, tevi_dir: Path, test_emb, img_vals, cap_vals, out: Path, variant: str) -> dict:
    from vlctl.methods.tevi import TEVI

    tevi = TEVI.load(tevi_dir)
    img, txt = test_emb["image_emb"], test_emb["text_emb"]
    n = len(img)
    edited = tevi.edit(img, txt).numpy()
    perm = np.random.default_rng(cfg.seed).permutation(n)
    swapped = tevi.edit(img, txt[perm]).numpy()
    conditioning, leakage = {}, {}
    for c in EDITED:
        ci = CATEGORIES.index(c)
        conditioning[c] = conditioning_accuracy(img, edited, test_emb[f"text_{c}"], img_vals[:, ci], cap_vals[:, ci] >= 0)
        leakage[c] = leakage_accuracy(swapped, test_emb[f"text_{c}"], img_vals[:, ci], cap_vals[perm, ci])
    summary = {
        "in_caption_gap": float(np.mean([conditioning[c]["original"] - conditioning[c]["in_caption"] for c in EDITED])),
        "not_in_caption_excess": float(np.mean([conditioning[c]["not_in_caption"] - conditioning[c]["chance"]
                                                for c in EDITED])),
    }
    cos_before = metrics.positive_pair_cosine(img, txt)
    cos_after = metrics.positive_pair_cosine(edited, txt)

    base = img @ txt.T
    t0 = time.perf_counter()
    exact = tevi.scores(img, txt).numpy()
    exact_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rr_t2i = tevi.rerank(base, img, txt, k=cfg.rerank_k, direction="t2i").order.numpy()  # (P, Q)
    rr_i2t = tevi.rerank(base, img, txt, k=cfg.rerank_k, direction="i2t").order.numpy()  # (Q, P)
    rerank_s = time.perf_counter() - t0
    relevant = caption_relevance(img_vals, cap_vals)
    rec_base = metrics.recall_at_k_relevant(base, relevant)
    rec_exact = metrics.recall_at_k_relevant(exact, relevant)
    rec_rerank = {**{f"i2t{k}": v for k, v in recall_from_order(rr_i2t, relevant.T).items()},
                  **{f"t2i{k}": v for k, v in recall_from_order(rr_t2i, relevant).items()}}

    arrays = out / "arrays"
    cond_arrays = dict(original_emb=img, edited_emb=edited, swapped_emb=swapped, swap_perm=perm,
                       **{f"text_{c}": test_emb[f"text_{c}"] for c in EDITED},
                       **{f"label_{c}": img_vals[:, CATEGORIES.index(c)] for c in EDITED},
                       **{f"in_caption_{c}": cap_vals[:, CATEGORIES.index(c)] >= 0 for c in EDITED},
                       **{f"caption_label_{c}": cap_vals[:, CATEGORIES.index(c)] for c in EDITED})
    atomic_save_npz(arrays / f"conditioning_{variant}.npz", **cond_arrays)
    if variant == cfg.headline:
        atomic_save_npz(arrays / "conditioning.npz", **cond_arrays)
    atomic_save_npz(arrays / f"retrieval_{variant}.npz", base_scores=base, tevi_scores=exact, rerank_order_t2i=rr_t2i,
                    rerank_order_i2t=rr_i2t, image_values=img_vals, caption_values=cap_vals, edited_emb=edited,
                    text_emb=txt)
    return {
        "conditioning": conditioning, "summary": summary, "leakage": leakage,
        "alignment": {"before": float(cos_before.mean()), "after": float(cos_after.mean())},
        "retrieval": {"base": rec_base, "tevi": rec_exact, "tevi_rerank": rec_rerank},
        "seconds": {"tevi_scores_exhaustive": exact_s, "tevi_rerank": rerank_s},
        "_cos": (cos_before, cos_after),
    }


def _cg_probe(cg_sae_dir: Path, test_emb, img_vals, out: Path) -> tuple[dict, np.ndarray, np.ndarray]:
    """R1 (concept AUCs) and R2 (ablate the thickthinning latents, re-classify everything)."""
    from vlctl.methods.sae import SparseAutoencoder

    sae = SparseAutoencoder.load(cg_sae_dir)
    img = test_emb["image_emb"]
    z = sae.encode(img)
    present = np.concatenate([img_vals[:, [ci]] == np.arange(len(VALUES[c]))[None] for ci, c in enumerate(CATEGORIES)],
                             axis=1)  # (N, 26)
    auc = concept_auc_matrix(z.numpy(), present)
    thick = [i for i, (c, _) in enumerate((c, v) for c in CATEGORIES for v in VALUES[c]) if c == "thickthinning"]
    z_ablate = z.clone()
    z_ablate[:, thick] = 0
    rec = sae.decode(z).numpy()
    rec_ablated = sae.decode(z_ablate).numpy()
    zs = {name: {c: metrics.zero_shot_accuracy(e, test_emb[f"text_{c}"], img_vals[:, ci]) for ci, c in enumerate(CATEGORIES)}
          for name, e in (("original", img), ("reconstructed", rec), ("ablated", rec_ablated))}
    atomic_save_npz(out / "arrays" / "cg_sae.npz", latents=z.numpy(), concept_present=present, auc=auc,
                    concepts=np.array([f"{c}={v}" for c in CATEGORIES for v in VALUES[c]]),
                    reconstructed_emb=rec, ablated_emb=rec_ablated, thickthinning_latents=np.array(thick),
                    **{f"text_{c}": test_emb[f"text_{c}"] for c in CATEGORIES},
                    **{f"label_{c}": img_vals[:, ci] for ci, c in enumerate(CATEGORIES)})
    result = {
        "auc_own_mean": float(np.mean(np.diag(auc))) / 100.0,
        "auc_own": np.diag(auc).tolist(),
        "zero_shot": zs,
        "ablation_thickthinning": zs["ablated"],
        "fvu": float(fraction_variance_unexplained(img, rec)),
    }
    return result, auc, z.numpy()


def run(out: Path, quick: bool = False, force: bool = False, cfg: TeviMadRecipe | None = None,
        clip_cfg: mad_clip.MadClipRecipe | None = None, stages: Path | None = None,
        from_scratch: bool = False) -> Path:
    cfg = cfg or load_preset(quick)
    clip_cfg = clip_cfg or mad_clip.load_preset(quick)
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch)
    t_start = time.perf_counter()
    data_dir, train_dir, embed_dir, train_key = mad_clip.clip_stages(runner, clip_cfg)
    encoder_id = read_json(embed_dir / "encoder.json")["encoder_id"]
    train_emb_dir = runner.stage("embed-train", train_key,
                                 lambda w: _embed_train(train_dir / "model", data_dir / "train", w))
    train = dict(np.load(train_emb_dir / "embeddings.npz"))
    test_emb = dict(np.load(embed_dir / "embeddings.npz"))
    concepts = _concepts(test_emb)
    labels = load_mad(data_dir / "test")["labels"]
    img_vals, cap_vals = mad_clip.image_values(labels), mad_clip.caption_values(labels)

    rc = config_to_dict(cfg)
    sae_key = {"clip": train_key, "k": cfg.sae_k, "expansion": cfg.sae_expansion, "aux_k": cfg.sae_aux_k,
               "epochs": cfg.sae_epochs, "lr": cfg.sae_lr, "batch": cfg.sae_batch_size, "seed": cfg.seed}
    cg_key = {"clip": train_key, "k": cfg.cg_k, "epochs": cfg.cg_epochs, "lr": cfg.sae_lr, "batch": cfg.sae_batch_size,
              "seed": cfg.seed, "concepts": "prompt-ensemble, centred"}
    sae_dirs = {
        "learned": runner.stage("sae", sae_key, lambda w: _fit_sae(cfg, "learned", train["image_emb"], concepts,
                                                                    encoder_id, w)),
        "cg": runner.stage("cg-sae", cg_key, lambda w: _fit_sae(cfg, "cg", train["image_emb"], concepts, encoder_id, w)),
    }
    mask_key = {k: rc[k] for k in ("mask_hidden", "mask_temperature", "mask_floor", "mask_epochs", "mask_lr",
                                   "mask_batch_size", "conditioning", "seed")}
    tevi_dirs = {
        v: runner.stage(f"tevi-{v}", {"sae": sae_key if v == "learned" else cg_key, **mask_key},
                        lambda w, v=v: _fit_tevi(cfg, sae_dirs[v] / "sae", train, w))
        for v in VARIANTS
    }
    sweep_key = {"clip": train_key, "k": list(cfg.sweep_k), "expansion": list(cfg.sweep_expansion),
                 "epochs": cfg.sweep_epochs, "aux_k": cfg.sae_aux_k, "lr": cfg.sae_lr, "seed": cfg.seed}
    sweep_dir = runner.stage("sae-sweep", sweep_key, lambda w: _sweep(cfg, train, test_emb["image_emb"], test_emb,
                                                                      img_vals, encoder_id, w))

    # Evaluate.
    t_eval = time.perf_counter()
    variants = {v: _evaluate_variant(cfg, tevi_dirs[v] / "tevi", test_emb, img_vals, cap_vals, out, v)
                for v in VARIANTS}
    cg, auc, cg_latents = _cg_probe(sae_dirs["cg"] / "sae", test_emb, img_vals, out)
    from vlctl.methods.sae import SparseAutoencoder

    sae = SparseAutoencoder.load(sae_dirs["learned"] / "sae")
    rec = sae.reconstruct(test_emb["image_emb"]).numpy()
    sae_stats = {"fvu": float(fraction_variance_unexplained(test_emb["image_emb"], rec)), "dead_latents": sae.n_dead_,
                 "n_latents": sae.config_.n_latents, "k": sae.config_.k,
                 "zero_shot_rec": {c: metrics.zero_shot_accuracy(rec, test_emb[f"text_{c}"], img_vals[:, ci])
                                   for ci, c in enumerate(CATEGORIES)}}
    cos = {v: variants[v].pop("_cos") for v in VARIANTS}
    head = variants[cfg.headline]
    _figures(out, cos, auc, cg_latents, data_dir / "test")
    atomic_write_text(out / "arrays" / "README.md", ARRAYS_README)
    runner.timings["evaluate"] = {"seconds": time.perf_counter() - t_eval, "cached": False}

    results = {
        "recipe": "tevi-mad",
        "quick": quick,
        "config": rc,
        "clip_config": config_to_dict(clip_cfg),
        "encoder_id": encoder_id,
        "n_test": len(test_emb["image_emb"]),
        "headline": cfg.headline,
        "conditioning": {c: {**head["conditioning"][c]} for c in EDITED},
        "conditioning_summary": head["summary"],
        "leakage": head["leakage"],
        "alignment": head["alignment"],
        "retrieval": head["retrieval"],
        "variants": variants,
        "cg_sae": cg,
        "sae": sae_stats,
        "sae_sweep": read_json(sweep_dir / "sweep.json"),
        "paper_conditioning": PAPER_CONDITIONING,
        "timings": {**runner.timings, "total_seconds": time.perf_counter() - t_start},
    }
    atomic_write_json(out / "results.json", results)
    _report(cfg, results, quick).write(out)
    return out / "report.md"


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
- `cg_sae.npz`: `latents` (N, 26) CG-SAE codes, `concept_present` (N, 26), `auc` (26, 26) =
  `editing.concept_auc_matrix(latents, concept_present)` (percent), `reconstructed_emb`,
  `ablated_emb` (thickthinning latents zeroed), and `text_c`, `label_c` for zero-shot accuracy.
"""


def _report(cfg: TeviMadRecipe, r: dict, quick: bool) -> Report:
    rep = Report(f"tevi-mad{' (--quick)' if quick else ''}: TEVI's controlled experiments on MAD")
    rep.text(f"CLIP: `{r['encoder_id']}` (the mad-clip recipe's model). Test set: {r['n_test']} held-out images. "
             "Two SAE variants, as in the paper: a learned TopK SAE and a CLIP-guided SAE (CG-SAE: one latent per "
             "attribute value, decoder rows fixed to the value's text embedding, centred on the concepts' mean). "
             f"Mask: 3-layer MLP, {cfg.conditioning} conditioning, sigmoid temperature {cfg.mask_temperature}, "
             f"mask values below {cfg.mask_floor} zeroed at inference. "
             "All numbers are percentages unless noted, recomputable from arrays/ (arrays/README.md).")
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
                 f"(paper: {paper_excess:.1f}; target <= 10.5).")
        rep.text("Leakage control: each test image edited by a random other image's caption. 'keeps image': "
                 "accuracy against the image's own labels where the foreign caption names the category; "
                 "on pairs where the caption names a different value, how often the prediction follows the image "
                 "and how often it follows the caption (a mask that writes the caption's labels in would follow "
                 "the caption).")
        rows = [[c, res["conditioning"][c]["in_caption"], res["leakage"][c]["image_accuracy"],
                 res["leakage"][c]["follows_image"], res["leakage"][c]["follows_caption"], res["leakage"][c]["n_pairs"]]
                for c in EDITED]
        rep.table(["category", "own caption", "foreign caption: keeps image", "follows image", "follows caption",
                   "pairs"], rows)
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
    rep.text(f"Learned SAE: {s['n_latents']} latents, K={s['k']}: test FVU {s['fvu']:.4f}, dead latents "
             f"{s['dead_latents']}.")
    rep.table(["category", "original", "reconstructed"],
              [[c, zs["original"][c], s["zero_shot_rec"][c]] for c in CATEGORIES])
    rep.text("Model-selection sweep (test-set FVU, dead latents, zero-shot accuracy of the reconstructions):")
    rep.table(["K", "expansion", "latents", "FVU", "dead", *CATEGORIES],
              [[w["k"], w["expansion"], w["n_latents"], w["fvu"], w["dead_latents"],
                *[w["zero_shot_rec"][c] for c in CATEGORIES]] for w in r["sae_sweep"]], digits=3)
    rep.heading("Timings")
    rep.table(["stage", "seconds", "cached"],
              [[k, v["seconds"], v["cached"]] for k, v in r["timings"].items() if isinstance(v, dict)]
              + [["total", r["timings"]["total_seconds"], ""]])
    return rep

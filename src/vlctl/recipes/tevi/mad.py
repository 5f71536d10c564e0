"""Recipe `tevi-mad`: TEVI's controlled experiments on MAD (docs/methods.md §1; paper Tables A1/A2).

Stages: mad-clip's data -> train -> embed (shared: the same CLIP, found in a shared stage cache)
-> embed-train (training images and captions) -> sae (learned TopK SAE), cg-sae (CLIP-guided,
one fixed latent per attribute value) and sae-random (`random_reading`) -> tevi-learned / tevi-cg
/ tevi-random (the caption-conditioned mask over each) -> tevi-learned-fused / tevi-cg-fused (the
mask again, images held out for the fusion weight) -> sae-sweep (K x expansion) -> evaluate -> report.

Reported, for both SAE variants as the paper does: conditioning effectiveness (accuracy of the
original embeddings, of edited embeddings when the caption names the category and when it does
not, chance), the leakage control (each caption applied to a random other image), positive-pair
alignment before/after, retrieval recall (base CLIP, exhaustive TEVI, TEVI-rerank of CLIP's top
k), CG-SAE concept AUCs and the thickthinning ablation, and the SAE sweep.

The leakage control is first-class (issue 23): per category, on mismatched pairs (a foreign
caption naming another value), how often the edited embedding follows the image and how often
the caption, in every variant's summary. `cg_group_mask` trains the CG-SAE's mask per attribute
category (the presets' choice, measured on held-out training pairs: experiments/tevi_levers.py);
`n_seeds` > 1 refits SAE and mask per seed and reports Tables A1/A2 as mean +- std.

Presets (tevi-mad.json, issue 41): the paper's configuration is the default and the headline. The
learned SAE is 26 latents whose decoder starts at the values' normalised centred text embeddings and
is trained (`sae_init=concepts`), under the paper's mask and schedule (hidden 256, plain sigmoid, no
floor, AdamW 1e-2, 25 epochs with 5 of warmup, Eq. 10); beside it the CG-SAE (Table A1's proof, the
paper's free per-latent mask) and the random-start 26-latent SAE (`random_reading`: the other
reading of "keep them learnable"), each with the leakage and retrieval controls, and a fused rerank
for the learned SAE and the CG-SAE. The full preset fine-tunes the text tower beside the mask at
1e-6 (`text_finetune`); --quick leaves it frozen: one fine-tuned mask fit took 100 s on the shared
2 cores against 12 s frozen, and the five fits would take make demo past 10 minutes (the
diagnosis measured fine-tuning moving no figure by more than 2.5 points: docs/findings.md).

Figures, arrays/README.md and report.md: vlctl.recipes.tevi.mad_report; the SAEs' own probes
(FVU, purity, CG-SAE R1/R2): vlctl.recipes.tevi.mad_sae.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.data.mad import CATEGORIES, VALUES, load_mad
from vlctl.eval import metrics
from vlctl.eval.editing import (
    conditioning_accuracy,
    latent_purity,
    leakage_accuracy,
)
from vlctl.eval.metrics import caption_relevance, recall_from_order
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, read_json
from vlctl.methods.sae.rows import fraction_variance_unexplained
from vlctl.recipes.runner import Runner
from vlctl.recipes.tevi import mad_clip
from vlctl.recipes.tevi.mad_report import (
    ARRAYS_README,
    EDITED,
    N_PURITY,
    PAPER_CONDITIONING,
    _figures,
    _report,
)
from vlctl.recipes.tevi.mad_sae import _cg_probe, _nanmean, _present, _sae_stats
from vlctl.threads import torch_threads

VARIANTS = ("learned", "cg")  # the headline can be either; "random" is a reported reading beside them
FUSED = ("learned", "cg")  # the variants whose mask is fitted again with held-out images for the fused rerank


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
    mask_mass_coef: float = opt(0.0, "weight of a penalty on the mask's mean value (TeviConfig.mask_mass_coef)", ge=0,
                                le=1000)
    contradicting_batches: bool = opt(False, "each mask-training batch also holds, for every pair, a training caption "
                                      "that names one attribute with another value (TEVI.fit partners)")
    cg_group_mask: bool = opt(False, "CG-SAE: one mask value per attribute category, shared by its value latents "
                              "(TeviConfig.latent_groups); False: the paper's free per-latent mask")
    sae_init: str = opt("random", "learned SAE's start: random (expansion * d latents) | concepts (one latent per "
                        "attribute value, 26, the decoder rows started at the values' normalised centred text "
                        "embeddings as the CG-SAE's, then every weight trained: TEVI §4.2 'we follow the setup from "
                        "Sec. 3.3; however, we no longer fix the decoder weights')", choices=("random", "concepts"),
                        added=True)
    mask_warmup_epochs: int = opt(0, "mask: linear lr warmup over this many epochs (the paper, MAD: 5 of 25)", ge=0,
                                  le=100_000, added=True)
    text_finetune: bool = opt(False, "fine-tune the CLIP text tower beside the mask, through the mask's loss, at "
                              "text_lr (the paper: 'we train f_m and fine-tune the CLIP text encoder f_t'); the "
                              "test captions and class texts are then embedded by the fine-tuned tower", added=True)
    text_lr: float = opt(1e-6, "learning rate of the fine-tuned text tower (the paper, MAD: 1e-6)", ge=0, le=10,
                         added=True)
    random_reading: bool = opt(False, "also fit and report variant 'random': a learned SAE with as many latents as "
                               "concepts (26), randomly started, under the same mask (the other reading of the "
                               "paper's 'keep them learnable')", added=True)
    sae_resample_every: int = opt(0, "learned SAE: re-initialise dead latents every this many steps (0: never)",
                                  ge=0, le=10**9)
    headline: str = opt("cg", "the variant whose numbers fill results.conditioning and arrays/conditioning.npz "
                        "(the presets: learned, the paper's method)", choices=VARIANTS)
    rerank_k: int = opt(100, "TEVI-rerank: re-score CLIP's top k", ge=1, le=10**6)
    fusion_holdout: float = opt(0.1, "the fused rerank's learned-SAE mask (stage tevi-learned-fused) holds out this "
                                "share of the training images; its fusion weight alpha is chosen on their pairs",
                                ge=0, lt=1, added=True)
    sweep_k: tuple[int, ...] = opt((4, 6, 12), "SAE sweep: values of K", ge=1, le=2**24)
    sweep_expansion: tuple[int, ...] = opt((1, 4), "SAE sweep: expansion factors", ge=1, le=1024)
    sweep_epochs: int = opt(30, "SAE sweep: epochs per fit", ge=1, le=100_000)
    seed: int = opt(0, "seed of the SAE/mask fits and of the leakage permutation", ge=0, le=2**32 - 1)
    fit_threads: int = opt(1, "torch threads of the SAE and mask fits: their steps are a few small matmuls (d=18), "
                           "which a second thread slows (docs/findings.md, 'Threads on a shared machine')",
                           ge=1, le=1024)
    n_seeds: int = opt(1, "SAE + mask fits with seeds seed .. seed+n_seeds-1; Tables A1/A2 are their mean +- std "
                       "(the paper: mean of 5 runs); arrays/conditioning*.npz and retrieval*.npz are seed `seed`'s",
                       ge=1, le=100)

    def __post_init__(self):
        if self.headline not in VARIANTS:
            raise ValueError(f"headline must be one of {VARIANTS}, got {self.headline!r}")


def fitted_variants(cfg: TeviMadRecipe) -> tuple[str, ...]:
    """The variants a run fits and reports: the learned SAE, the CG-SAE and, with `random_reading`,
    the random-start SAE."""
    return (*VARIANTS, "random") if cfg.random_reading else VARIANTS


def load_preset(quick: bool) -> TeviMadRecipe:
    path = Path(__file__).with_name("tevi-mad.json")
    return config_from_dict(TeviMadRecipe, read_json(path)["quick" if quick else "full"], source=f"{path}")


# --- stages ------------------------------------------------------------------------------------


def contradicting_partners(cap_vals: np.ndarray, seed: int = 0) -> np.ndarray:
    """(n,) for each caption a random other row whose caption names the same categories with the
    same values except exactly one non-digit category, whose value differs; -1 when none exists.

    cap_vals: (n, 6) value index per category, -1 = not named (`mad_clip.caption_values`). These
    are the hard contradicting captions of `contradicting_batches` (TEVI.fit's partners)."""
    rng = np.random.default_rng(seed)
    keys = list(map(tuple, np.asarray(cap_vals).tolist()))
    rows: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        rows.setdefault(key, []).append(i)
    out = np.full(len(keys), -1, dtype=np.int64)
    for i, key in enumerate(keys):
        cands = [j for ci, c in enumerate(CATEGORIES) if c != "digit" and key[ci] >= 0
                 for v in range(len(VALUES[c])) if v != key[ci]
                 for j in rows.get(key[:ci] + (v,) + key[ci + 1:], ())]
        if cands:
            out[i] = cands[rng.integers(len(cands))]
    return out


def concept_categories() -> tuple[int, ...]:
    """The category index of each CG-SAE latent (CATEGORIES x VALUES order, as `_concepts`)."""
    return tuple(ci for ci, c in enumerate(CATEGORIES) for _ in VALUES[c])


def _embed_train(encoder_dir: Path, train_dir: Path, work: Path) -> None:
    encoder, cache = mad_clip.embed_split(encoder_dir, train_dir, work)
    atomic_save_npz(work / "embeddings.npz", image_emb=np.asarray(cache.image_emb), text_emb=np.asarray(cache.text_emb))
    atomic_write_json(work / "encoder.json", {"encoder_id": encoder.id})


def _concepts(test_emb) -> np.ndarray:
    """(26, d): the class embeddings of every attribute value, in CATEGORIES x VALUES order."""
    return np.concatenate([test_emb[f"text_{c}"] for c in CATEGORIES])


def _fit_sae(cfg: TeviMadRecipe, variant: str, x: np.ndarray, concepts: np.ndarray, encoder_id: str, work: Path,
             k: int | None = None, expansion: int | None = None, epochs: int | None = None, seed: int | None = None):
    from vlctl.methods.sae.model import SparseAutoencoder

    common = {"lr": cfg.sae_lr, "batch_size": cfg.sae_batch_size, "seed": cfg.seed if seed is None else seed,
              "dead_after": 20 * len(x) // 30}
    if variant == "cg":
        sae = SparseAutoencoder.from_concepts(concepts, k=cfg.cg_k, aux_k=0, epochs=cfg.cg_epochs, **common)
    elif variant == "random":  # as many latents as concepts, random start: the other reading
        sae = SparseAutoencoder(k=cfg.sae_k, d_latent=len(concepts), aux_k=cfg.sae_aux_k, epochs=cfg.sae_epochs,
                                resample_every=cfg.sae_resample_every, **common)
    elif cfg.sae_init == "concepts" and expansion is None:  # the sweep's SAEs stay random-started
        sae = SparseAutoencoder.from_concepts(concepts, fixed=False, k=k or cfg.sae_k, aux_k=cfg.sae_aux_k,
                                              epochs=epochs or cfg.sae_epochs, resample_every=cfg.sae_resample_every,
                                              **common)
    else:
        sae = SparseAutoencoder(k=k or cfg.sae_k, expansion=expansion or cfg.sae_expansion, aux_k=cfg.sae_aux_k,
                                epochs=epochs or cfg.sae_epochs, resample_every=cfg.sae_resample_every, **common)
    with torch_threads(cfg.fit_threads):
        sae.fit(x, encoder_id)
    if work is not None:
        sae.save(work / "sae")
    return sae


def _fit_tevi(cfg: TeviMadRecipe, sae_dir: Path, train: dict, work: Path, variant: str = "cg",
              partners: np.ndarray | None = None, seed: int | None = None, holdout: float = 0.0,
              text: tuple | None = None) -> None:
    """Fit the mask over the SAE in `sae_dir` on the training pairs; with `text` = (text tower,
    (n, L) caption tokens) the tower is fine-tuned beside it (`text_finetune`)."""
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    sae = SparseAutoencoder.load(sae_dir)
    groups = concept_categories() if variant == "cg" and cfg.cg_group_mask else None
    tevi = TEVI(hidden=cfg.mask_hidden, conditioning=cfg.conditioning, mask_temperature=cfg.mask_temperature,
                mask_floor=cfg.mask_floor, lr=cfg.mask_lr, epochs=cfg.mask_epochs, batch_size=cfg.mask_batch_size,
                mask_mass_coef=cfg.mask_mass_coef, latent_groups=groups, seed=cfg.seed if seed is None else seed,
                warmup_epochs=cfg.mask_warmup_epochs, text_lr=cfg.text_lr,
                holdout=holdout, out_dir=work / "run")  # holdout 0: every training pair, as before issue 41
    captions = {"text_emb": train["text_emb"]} if text is None else {"text_encoder": text[0], "texts": text[1]}
    with torch_threads(cfg.fit_threads):
        tevi.fit(train["image_emb"], sae=sae, partners=partners, **captions)
    tevi.save(work / "tevi")


def _sweep(cfg: TeviMadRecipe, train: dict, test_img: np.ndarray, test_emb, img_vals, encoder_id: str,
           work: Path, train_vals: np.ndarray) -> None:
    """Fit one learned SAE per (K, expansion); record test FVU and reconstructed zero-shot (reported)
    and the criteria to choose by, on TRAINING embeddings: FVU, dead latents and per-latent purity
    (best-concept AUC of each live latent, on the first len(train_vals) training images)."""
    rows = []
    present = _present(train_vals)
    x_pur = train["image_emb"][: len(train_vals)]
    for k in cfg.sweep_k:
        for e in cfg.sweep_expansion:
            sae = _fit_sae(cfg, "learned", train["image_emb"], None, encoder_id, None, k=k, expansion=e,
                           epochs=cfg.sweep_epochs)
            rec = sae.reconstruct(test_img).numpy()
            zs = {c: metrics.zero_shot_accuracy(rec, test_emb[f"text_{c}"], img_vals[:, ci])
                  for ci, c in enumerate(CATEGORIES)}
            purity, _ = latent_purity(sae.encode(x_pur).numpy(), present)
            rows.append({"k": k, "expansion": e, "n_latents": sae.config_.n_latents,
                         "fvu": float(fraction_variance_unexplained(test_img, rec)), "fvu_train": float(sae.fvu_),
                         "dead_latents": sae.n_dead_, "dead_fraction": sae.n_dead_ / sae.config_.n_latents,
                         "purity_mean": _nanmean(purity), "purity": [None if np.isnan(p) else float(p) for p in purity],
                         "zero_shot_rec": zs})
    atomic_write_json(work / "sweep.json", rows)


# --- evaluation --------------------------------------------------------------------------------


def _evaluate_variant(cfg: TeviMadRecipe, tevi_dir: Path, test_emb, img_vals, cap_vals, out: Path, variant: str,
                      seed: int | None = None, text: tuple | None = None) -> dict:
    """Every figure of one variant's TEVI. Seed `cfg.seed` (the primary fit) writes the full arrays;
    another seed writes `conditioning_<variant>_seed<s>.npz` and the top-10 orders of its exhaustive
    scores (`retrieval_<variant>_seed<s>.npz`), enough to recompute its conditioning, leakage and
    R@1/5/10, and skips the rerank. With `text` = (a text tower of the CLIP's architecture, its
    tokenize, the test captions) the TEVI's own fine-tuned tower embeds the captions and class texts.

    Zero-shot is read with both class texts: `text_<c>` (the prompt ensemble, the headline as
    before) and `word_<c>` (the bare values, the paper's): the summary's `*_words` figures."""

    seed = cfg.seed if seed is None else seed
    primary = seed == cfg.seed
    tevi, test_emb = _load_tevi(tevi_dir, test_emb, text)
    img, txt = test_emb["image_emb"], test_emb["text_emb"]
    n = len(img)
    edited = tevi.edit(img, txt).numpy()
    perm = np.random.default_rng(cfg.seed).permutation(n)
    swapped = tevi.edit(img, txt[perm]).numpy()
    conditioning, leakage, words, leakage_words = {}, {}, {}, {}
    for c in EDITED:
        ci = CATEGORIES.index(c)
        conditioning[c] = conditioning_accuracy(img, edited, test_emb[f"text_{c}"], img_vals[:, ci], cap_vals[:, ci] >= 0)
        leakage[c] = leakage_accuracy(swapped, test_emb[f"text_{c}"], img_vals[:, ci], cap_vals[perm, ci])
        words[c] = conditioning_accuracy(img, edited, test_emb[f"word_{c}"], img_vals[:, ci], cap_vals[:, ci] >= 0)
        leakage_words[c] = leakage_accuracy(swapped, test_emb[f"word_{c}"], img_vals[:, ci], cap_vals[perm, ci])
    summary = {
        "in_caption_gap": float(np.mean([conditioning[c]["original"] - conditioning[c]["in_caption"] for c in EDITED])),
        "not_in_caption_excess": float(np.mean([conditioning[c]["not_in_caption"] - conditioning[c]["chance"]
                                                for c in EDITED])),
        # The leakage control's headline: an edit that keeps what the image shows follows the image
        # on every category when the caption names another value (issue 23's target: >= 90).
        "follows_image_min": float(min(leakage[c]["follows_image"] for c in EDITED)),
        "follows_image_mean": float(np.mean([leakage[c]["follows_image"] for c in EDITED])),
        "follows_caption_mean": float(np.mean([leakage[c]["follows_caption"] for c in EDITED])),
        # The same read with the bare value words as class texts (the paper's zero-shot classes).
        "in_caption_gap_words": float(np.mean([words[c]["original"] - words[c]["in_caption"] for c in EDITED])),
        "not_in_caption_excess_words": float(np.mean([words[c]["not_in_caption"] - words[c]["chance"] for c in EDITED])),
        "follows_image_min_words": float(min(leakage_words[c]["follows_image"] for c in EDITED)),
        "follows_caption_mean_words": float(np.mean([leakage_words[c]["follows_caption"] for c in EDITED])),
    }
    cos_before = metrics.positive_pair_cosine(img, txt)
    cos_after = metrics.positive_pair_cosine(edited, txt)

    base = img @ txt.T
    t0 = time.perf_counter()
    exact = tevi.scores(img, txt).numpy()
    exact_s = time.perf_counter() - t0
    relevant = caption_relevance(img_vals, cap_vals)
    cond_arrays = dict(original_emb=img, edited_emb=edited, swapped_emb=swapped, swap_perm=perm,
                       **{f"text_{c}": test_emb[f"text_{c}"] for c in EDITED},
                       **{f"word_{c}": test_emb[f"word_{c}"] for c in EDITED},
                       **{f"label_{c}": img_vals[:, CATEGORIES.index(c)] for c in EDITED},
                       **{f"in_caption_{c}": cap_vals[:, CATEGORIES.index(c)] >= 0 for c in EDITED},
                       **{f"caption_label_{c}": cap_vals[:, CATEGORIES.index(c)] for c in EDITED})
    arrays = out / "arrays"
    if not primary:
        top_t2i = _top_order(exact, 10)  # (10, N_texts): each text's best images
        top_i2t = _top_order(exact.T, 10)  # (10, N_images)
        atomic_save_npz(arrays / f"conditioning_{variant}_seed{seed}.npz", **cond_arrays)
        atomic_save_npz(arrays / f"retrieval_{variant}_seed{seed}.npz", top_order_t2i=top_t2i, top_order_i2t=top_i2t,
                        image_values=img_vals, caption_values=cap_vals)
        rec = _order_recall(top_t2i, top_i2t, relevant)
        return {"seed": seed, "conditioning": conditioning, "conditioning_words": words, "summary": summary,
                "leakage": leakage,
                "alignment": {"before": float(cos_before.mean()), "after": float(cos_after.mean())},
                "retrieval": {"tevi": rec}}
    t0 = time.perf_counter()
    # TEVI alone (alpha 0): the unfused rerank
    rr_t2i = tevi.rerank(base, img, txt, k=cfg.rerank_k, direction="t2i", alpha=0.0).order.numpy()  # (P, Q)
    rr_i2t = tevi.rerank(base, img, txt, k=cfg.rerank_k, direction="i2t", alpha=0.0).order.numpy()  # (Q, P)
    rerank_s = time.perf_counter() - t0
    rec_base = metrics.recall_at_k_relevant(base, relevant)
    rec_exact = metrics.recall_at_k_relevant(exact, relevant)
    rec_rerank = _order_recall(rr_t2i, rr_i2t, relevant)

    atomic_save_npz(arrays / f"conditioning_{variant}.npz", **cond_arrays)
    if variant == cfg.headline:
        atomic_save_npz(arrays / "conditioning.npz", **cond_arrays)
    atomic_save_npz(arrays / f"retrieval_{variant}.npz", base_scores=base, tevi_scores=exact, rerank_order_t2i=rr_t2i,
                    rerank_order_i2t=rr_i2t, image_values=img_vals, caption_values=cap_vals, edited_emb=edited,
                    text_emb=txt)
    return {
        "seed": seed, "conditioning": conditioning, "conditioning_words": words, "summary": summary,
        "leakage": leakage,
        "alignment": {"before": float(cos_before.mean()), "after": float(cos_after.mean())},
        "retrieval": {"base": rec_base, "tevi": rec_exact, "tevi_rerank": rec_rerank},
        "seconds": {"tevi_scores_exhaustive": exact_s, "tevi_rerank": rerank_s},
        "_cos": (cos_before, cos_after),
    }


def _load_tevi(tevi_dir: Path, test_emb: dict, text: tuple | None):
    """(TEVI, test embeddings): a TEVI that fine-tuned its text tower loads it into a copy of
    text[0] and re-embeds the test texts with it (`finetuned_texts`)."""
    import copy

    from vlctl.methods.tevi.estimator import TEVI

    tevi = TEVI.load(tevi_dir, text_encoder=None if text is None else copy.deepcopy(text[0]))
    if tevi.text_encoder_ is not None:
        test_emb = {**test_emb, **finetuned_texts(tevi.text_encoder_, text[1], text[2])}
    return tevi, test_emb


def finetuned_texts(text_tower, tokenize, captions: list[str]) -> dict[str, np.ndarray]:
    """The test captions (`text_emb`) and class texts (`text_<c>`, `word_<c>`) embedded by a
    (fine-tuned) TinyCLIP text tower, normalised, as the embed stage's; `tokenize`: texts -> ids."""
    import torch

    @torch.no_grad()
    def encode(texts: list[str]) -> np.ndarray:
        return torch.nn.functional.normalize(text_tower(tokenize(texts)), dim=-1).numpy()

    return {"text_emb": encode(captions), **mad_clip.class_embeddings(encode)}


def _order_recall(order_t2i: np.ndarray, order_i2t: np.ndarray, relevant: np.ndarray) -> dict:
    """R@1/5/10 both ways of rankings given as orders (t2i: (m, N_texts), i2t: (m, N_images))."""
    return {**{f"i2t{k}": v for k, v in recall_from_order(order_i2t, relevant.T).items()},
            **{f"t2i{k}": v for k, v in recall_from_order(order_t2i, relevant).items()}}


def _evaluate_fused(cfg: TeviMadRecipe, tevi_dir: Path, test_emb, img_vals, cap_vals, out: Path, variant: str,
                    text: tuple | None = None) -> dict:
    """The fused rerank (issue 41) of `variant`'s mask fitted with held-out images: on the test set,
    CLIP, TEVI alone (exhaustive), TEVI-rerank (alpha 0) and the fused rerank at the model's alpha,
    from the arrays it saves (arrays/retrieval_fused_<variant>.npz); beside them the model's held-out figures."""
    tevi, test_emb = _load_tevi(tevi_dir, test_emb, text)
    img, txt = test_emb["image_emb"], test_emb["text_emb"]
    base = img @ txt.T
    relevant = caption_relevance(img_vals, cap_vals)
    orders = {f"{name}_order_{d}": tevi.rerank(base, img, txt, k=cfg.rerank_k, direction=d, alpha=a).order.numpy()
              for name, a in (("rerank", 0.0), ("fused", None)) for d in ("t2i", "i2t")}
    exact = tevi.scores(img, txt).numpy()
    atomic_save_npz(out / "arrays" / f"retrieval_fused_{variant}.npz", base_scores=base, tevi_scores=exact, **orders,
                    image_values=img_vals, caption_values=cap_vals, alpha=np.float64(tevi.alpha_))
    test = {"base": metrics.recall_at_k_relevant(base, relevant), "tevi": metrics.recall_at_k_relevant(exact, relevant),
            **{name: _order_recall(orders[f"{o}_order_t2i"], orders[f"{o}_order_i2t"], relevant)
               for name, o in (("tevi_rerank", "rerank"), ("fused", "fused"))}}
    return {**tevi.fusion(), "test": test}


def _copy(text: tuple | None) -> tuple | None:
    """(a fresh copy of the text tower, its inputs): each fit fine-tunes its own copy."""
    import copy

    return None if text is None else (copy.deepcopy(text[0]), *text[1:])


def _top_order(scores: np.ndarray, k: int) -> np.ndarray:
    """(k, Q): per column of `scores` (P, Q), the rows of its k largest scores, best first (ties:
    lower row first), the layout `metrics.recall_from_order` reads."""
    return np.argsort(-scores, axis=0, kind="stable")[:k]


def _mean_std(runs: list[dict]) -> dict:
    """Per-seed results of one variant -> the same nesting with {"mean", "std", "n"} at each number
    (std: population standard deviation over the seeds, 0 for one seed)."""
    def combine(values):
        if isinstance(values[0], dict):
            return {k: combine([v[k] for v in values]) for k in values[0] if all(k in v for v in values)}
        x = np.asarray(values, dtype=np.float64)
        return {"mean": float(np.mean(x)), "std": float(np.std(x)), "n": len(x)}

    return combine([{"conditioning": r["conditioning"], "summary": r["summary"],
                     "leakage": {c: {k: r["leakage"][c][k] for k in ("follows_image", "follows_caption")}
                                 for c in r["leakage"]},
                     "retrieval": {k: r["retrieval"]["tevi"][k] for k in ("i2t@1", "t2i@1")}} for r in runs])


def shipped_stage_keys(cfg: TeviMadRecipe, stages: Path | None = None, **_: object) -> dict[str, dict]:
    """The stage `make demo` ships: the train split's embeddings by the --quick CLIP (what would
    otherwise need the 30,000 training images rendered and embedded); its key is the CLIP's."""
    return {"embed-train": mad_clip.stage_keys(mad_clip.load_preset(True))["train"]}


def run(out: Path, quick: bool = False, force: bool = False, cfg: TeviMadRecipe | None = None,
        clip_cfg: mad_clip.MadClipRecipe | None = None, stages: Path | None = None,
        from_scratch: bool = False) -> Path:
    cfg = cfg or load_preset(quick)
    clip_cfg = clip_cfg or mad_clip.load_preset(quick)
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch)
    t_start = time.perf_counter()
    data, train_dir, embed_dir, train_key = mad_clip.clip_stages(runner, clip_cfg)
    encoder_id = read_json(embed_dir / "encoder.json")["encoder_id"]
    train_emb_dir = runner.stage("embed-train", train_key,
                                 lambda w: _embed_train(train_dir / "model", data.train, w))
    train = dict(np.load(train_emb_dir / "embeddings.npz"))
    test_emb = dict(np.load(embed_dir / "embeddings.npz"))
    concepts = _concepts(test_emb)
    labels = load_mad(data.test)["labels"]
    img_vals, cap_vals = mad_clip.image_values(labels), mad_clip.caption_values(labels)

    rc = config_to_dict(cfg)
    # Keys name only what changes a stage's output; the issue-23 levers enter only when set, so a
    # stage cache made before them stays valid for the default (paper) settings.
    sae_key = {"clip": train_key, "k": cfg.sae_k, "expansion": cfg.sae_expansion, "aux_k": cfg.sae_aux_k,
               "epochs": cfg.sae_epochs, "lr": cfg.sae_lr, "batch": cfg.sae_batch_size, "seed": cfg.seed,
               **({"resample_every": cfg.sae_resample_every} if cfg.sae_resample_every else {}),
               **({"init": "concepts", "concepts": "prompt-ensemble, centred"} if cfg.sae_init == "concepts" else {})}
    cg_key = {"clip": train_key, "k": cfg.cg_k, "epochs": cfg.cg_epochs, "lr": cfg.sae_lr, "batch": cfg.sae_batch_size,
              "seed": cfg.seed, "concepts": "prompt-ensemble, centred"}
    mask_key = {k: rc[k] for k in ("mask_hidden", "mask_temperature", "mask_floor", "mask_epochs", "mask_lr",
                                   "mask_batch_size", "conditioning", "seed")}
    mask_key.update({k: rc[k] for k in ("mask_mass_coef", "contradicting_batches") if rc[k]})
    mask_key.update({k: rc[k] for k in ("mask_warmup_epochs", "text_finetune") if k in rc})
    fit_text = eval_text = None
    if cfg.text_finetune:  # the CLIP's text tower, fine-tuned from its trained weights by each mask fit
        from vlctl.encoders.factory import load_encoder

        mask_key["text_lr"] = cfg.text_lr
        clip = load_encoder(train_dir / "model")
        fit_text = (clip.model.text, clip.tokenize(data.train_captions()))
        eval_text = (clip.model.text, clip.tokenize, [lab["caption"] for lab in labels])
    partners = None
    if cfg.contradicting_batches:  # reads the training images' labels (generates that split if need be)
        partners = contradicting_partners(data.train_values()["caption_values"], cfg.seed)
    seeds = [cfg.seed + i for i in range(cfg.n_seeds)]
    fitted = fitted_variants(cfg)
    random_key = {**{k: v for k, v in sae_key.items() if k not in ("init", "concepts", "expansion")},
                  "init": "random", "n_latents": len(concepts)}
    sae_dirs, tevi_dirs = {}, {}  # (variant, seed) -> stage dir
    for s in seeds:
        # The primary seed's stages keep their names (scripts find them with find_stage); others get -seed<s>.
        tag = "" if s == cfg.seed else f"-seed{s}"
        keys = {"learned": {**sae_key, "seed": s}, "cg": {**cg_key, "seed": s}, "random": {**random_key, "seed": s}}
        for v in fitted:
            sae_dirs[v, s] = runner.stage({"learned": "sae", "cg": "cg-sae", "random": "sae-random"}[v] + tag, keys[v],
                                          lambda w, v=v, s=s: _fit_sae(cfg, v, train["image_emb"], concepts,
                                                                       encoder_id, w, seed=s))
        for v in fitted:
            groups = {"cg_group_mask": True} if v == "cg" and cfg.cg_group_mask else {}
            tevi_dirs[v, s] = runner.stage(
                f"tevi-{v}{tag}", {"sae": keys[v], **mask_key, "seed": s, **groups},
                lambda w, v=v, s=s: _fit_tevi(cfg, sae_dirs[v, s] / "sae", train, w, v, partners, s,
                                              text=_copy(fit_text)))
    # Issue 41: the learned-SAE and CG-SAE masks again, `fusion_holdout` of the training images held
    # out and the fusion weight chosen on their pairs (the stages above keep every pair: their numbers stand).
    fused_dirs = {v: runner.stage(
        f"tevi-{v}-fused", {"sae": {"learned": sae_key, "cg": cg_key}[v], **mask_key, "holdout": cfg.fusion_holdout,
                            **({"cg_group_mask": True} if v == "cg" and cfg.cg_group_mask else {})},
        lambda w, v=v: _fit_tevi(cfg, sae_dirs[v, cfg.seed] / "sae", train, w, v, partners,
                                 holdout=cfg.fusion_holdout, text=_copy(fit_text))) for v in FUSED}
    sweep_key = {"clip": train_key, "k": list(cfg.sweep_k), "expansion": list(cfg.sweep_expansion),
                 "epochs": cfg.sweep_epochs, "aux_k": cfg.sae_aux_k, "lr": cfg.sae_lr, "seed": cfg.seed,
                 "purity": f"train[:{N_PURITY}]",
                 **({"resample_every": cfg.sae_resample_every} if cfg.sae_resample_every else {})}
    train_vals = data.train_values()["image_values"][:N_PURITY]  # a small stage: no need to render the images
    sweep_dir = runner.stage("sae-sweep", sweep_key, lambda w: _sweep(cfg, train, test_emb["image_emb"], test_emb,
                                                                      img_vals, encoder_id, w, train_vals))

    # Evaluate.
    t_eval = time.perf_counter()
    variants = {v: _evaluate_variant(cfg, tevi_dirs[v, cfg.seed] / "tevi", test_emb, img_vals, cap_vals, out, v,
                                     text=eval_text) for v in fitted}
    per_seed = {v: [variants[v]] + [_evaluate_variant(cfg, tevi_dirs[v, s] / "tevi", test_emb, img_vals, cap_vals, out,
                                                      v, seed=s, text=eval_text) for s in seeds[1:]]
                for v in fitted}
    seeds_summary = {v: {"seeds": seeds, **_mean_std(per_seed[v])} for v in fitted}
    fused = {v: _evaluate_fused(cfg, fused_dirs[v] / "tevi", test_emb, img_vals, cap_vals, out, v, text=eval_text)
             for v in FUSED}
    sae_dirs = {v: sae_dirs[v, cfg.seed] for v in fitted}
    cg, auc, cg_latents = _cg_probe(sae_dirs["cg"] / "sae", test_emb, img_vals, out)
    sae_stats = {v: _sae_stats(sae_dirs[v] / "sae", train, test_emb, img_vals, train_vals)
                 for v in fitted if v != "cg"}
    cos = {v: variants[v].pop("_cos") for v in fitted}
    head = variants[cfg.headline]
    _figures(out, cos, auc, cg_latents, data.test)
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
        "fused": fused,
        "seeds": seeds_summary,
        "cg_sae": cg,
        "sae": sae_stats["learned"],
        **({"sae_random": sae_stats["random"]} if "random" in sae_stats else {}),
        "sae_sweep": read_json(sweep_dir / "sweep.json"),
        "paper_conditioning": PAPER_CONDITIONING,
        "timings": {**runner.timings, "total_seconds": time.perf_counter() - t_start},
    }
    atomic_write_json(out / "results.json", results)
    _report(cfg, results, quick).write(out)
    return out / "report.md"

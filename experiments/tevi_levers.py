"""Which levers make TEVI's mask category-selective on MAD (issue 23)?

A caption-conditioned mask edits; it should not leak. On a mismatched pair (image i edited by a
caption that names another value of a category than image i has) the edited embedding should
still be classified as the image's value: `leakage_accuracy(...)["follows_image"]`. The paper's
free per-latent mask, trained with positive conditioning (Eq. 10), keeps the latent of the value
the caption names and drops the others, so under a foreign caption the image's own evidence for
that category is gone. This script trains one mask per lever over the frozen SAEs of a
`tevi-mad` stage cache and measures, for each:

  follows_image / follows_caption per category on mismatched pairs (the leakage control),
  not-in-caption excess over chance and in-caption gap (Tables A1/A2),
  t2i@1 / i2t@1 (exhaustive TEVI scores) beside CLIP's and beside the oracle category mask's.

Levers: conditioning (positive Eq. 10 | negative Eq. 11 | both), the mask floor, the sigmoid
temperature, `partners` (each batch also holds, for every pair, a training caption that names
one attribute with another value: the hard contradicting caption), a mask parameterised per
attribute category (`latent_groups`: the CG-SAE's known categories, or on the learned SAE each
latent's best concept's category measured on training images), and a penalty on the mask's mass.

Settings are chosen on TRAINING embeddings only: masks train on training pairs [n_val:], every
lever is scored on the held-out training pairs [:n_val] ("val"), and the test split ("test")
is reported beside it, never used to choose.

    python experiments/tevi_levers.py --stages runs/demo/stages --out /tmp/23/levers

writes levers.json (every lever's val and test figures), levers.npz (the curve arrays) and
tradeoff.png (follows-image, and its shortfall below the original accuracy, against the
not-in-caption excess, one point per lever). `--replot A/levers.json B/levers.json --out DIR`
redraws the figure and arrays of several runs merged.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from vlctl.data.mad import CATEGORIES, VALUES, load_mad
from vlctl.eval.editing import conditioning_accuracy, latent_purity, leakage_accuracy
from vlctl.eval.metrics import caption_relevance
from vlctl.io import atomic_save_npz, atomic_write_json
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.tevi.estimator import TEVI
from vlctl.methods.tevi.scoring import conditioned_scores
from vlctl.recipes.runner import find_stage
from vlctl.recipes.tevi import mad_clip
from vlctl.recipes.tevi.mad import contradicting_partners

EDITED = [c for c in CATEGORIES if c != "digit"]
TARGET_EXCESS = {"learned": 10.5, "cg": 6.7}  # paper Table A2 / A1

# name -> TEVI keyword arguments (over the recipe's quick mask: hidden 512, 10 epochs, lr 1e-3,
# batch 256, temperature 0.2, floor 0.2) and the two data levers.
BASE = {"conditioning": "positive", "mask_temperature": 0.2, "mask_floor": 0.2}
LEVERS = {
    "paper (positive, T0.2, floor0.2)": {},
    "floor 0": {"mask_floor": 0.0},
    "floor 0.3": {"mask_floor": 0.3},
    "temperature 1": {"mask_temperature": 1.0},
    "negative": {"conditioning": "negative"},
    "both": {"conditioning": "both"},
    "negative + partners": {"conditioning": "negative", "_partners": True},
    "both + partners": {"conditioning": "both", "_partners": True},
    "both + partners + mass 0.05": {"conditioning": "both", "_partners": True, "mask_mass_coef": 0.05},
    "both + partners + mass 0.2": {"conditioning": "both", "_partners": True, "mask_mass_coef": 0.2},
    "both + partners + mass 1": {"conditioning": "both", "_partners": True, "mask_mass_coef": 1.0},
    "negative + partners + mass 0.2": {"conditioning": "negative", "_partners": True, "mask_mass_coef": 0.2},
    "positive + mass 0.2": {"mask_mass_coef": 0.2},
    "group mask": {"_groups": True},
    "group mask + mass 0.2": {"_groups": True, "mask_mass_coef": 0.2},
    "group mask + mass 1": {"_groups": True, "mask_mass_coef": 1.0},
    "group mask + floor 0.5": {"_groups": True, "mask_floor": 0.5},
    "group mask + both": {"_groups": True, "conditioning": "both"},
    "group mask + both + partners": {"_groups": True, "conditioning": "both", "_partners": True},
    "group mask + both + partners + mass 0.2": {"_groups": True, "conditioning": "both", "_partners": True,
                                                "mask_mass_coef": 0.2},
}


def category_of_latents(sae: SparseAutoencoder, variant: str, train_img: np.ndarray, train_vals: np.ndarray,
                        concepts: list[str]) -> np.ndarray:
    """(d1,) attribute category index of each latent: the CG-SAE's by construction; the learned
    SAE's from its best concept (latent_purity) on training images; a dead latent gets its own
    category's neighbour 0 (it never fires, so its mask value does not matter)."""
    if variant == "cg":
        return np.array([CATEGORIES.index(c.split("=")[0]) for c in concepts])
    present = np.concatenate([train_vals[:, [ci]] == np.arange(len(VALUES[c]))[None] for ci, c in enumerate(CATEGORIES)],
                             axis=1)
    _, best = latent_purity(sae.encode(train_img).numpy(), present)
    cat = np.array([CATEGORIES.index(concepts[b].split("=")[0]) if b >= 0 else 0 for b in best])
    return cat


def dense_groups(cat: np.ndarray) -> tuple[int, ...]:
    """Category ids renumbered 0..G-1 over the categories that occur (TeviConfig.latent_groups)."""
    _, inv = np.unique(cat, return_inverse=True)
    return tuple(int(g) for g in inv)


def r_at_1(scores: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    n_img, n_txt = scores.shape
    return {"i2t@1": 100.0 * float(relevant[np.arange(n_img), scores.argmax(1)].mean()),
            "t2i@1": 100.0 * float(relevant[scores.argmax(0), np.arange(n_txt)].mean())}


def evaluate(tevi_or_masks, sae: SparseAutoencoder, img: np.ndarray, txt: np.ndarray, img_vals: np.ndarray,
             cap_vals: np.ndarray, class_emb: dict, seed: int = 0) -> dict:
    """Conditioning, leakage and R@1 of one mask on one split. `tevi_or_masks`: a fitted TEVI, or
    a function text_emb -> masks (the oracle)."""
    model = sae.model_
    x, t = torch.as_tensor(img), torch.as_tensor(txt)
    with torch.no_grad():
        z = model.encode(x)
        masks = tevi_or_masks.masks(t) if isinstance(tevi_or_masks, TEVI) else tevi_or_masks(np.arange(len(t)))
        edited = ((z * masks) @ model.W_D + model.b_pre).numpy()
        perm = np.random.default_rng(seed).permutation(len(img))
        swapped = ((z * masks[perm]) @ model.W_D + model.b_pre).numpy()
        scores = conditioned_scores(z, masks, model.W_D, model.b_pre, t, k=model.cfg.k).numpy()
    cond = {c: conditioning_accuracy(img, edited, class_emb[c], img_vals[:, CATEGORIES.index(c)],
                                     cap_vals[:, CATEGORIES.index(c)] >= 0) for c in EDITED}
    leak = {c: leakage_accuracy(swapped, class_emb[c], img_vals[:, CATEGORIES.index(c)],
                                cap_vals[perm, CATEGORIES.index(c)]) for c in EDITED}
    return {
        "conditioning": cond,
        "leakage": leak,
        "in_caption_gap": float(np.mean([cond[c]["original"] - cond[c]["in_caption"] for c in EDITED])),
        "not_in_caption_excess": float(np.mean([cond[c]["not_in_caption"] - cond[c]["chance"] for c in EDITED])),
        "follows_image_min": float(min(leak[c]["follows_image"] for c in EDITED)),
        "follows_image_mean": float(np.mean([leak[c]["follows_image"] for c in EDITED])),
        # An edit only removes information: a category's follows-image is capped near its original
        # accuracy (fracture: 62% on the quick CLIP). The largest shortfall below it:
        "follows_image_shortfall": float(max(cond[c]["original"] - leak[c]["follows_image"] for c in EDITED)),
        "mask_mean": float(masks.mean()),
        **r_at_1(scores, caption_relevance(img_vals, cap_vals)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=Path, required=True, help="a tevi-mad stage cache (sae, cg-sae, embed-train)")
    ap.add_argument("--variants", nargs="+", default=["cg", "learned"], choices=["cg", "learned"])
    ap.add_argument("--levers", nargs="*", default=None, help=f"names from {list(LEVERS)} (default: all)")
    ap.add_argument("--sae", type=Path, default=None, help="a saved learned SAE to use instead of the cache's sae stage")
    ap.add_argument("--n-val", type=int, default=5000, help="held-out TRAINING pairs the levers are scored on")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--replot", type=Path, nargs="*", default=None,
                    help="only redraw levers.npz / tradeoff.png in --out from these levers.json files (merged)")
    args = ap.parse_args()
    if args.replot:
        merged = {"variants": {}}
        for f in args.replot:
            run = json.loads(f.read_text())
            for v, res in run["variants"].items():
                # Two runs of one variant over different SAEs: label the second by its SAE.
                label = v if v not in merged["variants"] else f"{v}:{Path(run.get('sae') or f.parent).name}"
                merged["variants"][label] = res
        args.out.mkdir(parents=True, exist_ok=True)
        _curve(merged, args.out)
        return
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args.out.mkdir(parents=True, exist_ok=True)

    train = dict(np.load(find_stage(args.stages, "embed-train") / "embeddings.npz"))
    test = dict(np.load(find_stage(args.stages, "embed") / "embeddings.npz"))
    class_emb = {c: test[f"text_{c}"] for c in CATEGORIES}  # class prompts' text embeddings (no test images)
    concepts = [f"{c}={v}" for c in CATEGORIES for v in VALUES[c]]
    tr_labels = load_mad(find_stage(args.stages, "data-train") / "train")["labels"]
    te_labels = load_mad(find_stage(args.stages, "data-test") / "test")["labels"]
    tr_img_vals, tr_cap_vals = mad_clip.image_values(tr_labels), mad_clip.caption_values(tr_labels)
    te_img_vals, te_cap_vals = mad_clip.image_values(te_labels), mad_clip.caption_values(te_labels)
    nv = args.n_val
    fit_img, fit_txt = train["image_emb"][nv:], train["text_emb"][nv:]
    splits = {
        "val": (train["image_emb"][:nv], train["text_emb"][:nv], tr_img_vals[:nv], tr_cap_vals[:nv]),
        "test": (test["image_emb"], test["text_emb"], te_img_vals, te_cap_vals),
    }
    partners = contradicting_partners(tr_cap_vals[nv:], seed=args.seed)
    names = args.levers or list(LEVERS)
    out = {"stages": str(args.stages), "sae": None if args.sae is None else str(args.sae), "epochs": args.epochs,
           "n_fit": len(fit_img), "n_val": nv, "n_test": len(test["image_emb"]),
           "partners_found": float((partners >= 0).mean()), "variants": {}}
    for variant in args.variants:
        if variant == "learned" and args.sae is not None:
            sae = SparseAutoencoder.load(args.sae)
        else:
            sae = SparseAutoencoder.load(find_stage(args.stages, "sae" if variant == "learned" else "cg-sae") / "sae")
        cat = category_of_latents(sae, variant, fit_img, tr_img_vals[nv:], concepts)
        res = {"clip": {}, "oracle_category_mask": {}, "levers": {}}
        for split, (img, txt, iv, cv) in splits.items():
            xn = img / np.linalg.norm(img, axis=1, keepdims=True)
            tn = txt / np.linalg.norm(txt, axis=1, keepdims=True)
            res["clip"][split] = r_at_1(xn @ tn.T, caption_relevance(iv, cv))
            oracle = torch.as_tensor((cv >= 0)[:, cat].astype(np.float32))  # 1 on every latent of a named category
            res["oracle_category_mask"][split] = evaluate(lambda rows, o=oracle: o[rows], sae, img, txt, iv, cv,
                                                          class_emb, args.seed)
        for name in names:
            kw = {**BASE, **LEVERS[name]}
            use_partners, use_groups = kw.pop("_partners", False), kw.pop("_groups", False)
            if use_groups:
                kw["latent_groups"] = dense_groups(cat)
            t0 = time.perf_counter()
            tevi = TEVI(hidden=512, lr=1e-3, epochs=args.epochs, batch_size=256, seed=args.seed, **kw)
            tevi.fit(fit_img, fit_txt, sae=sae, partners=partners if use_partners else None)
            fit_s = time.perf_counter() - t0
            row = {"settings": {**kw, "partners": use_partners, "groups": use_groups}, "fit_seconds": fit_s}
            for split, (img, txt, iv, cv) in splits.items():
                row[split] = evaluate(tevi, sae, img, txt, iv, cv, class_emb, args.seed)
            res["levers"][name] = row
            v = row["val"]
            print(f"{variant:7s} {name:45s} val: follows_img min {v['follows_image_min']:5.1f} excess "
                  f"{v['not_in_caption_excess']:5.1f} gap {v['in_caption_gap']:5.1f} t2i {v['t2i@1']:5.1f} "
                  f"i2t {v['i2t@1']:5.1f} | test: follows_img min {row['test']['follows_image_min']:5.1f} excess "
                  f"{row['test']['not_in_caption_excess']:5.1f} ({fit_s:.0f} s)", flush=True)
            out["variants"][variant] = res
            atomic_write_json(args.out / "levers.json", out)
        out["variants"][variant] = res
    atomic_write_json(args.out / "levers.json", out)
    _curve(out, args.out)


def _shortfall(r: dict) -> float:
    """max over categories of original accuracy - follows image (recomputed from a split's figures)."""
    return float(max(r["conditioning"][c]["original"] - r["leakage"][c]["follows_image"] for c in EDITED))


def _curve(out: dict, folder: Path) -> None:
    """levers.npz (one row per variant x lever) and tradeoff.png drawn from it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(v, name, r) for v, res in out["variants"].items() for name, r in res["levers"].items()]
    arrays = {"variant": np.array([v for v, _, _ in rows]), "lever": np.array([n for _, n, _ in rows])}
    for split in ("val", "test"):
        for key in ("follows_image_min", "follows_image_mean", "not_in_caption_excess", "in_caption_gap", "t2i@1",
                    "i2t@1", "mask_mean"):
            arrays[f"{split}_{key.replace('@', '_at_')}"] = np.array([r[split][key] for _, _, r in rows])
        arrays[f"{split}_follows_image_shortfall"] = np.array([_shortfall(r[split]) for _, _, r in rows])
    atomic_save_npz(folder / "levers.npz", **arrays)
    fig, axes = plt.subplots(2, 2, figsize=(13, 10))
    for col, split in enumerate(("val", "test")):
        for row, (key, label, line) in enumerate((
                ("follows_image_min", "follows image on mismatched pairs, worst category (%)", 90),
                ("follows_image_shortfall", "largest (original accuracy - follows image) over categories (points)",
                 0))):
            ax = axes[row, col]
            for i, v in enumerate(dict.fromkeys(arrays["variant"].tolist())):
                sel = arrays["variant"] == v
                marker = "o" if v.startswith("cg") else "s^v"[i % 3]
                xs, ys = arrays[f"{split}_not_in_caption_excess"][sel], arrays[f"{split}_{key}"][sel]
                ax.scatter(xs, ys, marker=marker, label=f"{v} SAE")
                for x, y, n in zip(xs, ys, arrays["lever"][sel]):
                    ax.annotate(n, (x, y), fontsize=5)
                ax.axvline(TARGET_EXCESS[v.split(":")[0]], ls=":", c="C0" if v.startswith("cg") else "C1")
            ax.axhline(line, ls="--", c="gray")
            ax.set_xlabel("not-in-caption excess over chance (points, lower = edits more)")
            ax.set_ylabel(label, fontsize=8)
            ax.set_title(f"{split} ({'held-out training pairs' if split == 'val' else 'test split'})")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "tradeoff.png", dpi=130)
    plt.close(fig)
    print(json.dumps({"wrote": [str(folder / f) for f in ("levers.npz", "tradeoff.png")]}))


if __name__ == "__main__":
    main()

"""Probes of tevi-mad's SAEs themselves (vlctl.recipes.tevi.mad): a learned SAE's FVU, dead latents,
purity and reconstructed zero-shot; the CG-SAE's concept AUCs (R1) and thickthinning ablation (R2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vlctl.data.mad import CATEGORIES, VALUES
from vlctl.eval import metrics
from vlctl.eval.editing import concept_auc_matrix, latent_purity
from vlctl.io import atomic_save_npz
from vlctl.methods.sae.rows import fraction_variance_unexplained
from vlctl.recipes.tevi.mad_report import N_PURITY

CONCEPT_NAMES = [f"{c}={v}" for c in CATEGORIES for v in VALUES[c]]


def _sae_stats(sae_dir: Path, train: dict, test_emb, img_vals, train_vals) -> dict:
    """A learned SAE's test FVU, dead latents, purity (training images) and reconstructed zero-shot."""
    from vlctl.methods.sae.model import SparseAutoencoder

    sae = SparseAutoencoder.load(sae_dir)
    rec = sae.reconstruct(test_emb["image_emb"]).numpy()
    purity, best = latent_purity(sae.encode(train["image_emb"][:N_PURITY]).numpy(), _present(train_vals))
    return {"fvu": float(fraction_variance_unexplained(test_emb["image_emb"], rec)), "dead_latents": sae.n_dead_,
            "n_latents": sae.config_.n_latents, "k": sae.config_.k,
            "dead_fraction": sae.n_dead_ / sae.config_.n_latents, "purity_mean": _nanmean(purity),
            "purity": [None if np.isnan(p) else float(p) for p in purity],
            "purity_concept": [None if b < 0 else CONCEPT_NAMES[b] for b in best],
            "zero_shot_rec": {c: metrics.zero_shot_accuracy(rec, test_emb[f"text_{c}"], img_vals[:, ci])
                              for ci, c in enumerate(CATEGORIES)}}


def _present(vals: np.ndarray) -> np.ndarray:
    """(N, 26) bool: image has concept (category, value), CATEGORIES x VALUES order."""
    return np.concatenate([vals[:, [ci]] == np.arange(len(VALUES[c]))[None] for ci, c in enumerate(CATEGORIES)], axis=1)


def _nanmean(x) -> float | None:
    x = np.asarray(x, dtype=np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else None


def _cg_probe(cg_sae_dir: Path, test_emb, img_vals, out: Path) -> tuple[dict, np.ndarray, np.ndarray]:
    """R1 (concept AUCs) and R2 (ablate the thickthinning latents, re-classify everything)."""
    from vlctl.methods.sae.model import SparseAutoencoder

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

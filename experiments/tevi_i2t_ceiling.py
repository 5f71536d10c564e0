"""How far can any caption-conditioned mask take TEVI's image->text retrieval on MAD?

TEVI ranks the captions of an image by cos(e_{p|q}, t_q): every candidate caption edits the
image differently, so i2t compares scores made in different subspaces. This script puts an upper
bound on what a better mask could do, with the CG-SAE of a `tevi-mad` run, on its test split:

  base        CLIP cosine;
  tevi        the run's learned mask (the recipe's headline numbers);
  oracle      the ideal category mask: 1 on every latent of a category the caption names, 0
              elsewhere (no learned mask can know more about the caption than this);
  no_mask     every mask 1, i.e. the CG-SAE reconstruction alone;
  tevi_zscore the learned mask's scores standardised per caption over 5,000 training images
              (a calibration across captions; t2i is unchanged by it);
and the oracle again for CG-SAEs refitted at other K (--refit-k). R@1 uses the recipe's relevance
(a caption is correct for an image that has every attribute value it names).

    python experiments/tevi_i2t_ceiling.py --stages RUN/stages --refit-k 12 16 --out ceiling.json

RUN/stages is a `vlctl reproduce tevi-mad` stage cache (the full preset: --stages shared with
mad-clip). --tevi picks one TEVI when the cache holds several (e.g. runs with other mask floors).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from vlctl.data.mad import CATEGORIES, load_mad
from vlctl.eval.metrics import caption_relevance
from vlctl.io import atomic_write_json
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.tevi.estimator import TEVI
from vlctl.methods.tevi.scoring import conditioned_scores
from vlctl.recipes.runner import find_stage
from vlctl.recipes.tevi import mad as tevi_mad
from vlctl.recipes.tevi import mad_clip


def recall_at_1(scores: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    """i2t@1 / t2i@1 (%) of an (images, texts) score matrix: the top-1 is relevant."""
    n_img, n_txt = scores.shape
    return {"i2t@1": 100.0 * float(relevant[np.arange(n_img), scores.argmax(1)].mean()),
            "t2i@1": 100.0 * float(relevant[scores.argmax(0), np.arange(n_txt)].mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=Path, required=True, help="a tevi-mad stage cache")
    ap.add_argument("--tevi", type=Path, default=None,
                    help="the TEVI to use (a tevi-cg stage's tevi/ folder) when the cache holds several")
    ap.add_argument("--refit-k", type=int, nargs="*", default=[], help="also refit the CG-SAE at these K")
    ap.add_argument("--calibration-images", type=int, default=5000)
    ap.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args()

    test = dict(np.load(find_stage(args.stages, "embed") / "embeddings.npz"))
    train = dict(np.load(find_stage(args.stages, "embed-train") / "embeddings.npz"))
    labels = load_mad(find_stage(args.stages, "data-test") / "test")["labels"]
    img_vals, cap_vals = mad_clip.image_values(labels), mad_clip.caption_values(labels)
    relevant = caption_relevance(img_vals, cap_vals)
    tevi = TEVI.load(args.tevi or find_stage(args.stages, "tevi-cg") / "tevi")
    cg = tevi.sae_.model_
    x, t = torch.as_tensor(test["image_emb"]), torch.as_tensor(test["text_emb"])
    x_cal = torch.as_tensor(train["image_emb"][: args.calibration_images])

    # The CG-SAE's latents are the concepts in CATEGORIES x values order (tevi_mad._concepts).
    cat_of_latent = np.concatenate([np.full(len(test[f"text_{c}"]), i) for i, c in enumerate(CATEGORIES)])
    oracle = torch.as_tensor((cap_vals >= 0)[:, cat_of_latent].astype(np.float32))  # (texts, latents)

    def scores(model, x_img, masks) -> np.ndarray:
        with torch.no_grad():
            return conditioned_scores(model.encode(x_img), masks, model.W_D, model.b_pre, t, k=model.cfg.k).numpy()

    xn = test["image_emb"] / np.linalg.norm(test["image_emb"], axis=1, keepdims=True)
    tn = test["text_emb"] / np.linalg.norm(test["text_emb"], axis=1, keepdims=True)
    with torch.no_grad():
        learned = tevi.masks(t)
    s_tevi = scores(cg, x, learned)
    s_cal = scores(cg, x_cal, learned)
    rows = {
        "base": recall_at_1(xn @ tn.T, relevant),
        "tevi": recall_at_1(s_tevi, relevant),
        "tevi_zscore": recall_at_1((s_tevi - s_cal.mean(0)) / s_cal.std(0), relevant),
        f"oracle_k{cg.cfg.k}": recall_at_1(scores(cg, x, oracle), relevant),
        f"no_mask_k{cg.cfg.k}": recall_at_1(scores(cg, x, torch.ones_like(oracle)), relevant),
    }
    concepts = tevi_mad._concepts(test)
    for k in args.refit_k:
        sae = SparseAutoencoder.from_concepts(concepts, k=k, aux_k=0, epochs=100, lr=1e-2, batch_size=512, seed=0,
                                              dead_after=20 * len(train["image_emb"]) // 30)
        model = sae.fit(train["image_emb"], tevi.sae_.encoder_id_).model_
        rows[f"oracle_k{k}"] = recall_at_1(scores(model, x, oracle), relevant)
        rows[f"no_mask_k{k}"] = recall_at_1(scores(model, x, torch.ones_like(oracle)), relevant)
    for name, r in rows.items():
        print(f"{name:14s} i2t@1 {r['i2t@1']:6.2f}   t2i@1 {r['t2i@1']:6.2f}")
    if args.out is not None:
        atomic_write_json(args.out, {"stages": str(args.stages), "tevi": str(args.tevi), "r_at_1": rows})


if __name__ == "__main__":
    main()

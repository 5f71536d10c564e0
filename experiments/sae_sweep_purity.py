"""Which learned TopK SAE separates MAD's attributes into its latents (issue 23, item 3)?

Fits learned SAEs over the training image embeddings of a `tevi-mad` stage cache, one per setting
of K, the expansion, AuxK and dead-latent handling (`dead_after`, `resample_every`), the paper's
MAD settings among them (K 12, auxK 18, expansion 1-4, lr 1e-2, 200 epochs), and records for each:

  fvu_train / fvu_val   reconstruction error on the fitting rows / on held-out training rows,
  dead latents          at the end of training (and their fraction),
  zero-shot (val)       accuracy of every category on the reconstructed held-out embeddings,
  purity                per live latent, the best-concept ROC-AUC on held-out training images
                        (`editing.latent_purity`); its mean, and how many live latents reach 90.

Everything is measured on TRAINING embeddings (fit on rows [n_val:], scored on rows [:n_val]):
the test split is never used to choose.

    python experiments/sae_sweep_purity.py --stages runs/demo/stages --out /tmp/23/sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

import numpy as np
import torch

from vlctl.data.mad import CATEGORIES, VALUES, load_mad
from vlctl.eval import metrics
from vlctl.eval.editing import latent_purity
from vlctl.io import atomic_write_json, read_json
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.sae.rows import fraction_variance_unexplained
from vlctl.recipes.runner import find_stage
from vlctl.recipes.tevi import mad_clip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=Path, required=True)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 6, 12])
    ap.add_argument("--expansion", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--aux-k", type=int, nargs="+", default=[18])
    ap.add_argument("--dead-after-epochs", type=float, nargs="+", default=[2 / 3],
                    help="dead_after in epochs of training samples (the recipe: 2/3)")
    ap.add_argument("--resample-every", type=int, nargs="+", default=[0], help="steps; 0 = never")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--n-val", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    train = dict(np.load(find_stage(args.stages, "embed-train") / "embeddings.npz"))
    test = dict(np.load(find_stage(args.stages, "embed") / "embeddings.npz"))  # class prompts only
    encoder_id = read_json(find_stage(args.stages, "embed-train") / "encoder.json")["encoder_id"]
    vals = mad_clip.image_values(load_mad(find_stage(args.stages, "data-train") / "train")["labels"])
    nv = args.n_val
    x_fit, x_val, v_val = train["image_emb"][nv:], train["image_emb"][:nv], vals[:nv]
    present = np.concatenate([v_val[:, [ci]] == np.arange(len(VALUES[c]))[None] for ci, c in enumerate(CATEGORIES)],
                             axis=1)
    original = {c: metrics.zero_shot_accuracy(x_val, test[f"text_{c}"], v_val[:, ci]) for ci, c in enumerate(CATEGORIES)}
    rows = []
    grid = itertools.product(args.k, args.expansion, args.aux_k, args.dead_after_epochs, args.resample_every)
    for k, e, aux_k, dead_ep, resample in grid:
        if k > e * x_fit.shape[1]:
            continue
        t0 = time.perf_counter()
        sae = SparseAutoencoder(k=k, expansion=e, aux_k=aux_k, dead_after=int(dead_ep * len(x_fit)),
                                resample_every=resample, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                                seed=args.seed).fit(x_fit, encoder_id)
        rec = sae.reconstruct(x_val).numpy()
        z = sae.encode(x_val).numpy()
        purity, best = latent_purity(z, present)
        live = np.isfinite(purity)
        row = {"k": k, "expansion": e, "aux_k": aux_k, "dead_after_epochs": dead_ep, "resample_every": resample,
               "n_latents": sae.config_.n_latents, "fvu_train": float(sae.fvu_),
               "fvu_val": fraction_variance_unexplained(x_val, rec), "dead_latents": sae.n_dead_,
               "dead_fraction": sae.n_dead_ / sae.config_.n_latents,
               "never_fire_val": int((~live).sum()),
               "purity_mean": float(np.nanmean(purity)) if live.any() else None,
               "purity_ge_90": int((purity[live] >= 90).sum()),
               "concepts_covered_ge_90": len(set(best[live][purity[live] >= 90].tolist())),
               "zero_shot_val": {c: metrics.zero_shot_accuracy(rec, test[f"text_{c}"], v_val[:, ci])
                                 for ci, c in enumerate(CATEGORIES)},
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        zs_drop = np.mean([original[c] - row["zero_shot_val"][c] for c in CATEGORIES])
        print(f"K {k:3d} exp {e} auxK {aux_k:3d} dead_after {dead_ep:.2f} ep resample {resample:4d}: FVU val "
              f"{row['fvu_val']:.4f}, dead {sae.n_dead_}/{sae.config_.n_latents}, purity mean "
              f"{row['purity_mean'] or float('nan'):.1f} (>=90: {row['purity_ge_90']}, concepts "
              f"{row['concepts_covered_ge_90']}), zero-shot drop {zs_drop:.2f} ({row['seconds']:.0f} s)", flush=True)
        atomic_write_json(args.out, {"stages": str(args.stages), "epochs": args.epochs, "lr": args.lr,
                                     "n_fit": len(x_fit), "n_val": nv, "original_zero_shot_val": original,
                                     "rows": rows})


if __name__ == "__main__":
    main()

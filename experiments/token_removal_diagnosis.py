"""Why does token removal by relevance maps lose accuracy on the scenes models?

Over a `vlctl reproduce 3vl-scenes` run (its arrays/token_removal.npz and stage cache), for the
base and tree models and the same items as the report's token-removal curves, at each removal
fraction f:
  random     keep n_keep(P, f) patches chosen uniformly (mean over --seeds draws);
  <method>   keep the most relevant patches by the run's saved maps (hilacam, anchor, dire);
  <method>_least  keep the least relevant ones instead;
each as checklist accuracy (%) and two diagnostics of the kept-patch embeddings e:
  margin     mean |cos(e, POS) - cos(e, NEG)| (how strongly the model decides);
  cross_cos  mean cosine between the embeddings of different items (a collapse to one
             out-of-distribution point shows as a value far from the full images');
plus the same two for the full images. Accuracy equal to the run's removal curves is a check.

    python experiments/token_removal_diagnosis.py RUN --out diagnosis.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from vlctl.data.scenes import CHECKLIST_CATEGORIES, load_checklist, load_scenes
from vlctl.encoders import tiny_encoder
from vlctl.io import atomic_write_json
from vlctl.methods.threevl import relevancy as rel
from vlctl.recipes.runner import find_stage

FRACTIONS = (0.3, 0.5, 0.65)
STAGE_OF = {"base": "base", "tree": "finetune_tree"}


def _stats(e: torch.Tensor, tp: torch.Tensor, tn: torch.Tensor) -> dict[str, float]:
    d = (e * tp).sum(-1) - (e * tn).sum(-1)
    n = len(e)
    gram = e @ e.T
    return {"accuracy": 100.0 * float((d > 0).double().mean()), "margin": float(d.abs().mean()),
            "cross_cos": float((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a 3vl-scenes output directory (arrays/, stages/)")
    ap.add_argument("--stages", type=Path, default=None, help="its stage cache (default RUN/stages)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stages = args.stages or args.run / "stages"
    saved = np.load(args.run / "arrays" / "token_removal.npz")
    data = find_stage(stages, "data")
    test = load_scenes(data / "test")
    by_cat = {c: {it["index"]: it for it in load_checklist(data / "test", c)} for c in CHECKLIST_CATEGORIES}
    sub = [by_cat[str(c)][int(i)] for c, i in zip(saved["relevancy_item_category"], saved["relevancy_item_index"])]
    out: dict = {"run": str(args.run), "items": len(sub), "fractions": list(FRACTIONS)}
    for model, stage in STAGE_OF.items():
        enc = tiny_encoder.load_tiny_encoder(find_stage(stages, stage) / "model")
        x = enc.preprocess_batch(np.asarray(test["images"]))[[it["index"] for it in sub]]
        tp = enc.encode_texts(enc.tokenize([it["pos"] for it in sub])).float()
        tn = enc.encode_texts(enc.tokenize([it["neg"] for it in sub])).float()
        n_patches = int(np.prod(saved[f"maps_{model}__hilacam"].shape[1:]))
        rows: dict = {"full": _stats(enc.encode_images(x).float(), tp, tn)}
        for f in FRACTIONS:
            m = rel.n_keep(n_patches, f)
            draws = [_stats(enc.encode_images_keep(x, rel.random_keep(len(x), n_patches, m, s)).float(), tp, tn)
                     for s in range(args.seeds)]
            rows[f"random@{f}"] = {k: float(np.mean([d[k] for d in draws])) for k in draws[0]}
            for method in ("hilacam", "anchor", "dire"):
                maps = saved[f"maps_{model}__{method}"]
                for tag, mp in ((method, maps), (f"{method}_least", -maps)):
                    e = enc.encode_images_keep(x, rel.keep_most_relevant(mp, f)).float()
                    rows[f"{tag}@{f}"] = _stats(e, tp, tn)
        out[model] = rows
        for name, r in rows.items():
            print(f"{model:5s} {name:22s} acc {r['accuracy']:5.1f}  margin {r['margin']:.3f}  cross_cos {r['cross_cos']:.3f}")
    if args.out is not None:
        atomic_write_json(args.out, out)


if __name__ == "__main__":
    main()

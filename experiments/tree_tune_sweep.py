"""Fine-tune one 3vl-scenes base with TreeTuner under other settings and score the checklist.

Reuses a `vlctl reproduce 3vl-scenes` stage directory (its data, base and trees stages), so a
setting is compared on exactly the base, fine-tuning split and trees the recipe used:

    python experiments/tree_tune_sweep.py runs/3vl/stages --mode tree --epochs 16 --lr 1e-2 --rank 16 \\
        --patch-dropout 0 --out tree.json

Writes the checklist accuracy per category and their average (the recipe's definition: the
positive caption's cosine beats the negative's), the fit's final loss and seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from vlctl.data.scenes import CHECKLIST_CATEGORIES, load_checklist, load_scenes
from vlctl.encoders import tiny_encoder, tiny_model, tiny_pretrained
from vlctl.eval.checklist import checklist_scores
from vlctl.eval.metrics import checklist_accuracy
from vlctl.io import atomic_write_json, read_json
from vlctl.methods.threevl.tree_tune import MODES, TreeTuner
from vlctl.recipes.runner import find_stage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stages", type=Path, help="a 3vl-scenes stage directory (OUT/stages)")
    ap.add_argument("--mode", choices=MODES, default="tree")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--patch-dropout", type=float, default=0.5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    data, base, trees = (find_stage(args.stages, n) for n in ("data", "base", "trees"))
    ft, test = load_scenes(data / "finetune"), load_scenes(data / "test")
    t = read_json(trees / "trees.json", "trees")
    model = tiny_pretrained.load_pretrained(base / "model")
    t0 = time.perf_counter()
    tuner = TreeTuner(mode=args.mode, alpha=0.5, level_reduction="mean", rank=args.rank, lora_alpha=float(args.rank),
                      lr=args.lr, epochs=args.epochs, batch_size=args.batch_size, warmup_steps=20, max_levels=8,
                      max_negatives=8, seed=args.seed, threads=args.threads, towers="both",
                      patch_dropout=args.patch_dropout)
    tuner.fit(ft["images"], [lab["caption"] for lab in ft["labels"]], model=model, out_dir=args.out.with_suffix(".run"),
              trees=t["trees"], negatives=t["negatives"])
    seconds = time.perf_counter() - t0
    items = {c: load_checklist(data / "test", c) for c in CHECKLIST_CATEGORIES}
    x_test = tiny_model.preprocess_batch(np.asarray(test["images"]))
    scores = checklist_scores(tiny_encoder.TinyCLIPEncoder(tuner.merged_), x_test, items)
    acc = {c: checklist_accuracy(s) for c, s in scores.items()}
    acc["average"] = float(np.mean([acc[c] for c in CHECKLIST_CATEGORIES]))
    result = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "checklist": acc, "final_loss": tuner.result_.final_loss, "seconds": seconds}
    atomic_write_json(args.out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

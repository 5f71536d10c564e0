"""Can the 3vl-lit models learn left/right/above/below, and which lever moves it?

Reads the stages of a `vlctl reproduce 3vl-lit` run (its data, trees and one seed's base) and
fine-tunes that base again with one setting changed (more epochs, a higher lr, adapters on
more MiniLM layers, one tower, or relation-swap negatives only), with the recipe's own
TreeTuner. After training it writes, for the base and the new model, the relation accuracy
(caption vs its relation swap) on the first `--n-train-items` fine-tuning scenes (can it fit
what it trained on?) and on the test split's relation_spatial items, plus the five checklist
categories on the test split, to --out (JSON).

    python experiments/lit_relation_lever.py RUN --seed 0 --epochs 4 --out lever.json
    python experiments/lit_relation_lever.py RUN --relation-only --epochs 4 --out lever_rel.json
    python experiments/lit_relation_lever.py RUN --mode negclip --epochs 5 --rank 16 --lora-alpha 32 --lr 5e-3 \
        --data-finetune data-finetune-49c5048a942f --trees trees-ee04d2202213 --out lever.json

A RUN whose stage directory holds several variants of a stage (shared `--stages`) takes the
stage names to use from --data-finetune / --trees / --base (default: the last one of each name).

--relation-only replaces every tree by one level: the full caption against its relation swap
(NegCLIP-style hard negative of the relation alone), the most direct pressure on relations.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import re
import time
from pathlib import Path

import numpy as np
import torch

from vlctl.data.scenes import CHECKLIST_CATEGORIES, OPPOSITE_RELATION, load_checklist, load_scenes, render_caption
from vlctl.encoders import tiny_pretrained
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.eval.checklist import checklist_scores
from vlctl.eval.metrics import checklist_accuracy
from vlctl.io import atomic_write_json, read_json
from vlctl.methods.threevl.tree_tune import TreeTuner
from vlctl.recipes.threevl.lit import load_preset


def _stage(run: Path, name: str, exact: str | None = None) -> Path:
    if exact is not None:
        return run / "stages" / exact
    hits = sorted(h for h in glob.glob(str(run / "stages" / f"{name}-*"))
                  if re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{12}}", Path(h).name))  # not data-finetune-* for data
    hits = [h for h in hits if (Path(h) / "done.json").is_file()]
    if not hits:
        raise SystemExit(f"{run}: no finished stage {name}")
    return Path(hits[-1])


def relation_items(labels: list[dict], n: int) -> dict[str, list[dict]]:
    return {"relation": [{"index": i, "pos": lab["caption"],
                          "neg": render_caption({**lab["structure"],
                                                 "rel": OPPOSITE_RELATION[lab["structure"]["rel"]]})}
                         for i, lab in enumerate(labels[:n])]}


def evaluate(model, ft, test, n_train_items: int) -> dict:
    enc = TinyCLIPEncoder(model)
    out = {}
    with torch.no_grad():
        x_ft = enc.preprocess_batch(np.asarray(ft["images"][:n_train_items]))
        out["finetune_split_relation"] = checklist_accuracy(
            checklist_scores(enc, x_ft, relation_items(ft["labels"], n_train_items))["relation"])
        items = {c: load_checklist(test["path"], c) for c in CHECKLIST_CATEGORIES}
        x = enc.preprocess_batch(np.asarray(test["images"]))
        for c, s in checklist_scores(enc, x, items).items():
            out[c] = checklist_accuracy(s)
    out["average"] = float(np.mean([out[c] for c in CHECKLIST_CATEGORIES]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="tree", choices=("tree", "negclip", "contrastive"))
    ap.add_argument("--epochs", type=int, default=None, help="default: the quick preset's ft_epochs")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--minilm-layers", type=int, default=None)
    ap.add_argument("--towers", default=None, choices=("both", "visual", "text"))
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--lora-alpha", type=float, default=None)
    ap.add_argument("--data-finetune", default=None, help="stage directory name of the fine-tuning scenes")
    ap.add_argument("--trees", default=None, help="stage directory name of their trees")
    ap.add_argument("--base", default=None, help="stage directory name of the base (default: base_s<seed>)")
    ap.add_argument("--relation-only", action="store_true")
    ap.add_argument("--n-train-items", type=int, default=500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = load_preset(True)
    cfg = dataclasses.replace(cfg, **{k: v for k, v in {"ft_epochs": a.epochs, "ft_lr": a.lr,
                                                         "minilm_layers": a.minilm_layers,
                                                         "towers": a.towers, "rank": a.rank,
                                                         "lora_alpha": a.lora_alpha}.items() if v is not None})
    data = _stage(a.run, "data")
    ft_dir = _stage(a.run, "data-finetune", a.data_finetune) if (a.data_finetune or not (data / "finetune").is_dir()) \
        else data  # runs before the fine-tuning scenes were a stage of their own kept them in data/
    ft, test = load_scenes(ft_dir / "finetune"), load_scenes(data / "test")
    trees = read_json(_stage(a.run, "trees", a.trees) / "trees.json", "trees")
    base_dir = _stage(a.run, f"base_s{a.seed}", a.base)
    caps = [lab["caption"] for lab in ft["labels"]]
    tree_list, negatives = trees["trees"], trees["negatives"]
    if a.relation_only:
        swaps = [rel["neg"] for rel in relation_items(ft["labels"], len(caps))["relation"]]
        tree_list = [[{"positive": c, "negatives": [s], "negative_pos": ["ADP"]}] for c, s in zip(caps, swaps)]
        negatives = swaps
    result = {"config": {**vars(a), "run": str(a.run), "out": str(a.out)}, "recipe": dataclasses.asdict(cfg)}
    result["base"] = evaluate(tiny_pretrained.load_pretrained(base_dir / "model"), ft, test, a.n_train_items)
    t0 = time.perf_counter()
    model = tiny_pretrained.load_pretrained(base_dir / "model")
    tuner = TreeTuner(mode=a.mode, alpha=cfg.alpha, level_reduction=cfg.level_reduction, rank=cfg.rank,
                      lora_alpha=cfg.lora_alpha, lr=cfg.ft_lr, epochs=cfg.ft_epochs, batch_size=cfg.ft_batch_size,
                      warmup_steps=cfg.ft_warmup_steps, max_levels=cfg.max_levels, max_negatives=cfg.max_negatives,
                      seed=a.seed, threads=a.threads, towers=cfg.towers, minilm_layers=cfg.minilm_layers)
    tuner.fit(ft["images"], caps, model=model, trees=tree_list, negatives=negatives)
    result["fit_seconds"] = time.perf_counter() - t0
    result["final_loss"] = tuner.result_.final_loss
    result["tuned"] = evaluate(tuner.merged_, ft, test, a.n_train_items)
    atomic_write_json(a.out, result)
    print(json.dumps({k: result[k] for k in ("base", "tuned", "fit_seconds")}, indent=1))


if __name__ == "__main__":
    main()

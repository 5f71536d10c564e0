"""3vl-lit premise lever (issue 42): a base pre-trained on the fine-tuning captions' distribution,
then the three fine-tunes at one budget -> checklist accuracy of each, one seed, test split.

    python experiments/lit_premise.py NAME field=value ...   (fields of ThreeVLLitRecipe over the quick preset)

Stages are shared through runs/lit-premise/stages (the keys of `vlctl reproduce 3vl-lit`); writes experiments/lit_premise/NAME.json.
"""
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vlctl.config import check_values
from vlctl.data.scenes import CHECKLIST_CATEGORIES, load_scenes
from vlctl.encoders import tiny_pretrained
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.eval.checklist import checklist_scores
from vlctl.eval.metrics import checklist_accuracy
from vlctl.recipes.runner import Runner
from vlctl.recipes.threevl import lit as L

name, overrides = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
typed = {k: json.loads(v) if v[:1] in "0123456789[-" else v for k, v in overrides.items()}
if "seeds" in typed:
    typed["seeds"] = tuple(typed["seeds"])
cfg = dataclasses.replace(L.load_preset(True), **check_values(L.ThreeVLLitRecipe, typed, "override"))
runner = Runner(Path("runs/lit-premise"))
t0 = time.perf_counter()
keys = L.stage_keys(cfg)
data = runner.stage("data", keys["data"], lambda w: L._data(cfg, w))
ft_data = runner.stage("data-finetune", keys["data_finetune"], lambda w: L._data_finetune(cfg, w))
trees = runner.stage("trees", keys["trees"], lambda w: L._trees(cfg, ft_data, w))
test = load_scenes(data / "test")
items = L.test_items(data, cfg.data_seed)
out = {"config": {k: str(v) for k, v in dataclasses.asdict(cfg).items()}, "models": {}}
for seed in cfg.seeds:
    bkey = L.base_stage_key(cfg, seed, keys)
    base = runner.stage(f"base_s{seed}", bkey, lambda w, r, seed=seed: L._base(cfg, seed, data, w, r), resumable=True)
    dirs = {"base": base}
    for mode in L.FT_MODES:
        dirs[mode] = runner.stage(f"finetune_{mode}_s{seed}", L.finetune_stage_key(cfg, mode, bkey, keys),
                                  lambda w, mode=mode, seed=seed, base=base: L._finetune(cfg, mode, seed, base,
                                                                                         ft_data, trees, w))
    for m, d in dirs.items():
        model = tiny_pretrained.load_pretrained(d / "model") if m == "base" else L.load_tuned(d)
        enc = TinyCLIPEncoder(model)
        with torch.no_grad():
            x = enc.preprocess_batch(np.asarray(test["images"]))
            acc = {c: checklist_accuracy(s) for c, s in checklist_scores(enc, x, items).items()}
        acc["average"] = float(np.mean([acc[c] for c in CHECKLIST_CATEGORIES]))
        out["models"][f"{m}_s{seed}"] = {"accuracy": acc, "fit": json.loads((d / "fit.json").read_text())}
        print(m, seed, {k: round(v, 1) for k, v in acc.items()}, flush=True)
out["seconds"] = time.perf_counter() - t0
Path(f"experiments/lit_premise/{name}.json").write_text(json.dumps(out, indent=1))

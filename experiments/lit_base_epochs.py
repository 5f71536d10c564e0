"""3vl-lit lever: a longer base pre-training -> the seed-0 base's checklist and extra items on the test split.

    python experiments/lit_base_epochs.py EPOCHS   (stages shared with `vlctl reproduce 3vl-lit --quick --out runs/lit-quick`)

Writes experiments/relation_levers/lit_base_epochs_<EPOCHS>.json.
"""
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

from vlctl.data.scenes import CHECKLIST_CATEGORIES, load_scenes
from vlctl.encoders import tiny_pretrained
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.eval.checklist import checklist_scores
from vlctl.eval.metrics import checklist_accuracy
from vlctl.recipes.runner import Runner
from vlctl.recipes.threevl import lit as L

ep = int(sys.argv[1])
cfg = dataclasses.replace(L.load_preset(True), base_epochs=ep, seeds=(0,))
r = Runner(Path("runs/lit-base-lever"), stages="runs/lit-quick/stages")
k = L.stage_keys(cfg)
data = r.stage("data", k["data"], lambda w: L._data(cfg, w))
b = r.stage("base_s0", L.base_stage_key(cfg, 0, k), lambda w, res: L._base(cfg, 0, data, w, res), resumable=True)
secs = json.loads((b / "fit.json").read_text())["seconds"]  # the stage's own fit time (also when reused)
enc = TinyCLIPEncoder(tiny_pretrained.load_pretrained(b / "model"))
test = load_scenes(data / "test")
items = L.test_items(data, cfg.data_seed)
with torch.no_grad():
    x = enc.preprocess_batch(np.asarray(test["images"]))
    acc = {c: checklist_accuracy(s) for c, s in checklist_scores(enc, x, items).items()}
acc["average"] = float(np.mean([acc[c] for c in CHECKLIST_CATEGORIES]))
out = {"base_epochs": ep, "seed": 0, "base_seconds": secs, "accuracy": acc, "stage": b.name}
Path(f"experiments/relation_levers/lit_base_epochs_{ep}.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out))

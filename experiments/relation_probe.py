"""Does a 3vl-lit base's image embedding carry the spatial relation at all? (issue 42)

The recipe now runs this probe itself (stage relation_probe, vlctl.recipes.threevl.lit_probe); this
script made experiments/relation_probe.json on stop 49's 999-step stages, with an MLP probe beside.

Relations stay at chance after every fine-tune of the LiT base, at 111 and at 999 LoRA steps. A text-side
adapter can only read what the image embedding holds, so this probes the base's pooled image
embedding for the relation of two-object scenes, against controls on the same embeddings:

- relation: which of the two objects is left of (above) the other, named by identity: y = 1 when
  the object whose attribute tuple sorts first lies left (above) by more than the generator's margin;
- position control: is the red object (when one is red) in the left (top) half: position without
  binding to the other object;
- identity control: is one object red: what the contrastive base is trained to carry;
- pixel control: the same probes on the images themselves, average-pooled to 8 x 8 x 3 (what a probe
  can read from this much data when the information is there).

Logistic regression (scikit-learn, C from 5-fold CV on the training scenes) and a 2-layer MLP,
fitted on the train split's two-object scenes, scored on the test split's (disjoint configurations).

    S=runs/lit-premise/stages; python experiments/relation_probe.py $S/data-187969f232f6 \\
        base=$S/base_s0-fa6103eb1852 tree_999_steps=$S/finetune_tree_s0-c1a6ddf02bce \\
        contrastive_999_steps=$S/finetune_contrastive_s0-fc02baf5c7ad --out experiments/relation_probe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegressionCV
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

from vlctl.data.scenes import RELATION_MARGIN, load_scenes
from vlctl.encoders import tiny_pretrained
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.recipes.threevl.lit_probe import pixels

KEY = ("color", "shape", "size", "texture")


def labels(scene_labels: list[dict]) -> dict[str, np.ndarray]:
    """Per scene, each probe's label (-1 where it does not apply)."""
    out = {k: [] for k in ("relation_x", "relation_y", "red_left", "red_top", "has_red")}
    for lab in scene_labels:
        objs = lab["objects"]
        two = len(objs) == 2
        a, b = sorted(objs, key=lambda o: tuple(o[k] for k in KEY)) if two else (None, None)
        for axis, name in (("cx", "relation_x"), ("cy", "relation_y")):
            d = b[axis] - a[axis] if two else 0.0
            out[name].append(int(d > 0) if two and abs(d) > RELATION_MARGIN else -1)
        red = [o for o in objs if o["color"] == "red"]
        out["red_left"].append(int(red[0]["cx"] < 0.5) if two and len(red) == 1 else -1)
        out["red_top"].append(int(red[0]["cy"] < 0.5) if two and len(red) == 1 else -1)
        out["has_red"].append(int(bool(red)) if two else -1)
    return {k: np.array(v) for k, v in out.items()}


def embed(model, images: np.ndarray) -> np.ndarray:
    enc = TinyCLIPEncoder(model)
    with torch.no_grad():
        return enc.encode_images(enc.preprocess_batch(np.asarray(images))).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="a 3vl-lit data stage (train/ and test/ scenes)")
    ap.add_argument("models", nargs="+", help="NAME=STAGE: 3vl-lit base or fine-tune stages (their model/)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    train, test = load_scenes(a.data / "train"), load_scenes(a.data / "test")
    y_tr, y_te = labels(train["labels"]), labels(test["labels"])
    models = dict(m.split("=", 1) for m in a.models)
    result = {"data": str(a.data), "models": models, "probes": {}}
    for name, stage in models.items():
        model = tiny_pretrained.load_pretrained(Path(stage) / "model")
        result["probes"][name] = {}
        probe(embed(model, train["images"]), embed(model, test["images"]), y_tr, y_te, result["probes"][name], name)
    result["probes"]["pixels"] = {}
    probe(pixels(train["images"]), pixels(test["images"]), y_tr, y_te, result["probes"]["pixels"], "pixels")
    a.out.write_text(json.dumps(result, indent=1) + "\n")


def probe(x_tr, x_te, y_tr, y_te, out: dict, what: str) -> None:
    with threadpool_limits(1):
        for name in y_tr:
            tr, te = y_tr[name] >= 0, y_te[name] >= 0
            lin = LogisticRegressionCV(Cs=8, cv=5, max_iter=4000, l1_ratios=(0.0,), use_legacy_attributes=False).fit(x_tr[tr], y_tr[name][tr])
            mlp = MLPClassifier((256, 256), max_iter=2000, random_state=0, early_stopping=True).fit(
                x_tr[tr], y_tr[name][tr])
            chance = max(np.mean(y_te[name][te]), 1 - np.mean(y_te[name][te]))
            out[name] = {
                "n_train": int(tr.sum()), "n_test": int(te.sum()), "majority": round(100 * float(chance), 1),
                "linear_test": round(100 * float(lin.score(x_te[te], y_te[name][te])), 1),
                "linear_train": round(100 * float(lin.score(x_tr[tr], y_tr[name][tr])), 1),
                "mlp_test": round(100 * float(mlp.score(x_te[te], y_te[name][te])), 1)}
            print(what, name, out[name], flush=True)


if __name__ == "__main__":
    main()

"""3vl-lit's relation probe: does a model's pooled image embedding carry the spatial relation at all?

A text-side adapter, and the dot product the checklist scores with, can only read what the image
embedding holds. Linear probes (`vlctl.eval.probe`) fitted on the train split's two-object scenes
and scored on the test split's (disjoint configurations) read each model's image embedding for the
relation of its two objects (`vlctl.data.scenes.probe_labels`), beside two controls on the same
embeddings, an object's colour (identity: what the contrastive base is trained to carry) and where
the one red object lies (position without the other object), and beside the same probes on the
images themselves, average-pooled to 8 x 8 x 3 (what a linear probe reads from this much data when
the information is there). Stage `relation_probe`, after the fine-tunes; its arrays recompute
every accuracy (ARRAYS_README).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from vlctl.data.scenes import load_scenes, probe_labels
from vlctl.eval.probe import linear_probe
from vlctl.io import atomic_save_npz

PIXEL_GRID = 8  # the pixel control's average-pooled side
PROBES = ("relation_x", "relation_y", "color_present", "color_left")

ARRAYS_README = """`relation_probe.npz`: `y__<probe>` (n_test,) int64, the label of each test scene
(vlctl.data.scenes.probe_labels; -1: the probe does not apply), and `pred_<model>__<probe>` (the
labels a logistic regression fitted on the train split's scenes predicts for the test scenes where
y >= 0), model in `<base|contrastive|negclip|tree>_s<seed>` (its pooled image embedding) and
`pixels` (the images average-pooled to 8 x 8 x 3): accuracy = 100 * mean(pred == y[y >= 0]); the
report's "majority" is 100 * max(mean(y[y >= 0]), 1 - mean(y[y >= 0])).
"""


def pixels(images: np.ndarray, grid: int = PIXEL_GRID) -> np.ndarray:
    """(n, grid * grid * 3) float32: images (n, s, s, 3) uint8, average-pooled to grid x grid in [0, 1]."""
    x = np.asarray(images, dtype=np.float32) / 255.0
    n, s = x.shape[0], x.shape[1]
    if s % grid:
        raise ValueError(f"pixels: image side {s} is not a multiple of {grid}")
    return x.reshape(n, grid, s // grid, grid, s // grid, 3).mean(axis=(2, 4)).reshape(n, -1)


def _embed(model, images: np.ndarray, batch: int = 1024) -> np.ndarray:
    import torch

    from vlctl.encoders.tiny_encoder import TinyCLIPEncoder

    enc = TinyCLIPEncoder(model.eval())
    with torch.no_grad():
        return np.concatenate([enc.encode_images(enc.preprocess_batch(np.asarray(images[i:i + batch]))).numpy()
                               for i in range(0, len(images), batch)])


def relation_probe(data_dir: Path, models: dict[str, Path], load: Callable, work: Path) -> None:
    """Write work/relation_probe.npz: `models` maps a name to a stage directory, `load(directory)`
    returns its TinyCLIP."""
    train, test = load_scenes(data_dir / "train"), load_scenes(data_dir / "test")
    y_tr, y_te = probe_labels(train["labels"]), probe_labels(test["labels"])
    arrays = {f"y__{p}": y_te[p] for p in PROBES}

    def features():  # one model's embeddings in memory at a time
        yield "pixels", pixels(train["images"]), pixels(test["images"])
        for name, directory in models.items():
            model = load(directory)
            yield name, _embed(model, train["images"]), _embed(model, test["images"])

    for name, x_tr, x_te in features():
        for p in PROBES:
            tr, te = y_tr[p] >= 0, y_te[p] >= 0
            arrays[f"pred_{name}__{p}"] = linear_probe(x_tr[tr], y_tr[p][tr], x_te[te])
    atomic_save_npz(work / "relation_probe.npz", **arrays)


def probe_results(arr) -> dict:
    """{model: {probe: accuracy %}, "majority": {probe: %}, "n_test": {probe: n}} from relation_probe.npz;
    a model trained with several seeds (`<model>_s<seed>`) also gets `<model>`: the mean over its seeds."""
    out: dict[str, dict] = {"majority": {}, "n_test": {}}
    labels = {p: arr[f"y__{p}"][arr[f"y__{p}"] >= 0] for p in PROBES}  # the test rows each probe applies to
    for p, y in labels.items():
        out["majority"][p] = 100.0 * max(float(y.mean()), 1.0 - float(y.mean())) if len(y) else float("nan")
        out["n_test"][p] = len(y)
    names = sorted({k[len("pred_"):].split("__")[0] for k in arr.files if k.startswith("pred_")})
    for name in names:
        out[name] = {p: 100.0 * float(np.mean(arr[f"pred_{name}__{p}"] == y)) for p, y in labels.items()}
    seeded: dict[str, list[str]] = {}
    for name in names:
        if "_s" in name and name.rsplit("_s", 1)[1].isdigit():
            seeded.setdefault(name.rsplit("_s", 1)[0], []).append(name)
    for model, runs in seeded.items():
        out[model] = {p: float(np.mean([out[r][p] for r in runs])) for p in PROBES}
    return out

"""Tiny trainings run both under torchrun (by tests/test_ddp.py) and in one process (imported there).

Usage: torchrun --standalone --nproc_per_node 2 tests/ddp_worker.py OUT_DIR
Trains each kind in KINDS into OUT_DIR/<kind>/ on CPU (gloo).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.train import LoopConfig, all_gather_with_grad, destroy_distributed, sample_rng, seed_everything, train

KINDS = ("contrastive", "mse")
N, DIM = 64, 8

# float64 so that DDP and one process agree far below the test's tolerance. eps=1.0 makes AdamW
# sensitive to the gradient's scale (update ~ m / (sqrt(v) + 1)); with a tiny eps Adam would hide
# a wrong all_gather/DDP factor, since m / sqrt(v) does not change when every gradient doubles.
CFG = LoopConfig(
    epochs=5, batch_size=16, lr=0.05, eps=1.0, warmup_steps=3, min_lr_ratio=0.1, seed=3, log_every=5, progress=False
)


class TwoTower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image = torch.nn.Linear(DIM, 4)
        self.text = torch.nn.Linear(DIM, 4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(5.0)))

    def forward(self, x, y):
        return F.normalize(self.image(x), dim=-1), F.normalize(self.text(y), dim=-1), self.logit_scale.exp()


def contrastive_loss(model, batch):
    """CLIP InfoNCE over the GLOBAL batch: every rank scores all pairs of gathered features."""
    x, y = batch
    fi, ft, scale = model(x, y)
    fi, ft = all_gather_with_grad(fi), all_gather_with_grad(ft)
    logits = scale * fi @ ft.T
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def mse_loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y[:, :1])


def data():
    g = torch.Generator().manual_seed(123)
    x = torch.randn(N, DIM, generator=g, dtype=torch.float64)
    y = x @ torch.randn(DIM, DIM, generator=g, dtype=torch.float64) + 0.1 * torch.randn(
        N, DIM, generator=g, dtype=torch.float64
    )
    return x, y


def run(kind: str, out_dir: Path):
    """Train `kind` into out_dir; returns (initial state_dict, TrainResult)."""
    x, y = data()

    def make_batch(indices, epoch):
        # Per-sample augmentation from (seed, epoch, index): identical however ranks split a batch.
        noise = torch.from_numpy(np.stack([sample_rng(CFG.seed, epoch, i).normal(size=DIM) for i in indices]))
        return x[indices] + 0.05 * noise, y[indices]

    seed_everything(0)
    if kind == "contrastive":
        model = TwoTower().double()
        # The temperature gets its own, larger lr, as in CLIP training.
        temp = [model.logit_scale]
        groups = [
            {"params": [p for p in model.parameters() if p is not model.logit_scale], "lr": 0.05, "weight_decay": 0.01},
            {"params": temp, "lr": 0.2, "weight_decay": 0.0},
        ]
        loss_fn = contrastive_loss
    else:
        model = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
        groups, loss_fn = None, mse_loss
    init = {k: v.clone() for k, v in model.state_dict().items()}
    result = train(
        model,
        n_samples=N,
        make_batch=make_batch,
        loss_fn=loss_fn,
        cfg=CFG,
        out_dir=out_dir,
        param_groups=groups,
        device="cpu",
    )
    return init, result


if __name__ == "__main__":
    for kind in KINDS:
        run(kind, Path(sys.argv[1]) / kind)
    destroy_distributed()

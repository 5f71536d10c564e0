"""Tiny trainings run both under torchrun (by tests/test_ddp.py) and in one process (imported there).

Usage: torchrun --standalone --nproc_per_node 2 tests/ddp_worker.py OUT_DIR [controlembed]
Trains each kind in KINDS into OUT_DIR/<kind>/ on CPU (gloo). With `controlembed` (read by
tests/test_controlembed_ddp.py) instead: each ControlEmbed fit of CE_KINDS, a fit cut short and
resumed, and one episode's gradient, saved by rank 0 as OUT_DIR/controlembed.pt.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.encoders.loss import all_gather_with_grad
from vlctl.train.config import LoopConfig
from vlctl.train.distributed import destroy_distributed
from vlctl.train.loop import sample_rng, seed_everything, train

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


# --- ControlEmbed (tests/test_controlembed_ddp.py) -----------------------------------------------

# Episodes of 3 subclasses x 3 images: 9 anchors, split 5 / 4 over two ranks. "color" has 5
# subclasses, so an episode draws 3 of them; "shape" leaves every 7th image unlabelled.
CE_CFG = {"steps": 10, "hidden": 16, "images_per_subclass": 3, "max_subclasses_per_batch": 3, "lr": 1e-2,
          "warmup_steps": 2, "align_weight": 0.5, "temperature": 0.2, "seed": 4}
CE_KINDS = {"full": {}, "factored": {"head_rank": 3}, "lowrank": {"parameterisation": "lowrank", "rank": 2},
            "no_text": {"align_weight": 0.0}}
CE_N, CE_D = 60, 6


def controlembed_data():
    """(x, labels, category embeddings, subclass text embeddings) of a tiny two-category task."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(CE_N, CE_D)).astype(np.float32)
    color = np.array([f"c{i % 5}" for i in range(CE_N)], dtype=object)
    shape = np.array([f"s{(i // 5) % 2}" for i in range(CE_N)], dtype=object)
    shape[::7] = None
    cond = {"color": rng.normal(size=5), "shape": rng.normal(size=5)}
    text = {"color": rng.normal(size=(5, CE_D)), "shape": rng.normal(size=(2, CE_D))}
    return x, {"color": color, "shape": shape}, cond, text


def controlembed_fit(kind: str, out_dir=None, **fit_kw):
    """The ControlEmbed fit of CE_KINDS[kind] (under torchrun: data-parallel)."""
    from vlctl.methods.controlembed.estimator import ControlEmbed

    x, labels, cond, text = controlembed_data()
    est = ControlEmbed(**{**CE_CFG, **CE_KINDS[kind]}, out_dir=out_dir)
    return est.fit(x, labels, encoder_id="toy", category_emb=cond,
                   class_text_emb=None if kind == "no_text" else text, **fit_kw)


def controlembed_episode_grad(sharded: bool):
    """(loss, metrics, grads of W and b) of one 9-image episode at a random map: the whole episode in
    one process, or each rank's anchors with the gradients averaged as DDP averages them."""
    import torch.distributed as dist

    from vlctl.methods.controlembed.fit import controlembed_loss, sharded_loss
    from vlctl.train.distributed import rank_and_world, shard_rows

    g = torch.Generator().manual_seed(5)
    w = (torch.eye(CE_D) + 0.3 * torch.randn(CE_D, CE_D, generator=g)).requires_grad_()
    b = (0.2 * torch.randn(CE_D, generator=g)).requires_grad_()
    emb = F.normalize(torch.randn(9, CE_D, generator=g), dim=-1)
    y = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    text = F.normalize(torch.randn(3, CE_D, generator=g), dim=-1)
    if not sharded:
        loss, stats = controlembed_loss(emb @ w + b, emb, y, text, 0.2, 0.5)
        loss.backward()
        return float(loss.detach()), stats, w.grad, b.grad
    rank, world = rank_and_world()
    rows = torch.tensor(shard_rows(9, rank, world))
    loss, stats = sharded_loss(w, b, emb, y, rows, text, 0.2, 0.5, world)
    loss.backward()
    both = torch.cat([w.grad.flatten(), b.grad, loss.detach().reshape(1),
                      torch.tensor([stats["sr"], stats["i2t"], stats["t2i"]])])
    dist.all_reduce(both)
    both /= world  # DDP's average of the gradients; the loop's average of the logged values
    n = CE_D * CE_D
    return float(both[n + CE_D]), dict(zip(("sr", "i2t", "t2i"), both[-3:].tolist())), both[:n].view(CE_D, CE_D), \
        both[n : n + CE_D]


def controlembed_main(out: Path) -> None:
    import functools
    import os

    from vlctl.train import loop
    from vlctl.train.distributed import init_distributed

    init_distributed("cpu")  # the episode's gradient is all-reduced before any fit joins the group
    saved = {"grad": controlembed_episode_grad(sharded=True)}
    for kind in CE_KINDS:
        est = controlembed_fit(kind, out / kind)
        saved[kind] = ({k: v.clone() for k, v in est.hypernet_.state_dict().items()}, est.final_loss_)
    real = loop.train
    loop.train = functools.partial(real, stop_after_steps=6)  # "killed" after step 6
    controlembed_fit("full", out / "cut", checkpoint_every=4)
    loop.train = real
    est = controlembed_fit("full", out / "cut", checkpoint_every=4, resume=True)
    saved["resumed"] = ({k: v.clone() for k, v in est.hypernet_.state_dict().items()}, est.final_loss_)
    if os.environ["RANK"] == "0":
        torch.save(saved, out / "controlembed.pt")


if __name__ == "__main__":
    if sys.argv[2:] == ["controlembed"]:
        controlembed_main(Path(sys.argv[1]))
    else:
        for kind in KINDS:
            run(kind, Path(sys.argv[1]) / kind)
    destroy_distributed()

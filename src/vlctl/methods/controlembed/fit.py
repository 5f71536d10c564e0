"""ControlEmbed's training (docs/methods.md §2): the episode loss, the episodes, and the run of the
project's training loop, in one process or data-parallel under torchrun.

One step is one episode: one category, m images of each of (at most max_subclasses_per_batch) of
its subclasses. Episode e (e = 0 .. steps - 1, in the order `epoch_order(steps, seed, 0)`) is a
pure function of (seed, e): its category cycles over the categories, its images come from
`sample_rng(seed, 0, e)`.

Data parallel. Under torchrun every rank builds the whole episode of the step (cheap: indices into
the cached embeddings) and takes the anchors `shard_rows(B, rank, world)` of its B images. The
loss splits exactly over the anchors but for one term:

    L_SR  = (1 / N_pos) sum_i l_SR(i)       l_SR(i) needs q'_i and the frozen g of the whole episode
    L_i2t = (1 / B) sum_i CE_i               CE_i needs q'_i and the subclass texts
    L_t2i = mean_c -1/|I(c)| sum_{i in I(c)} log softmax_i(t_c . q'_i / tau)   (a softmax over ALL i)

(N_pos: anchors with a positive, counted over the episode). A rank's loss is world x (its anchors'
sums of L_SR and omega L_i2t with the episode's denominators) + omega L_t2i, the latter computed
whole on every rank from t_c . q'_i = (t_c W^T) . g_i + t_c . b (K x D^2 work, no image map) and
identical on every rank. DDP averages the ranks' gradients, so the result is the one-process
gradient of the episode: the same fit up to float rounding. The logged sr / i2t / t2i (averaged
over ranks by the loop) are the episode's.

The loop splits a global batch of `batch_size` samples over the ranks; an episode is not such a
batch, so the loop is given `steps x world` samples in global batches of `world`: sample s of the
loop's order sits at position p, which is step p // world, whose episode is the one-process
order's p // world-th. The loop's checkpoint therefore records the number of ranks (its
batch_size), and a resume needs the same number.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.config import config_to_dict
from vlctl.fsops import VlctlError
from vlctl.io import hash_state_dict, read_json
from vlctl.train.distributed import rank_and_world, shard_rows


def controlembed_loss(
    q: torch.Tensor, g: torch.Tensor, y: torch.Tensor, text: torch.Tensor | None, temperature: float, align_weight: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one episode (`vlctl.methods.controlembed.estimator` docstring).

    q: (B, D) transformed embeddings; g: (B, D) the same images' frozen embeddings; y: (B,) subclass
    index in [0, K); text: (K, D) normalised subclass text embeddings (None: no alignment term).
    Returns (loss, {"sr", "i2t", "t2i"}).
    """
    n = q.shape[0]
    self_pair = torch.eye(n, dtype=torch.bool, device=q.device)
    logits = (q @ g.T / temperature).masked_fill(self_pair, float("-inf"))
    logp = torch.log_softmax(logits, dim=1)
    pos = (y[:, None] == y[None, :]) & ~self_pair
    n_pos = pos.sum(1)
    has = n_pos > 0
    sr = -(torch.where(pos, logp, 0.0).sum(1)[has] / n_pos[has]).mean()
    stats = {"sr": float(sr.detach())}
    if text is None or align_weight == 0:
        return sr, stats
    i2t = F.cross_entropy(q @ text.T / temperature, y)
    logp_t = torch.log_softmax(text @ q.T / temperature, dim=1)  # (K, B): each text over the images
    t2i = _t2i(logp_t, y, text.shape[0])
    stats.update(i2t=float(i2t.detach()), t2i=float(t2i.detach()))
    return sr + align_weight * (i2t + t2i), stats


def _t2i(logp_t: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """mean over the present texts c of -1/|I(c)| sum_{i in I(c)} logp_t[c, i]."""
    member = torch.arange(k, device=y.device)[:, None] == y[None, :]
    count = member.sum(1)
    present = count > 0
    return -(torch.where(member, logp_t, 0.0).sum(1)[present] / count[present]).mean()


def sharded_loss(
    w: torch.Tensor, b: torch.Tensor, g: torch.Tensor, y: torch.Tensor, rows: torch.Tensor,
    text: torch.Tensor | None, temperature: float, align_weight: float, world: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This rank's loss for the anchors `rows` of the episode (module docstring): the mean over
    ranks of the value, and DDP's average of the gradients, are `controlembed_loss`'s of the
    episode (w (D, D), b (D,) its map; g (B, D), y (B,) the whole episode)."""
    n = g.shape[0]
    q = g[rows] @ w + b  # (n_r, D): this rank's anchors, transformed
    self_pair = rows[:, None] == torch.arange(n, device=g.device)[None, :]
    logp = torch.log_softmax((q @ g.T / temperature).masked_fill(self_pair, float("-inf")), dim=1)
    pos = (y[rows][:, None] == y[None, :]) & ~self_pair
    n_pos = pos.sum(1)
    has = n_pos > 0
    n_has = int((torch.bincount(y)[y] > 1).sum())  # anchors with a positive, over the whole episode
    sr = -(torch.where(pos, logp, 0.0).sum(1)[has] / n_pos[has]).sum() * (world / max(n_has, 1))
    stats = {"sr": float(sr.detach())}
    if text is None or align_weight == 0:
        return sr, stats
    i2t = F.cross_entropy(q @ text.T / temperature, y[rows], reduction="sum") * (world / n)
    # Every image's logit for every text without mapping every image: t . (g W + b) = (t W^T) . g + t . b.
    logits_t = ((text @ w.T) @ g.T + (text @ b)[:, None]) / temperature  # (K, B)
    t2i = _t2i(torch.log_softmax(logits_t, dim=1), y, text.shape[0])
    stats.update(i2t=float(i2t.detach()), t2i=float(t2i.detach()))
    return sr + align_weight * (i2t + t2i), stats


def fit_hypernet(
    net: nn.Module, cfg: Any, x: np.ndarray, categories: list[str], members: dict[str, list[np.ndarray]],
    cond: np.ndarray, text: dict[str, np.ndarray] | None, *, encoder_id: str, progress: bool,
    out_dir: str | Path | None, checkpoint_every: int = 0, resume: bool = False,
) -> float:
    """Train `net` (an AffineHyperNet of config `cfg`) in place on the episodes; returns the final
    logged loss. x: (N, D) normalised embeddings; members[category][k]: rows of its k-th subclass;
    cond: (C, cond_dim) category embeddings; text: {category: (K, D)} or None.

    checkpoint_every (steps): the loop's checkpoint in `out_dir/checkpoint/`; resume: continue
    from it, refused when it was written for another config, encoder, data or number of ranks."""
    from vlctl.train.config import LoopConfig
    from vlctl.train.loop import default_param_groups, epoch_order, sample_rng, train

    if (checkpoint_every or resume) and out_dir is None:
        raise VlctlError("ControlEmbed.fit: checkpoint_every / resume need out_dir (where the checkpoint lives)")
    # The loop's view of the ranks (torchrun's variables; the runner sets WORLD_SIZE=1 once it has left).
    world = int(os.environ.get("WORLD_SIZE", "1"))
    x_t, cond_t = torch.from_numpy(x), torch.from_numpy(cond)
    text_t = {c: torch.from_numpy(t) for c, t in text.items()} if text is not None else None
    m, k_max = cfg.images_per_subclass, cfg.max_subclasses_per_batch
    episodes = epoch_order(cfg.steps, cfg.seed, 0)  # step i's episode (one process: the loop's own order)
    loop_pos = np.empty(cfg.steps * world, dtype=np.int64)
    loop_pos[epoch_order(cfg.steps * world, cfg.seed, 0)] = np.arange(cfg.steps * world)

    def make_batch(samples: np.ndarray, epoch: int):
        # A pure function of (seed, episode): the same episode whatever the number of ranks.
        (sample,) = samples
        episode = int(episodes[loop_pos[sample] // world])
        rng = sample_rng(cfg.seed, epoch, episode)
        ci = episode % len(categories)
        groups = members[categories[ci]]
        chosen = np.arange(len(groups)) if len(groups) <= k_max else np.sort(rng.choice(len(groups), k_max, replace=False))
        idx, y = [], []
        for slot, k in enumerate(chosen):
            pool = groups[k]
            idx.append(rng.choice(pool, size=min(m, len(pool)), replace=False))
            y.append(np.full(len(idx[-1]), slot))
        idx_t = torch.from_numpy(np.concatenate(idx))
        txt = text_t[categories[ci]][torch.from_numpy(chosen)] if text_t is not None else torch.zeros(0)
        rank, n_ranks = rank_and_world()
        rows = torch.tensor(shard_rows(len(idx_t), rank, n_ranks), dtype=torch.long)
        return cond_t[ci : ci + 1], x_t[idx_t], torch.from_numpy(np.concatenate(y)), txt, rows

    def loss_fn(model: nn.Module, batch):
        cond_b, g, y, txt, rows = batch
        w, b = model(cond_b)
        if world == 1:  # the one-process loss as it always was (bit for bit)
            q = g @ w[0] + b[0]
            return controlembed_loss(q, g, y, txt if txt.numel() else None, cfg.temperature, cfg.align_weight)
        return sharded_loss(w[0], b[0], g, y, rows, txt if txt.numel() else None, cfg.temperature,
                            cfg.align_weight, world)

    loop_cfg = LoopConfig(
        epochs=1, batch_size=world, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999),
        warmup_steps=min(cfg.warmup_steps, cfg.steps - 1), seed=cfg.seed, progress=progress,
        log_every=max(1, min(50, cfg.steps)), checkpoint_every=checkpoint_every,
    )
    run_config = {"controlembed": config_to_dict(cfg), "encoder_id": encoder_id, "categories": categories,
                  # what a resume must find again; a temporary run directory is never resumed
                  "data": _data_hash(x_t, cond_t, members, text_t) if out_dir is not None else None}
    if resume:
        _check_ranks(Path(out_dir) / "checkpoint", world)
    # Factored: PyTorch's fused AdamW (the same update up to rounding, one pass per tensor: half the
    # for-loop AdamW's time at D = 512). Unfactored: the loop's default, bit-identical to before.
    groups = [{**g, "fused": True} for g in default_param_groups(net, cfg.weight_decay)] if cfg.head_rank else None
    tmp = tempfile.TemporaryDirectory(prefix="vlctl-controlembed-") if out_dir is None else None
    threads = torch.get_num_threads()
    try:
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        result = train(net, n_samples=cfg.steps * world, make_batch=make_batch, loss_fn=loss_fn, cfg=loop_cfg,
                       out_dir=tmp.name if tmp else out_dir, run_config=run_config, device=cfg.device,
                       param_groups=groups, resume=resume)
    finally:
        torch.set_num_threads(threads)
        if tmp is not None:
            tmp.cleanup()
    return result.final_loss


def _data_hash(x: torch.Tensor, cond: torch.Tensor, members: dict, text: dict | None) -> str:
    """Content hash of what the episodes are drawn from: embeddings, subclass rows, category and
    subclass text embeddings."""
    data = {"x": x, "cond": cond, **{f"members.{c}.{k}": torch.from_numpy(np.asarray(rows, dtype=np.int64))
                                     for c, groups in members.items() for k, rows in enumerate(groups)},
            **({f"text.{c}": t for c, t in text.items()} if text is not None else {})}
    return hash_state_dict(data)


def checkpoint_ranks(ckpt_dir: str | Path) -> int | None:
    """The number of ranks a ControlEmbed fit's checkpoint was written by (the loop's batch_size,
    module docstring); None when there is no readable checkpoint."""
    state_path = Path(ckpt_dir) / "state.json"
    if not state_path.is_file():
        return None
    try:
        return int(read_json(state_path, "checkpoint state")["setup"]["loop"]["batch_size"])
    except (VlctlError, KeyError, TypeError, ValueError):
        return None  # the loop's own checks name what is wrong


def _check_ranks(ckpt_dir: Path, world: int) -> None:
    """Refuse, in words, a checkpoint written by another number of ranks (the loop would name only
    its batch_size, which here is the number of ranks)."""
    ranks = checkpoint_ranks(ckpt_dir)
    if ranks is not None and ranks != world:
        raise VlctlError(f"{ckpt_dir / 'state.json'}: the ControlEmbed fit was checkpointed by {ranks} process(es), "
                         f"this one runs {world}; resume it with the same number (torchrun --nproc_per_node {ranks})")

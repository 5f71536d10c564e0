"""The CLIP contrastive loss (symmetric InfoNCE) and the autograd-aware gather it uses under DDP.

`all_gather_with_grad` lives here, not in `vlctl.train.distributed`, so the encoders never import
the training package (train/ builds on encoders/, not the other way round).

Gradients through `all_gather_with_grad`: a CLIP-style loss computes the SAME global loss L on
every rank from the gathered features. all_gather's backward sums, over ranks, the gradient each
rank's loss sends to a rank's slice, so rank r's local features receive W * dL/df_r (W = world
size) and its parameters W * (dL/df_r)(df_r/dθ). DistributedDataParallel then averages over
ranks: (1/W) Σ_r W (dL/df_r)(df_r/dθ) = dL/dθ, exactly the single-process gradient of L on the
whole batch. No correction factor is needed; tests/test_ddp.py checks it.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vlctl.fsops import VlctlError


def all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate `x` (n_local, ...) over ranks in rank order, keeping the autograd graph.

    Gradients reach each rank's own slice; see the module docstring for why the result after
    DDP's averaging equals single-process training. Returns `x` unchanged in one process (no
    process group, or a world of one).
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return x
    from torch.distributed.nn.functional import all_gather

    # torch marks this function deprecated in favour of a private API; it is the public
    # autograd-aware gather, so silence the warning it would print on every call.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        parts = all_gather(x)
    return torch.cat(parts, dim=0)


def clip_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE over the global batch.

    `image_emb[i]` and `text_emb[i]` (unit norm, (n, d)) are a positive pair; `logit_scale` is the
    multiplier exp(t) (what `TinyCLIP.forward` returns). Under DDP both embeddings are gathered
    from all ranks with gradient (`all_gather_with_grad`) and the loss is computed over the full
    N x N similarity matrix, identically on every rank:
    L = (CE(s * I T^T, arange N) + CE(s * T I^T, arange N)) / 2.
    """
    if image_emb.shape != text_emb.shape or image_emb.ndim != 2:
        raise VlctlError(
            "clip_loss: need image and text embeddings of equal shape (n, d), "
            f"got {tuple(image_emb.shape)} and {tuple(text_emb.shape)}"
        )
    img = all_gather_with_grad(image_emb)
    txt = all_gather_with_grad(text_emb)
    logits = logit_scale * img @ txt.t()
    labels = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))

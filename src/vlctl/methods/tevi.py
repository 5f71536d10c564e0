"""TEVI (§1.3): text-conditioned editing of image embeddings through SAE latents.

For now: exact, fast scoring of every image conditioned on every text, and reranking of a cheap
first-stage ranking (CLIP) with it.

The edited embedding of image p conditioned on text q is e_{p|q} = W_D^T (z_p ⊙ m_q) + b_pre and
the retrieval score is cos(e_{p|q}, e_{t,q}). Naively that is an (n_images, n_texts, d) tensor.
It is not needed (DESIGN.md, "Cost model to design against"):

  numerator   e_{p|q} · t̂_q = (z_p ⊙ m_q) · u_q + b_pre · t̂_q,   u_q = W_D t̂_q   (d1,)
              = z @ (m ⊙ u)^T + b_pre · t̂       -- one (n_images, d1) x (d1, n_texts) matmul
  norm^2      ||W_D^T y + b||^2 = y^T G y + 2 y · (W_D b) + ||b||^2,   y = z_p ⊙ m_q,  G = W_D W_D^T

and y is zero outside the support S_p of z_p (at most K latents), so only G's K x K block
G_p = W_D[S_p] W_D[S_p]^T enters the quadratic form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch


def conditioned_scores(
    latents: torch.Tensor,
    masks: torch.Tensor,
    decoder: torch.Tensor,
    b_pre: torch.Tensor,
    text_emb: torch.Tensor,
    chunk_size: int | tuple[int, int] = 256,
    k: int | None = None,
) -> torch.Tensor:
    """cos(decoder^T (latents[p] ⊙ masks[q]) + b_pre, text_emb[q]) for every (p, q).

    latents:  (P, d1) SAE codes, zero outside each row's top K (rows may have fewer nonzeros)
    masks:    (Q, d1) text-conditioned masks m_q
    decoder:  (d1, d) W_D
    b_pre:    (d,)
    text_emb: (Q, d)  unnormalised text embeddings
    chunk_size: images per chunk and texts per chunk (an int means the same for both)
    k: support size K; default: the largest number of nonzeros in a row of `latents`
    returns   (P, Q)

    Exact (no approximation) and differentiable in every input. The gradient w.r.t. `latents` is
    exact on each row's support (the only entries a TopK code can move); off the support it
    holds only the numerator's part, since the norm is computed on the support alone. Peak extra memory, besides the
    inputs and the (P, Q) output, is O(P·K + Q·d1 + c·K·(d + K) + m·c·K) elements for image chunk c
    and text chunk m: the support's values and indices, m ⊙ u, the gathered decoder rows and their
    Gram blocks of one image chunk, and the masked codes y of one (image, text) chunk. Never
    P·Q·d. (Under autograd the per-chunk tensors are kept for backward, as usual.)
    """
    c_img, c_txt = (chunk_size, chunk_size) if isinstance(chunk_size, int) else chunk_size
    P, Q = latents.shape[0], masks.shape[0]
    t_hat = text_emb / text_emb.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (Q, d)

    # Numerator: one matmul over the codes (zeros outside the support contribute nothing).
    u = t_hat @ decoder.T  # (Q, d1): u_q = W_D t̂_q
    num = latents @ (masks * u).T + (t_hat @ b_pre)[None, :]  # (P, Q)

    # Support of each code: K indices and values; rows with fewer nonzeros are padded with
    # index 0 and value 0, which adds nothing to any term below.
    if k is None:
        k = int((latents != 0).sum(1).max()) if P else 0
    k = max(1, min(k, latents.shape[1]))
    idx = latents.detach().abs().topk(k, dim=1).indices  # (P, K)
    vals = latents.gather(1, idx)  # (P, K), differentiable in latents
    idx = torch.where(vals.detach() != 0, idx, torch.zeros_like(idx))
    wb = decoder @ b_pre  # (d1,): W_D b
    bb = b_pre @ b_pre  # ()

    rows = []
    for i0 in range(0, P, c_img):
        idx_c, vals_c = idx[i0 : i0 + c_img], vals[i0 : i0 + c_img]  # (c, K)
        dec_c = decoder[idx_c]  # (c, K, d)
        gram_c = dec_c @ dec_c.transpose(1, 2)  # (c, K, K): G_p = W_D[S_p] W_D[S_p]^T
        wb_c = wb[idx_c]  # (c, K)
        cols = []
        for j0 in range(0, Q, c_txt):
            m_c = masks[j0 : j0 + c_txt]  # (m, d1)
            y = vals_c[None] * m_c[:, idx_c]  # (m, c, K): z_p ⊙ m_q on S_p
            quad = torch.einsum("mck,ckl,mcl->cm", y, gram_c, y)  # (c, m)
            lin = 2 * torch.einsum("mck,ck->cm", y, wb_c)  # (c, m)
            cols.append(quad + lin + bb)
        rows.append(torch.cat(cols, dim=1))
    sq_norm = torch.cat(rows, dim=0) if rows else num.new_zeros((0, Q))  # (P, Q)
    # Rounding can leave a tiny negative value for an edited embedding of (almost) zero length.
    return num / sq_norm.clamp_min(1e-24).sqrt()


class Reranked(NamedTuple):
    order: torch.Tensor  # (P, Q) long: image indices per text, best first
    scores: torch.Tensor  # (k, Q) the rescored top-k, in the new order


def rerank(
    base_scores: torch.Tensor,
    k: int,
    rescore_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Reranked:
    """Coarse-to-fine retrieval: per text (column), take the top-k images by `base_scores`
    (P, Q) (e.g. CLIP cosine) and reorder only those by `rescore_fn` (e.g. TEVI scores).

    rescore_fn(image_idx (k, Q) long, text_idx (Q,) long) -> (k, Q): the score of image
        image_idx[i, j] for text text_idx[j]. (With conditioned_scores: score the union of the
        candidate images against the texts and gather.)
    returns Reranked(order, scores): `order[:k]` is the top-k reordered by the new score,
        `order[k:]` the remaining images in base order, so ranks below k never change and
        rank metrics (R@n, n <= k) read straight off `order`.

    Only k·Q pairs are rescored instead of P·Q: the cost drops by P/k.
    """
    P, Q = base_scores.shape
    k = min(k, P)
    base_order = base_scores.argsort(dim=0, descending=True, stable=True)  # (P, Q)
    cand = base_order[:k]  # (k, Q)
    new = rescore_fn(cand, torch.arange(Q, device=base_scores.device))  # (k, Q)
    new_scores, perm = new.sort(dim=0, descending=True, stable=True)
    order = torch.cat([cand.gather(0, perm), base_order[k:]], dim=0)
    return Reranked(order, new_scores)

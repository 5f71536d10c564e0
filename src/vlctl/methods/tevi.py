"""TEVI (§1.3): text-conditioned editing of image embeddings through SAE latents.

A frozen SAE codes each image embedding as sparse latents z (TopK). A caption q is mapped by a
3-layer ReLU MLP to a mask m_q = sigmoid(f_m(t_q)) over the latents; the edited embedding of
image p conditioned on q is e_{p|q} = W_D^T (z_p ⊙ m_q) + b_pre and the retrieval score is
cos(e_{p|q}, e_{t,q}). The mask is trained with InfoNCE, either with positive conditioning
(Eq. 10: image i edited by its own caption, against every text) or negative conditioning
(Eq. 11: every image of the batch edited by every text; `conditioned_scores` makes that exact
and cheap).

Scoring every image conditioned on every text looks like an (n_images, n_texts, d) tensor.
It is not needed (DESIGN.md, "Cost model to design against"):

  numerator   e_{p|q} · t̂_q = (z_p ⊙ m_q) · u_q + b_pre · t̂_q,   u_q = W_D t̂_q   (d1,)
              = z @ (m ⊙ u)^T + b_pre · t̂       -- one (n_images, d1) x (d1, n_texts) matmul
  norm^2      ||W_D^T y + b||^2 = y^T G y + 2 y · (W_D b) + ||b||^2,   y = z_p ⊙ m_q,  G = W_D W_D^T

and y is zero outside the support S_p of z_p (at most K latents), so only G's K x K block
G_p = W_D[S_p] W_D[S_p]^T enters the quadratic form.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.config import config_to_dict, opt
from vlctl.io import VlctlError, atomic_dir, atomic_save_safetensors, atomic_write_json


def conditioned_scores(
    latents: torch.Tensor,
    masks: torch.Tensor,
    decoder: torch.Tensor,
    b_pre: torch.Tensor,
    text_emb: torch.Tensor,
    chunk_size: int | tuple[int, int] | None = None,
    k: int | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """cos(decoder^T (latents[p] ⊙ masks[q]) + b_pre, text_emb[q]) for every (p, q).

    latents:  (P, d1) SAE codes, zero outside each row's top K (rows may have fewer nonzeros)
    masks:    (Q, d1) text-conditioned masks m_q
    decoder:  (d1, d) W_D
    b_pre:    (d,)
    text_emb: (Q, d)  unnormalised text embeddings
    chunk_size: images per chunk and texts per chunk (an int means the same for both); default:
              512 texts and as many images as keep a chunk's (c, K, m) tensors near 2^20 elements
              (cache-sized: measured 2.3x faster than 256 x 256 at K=128)
    k: support size K; default: the largest number of nonzeros in a row of `latents`
    returns   (P, Q)

    Exact (no approximation) and differentiable in every input; the gradient w.r.t. `latents`
    lives on each row's support (the only entries a TopK code can move). Work is
    O(Q·d·d1 + P·K²·d + P·Q·K²): u for every text, the Gram blocks of every image, and one K x K
    quadratic form per pair -- never a dense d1-long product per pair. Peak extra memory, besides
    the inputs and the (P, Q) output, is O(P·K + Q·d1 + c·K·(d + K) + c·m·K) elements for image
    chunk c and text chunk m: the supports, u, one image chunk's decoder rows and Gram blocks, and
    one (image, text) chunk's masked codes. Never P·Q·d. (Under autograd the per-chunk tensors are
    kept for backward, as usual.)

    method: "sparse" is the above. "dense" writes the quadratic form over all d1 latents as one
    GEMM, ||W_D^T y||² = vec(z_p z_p^T ⊙ G) · vec(m_q m_q^T): P·Q·d1² multiply-adds with no
    gathers, the fast way for a small dictionary (a CG-SAE's few dozen concept latents), in
    blocks of about 2^22 elements. "auto" takes "dense" when d1 <= min(4K, 64).
    """
    if method not in ("auto", "sparse", "dense"):
        raise ValueError(f"method must be 'auto', 'sparse' or 'dense', got {method!r}")
    P, Q = latents.shape[0], masks.shape[0]
    t_hat = text_emb / text_emb.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (Q, d)
    # u (and, on the sparse path, the masks) transposed to (d1, Q): a chunk's gather then reads
    # contiguous runs of texts.
    u_t = (decoder @ t_hat.T).contiguous()  # (d1, Q): column q is u_q = W_D t̂_q
    tb = t_hat @ b_pre  # (Q,): b_pre · t̂_q
    wb = decoder @ b_pre  # (d1,): W_D b
    bb = b_pre @ b_pre  # ()
    if k is None:
        k = int((latents != 0).sum(1).max()) if P else 0
    k = max(1, min(k, latents.shape[1]))
    d1 = latents.shape[1]
    if method == "dense" or (method == "auto" and d1 <= min(4 * k, 64)):
        gram = decoder @ decoder.T  # (d1, d1)
        mu = masks * u_t.T  # (Q, d1): m_q ⊙ u_q
        c = max(1, (1 << 22) // (d1 * d1))  # rows per chunk: each (c, d1²) block stays near 2^22 elements
        rows = []
        for i0 in range(0, P, c):
            z = latents[i0 : i0 + c]
            zz = (z[:, :, None] * z[:, None, :] * gram).reshape(len(z), d1 * d1)  # vec(z_p z_p^T ⊙ G)
            zwb = 2 * z * wb  # (c, d1): the cross term's image side
            cols = []
            for j0 in range(0, Q, c):
                m = masks[j0 : j0 + c]
                mm = (m[:, :, None] * m[:, None, :]).reshape(len(m), d1 * d1)  # vec(m_q m_q^T)
                num = z @ mu[j0 : j0 + c].T + tb[j0 : j0 + c]  # (c, m)
                sq = zz @ mm.T + zwb @ m.T + bb
                cols.append(num / sq.clamp_min(1e-24).sqrt())
            rows.append(torch.cat(cols, dim=1) if cols else tb.new_zeros((len(z), 0)))
        return torch.cat(rows, dim=0) if rows else tb.new_zeros((0, Q))

    masks_t = masks.T.contiguous()  # (d1, Q)
    if chunk_size is None:
        chunk_size = (max(1, (1 << 20) // (k * 512)), 512)
    c_img, c_txt = (chunk_size, chunk_size) if isinstance(chunk_size, int) else chunk_size
    # Support of each code: K indices and values; rows with fewer nonzeros are padded with
    # index 0 and value 0, which adds nothing to any term below.
    idx = latents.detach().abs().topk(k, dim=1).indices  # (P, K)
    vals = latents.gather(1, idx)  # (P, K), differentiable in latents
    idx = torch.where(vals.detach() != 0, idx, torch.zeros_like(idx))

    rows = []
    for i0 in range(0, P, c_img):
        idx_c, vals_c = idx[i0 : i0 + c_img], vals[i0 : i0 + c_img]  # (c, K)
        dec_c = decoder[idx_c]  # (c, K, d)
        gram_c = dec_c @ dec_c.transpose(1, 2)  # (c, K, K): G_p = W_D[S_p] W_D[S_p]^T
        wb_c = wb[idx_c][:, :, None]  # (c, K, 1)
        cols = []
        for j0 in range(0, Q, c_txt):
            j1 = min(j0 + c_txt, Q)
            # Layout (c, K, m): row-gathers of the (d1, m) chunks, contiguous for the batched matmul.
            y = vals_c[:, :, None] * masks_t[:, j0:j1][idx_c]  # (c, K, m): z_p ⊙ m_q on S_p
            num = (y * u_t[:, j0:j1][idx_c]).sum(1) + tb[None, j0:j1]  # (c, m): e_{p|q} · t̂_q
            sq = ((gram_c @ y) * y).sum(1) + 2 * (y * wb_c).sum(1) + bb  # (c, m): ||e_{p|q}||²
            # Rounding can leave a tiny negative value for an edited embedding of (almost) zero length.
            cols.append(num / sq.clamp_min(1e-24).sqrt())
        rows.append(torch.cat(cols, dim=1))
    return torch.cat(rows, dim=0) if rows else tb.new_zeros((0, Q))


class TopKCodes(NamedTuple):
    """Sparse SAE codes of n inputs: latent `indices` (n, K) long and their `values` (n, K)."""

    indices: torch.Tensor
    values: torch.Tensor
    n_latents: int


class Reranked(NamedTuple):
    order: torch.Tensor  # (P, Q) long: image indices per text, best first
    scores: torch.Tensor  # (k, Q) the rescored top-k, in the new order


def rerank(
    base_scores: torch.Tensor,
    k: int,
    rescore_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    full_order: bool = False,
) -> Reranked:
    """Coarse-to-fine retrieval: per text (column), take the top-k images by `base_scores`
    (P, Q) (e.g. CLIP cosine) and reorder only those by `rescore_fn` (e.g. TEVI scores).

    rescore_fn(image_idx (k, Q) long, text_idx (Q,) long) -> (k, Q): the score of image
        image_idx[i, j] for text text_idx[j].
    returns Reranked(order, scores): `order` (k, Q) is each text's top-k reordered by the new
        score (rank metrics R@n, n <= k, read straight off it); with `full_order`, `order` is
        (P, Q) and continues with the remaining images in base order, so ranks below k never
        change. Ties in the base scores go to the lower image index; exactly tied images at the
        k-th place may be swapped for one another.

    Only k·Q pairs are rescored instead of P·Q: the cost drops by P/k. The candidates come from a
    top-k selection, not a full sort of every column (which costs more than the rescoring).
    """
    P, Q = base_scores.shape
    k = min(k, P)
    if full_order:
        base_order = base_scores.argsort(dim=0, descending=True, stable=True)  # (P, Q)
        cand = base_order[:k]
    else:
        top = base_scores.topk(k, dim=0)
        # topk's order among equal scores is unspecified: order candidates by (score desc, index asc).
        by_index = top.indices.sort(dim=0).indices
        cand = top.indices.gather(0, by_index)
        cand = cand.gather(0, base_scores.gather(0, cand).argsort(dim=0, descending=True, stable=True))
    new = rescore_fn(cand, torch.arange(Q, device=base_scores.device))  # (k, Q)
    new_scores, perm = new.sort(dim=0, descending=True, stable=True)
    order = cand.gather(0, perm)
    if full_order:
        order = torch.cat([order, base_order[k:]], dim=0)
    return Reranked(order, new_scores)


PAIR_METHODS = ("auto", "direct", "embed", "gram")


def pair_method(n_pairs: int, n_images: int, n_texts: int, d: int, d1: int, k: int) -> str:
    """The `pair_scores` method "auto" picks for n_pairs pairs over n_images images and n_texts
    texts: "direct" below 8 pairs per image or when an image's K decoder rows are tiny (K·d <= 256,
    e.g. a CG-SAE: the per-image loop then costs more than the arithmetic), else "gram" only when
    its multiply-adds (Q'·d·d1 + P'·K²·d + n·K²) are under 2/3 of "embed"'s (n·K·d): its passes run
    1.3x (5k x 25k, d1=16384, K=128) to 2.3x (10k x 10k, d1=256, K=12) slower per multiply-add."""
    if n_pairs < 8 * n_images or k * d <= 256:
        return "direct"
    gram_cost = n_texts * d * d1 + n_images * k * k * d + n_pairs * k * k
    return "gram" if 1.5 * gram_cost < n_pairs * k * d else "embed"


def pair_scores(
    latents: torch.Tensor,
    masks: torch.Tensor,
    decoder: torch.Tensor,
    b_pre: torch.Tensor,
    text_emb: torch.Tensor,
    image_idx: torch.Tensor,
    text_idx: torch.Tensor,
    support: int | None = None,
    pair_chunk: int = 2048,
    text_chunk: int = 64,
    method: str = "auto",
) -> torch.Tensor:
    """cos(e_{p|q}, t_q) for the listed pairs (image_idx[i], text_idx[i]) only -> (n_pairs,).

    Arguments as in `conditioned_scores` (`support` is its `k`). For the Q' texts and P' images
    that occur, n pairs, support K, there are three exact ways (`method`; "auto" takes the cheapest):
      "direct": each pair's edited embedding from its K decoder rows, pairs in chunks of
                `pair_chunk`: n·K·d, but the (chunk, K, d) decoder rows are gathered per pair.
                For few pairs per image (one query's candidates).
      "embed":  the same n·K·d arithmetic, image by image: the image's K decoder rows are read once
                and its pairs' edited embeddings come out of one (n_p, K) x (K, d) GEMM.
      "gram":   u_q = W_D t̂_q once per text, the K x K Gram block W_D[S_p] W_D[S_p]^T once per
                image, one K x K quadratic form per pair: Q'·d·d1 + P'·K²·d + n·K². Cheaper than
                "embed" only when each text has many pairs (rerank depth above ~370 at d=512,
                d1=16384, K=128, see `pair_method`).
    Extra memory O(n·K + text_chunk·d1 + K·d) besides the inputs ("direct": pair_chunk·K·d).
    """
    if method not in PAIR_METHODS:
        raise ValueError(f"method must be one of {PAIR_METHODS}, got {method!r}")
    t_hat = text_emb / text_emb.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (Q, d)
    k = support if support is not None else int((latents != 0).sum(1).max())
    k = max(1, min(k, latents.shape[1]))
    texts, qi = torch.unique(text_idx, return_inverse=True)  # the Q' texts used; qi: (n_pairs,)
    images, pi = torch.unique(image_idx, return_inverse=True)  # the P' images used
    z = latents[images]
    idx = z.abs().topk(k, dim=1).indices  # (P', K)
    vals = z.gather(1, idx)
    n_pairs, d1, d = len(image_idx), latents.shape[1], decoder.shape[1]
    if method == "auto":
        method = pair_method(n_pairs, len(images), len(texts), d, d1, k)
    if method == "direct":
        out = torch.empty(n_pairs, dtype=latents.dtype)
        t_q, m = t_hat[texts], masks[texts]
        for i0 in range(0, n_pairs, pair_chunk):
            p, q = pi[i0 : i0 + pair_chunk], qi[i0 : i0 + pair_chunk]
            sp = idx[p]  # (n, K)
            y = vals[p] * m[q[:, None], sp]  # (n, K): z_p ⊙ m_q on S_p
            e = (y[:, None, :] @ decoder[sp]).squeeze(1) + b_pre  # (n, d): e_{p|q}
            out[i0 : i0 + pair_chunk] = (e * t_q[q]).sum(1) / e.norm(dim=1).clamp_min(1e-12)
        return out

    # Two passes, each reading memory in the order it is laid out. Random reads of single mask
    # entries were the cost (one cache miss per (pair, latent)), not the arithmetic.
    # Pass 1, pairs grouped by text: each pair's K mask entries are read from its text's row of
    # m, which stays in cache while that text's pairs are served: y = z_p ⊙ m_q on S_p.
    # Pass 2, pairs grouped by image: the image's K decoder rows W_D[S_p] serve all its pairs.
    by_text = torch.argsort(qi, stable=True)
    text_starts = torch.searchsorted(qi[by_text], torch.arange(len(texts) + 1)).tolist()
    by_image = torch.argsort(pi, stable=True)
    img_starts = torch.searchsorted(pi[by_image], torch.arange(len(images) + 1)).tolist()
    c_txt = max(1, text_chunk)
    # Pass 1 writes its rows in text order; pass 2 reads row pos[j] for the j-th pair in image order.
    pos_of_pair = torch.empty_like(by_text)
    pos_of_pair[by_text] = torch.arange(n_pairs)
    pos = pos_of_pair[by_image]
    if method == "embed":
        # Pass 1 gathers the raw mask entries m_q[S_p] only: z_p is folded into the image's decoder
        # rows in pass 2 (K x d once per image instead of n x K products here).
        m_flat = masks.reshape(-1)
        # int32 offsets when they fit: index_select then moves half the index bytes (measured
        # 3x faster than int64 advanced indexing on a 25k x 16k mask).
        off_type = torch.int32 if m_flat.numel() < 2**31 else torch.int64
        idx_off, row_off = idx.to(off_type), texts.to(off_type) * d1
        g = torch.empty(n_pairs, k, dtype=latents.dtype)  # row r: pair by_text[r]
        for j0 in range(0, len(texts), c_txt):
            r0, r1 = text_starts[j0], text_starts[min(j0 + c_txt, len(texts))]
            rows = by_text[r0:r1]
            flat = row_off[qi[rows]][:, None] + idx_off[pi[rows]]  # (n, K) offsets into m
            torch.index_select(m_flat, 0, flat.view(-1), out=g[r0:r1].view(-1))
        # e_{p|q} = m_q[S_p] (diag(z_p[S_p]) W_D[S_p]) + b_pre: one (n_p, K) x (K, d) GEMM per image,
        # then cos(e, t̂_q). index_select and vecdot: measured 5x and 3x faster than advanced
        # indexing and cosine_similarity at these sizes.
        t_used, q_img = t_hat[texts], qi[by_image]
        score = torch.empty(n_pairs, dtype=latents.dtype)  # image order
        for i in range(len(images)):
            s0, s1 = img_starts[i], img_starts[i + 1]
            dec = decoder.index_select(0, idx[i]).mul_(vals[i][:, None])  # (K, d)
            e = torch.addmm(b_pre, g.index_select(0, pos[s0:s1]), dec)  # (n_i, d)
            num = torch.linalg.vecdot(e, t_used.index_select(0, q_img[s0:s1]))
            score[s0:s1] = num / torch.linalg.vector_norm(e, dim=1).clamp_min(1e-12)
        out = torch.empty(n_pairs, dtype=latents.dtype)
        out[by_image] = score
        return out

    # "gram". Pass 1 also makes u_q = W_D t̂_q for a few texts at a time (a GEMM, never the whole
    # (Q', d1) matrix) and reads m_q ⊙ u_q beside m_q for the numerator.
    y = torch.empty(n_pairs, k, dtype=latents.dtype)  # row r: pair by_text[r]
    num = torch.empty(n_pairs, dtype=latents.dtype)
    tb = t_hat[texts] @ b_pre  # (Q',)
    both = torch.empty(c_txt, d1, 2, dtype=latents.dtype)
    for j0 in range(0, len(texts), c_txt):
        j1 = min(j0 + c_txt, len(texts))
        r0, r1 = text_starts[j0], text_starts[j1]
        if r0 == r1:
            continue
        rows = by_text[r0:r1]  # pair ids of these texts
        p = pi[rows]
        flat = (qi[rows] - j0)[:, None] * d1 + idx[p]  # (n, K) offsets into the (c, d1) rows
        v = vals[p]
        # m_q and m_q ⊙ u_q side by side, so one read fetches both from the same cache line.
        pair = both[: j1 - j0]
        pair[..., 0] = masks[texts[j0:j1]]
        torch.mul(pair[..., 0], t_hat[texts[j0:j1]] @ decoder.T, out=pair[..., 1])
        got = pair.view(-1, 2).index_select(0, flat.view(-1)).view(len(rows), k, 2)
        torch.mul(v, got[..., 0], out=y[r0:r1])
        num[r0:r1] = (v * got[..., 1]).sum(1) + tb[qi[rows]]
    # ||e_{p|q}||² = y^T G_p y + 2 y·(W_D b)[S_p] + ||b||², G_p = W_D[S_p] W_D[S_p]^T once per image.
    sq = torch.empty(n_pairs, dtype=latents.dtype)  # in y's row order
    wb_all = decoder @ b_pre  # (d1,)
    bb = b_pre @ b_pre
    for i in range(len(images)):
        r = pos[img_starts[i] : img_starts[i + 1]]
        sp = idx[i]  # (K,)
        dec = decoder[sp]  # (K, d)
        yi = y[r]  # (n_i, K)
        sq[r] = ((yi @ (dec @ dec.T)) * yi).sum(1) + 2 * (yi @ wb_all[sp]) + bb
    # Rounding can leave a tiny negative value for an edited embedding of (almost) zero length.
    out = torch.empty(n_pairs, dtype=latents.dtype)
    out[by_text] = num / sq.clamp_min(1e-24).sqrt()
    return out


def rerank_conditioned(
    base_scores: torch.Tensor,
    k: int,
    latents: torch.Tensor,
    masks: torch.Tensor,
    decoder: torch.Tensor,
    b_pre: torch.Tensor,
    text_emb: torch.Tensor,
    support: int | None = None,
    full_order: bool = False,
    direction: str = "t2i",
) -> Reranked:
    """`rerank` with exact TEVI scores: CLIP's top k candidates of each query re-scored by
    cos(e_{p|q}, t_q) with `pair_scores` (only those pairs). `base_scores` is (P, Q); other
    arguments as in `conditioned_scores` (`support` is its `k`).

    direction "t2i": per text (column), its top-k images are re-scored; `order` is (k, Q).
    direction "i2t": per image (row), its top-k texts are re-scored; `order` is (k, P), column
        p holding image p's texts.
    Cost: k·Q pairs (t2i) or k·P pairs (i2t) of n·K·d each, against P·Q·K² for
    `conditioned_scores` -- a ratio of (P/k)(K/d) for t2i and (Q/k)(K/d) for i2t (12.5 and 62.5
    on COCO's 5k images x 25k captions at K=128, d=512), besides the top-k selection.
    """
    if direction not in ("t2i", "i2t"):
        raise VlctlError(f"direction must be 't2i' or 'i2t', got {direction!r}")

    def rescore(cand: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        other = query[None, :].expand_as(cand)
        img, txt = (cand, other) if direction == "t2i" else (other, cand)
        s = pair_scores(latents, masks, decoder, b_pre, text_emb, img.reshape(-1), txt.reshape(-1), support)
        return s.reshape(cand.shape)

    return rerank(base_scores if direction == "t2i" else base_scores.T, k, rescore, full_order)


# --- the mask ----------------------------------------------------------------------------------

CONDITIONING = ("positive", "negative", "both")


@dataclasses.dataclass(frozen=True)
class TeviConfig:
    d: int = opt(512, "embedding dimension (image and text)")
    n_latents: int = opt(16384, "latents d1 of the SAE the mask acts on")
    hidden: int = opt(512, "width of the mask MLP's two hidden layers")
    conditioning: str = opt("positive", "positive (Eq. 10: each image edited by its own caption) | negative "
                            "(Eq. 11: every image of the batch edited by every text of the batch) | both (their mean)")
    mask_init_bias: float = opt(0.0, "initial bias of the MLP's output layer: sigmoid(bias) is the initial mask value")
    mask_temperature: float = opt(1.0, "m = sigmoid(f_m(t) / temperature); < 1 makes masks closer to binary")
    mask_floor: float = opt(0.0, "at inference, mask values below this are set to 0 (training keeps the soft mask): a "
                            "latent kept at 0.1 still decides an argmax over its attribute's values")
    init_logit_scale: float = opt(math.log(1 / 0.07), "initial log inverse temperature of the InfoNCE (CLIP's)")
    learn_logit_scale: bool = opt(True, "train the InfoNCE temperature (at the mask's lr)")

    def __post_init__(self):
        if self.conditioning not in CONDITIONING:
            raise VlctlError(f"conditioning must be one of {CONDITIONING}, got {self.conditioning!r}")
        if min(self.d, self.n_latents, self.hidden) < 1 or self.mask_temperature <= 0:
            raise VlctlError(f"TeviConfig: d, n_latents, hidden and mask_temperature must be positive, got {self}")
        if not 0.0 <= self.mask_floor < 1.0:
            raise VlctlError(f"TeviConfig.mask_floor: must be in [0, 1), got {self.mask_floor}")


class TeviMask(nn.Module):
    """f_m: text embedding (n, d) -> mask (n, d1) in [0, 1], a 3-layer ReLU MLP, plus the InfoNCE
    temperature it is trained with. The input is L2-normalised first: CLIP text embeddings are
    only meaningful up to scale."""

    def __init__(self, cfg: TeviConfig):
        super().__init__()
        self.cfg = cfg
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d, cfg.hidden), nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.n_latents),
        )  # fmt: skip
        nn.init.constant_(self.mlp[-1].bias, cfg.mask_init_bias)
        self.logit_scale = nn.Parameter(torch.tensor(float(cfg.init_logit_scale)), requires_grad=cfg.learn_logit_scale)

    def forward(self, text_emb: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (n, d1). In eval mode, values below `mask_floor` are zeroed."""
        m = torch.sigmoid(self.mlp(F.normalize(text_emb, dim=-1)) / self.cfg.mask_temperature)
        if not self.training and self.cfg.mask_floor > 0:
            m = m * (m >= self.cfg.mask_floor)
        return m

    def scale(self) -> torch.Tensor:
        return self.logit_scale.clamp(0.0, math.log(100.0)).exp()


def edit(latents: torch.Tensor, masks: torch.Tensor, decoder: torch.Tensor, b_pre: torch.Tensor) -> torch.Tensor:
    """Edited embeddings, row by row: (n, d1), (n, d1), (d1, d), (d,) -> (n, d) = (z ⊙ m) W_D + b_pre."""
    return (latents * masks) @ decoder + b_pre


class _TeviTrainer(nn.Module):
    """What the training loop optimises: the mask (and optionally a text encoder) over a frozen SAE
    decoder. forward((latents, texts)) -> InfoNCE loss over the global batch."""

    def __init__(self, mask: TeviMask, decoder: torch.Tensor, b_pre: torch.Tensor, text_encoder: nn.Module | None):
        super().__init__()
        self.mask = mask
        self.text_encoder = text_encoder
        self.register_buffer("decoder", decoder.detach().clone())
        self.register_buffer("b_pre", b_pre.detach().clone())

    def forward(self, latents: torch.Tensor, texts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from vlctl.encoders.tiny_clip import clip_loss
        from vlctl.train.distributed import all_gather_with_grad

        t = self.text_encoder(texts) if self.text_encoder is not None else texts  # (n, d)
        m = self.mask(t)  # (n, d1)
        s = self.mask.scale()
        mode = self.mask.cfg.conditioning
        loss = 0.0
        if mode in ("positive", "both"):
            e = edit(latents, m, self.decoder, self.b_pre)
            loss = loss + clip_loss(F.normalize(e, dim=-1), F.normalize(t, dim=-1), s)
        if mode in ("negative", "both"):
            # S[i, j] = cos(e_{i|j}, t_j): row i is image i against every text (the image->text
            # term), column i is text i against every image edited by text i (text->image).
            z, m_all, t_all = all_gather_with_grad(latents), all_gather_with_grad(m), all_gather_with_grad(t)
            S = s * conditioned_scores(z, m_all, self.decoder, self.b_pre, t_all, chunk_size=1024)
            target = torch.arange(S.shape[0], device=S.device)
            loss = loss + (F.cross_entropy(S, target) + F.cross_entropy(S.T, target)) / 2
        if mode == "both":
            loss = loss / 2
        return loss, m.mean()


# --- the estimator -----------------------------------------------------------------------------

MASK_FILE = "mask.safetensors"
TEXT_ENCODER_FILE = "text_encoder.safetensors"
TEVI_CONFIG_FILE = "tevi.json"
SAE_DIR = "sae"


def _embeddings(x: Any, name: str, d: int | None = None) -> torch.Tensor:
    from vlctl.methods.sae import _as_tensor

    t = _as_tensor(x, name)
    if d is not None and t.shape[1] != d:
        raise VlctlError(f"{name} have dimension {t.shape[1]}, but the SAE/mask was fitted on dimension {d}")
    return t


class TEVI:
    """Scikit-learn style TEVI: `TEVI(conditioning="negative").fit(sae, image_emb, text_emb)`.

    `sae` is a fitted `SparseAutoencoder` (learned or CG-SAE); it stays frozen. Hyperparameters
    are the `TeviConfig` fields (d and n_latents come from the SAE) plus lr, text_lr, epochs,
    batch_size, weight_decay, warmup_steps, seed, device, out_dir, progress.
    Learned state: `mask_` (TeviMask), `sae_`, `encoder_id_`, `text_encoder_` (when fine-tuned).

    Text-encoder fine-tuning: pass `text_encoder` (a module mapping a batch of `texts` to (n, d)
    embeddings, e.g. a TinyCLIP text tower) and `texts` (its inputs, e.g. token ids) to `fit`;
    it trains at `text_lr` beside the mask. Without it the text embeddings are fixed inputs.
    """

    def __init__(
        self,
        *,
        hidden: int = 512,
        conditioning: str = "positive",
        mask_init_bias: float = 0.0,
        mask_temperature: float = 1.0,
        mask_floor: float = 0.0,
        init_logit_scale: float = math.log(1 / 0.07),
        learn_logit_scale: bool = True,
        lr: float = 1e-3,
        text_lr: float = 1e-6,
        epochs: int = 10,
        batch_size: int = 256,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        seed: int = 0,
        device: str | None = "cpu",
        out_dir: str | Path | None = None,
        progress: bool = False,
    ):
        self.hidden, self.conditioning, self.mask_init_bias = hidden, conditioning, mask_init_bias
        self.mask_temperature, self.mask_floor, self.init_logit_scale, self.learn_logit_scale = (
            mask_temperature, mask_floor, init_logit_scale, learn_logit_scale)
        self.lr, self.text_lr, self.epochs, self.batch_size = lr, text_lr, epochs, batch_size
        self.weight_decay, self.warmup_steps, self.seed = weight_decay, warmup_steps, seed
        self.device, self.out_dir, self.progress = device, out_dir, progress

    def _config(self, d: int, n_latents: int) -> TeviConfig:
        return TeviConfig(
            d=d, n_latents=n_latents, hidden=self.hidden, conditioning=self.conditioning,
            mask_init_bias=self.mask_init_bias, mask_temperature=self.mask_temperature, mask_floor=self.mask_floor,
            init_logit_scale=self.init_logit_scale, learn_logit_scale=self.learn_logit_scale,
        )  # fmt: skip

    def fit(
        self,
        sae: Any,
        image_emb: Any,
        text_emb: Any = None,
        *,
        encoder_id: str | None = None,
        text_encoder: nn.Module | None = None,
        texts: Any = None,
    ) -> TEVI:
        """Train the mask on pairs (image_emb[i], caption i). The caption is given either as
        `text_emb` (n, d), fixed, or as `texts` (n, ...) run through `text_encoder`, which is then
        fine-tuned at `text_lr`. `encoder_id` (default: the SAE's) must match the SAE's."""
        from vlctl.train.loop import LoopConfig, default_param_groups, train

        sae_model = sae._check_fitted()
        if encoder_id is not None and encoder_id != sae.encoder_id_:
            raise VlctlError(f"embeddings of encoder {encoder_id!r} cannot train a mask over an SAE fitted on "
                             f"{sae.encoder_id_!r}")
        d, d1 = sae_model.cfg.d, sae_model.cfg.n_latents
        x = _embeddings(image_emb, "image embeddings", d)
        if (text_encoder is None) == (text_emb is None):
            raise VlctlError("fit: pass exactly one of text_emb (fixed captions) or text_encoder + texts (fine-tuned)")
        if text_encoder is None:
            captions = _embeddings(text_emb, "text embeddings", d)
        else:
            captions = torch.as_tensor(texts)
        if len(captions) != len(x):
            raise VlctlError(f"fit: {len(x)} image embeddings but {len(captions)} captions; pair them row by row")
        latents = sae.encode(x)  # (n, d1), the frozen SAE's codes, computed once

        cfg = self._config(d, d1)
        torch.manual_seed(self.seed)
        mask = TeviMask(cfg)
        net = _TeviTrainer(mask, sae_model.W_D, sae_model.b_pre, text_encoder)
        groups = default_param_groups(mask, self.weight_decay)
        if text_encoder is not None:
            groups.append({"params": [p for p in text_encoder.parameters() if p.requires_grad],
                           "lr": self.text_lr, "weight_decay": 0.0})

        def make_batch(idx: np.ndarray, epoch: int):
            idx = torch.as_tensor(idx)
            return latents[idx], captions[idx]

        def loss_fn(model: nn.Module, batch):
            loss, mean_mask = model(*batch)
            return loss, {"mask_mean": float(mean_mask.detach())}

        n = len(x)
        loop_cfg = LoopConfig(
            epochs=self.epochs, batch_size=min(self.batch_size, n), lr=self.lr, weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps, seed=self.seed, progress=self.progress, log_every=50,
        )  # fmt: skip
        tmp = tempfile.TemporaryDirectory(prefix="vlctl-tevi-") if self.out_dir is None else None
        try:
            train(net, n_samples=n, make_batch=make_batch, loss_fn=loss_fn, cfg=loop_cfg,
                  out_dir=tmp.name if tmp else self.out_dir, param_groups=groups, device=self.device,
                  run_config={"tevi": config_to_dict(cfg), "encoder_id": sae.encoder_id_})
        finally:
            if tmp is not None:
                tmp.cleanup()
        self.mask_ = mask.cpu().eval()
        self.text_encoder_ = None if text_encoder is None else text_encoder.cpu().eval()
        self.sae_ = sae
        self.encoder_id_ = sae.encoder_id_
        return self

    # -- inference

    def _check_fitted(self) -> TeviMask:
        if not hasattr(self, "mask_"):
            raise VlctlError("TEVI is not fitted; call fit() or load() first")
        return self.mask_

    @torch.no_grad()
    def masks(self, text_emb: Any) -> torch.Tensor:
        """(Q, d) text embeddings -> (Q, d1) masks."""
        mask = self._check_fitted()
        return mask(_embeddings(text_emb, "text embeddings", mask.cfg.d))

    @torch.no_grad()
    def edit(self, image_emb: Any, text_emb: Any) -> torch.Tensor:
        """Image i edited by text i: (n, d), (n, d) -> (n, d) (unnormalised)."""
        mask = self._check_fitted()
        x = _embeddings(image_emb, "image embeddings", mask.cfg.d)
        m = self.masks(text_emb)
        if len(m) != len(x):
            raise VlctlError(f"edit: {len(x)} images but {len(m)} texts; edit pairs them row by row")
        sae = self.sae_.model_
        return edit(sae.encode(x), m, sae.W_D, sae.b_pre)

    @torch.no_grad()
    def scores(self, image_emb: Any, text_emb: Any, chunk_size: int | tuple[int, int] | None = None) -> torch.Tensor:
        """(P, d), (Q, d) -> (P, Q) exact TEVI scores cos(e_{p|q}, t_q), via `conditioned_scores`."""
        mask = self._check_fitted()
        x = _embeddings(image_emb, "image embeddings", mask.cfg.d)
        t = _embeddings(text_emb, "text embeddings", mask.cfg.d)
        sae = self.sae_.model_
        return conditioned_scores(sae.encode(x), mask(t), sae.W_D, sae.b_pre, t, chunk_size=chunk_size, k=sae.cfg.k)

    @torch.no_grad()
    def rerank(self, base_scores: Any, image_emb: Any, text_emb: Any, k: int = 100, direction: str = "t2i",
               full_order: bool = False) -> Reranked:
        """Rank by `base_scores` (P, Q) (e.g. CLIP cosine), re-score the top k with TEVI.

        direction "t2i": per text (column), its top-k images are re-scored; `order` is (k, Q).
        direction "i2t": per image (row), its top-k texts are re-scored; `order` is (k, P), column
        p holding image p's texts. `full_order` extends `order` to every candidate. See `rerank`."""
        mask = self._check_fitted()
        x = _embeddings(image_emb, "image embeddings", mask.cfg.d)
        t = _embeddings(text_emb, "text embeddings", mask.cfg.d)
        sae = self.sae_.model_
        z, m = sae.encode(x), mask(t)
        base = torch.as_tensor(np.asarray(base_scores))
        return rerank_conditioned(base, k, z, m, sae.W_D, sae.b_pre, t, support=sae.cfg.k, full_order=full_order,
                                  direction=direction)

    @torch.no_grad()
    def encode_gallery(self, gallery: Any, batch_size: int = 4096) -> TopKCodes:
        """SAE codes of every gallery row as (indices, values), each (n, K), computed once so that
        reranking a query only gathers its candidates' codes (the SAE encoder is the costly
        part: d·d1 per row)."""
        self._check_fitted()
        gallery.check_encoder(self.encoder_id_)
        sae = self.sae_.model_
        idx, vals = [], []
        for i0 in range(0, len(gallery), batch_size):
            rows = np.arange(i0, min(i0 + batch_size, len(gallery)))
            z = sae.encode(_embeddings(gallery.vectors(rows), f"{gallery.path} embeddings", sae.cfg.d))
            top = z.topk(sae.cfg.k, dim=1)
            idx.append(top.indices)
            vals.append(top.values)
        d1 = sae.cfg.n_latents
        empty = torch.zeros(0, sae.cfg.k)
        return TopKCodes(torch.cat(idx) if idx else empty.long(), torch.cat(vals) if vals else empty, d1)

    def gallery_reranker(self, codes: TopKCodes | None = None) -> Callable[[np.ndarray, np.ndarray, Any], np.ndarray]:
        """A `vlctl.index.Reranker`: re-scores a gallery search's candidates with exact TEVI
        scores, the queries being text embeddings. Refuses a gallery of another encoder.
        `codes`: the gallery's SAE codes from `encode_gallery` (else encoded per query)."""
        mask = self._check_fitted()
        sae = self.sae_.model_

        @torch.no_grad()
        def rerank_fn(queries: np.ndarray, candidate_ids: np.ndarray, gallery: Any) -> np.ndarray:
            gallery.check_encoder(self.encoder_id_)
            ids = np.asarray(candidate_ids, dtype=np.int64)  # (q, c); -1 = no candidate
            valid = ids >= 0
            rows = np.unique(ids[valid])
            if codes is not None:
                if len(codes.indices) != len(gallery):
                    raise VlctlError(f"{gallery.path}: SAE codes cover {len(codes.indices)} rows, gallery has "
                                     f"{len(gallery)}; re-run encode_gallery after adding")
                r = torch.as_tensor(rows)
                z = torch.zeros(len(rows), codes.n_latents).scatter_(1, codes.indices[r], codes.values[r])
            else:
                z = sae.encode(_embeddings(gallery.vectors(rows), f"{gallery.path} embeddings", mask.cfg.d))
            t = _embeddings(queries, "query embeddings", mask.cfg.d)
            image_pos = np.searchsorted(rows, ids[valid])
            text_pos = np.nonzero(valid)[0]  # query of each valid candidate (row-major order)
            s = pair_scores(z, mask(t), sae.W_D, sae.b_pre, t, torch.as_tensor(image_pos), torch.as_tensor(text_pos),
                            support=sae.cfg.k)
            out = np.full(ids.shape, -np.inf, dtype=np.float32)
            out[valid] = s.numpy()
            return out

        return rerank_fn

    # -- files

    def save(self, path: str | Path) -> Path:
        """Directory with tevi.json, mask.safetensors, sae/ (the frozen SAE) and, if fine-tuned,
        text_encoder.safetensors; written atomically."""
        mask = self._check_fitted()
        meta = {"config": config_to_dict(mask.cfg), "encoder_id": self.encoder_id_,
                "training": {"lr": self.lr, "text_lr": self.text_lr, "epochs": self.epochs,
                             "batch_size": self.batch_size, "seed": self.seed},
                "text_encoder_finetuned": self.text_encoder_ is not None}
        with atomic_dir(path) as tmp:
            self.sae_.save(tmp / SAE_DIR)
            atomic_save_safetensors(tmp / MASK_FILE, dict(mask.state_dict()))
            if self.text_encoder_ is not None:
                atomic_save_safetensors(tmp / TEXT_ENCODER_FILE, dict(self.text_encoder_.state_dict()))
            atomic_write_json(tmp / TEVI_CONFIG_FILE, meta)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, encoder_id: str | None = None, text_encoder: nn.Module | None = None) -> TEVI:
        """Load a saved TEVI; refuse it if it was fitted on another encoder than `encoder_id`, or if
        its weights do not match its config. A fine-tuned text encoder is loaded into
        `text_encoder` (same architecture), which is then required."""
        from vlctl.methods.sae import SparseAutoencoder, load_checked_state, read_fitted_config, read_weights

        path = Path(path)
        cfg_path, w_path = path / TEVI_CONFIG_FILE, path / MASK_FILE
        cfg, meta, saved_id = read_fitted_config(cfg_path, TeviConfig, "TEVI", encoder_id)
        sae = SparseAutoencoder.load(path / SAE_DIR, encoder_id=saved_id)
        if (sae.config_.d, sae.config_.n_latents) != (cfg.d, cfg.n_latents):
            raise VlctlError(f"{cfg_path}: mask is for d={cfg.d}, d1={cfg.n_latents} but {path / SAE_DIR} has "
                             f"d={sae.config_.d}, d1={sae.config_.n_latents}")
        mask = TeviMask(cfg)
        load_checked_state(mask, read_weights(w_path), w_path, cfg_path)
        est = cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(TeviConfig)
                     if f.name not in ("d", "n_latents")},
                  **{k: v for k, v in meta.get("training", {}).items()
                     if k in ("lr", "text_lr", "epochs", "batch_size", "seed")})
        est.mask_, est.sae_, est.encoder_id_ = mask.eval(), sae, saved_id
        est.text_encoder_ = None
        if meta.get("text_encoder_finetuned"):
            if text_encoder is None:
                raise VlctlError(f"{path}: TEVI fine-tuned its text encoder; pass the same architecture as text_encoder")
            load_checked_state(text_encoder, read_weights(path / TEXT_ENCODER_FILE), path / TEXT_ENCODER_FILE, cfg_path)
            est.text_encoder_ = text_encoder.eval()
        return est

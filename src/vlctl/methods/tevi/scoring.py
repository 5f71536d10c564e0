"""TEVI's scoring kernels: exact conditioned scores, pair scores and coarse-to-fine rerank.

Scoring every image p conditioned on every text q, cos(e_{p|q}, t_q) with
e_{p|q} = W_D^T (z_p ⊙ m_q) + b_pre (`vlctl.methods.tevi.estimator`), looks like an (n_images, n_texts, d)
tensor. It is not needed (docs/design.md, "Cost model to design against"):

  numerator   e_{p|q} · t̂_q = (z_p ⊙ m_q) · u_q + b_pre · t̂_q,   u_q = W_D t̂_q   (d1,)
              = z @ (m ⊙ u)^T + b_pre · t̂       -- one (n_images, d1) x (d1, n_texts) matmul
  norm^2      ||W_D^T y + b||^2 = y^T G y + 2 y · (W_D b) + ||b||^2,   y = z_p ⊙ m_q,  G = W_D W_D^T

and y is zero outside the support S_p of z_p (at most K latents), so only G's K x K block
G_p = W_D[S_p] W_D[S_p]^T enters the quadratic form.

`conditioned_scores` scores all pairs; `pair_scores` only listed pairs; `rerank` /
`rerank_conditioned` re-score a base ranking's top k per query. Pure tensor functions: they know
nothing of the estimator, its files or the training loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F

from vlctl.fsops import VlctlError

# Sizes of the sparse path's blocks, in elements: the Gram blocks A_p kept for one image block
# (2^26: 256 MiB of float32), and one Gram GEMM's gathered (c, K, d) decoder rows (2^18: L2-sized).
# Each image block recomputes every text's u_q = W_D t̂_q (Q·d·d1): at K=128 the no-autograd path
# keeps 6,553 images per block (5k x 25k in one block; 2^25 took three, and 2 x 21% more work).
BLOCK_ELEMENTS = 1 << 26
GRAM_ELEMENTS = 1 << 18
# Support rows per block of the no-autograd path's half-symmetric quadratic form (`_sparse_fast`).
SYM_ROWS = 32
# Most Python threads a per-image loop is split over on a CPU (`_ranges_in_threads`).
MAX_PAIR_THREADS = 4


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
              512 texts and as many images as keep a chunk's (c, K, m) tensors near 2^19 elements
              (L2-sized; at K=128 8 x 512, measured 1.2-1.3x faster than the 2^20 images-outer loop;
              16 x 256 measured the same within noise)
    k: support size K; default: the largest number of nonzeros in a row of `latents`
    returns   (P, Q)

    Exact (no approximation) and differentiable in every input; the gradient w.r.t. `latents`
    lives on each row's support (the only entries a TopK code can move). Work is
    O(Q·d·d1 + P·K²·d + P·Q·K²): u for every text, the Gram blocks of every image, and one K x K
    quadratic form per pair -- never a dense d1-long product per pair. Without autograd the K x K
    blocks are symmetric and only their upper half is multiplied (`_sparse_fast`): 62.5% of the
    P·K²·d and P·Q·K² multiply-adds at K=128. Peak extra memory, besides
    the inputs and the (P, Q) output, is O(P·K + B·K² + d1·m + B·m + c·K·m) elements for image chunk
    c, text chunk m and image block B = 2^26 / K² (4,096 at K=128; 6,553 without autograd, which
    keeps only the upper half of each block): the supports, one block's Gram
    blocks, one text chunk's masks and m ⊙ u, and one (image, text) chunk's gathered masks. Never
    P·Q·d. (Under autograd the per-chunk tensors are kept for backward, as usual.)

    method: "sparse" is the above. "dense" writes the quadratic form over all d1 latents as one
    GEMM, ||W_D^T y||² = vec(z_p z_p^T ⊙ G) · vec(m_q m_q^T): P·Q·d1² multiply-adds with no
    gathers, the fast way for a small dictionary (a CG-SAE's few dozen concept latents), in
    blocks of about 2^22 elements. "auto" takes "dense" when d1 <= min(4K, 64).
    """
    if method not in ("auto", "sparse", "dense"):
        raise ValueError(f"method must be 'auto', 'sparse' or 'dense', got {method!r}")
    P, Q = latents.shape[0], masks.shape[0]
    t_hat = text_emb / text_emb.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (Q, d)
    tb = t_hat @ b_pre  # (Q,): b_pre · t̂_q
    wb = decoder @ b_pre  # (d1,): W_D b
    bb = b_pre @ b_pre  # ()
    if k is None:
        k = int((latents != 0).sum(1).max()) if P else 0
    k = max(1, min(k, latents.shape[1]))
    d1 = latents.shape[1]
    if method == "dense" or (method == "auto" and d1 <= min(4 * k, 64)):
        gram = decoder @ decoder.T  # (d1, d1)
        mu = masks * (t_hat @ decoder.T)  # (Q, d1): m_q ⊙ u_q, u_q = W_D t̂_q
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

    if chunk_size is None:
        chunk_size = (max(1, (1 << 19) // (k * 512)), 512)
    c_img, c_txt = (chunk_size, chunk_size) if isinstance(chunk_size, int) else chunk_size
    idx, vals = _support(latents, k)
    # With y = z_p ⊙ m_q on S_p = v ⊙ M (v = z_p[S_p], M = m_q[S_p]) the image's values are folded
    # into its K x K block once, and a pair only needs its gathered mask entries M:
    #   ||e||² = M^T A_p M + w_p · M + ||b||²,  A_p = diag(v) G_p diag(v),  w_p = 2 v ⊙ (W_D b)[S_p]
    #   e · t̂  = v · (m_q ⊙ u_q)[S_p] + b · t̂ = z_p · (m_q ⊙ u_q) + b · t̂
    track = torch.is_grad_enabled() and any(t.requires_grad for t in (latents, masks, decoder, b_pre, text_emb))
    run = _sparse_tracked if track else _sparse_fast
    return run(idx, vals, masks, decoder, t_hat, (tb, wb, bb), c_img, c_txt)


def _support(latents: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's nonzero latents as (P, K) indices, ascending, and their values (differentiable in
    `latents`). A row with fewer than K nonzeros is padded at the front with index 0 and value 0,
    which adds nothing to any term; one with more keeps its K largest in magnitude."""
    P = latents.shape[0]
    z = latents.detach()
    nz = z.nonzero()  # row-major: each row's columns ascending (2.3x faster than topk over d1)
    rows, cols = nz[:, 0], nz[:, 1]
    counts = torch.bincount(rows, minlength=P)
    if len(rows) and int(counts.max()) > k:
        top = z.abs().topk(k, dim=1)
        order = torch.where(top.values != 0, top.indices, -1).sort(dim=1)
        keep = order.values >= 0
        idx = order.values.clamp_min(0)
    else:
        # Slot of each nonzero: its rank within its row, shifted so that the row ends at slot K - 1.
        start = torch.cumsum(counts, 0) - counts
        slot = torch.arange(len(rows), device=z.device) - start[rows] + (k - counts)[rows]
        idx = torch.zeros(P, k, dtype=torch.long, device=z.device)
        keep = torch.zeros(P, k, dtype=torch.bool, device=z.device)
        idx[rows, slot] = cols
        keep[rows, slot] = True
    return idx, torch.where(keep, latents.gather(1, idx), 0)


def sym_blocks(k: int) -> list[tuple[int, int]]:
    """The support-row blocks (lo, hi) of `_sparse_fast`'s half-symmetric quadratic form: block row
    i multiplies rows lo..hi-1 by the trailing columns lo..K-1, so the share of the K² work done is
    sum((hi - lo)(K - lo)) / K² (62.5% at K=128 with SYM_ROWS = 32; 100% with SYM_ROWS = K)."""
    step = max(1, SYM_ROWS)
    return [(lo, min(lo + step, k)) for lo in range(0, k, step)]


def _sparse_fast(idx, vals, masks, decoder, t_hat, consts, c_img, c_txt):
    """`conditioned_scores`' sparse path without autograd. The quadratic form uses half of A_p:
    M^T A_p M = sum_i M_i^T (A_ii M_i + 2 sum_{j > i} A_ij M_j) over blocks of SYM_ROWS support
    rows, so block row i is one (c, rows, K - lo_i) x (c, K - lo_i, m) GEMM over the trailing rows
    of M: (B + 1) / 2B of the K² multiply-adds for B blocks (62.5% at K=128, 32-row blocks), and the
    Gram blocks are made the same way. Each image chunk writes into preallocated buffers (fresh
    (c, K, m) tensors per chunk measured slower: page faults and cache misses). A text chunk's
    image chunks run in ranges, one per Python thread (`_ranges_in_threads`: 5k x 25k 31.7 s vs
    37.2 s, 2k x 2k 1.41 vs 1.59 s, on 2 cores).
    Loops: image blocks of up to `big` images (their blocks of A_p kept: about big·K²/2 elements),
    then text chunks, then image chunks: a text chunk's (d1, m) masks are read by every image of
    the block while they are in cache (images-outer re-read the whole mask per image chunk)."""
    tb, wb, bb = consts
    (P, k), Q, d = idx.shape, masks.shape[0], decoder.shape[1]
    blocks = sym_blocks(k)
    big = max(c_img, BLOCK_ELEMENTS // sum((hi - lo) * (k - lo) for lo, hi in blocks))  # half of K² per image
    gram_c = max(1, GRAM_ELEMENTS // (k * d))  # images per Gram GEMM: their K x d rows stay in L2
    out = vals.new_empty((P, Q))
    for b0 in range(0, P, big):
        idx_b, vals_b = idx[b0 : b0 + big], vals[b0 : b0 + big]
        nb = len(idx_b)
        # Block row i of A_p over columns lo_i: (v W_D[S_p])_i (v W_D[S_p])_{lo_i:}^T, right of the diagonal doubled.
        a_blk = [vals_b.new_empty((nb, hi - lo, k - lo)) for lo, hi in blocks]
        for g0 in range(0, nb, gram_c):
            g1 = min(g0 + gram_c, nb)
            dec = decoder.index_select(0, idx_b[g0:g1].reshape(-1)).view(g1 - g0, k, d).mul_(vals_b[g0:g1, :, None])
            for a, (lo, hi) in zip(a_blk, blocks):
                torch.bmm(dec[:, lo:hi], dec[:, lo:].transpose(1, 2), out=a[g0:g1])
        for a, (lo, hi) in zip(a_blk, blocks):
            a[:, :, hi - lo :] *= 2
        w_b = 2 * vals_b * wb[idx_b]  # (nb, K): w_p
        for j0 in range(0, Q, c_txt):
            j1 = min(j0 + c_txt, Q)
            m_blk = masks[j0:j1].T.contiguous()  # (d1, m): a gather reads contiguous rows
            mu_blk = (decoder @ t_hat[j0:j1].T).mul_(m_blk)  # m_q ⊙ u_q, u_q = W_D t̂_q
            # The two terms linear in M as weighted sums of K table rows (embedding_bag: as fast as a
            # CSR x dense product at 512 texts, 2x at 256): z_p · (m_q ⊙ u_q) + b · t̂_q, and w_p · M + ||b||²
            # (apart from the GEMMs, whose bias it was: copying a broadcast bias into the output cost a pass).
            num_b = F.embedding_bag(idx_b, mu_blk, per_sample_weights=vals_b, mode="sum").add_(tb[j0:j1])
            lin_b = F.embedding_bag(idx_b, m_blk, per_sample_weights=w_b, mode="sum").add_(bb)
            chunk_starts = [*range(0, nb, c_img), nb]  # image offsets of the image chunks
            fn = partial(_quadratic_form_chunks, starts=chunk_starts, blocks=blocks, a_blk=a_blk, idx_b=idx_b,
                         m_blk=m_blk, num_b=num_b, lin_b=lin_b, out=out[b0 : b0 + nb, j0:j1])
            _ranges_in_threads(fn, chunk_starts, vals.device)
    return out


def _quadratic_form_chunks(first, last, starts, blocks, a_blk, idx_b, m_blk, num_b, lin_b, out):
    """`_sparse_fast`'s inner loop for image chunks first..last-1 (images starts[i]..starts[i + 1])
    of one image block and one text chunk of m texts, into `out` (the block's (nb, m) scores), with
    buffers of its own (each range of `_ranges_in_threads` runs one)."""
    k, m = idx_b.shape[1], m_blk.shape[1]
    c_max = max(b - a for a, b in zip(starts[first:last], starts[first + 1 : last + 1]))
    mm = m_blk.new_empty((c_max * k, m))
    r_buf = [m_blk.new_empty((c_max, hi - lo, m)) for lo, hi in blocks]
    sq_buf, part_buf = m_blk.new_empty((c_max, m)), m_blk.new_empty((c_max, m))
    for i0, i1 in zip(starts[first:last], starts[first + 1 : last + 1]):
        c = i1 - i0
        g = torch.index_select(m_blk, 0, idx_b[i0:i1].reshape(-1), out=mm[: c * k]).view(c, k, m)  # M
        sq, part = sq_buf[:c], part_buf[:c]
        for n, ((lo, hi), a) in enumerate(zip(blocks, a_blk)):
            r = torch.bmm(a[i0:i1], g[:, lo:], out=r_buf[n][:c])  # A'_i M
            torch.sum(r.mul_(g[:, lo:hi]), 1, out=sq if n == 0 else part)
            sq += lin_b[i0:i1] if n == 0 else part
        # Rounding can leave a tiny negative value for an edited embedding of (almost) zero length.
        torch.div(num_b[i0:i1], sq.clamp_min_(1e-24).sqrt_(), out=out[i0:i1])


def _sparse_tracked(idx, vals, masks, decoder, t_hat, consts, c_img, c_txt):
    """`conditioned_scores`' sparse path under autograd: the same terms with differentiable ops (full
    A_p, out-of-place multiply, the numerator from a gather); the per-chunk tensors are kept for backward."""
    tb, wb, bb = consts
    (P, k), Q, d = idx.shape, masks.shape[0], decoder.shape[1]
    big = max(c_img, BLOCK_ELEMENTS // (k * k))
    gram_c = max(1, GRAM_ELEMENTS // (k * d))
    out_rows = []
    for b0 in range(0, P, big):
        idx_b, vals_b = idx[b0 : b0 + big], vals[b0 : b0 + big]
        a_b, w_b = [], []
        for g0 in range(0, len(idx_b), gram_c):
            flat = idx_b[g0 : g0 + gram_c].reshape(-1)
            v = vals_b[g0 : g0 + gram_c]
            dec = decoder.index_select(0, flat).view(len(v), k, -1)  # (c, K, d): W_D[S_p]
            a_b.append((dec @ dec.transpose(1, 2)) * (v[:, :, None] * v[:, None, :]))  # A_p
            w_b.append((2 * v * wb.index_select(0, flat).view(len(v), k))[:, :, None])  # (c, K, 1): w_p
        a_b, w_b = torch.cat(a_b), torch.cat(w_b)
        cols = []
        for j0 in range(0, Q, c_txt):
            m_blk = masks[j0 : j0 + c_txt].T.contiguous()
            mu_blk = m_blk * (decoder @ t_hat[j0 : j0 + c_txt].T)
            m = m_blk.shape[1]
            rows = []
            for i0 in range(0, len(idx_b), c_img):
                flat = idx_b[i0 : i0 + c_img].reshape(-1)
                c = len(flat) // k
                mm = m_blk.index_select(0, flat).view(c, k, m)  # (c, K, m): M = m_q[S_p]
                sq = (torch.baddbmm(w_b[i0 : i0 + c], a_b[i0 : i0 + c], mm) * mm).sum(1)
                num = torch.bmm(vals_b[i0 : i0 + c, None, :], mu_blk.index_select(0, flat).view(c, k, m))[:, 0]
                rows.append((num + tb[j0 : j0 + m]) / (sq + bb).clamp_min(1e-24).sqrt())
            cols.append(torch.cat(rows, dim=0))
        out_rows.append(torch.cat(cols, dim=1) if cols else tb.new_zeros((len(idx_b), 0)))
    return torch.cat(out_rows, dim=0) if out_rows else tb.new_zeros((0, Q))


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
    texts, qi = _used(text_idx, masks.shape[0])  # the Q' texts used; qi: (n_pairs,)
    images, pi = _used(image_idx, latents.shape[0])  # the P' images used
    # Every image used (a rerank's usual case): no (P', d1) copy of the codes.
    idx, vals = _support(latents if len(images) == len(latents) else latents[images], k)  # (P', K)
    n_pairs, d1, d = len(image_idx), latents.shape[1], decoder.shape[1]
    if method == "auto":
        method = pair_method(n_pairs, len(images), len(texts), d, d1, k)
    if method == "direct":
        out = torch.empty(n_pairs, dtype=latents.dtype, device=latents.device)
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
    # Within a text its pairs go by image, within an image by text: pass 2's row reads (of pass 1's
    # rows and of the text embeddings) then run forward through memory instead of jumping about.
    by_text = torch.argsort(qi * len(images) + pi)
    qi_t, pi_t = qi[by_text], pi[by_text]
    text_starts = torch.searchsorted(qi_t, torch.arange(len(texts) + 1, device=qi.device)).tolist()
    by_image = torch.argsort(pi * len(texts) + qi)
    img_starts = torch.searchsorted(pi[by_image], torch.arange(len(images) + 1, device=pi.device)).tolist()
    c_txt = max(1, text_chunk)
    # Pass 1 writes its rows in text order; pass 2 reads row pos[j] for the j-th pair in image order.
    pos_of_pair = torch.empty_like(by_text)
    pos_of_pair[by_text] = torch.arange(n_pairs, device=qi.device)
    pos = pos_of_pair[by_image]
    if method == "embed":
        # Pass 1 gathers the raw mask entries m_q[S_p] only: z_p is folded into the image's decoder
        # rows in pass 2 (K x d once per image instead of n x K products here).
        g = torch.empty(n_pairs, k, dtype=latents.dtype, device=latents.device)  # row r: pair by_text[r]
        # Every text with the same number of pairs (a t2i rerank: k each): a chunk's gather is one
        # torch.gather over its (c, d1) mask rows, measured 1.8x faster than index_select into the
        # flat mask (1.16 vs 2.1 s for 5k x 25k rerank@100; docs/findings.md, "Where the t2i
        # rerank's time goes"). Other layouts index the flat mask.
        width = n_pairs // max(1, len(texts))
        uniform = width > 0 and text_starts == list(range(0, n_pairs + 1, width))
        if uniform:
            text_list = texts.tolist()
        else:
            m_flat = masks.reshape(-1)
            # int32 offsets when they fit: index_select then moves half the index bytes (measured
            # 3x faster than int64 advanced indexing on a 25k x 16k mask).
            off_type = torch.int32 if m_flat.numel() < 2**31 else torch.int64
            idx_off, row_off = idx.to(off_type), texts.to(off_type) * d1
        for j0 in range(0, len(texts), c_txt):
            j1 = min(j0 + c_txt, len(texts))
            r0, r1 = text_starts[j0], text_starts[j1]
            if uniform:
                t0, t1 = text_list[j0], text_list[j1 - 1] + 1
                rows = masks[t0:t1] if t1 - t0 == j1 - j0 else masks.index_select(0, texts[j0:j1])
                cols = idx.index_select(0, pi_t[r0:r1]).view(j1 - j0, width * k)
                torch.gather(rows, 1, cols, out=g[r0:r1].view(j1 - j0, width * k))
                continue
            # (n, K) offsets into m, from index_select (advanced indexing measured slower)
            flat = idx_off.index_select(0, pi_t[r0:r1]).add_(row_off.index_select(0, qi_t[r0:r1])[:, None])
            torch.index_select(m_flat, 0, flat.view(-1), out=g[r0:r1].view(-1))
        # e_{p|q} = m_q[S_p] (diag(z_p[S_p]) W_D[S_p]) + b_pre: one (n_p, K) x (K, d) GEMM per image,
        # then cos(e, t̂_q). index_select and a dot product: measured 5x and 3x faster than advanced
        # indexing and cosine_similarity at these sizes.
        t_used, q_img = t_hat[texts], qi[by_image]
        score = torch.empty(n_pairs, dtype=latents.dtype, device=latents.device)  # image order

        # One image at a time: batching groups of images into padded bmm calls measured 1.2x slower
        # (at ~500 pairs per image the per-image GEMM is already large enough).
        def score_images(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                s0, s1 = img_starts[i], img_starts[i + 1]
                dec = decoder.index_select(0, idx[i]).mul_(vals[i][:, None])  # (K, d)
                e = torch.addmm(b_pre, g.index_select(0, pos[s0:s1]), dec)  # (n_i, d)
                num = t_used.index_select(0, q_img[s0:s1]).mul_(e).sum(1)
                torch.div(num, torch.linalg.vector_norm(e, dim=1).clamp_min_(1e-12), out=score[s0:s1])

        _ranges_in_threads(score_images, img_starts, latents.device)
        out = torch.empty(n_pairs, dtype=latents.dtype, device=latents.device)
        out[by_image] = score
        return out

    # "gram". Pass 1 also makes u_q = W_D t̂_q for a few texts at a time (a GEMM, never the whole
    # (Q', d1) matrix) and reads m_q ⊙ u_q beside m_q for the numerator.
    y = torch.empty(n_pairs, k, dtype=latents.dtype, device=latents.device)  # row r: pair by_text[r]
    num = torch.empty(n_pairs, dtype=latents.dtype, device=latents.device)
    tb = t_hat[texts] @ b_pre  # (Q',)
    both = torch.empty(c_txt, d1, 2, dtype=latents.dtype, device=latents.device)
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
    sq = torch.empty(n_pairs, dtype=latents.dtype, device=latents.device)  # in y's row order
    wb_all = decoder @ b_pre  # (d1,)
    bb = b_pre @ b_pre
    for i in range(len(images)):
        r = pos[img_starts[i] : img_starts[i + 1]]
        sp = idx[i]  # (K,)
        dec = decoder[sp]  # (K, d)
        yi = y[r]  # (n_i, K)
        sq[r] = ((yi @ (dec @ dec.T)) * yi).sum(1) + 2 * (yi @ wb_all[sp]) + bb
    # Rounding can leave a tiny negative value for an edited embedding of (almost) zero length.
    out = torch.empty(n_pairs, dtype=latents.dtype, device=latents.device)
    out[by_text] = num / sq.clamp_min(1e-24).sqrt()
    return out


def _used(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.unique(ids, return_inverse=True)` for ids in [0, n): the ids that occur, ascending,
    and each entry's position among them, by marking instead of sorting (O(n + len(ids)): for a
    5k x 25k rerank's 2.5M pairs, texts and images together 0.023-0.031 s vs 0.068-0.145 s)."""
    seen = torch.zeros(n, dtype=torch.bool, device=ids.device)
    seen[ids] = True
    used = seen.nonzero().squeeze(1)
    rank = torch.empty(n, dtype=ids.dtype, device=ids.device)
    rank[used] = torch.arange(len(used), dtype=ids.dtype, device=ids.device)
    return used, rank[ids]


def _ranges_in_threads(fn: Callable[[int, int], None], starts: list[int], device: torch.device) -> None:
    """fn(lo, hi) over units 0..n-1 (images, or chunks of images; `starts`: n + 1 offsets of their
    work, e.g. pairs), split on a CPU into up to `torch.get_num_threads()` (at most
    MAX_PAIR_THREADS) ranges of about equal work, each run in its own Python thread with one
    intra-op thread; fn(0, n) in this thread otherwise (one thread, or a GPU, whose kernels run
    asynchronously anyway).

    Why: a per-image loop is small ops (`pair_scores`: a (K, d) gather, a (n_i, K) x (K, d) GEMM,
    a dot and a norm; `conditioned_scores`: a gather and a few bmm per chunk of 8 images), and each
    op split over the intra-op threads pays their wake-up (OMP_WAIT_POLICY=PASSIVE). Ranges in
    their own threads keep every core busy instead: 5k x 25k rerank@100 on 2 cores, pass 2 in
    3.3-3.6 s vs 4.1-4.6 s (docs/findings.md, "Where the t2i rerank's time goes"). Each range
    writes its own slice of the output; the intra-op thread count is restored afterwards."""
    n = len(starts) - 1
    outer = torch.get_num_threads()
    n_threads = min(outer, MAX_PAIR_THREADS, n)
    if device.type != "cpu" or n_threads < 2:
        fn(0, n)
        return
    cuts = [0, *(bisect.bisect_left(starts, starts[-1] * t // n_threads) for t in range(1, n_threads)), n]
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()  # both are per thread

    def one_range(lo: int, hi: int) -> None:
        torch.set_num_threads(1)  # this thread's OpenMP team; MKL's is thread-local too
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            fn(lo, hi)

    try:
        with ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(one_range, cuts[:-1], cuts[1:]))  # list(): re-raises a range's exception here
    finally:
        torch.set_num_threads(outer)


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
    alpha: float = 0.0,
) -> Reranked:
    """`rerank` with exact TEVI scores: CLIP's top k candidates of each query re-scored by
    cos(e_{p|q}, t_q) with `pair_scores` (only those pairs), fused with `base_scores` as
    α · base + (1 − α) · TEVI (`fuse`; α = 0: TEVI alone, α = 1: the base order, no TEVI work).
    `base_scores` is (P, Q); other arguments as in `conditioned_scores` (`support` is its `k`).

    direction "t2i": per text (column), its top-k images are re-scored; `order` is (k, Q).
    direction "i2t": per image (row), its top-k texts are re-scored; `order` is (k, P), column
        p holding image p's texts.
    Cost: k·Q pairs (t2i) or k·P pairs (i2t) of n·K·d each, against P·Q·K² for
    `conditioned_scores` -- a ratio of (P/k)(K/d) for t2i and (Q/k)(K/d) for i2t (12.5 and 62.5
    on COCO's 5k images x 25k captions at K=128, d=512), besides the top-k selection.
    """
    if direction not in ("t2i", "i2t"):
        raise VlctlError(f"direction must be 't2i' or 'i2t', got {direction!r}")

    base = base_scores if direction == "t2i" else base_scores.T

    def rescore(cand: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        if alpha == 1:
            return base.gather(0, cand)
        other = query[None, :].expand_as(cand)
        img, txt = (cand, other) if direction == "t2i" else (other, cand)
        s = pair_scores(latents, masks, decoder, b_pre, text_emb, img.reshape(-1), txt.reshape(-1), support)
        return fuse(base.gather(0, cand), s.reshape(cand.shape), alpha)

    return rerank(base, k, rescore, full_order)


def fuse(base: torch.Tensor, tevi: torch.Tensor, alpha: float) -> torch.Tensor:
    """α · base + (1 − α) · tevi (`vlctl.methods.tevi.fusion`: both are cosines, one scale); at α = 1
    `base` itself and at α = 0 `tevi` itself, bit for bit, so CLIP's order (or TEVI's) is kept."""
    return base if alpha == 1 else tevi if alpha == 0 else alpha * base + (1 - alpha) * tevi

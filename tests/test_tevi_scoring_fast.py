"""The fast paths of TEVI's exact scoring against a straightforward reference on small random problems:
the no-autograd path (sparse codes x dense numerator, in-place quadratic form) and the autograd path, in
several image blocks and chunks, float32 within 1e-5."""

from __future__ import annotations

import pytest
import torch

from vlctl.methods.tevi import scoring as tevi_scoring
from vlctl.methods.tevi.scoring import conditioned_scores


def _problem(P, Q, d1, d, k, seed):
    g = torch.Generator().manual_seed(seed)
    pre = torch.randn(P, d1, generator=g)
    top = pre.topk(k, dim=1)
    latents = torch.zeros_like(pre).scatter(1, top.indices, top.values.relu())  # some rows < k nonzeros
    if P > 1:
        latents[1] = 0  # an all-zero code: the edited embedding is b_pre alone
    masks = torch.rand(Q, d1, generator=g)
    decoder = torch.nn.functional.normalize(torch.randn(d1, d, generator=g), dim=1)
    return latents, masks, decoder, torch.randn(d, generator=g), 2 * torch.randn(Q, d, generator=g)


def _reference(latents, masks, decoder, b_pre, text):
    """Every edited embedding, in float64, one image at a time."""
    latents, masks, decoder, b_pre, text = (t.double() for t in (latents, masks, decoder, b_pre, text))
    rows = [torch.nn.functional.cosine_similarity((z * masks) @ decoder + b_pre, text, dim=1) for z in latents]
    return torch.stack(rows).float()


@pytest.mark.parametrize(("P", "Q", "chunk", "blocks"), [(13, 9, None, 1), (13, 9, (2, 4), 3), (13, 9, (5, 1), 2),
                                                         (1, 7, 3, 1), (6, 1, (1, 1), 6)])
def test_fast_path_equals_reference(P, Q, chunk, blocks, monkeypatch):
    d1, d, k = 40, 8, 6
    # Shrink the image blocks (Gram blocks kept at once) and Gram GEMMs so small problems span several.
    monkeypatch.setattr(tevi_scoring, "BLOCK_ELEMENTS", -(-P // blocks) * k * k)
    monkeypatch.setattr(tevi_scoring, "GRAM_ELEMENTS", 2 * k * d)
    args = _problem(P, Q, d1, d, k, seed=P + Q)
    want = _reference(*args)
    with torch.no_grad():
        fast = conditioned_scores(*args, chunk_size=chunk, k=k, method="sparse")
    tracked = conditioned_scores(*(t.clone().requires_grad_(True) for t in args), chunk_size=chunk, k=k,
                                 method="sparse")
    assert fast.shape == tracked.shape == (P, Q) and fast.dtype == torch.float32
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(tracked.detach(), want, atol=1e-5, rtol=0)


def test_fast_path_with_empty_sides():
    args = _problem(4, 3, 20, 5, 3, seed=0)
    with torch.no_grad():
        assert conditioned_scores(args[0][:0], *args[1:], k=3).shape == (0, 3)
        assert conditioned_scores(args[0], args[1][:0], args[2], args[3], args[4][:0], k=3).shape == (4, 0)


def test_embed_pairs_with_uneven_counts_equal_reference():
    from vlctl.methods.tevi.scoring import pair_scores

    P, Q, d1, d, k = 11, 9, 40, 8, 6
    args = _problem(P, Q, d1, d, k, seed=5)
    g = torch.Generator().manual_seed(6)
    # Uneven pair counts per image (1 to 24, repeats included), in shuffled order.
    image_idx = torch.cat([torch.full((n,), i) for i, n in enumerate(torch.randint(1, 25, (P,), generator=g).tolist())])
    text_idx = torch.randint(0, Q, (len(image_idx),), generator=g)
    perm = torch.randperm(len(image_idx), generator=g)
    image_idx, text_idx = image_idx[perm], text_idx[perm]
    got = pair_scores(*args, image_idx, text_idx, support=k, method="embed")
    torch.testing.assert_close(got, _reference(*args)[image_idx, text_idx], atol=1e-5, rtol=0)


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 6])
def test_half_symmetric_blocks_equal_reference(rows, monkeypatch):
    # The no-autograd path's quadratic form in blocks of `rows` support rows: one block (6), two
    # uneven ones (4, 5: 4 + 2, 5 + 1 rows), three (2) and one row per block (1).
    P, Q, d1, d, k = 9, 7, 40, 8, 6
    monkeypatch.setattr(tevi_scoring, "SYM_ROWS", rows)
    monkeypatch.setattr(tevi_scoring, "BLOCK_ELEMENTS", 4 * k * k)  # image blocks of 4-6 images: 2-3 blocks
    args = _problem(P, Q, d1, d, k, seed=11)
    with torch.no_grad():
        got = conditioned_scores(*args, chunk_size=(2, 3), k=k, method="sparse")
    torch.testing.assert_close(got, _reference(*args), atol=1e-5, rtol=0)


def test_rows_with_more_than_k_nonzeros_keep_their_k_largest():
    # k below a row's number of nonzeros: each code is cut to its k largest magnitudes, on both paths.
    P, Q, d1, d, k = 6, 5, 30, 8, 4
    args = _problem(P, Q, d1, d, 7, seed=12)  # up to 7 nonzeros per row
    latents = args[0].clone()
    latents[0, :3] = -torch.tensor([5.0, 4.0, 3.0])  # negative values count by magnitude
    assert int((latents != 0).sum(1).max()) > k
    top = latents.abs().topk(k, dim=1).indices
    cut = torch.zeros_like(latents).scatter(1, top, latents.gather(1, top))
    want = _reference(cut, *args[1:])
    with torch.no_grad():
        fast = conditioned_scores(latents, *args[1:], k=k, method="sparse")
    tracked = conditioned_scores(latents.clone().requires_grad_(True), *args[1:], k=k, method="sparse")
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(tracked.detach(), want, atol=1e-5, rtol=0)


def test_support_pads_short_rows_at_the_front():
    latents = torch.tensor([[0.0, 2.0, 0.0, 3.0, 0.0], [0.0] * 5, [1.0, 0.0, 0.0, 0.0, 4.0]])
    idx, vals = tevi_scoring._support(latents, 3)
    assert idx.tolist() == [[0, 1, 3], [0, 0, 0], [0, 0, 4]]
    assert vals.tolist() == [[0.0, 2.0, 3.0], [0.0, 0.0, 0.0], [0.0, 1.0, 4.0]]


@pytest.mark.parametrize("ids", [[], [3], [4, 0, 4, 2, 0, 9], list(range(10))[::-1] * 3])
def test_used_ids_are_torch_unique_with_inverse(ids):
    ids = torch.tensor(ids, dtype=torch.long)
    used, inverse = tevi_scoring._used(ids, 10)
    want_used, want_inverse = torch.unique(ids, return_inverse=True)
    assert torch.equal(used, want_used) and torch.equal(inverse, want_inverse)

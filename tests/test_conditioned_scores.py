"""TEVI's exact conditioned scores against the naive (P, Q, d) computation, and reranking."""

from __future__ import annotations

import pytest
import torch

from vlctl.methods.tevi.scoring import conditioned_scores, rerank

P, Q, D1, D, K = 7, 5, 12, 6, 4


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    pre = torch.randn(P, D1, generator=g, dtype=dtype)
    top = pre.topk(K, dim=1)
    latents = torch.zeros_like(pre).scatter(1, top.indices, top.values.relu())  # <= K nonzeros
    latents[0] = 0
    latents[0, 3] = 1.5  # a row with a single nonzero
    latents[1, :] = 0
    latents[1, [2, 9]] = torch.tensor([0.7, 2.0], dtype=dtype)  # two nonzeros
    masks = torch.rand(Q, D1, generator=g, dtype=dtype)
    decoder = torch.randn(D1, D, generator=g, dtype=dtype)
    decoder = decoder / decoder.norm(dim=1, keepdim=True)
    b_pre = torch.randn(D, generator=g, dtype=dtype)
    text = 3 * torch.randn(Q, D, generator=g, dtype=dtype)
    return latents, masks, decoder, b_pre, text


def _naive(latents, masks, decoder, b_pre, text):
    edited = (latents[:, None, :] * masks[None, :, :]) @ decoder + b_pre  # (P, Q, D)
    return torch.nn.functional.cosine_similarity(edited, text[None], dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("chunk", "method"), [(1, "sparse"), (2, "sparse"), (3, "sparse"), (256, "sparse"),
                                               ((2, 4), "sparse"), ((5, 1), "sparse"), (None, "dense"), (None, "auto")])
def test_equals_naive(dtype, chunk, method):
    args = _inputs(dtype)
    assert (args[0] != 0).sum(1).min() < K  # rows with fewer than K nonzeros are covered
    got = conditioned_scores(*args, chunk_size=chunk, method=method)
    assert got.shape == (P, Q) and got.dtype == dtype
    torch.testing.assert_close(got, _naive(*args), atol=1e-5, rtol=0)


def test_explicit_k_larger_than_support():
    args = _inputs(torch.float64)
    torch.testing.assert_close(conditioned_scores(*args, k=D1), _naive(*args), atol=1e-10, rtol=0)


@pytest.mark.parametrize(("chunk", "method"), [(2, "sparse"), (256, "sparse"), (None, "dense")])
def test_gradients_equal_naive(chunk, method):
    base = _inputs(torch.float64, seed=1)
    w = torch.randn(P, Q, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = []
    for fn in (lambda *a: conditioned_scores(*a, chunk_size=chunk, method=method), _naive):
        latents, masks, decoder, b_pre, text = (t.clone().requires_grad_(True) for t in base)
        (fn(latents, masks, decoder, b_pre, text) * w).sum().backward()
        # latents: only the support is compared (see conditioned_scores' docstring)
        grads.append([masks.grad, text.grad, decoder.grad, b_pre.grad, latents.grad[base[0] != 0]])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_rerank_changes_order_only_within_top_k():
    g = torch.Generator().manual_seed(3)
    n_img, n_txt, k = 20, 6, 5
    base = torch.randn(n_img, n_txt, generator=g)
    fine = torch.randn(n_img, n_txt, generator=g)
    calls = []

    def rescore(image_idx, text_idx):
        calls.append(image_idx.shape)
        return fine[image_idx, text_idx[None, :].expand_as(image_idx)]

    out = rerank(base, k, rescore, full_order=True)
    assert calls == [(k, n_txt)]  # only k candidates per text are rescored
    top_only = rerank(base, k, rescore)  # the default: the top k, from a top-k selection
    assert torch.equal(top_only.order, out.order[:k]) and torch.equal(top_only.scores, out.scores)
    base_order = base.argsort(dim=0, descending=True)
    for q in range(n_txt):
        top = base_order[:k, q]
        assert set(out.order[:k, q].tolist()) == set(top.tolist())
        assert torch.equal(out.order[k:, q], base_order[k:, q])
        want = top[fine[top, q].argsort(descending=True)]
        assert torch.equal(out.order[:k, q], want)
        torch.testing.assert_close(out.scores[:, q], fine[want, q])
    # every column is a permutation of the images
    assert torch.equal(out.order.sort(dim=0).values, torch.arange(n_img)[:, None].expand(n_img, n_txt))


def test_rerank_breaks_base_ties_by_index():
    base = torch.tensor([[1.0], [3.0], [3.0], [0.0], [3.0]])
    out = rerank(base, 3, lambda i, t: torch.zeros(i.shape))  # equal new scores keep the base order
    assert out.order[:, 0].tolist() == [1, 2, 4]


@pytest.mark.parametrize("method", ["auto", "direct", "embed", "gram"])
@pytest.mark.parametrize("n_pairs,text_chunk", [(3, 64), (200, 64), (200, 2)])  # few/many pairs per image; text chunks
def test_pair_scores_equal_the_full_matrix_at_the_listed_pairs(n_pairs, text_chunk, method):
    from vlctl.methods.tevi.scoring import pair_scores

    latents, masks, decoder, b_pre, text = _inputs(torch.float64, seed=3)
    g = torch.Generator().manual_seed(1)
    image_idx = torch.randint(0, P, (n_pairs,), generator=g)  # unordered, with repeats
    text_idx = torch.randint(0, Q, (n_pairs,), generator=g)
    full = _naive(latents, masks, decoder, b_pre, text)
    got = pair_scores(latents, masks, decoder, b_pre, text, image_idx, text_idx, support=K,
                      text_chunk=text_chunk, method=method)
    torch.testing.assert_close(got, full[image_idx, text_idx], rtol=1e-10, atol=1e-10)


def test_pair_scores_refuses_an_unknown_method():
    from vlctl.methods.tevi.scoring import pair_scores

    latents, masks, decoder, b_pre, text = _inputs(torch.float64, seed=3)
    with pytest.raises(ValueError, match="method"):
        pair_scores(latents, masks, decoder, b_pre, text, torch.tensor([0]), torch.tensor([0]), method="dense")


def test_pair_method_follows_the_multiply_add_counts():
    from vlctl.methods.tevi.scoring import pair_method

    d, d1, k = 512, 16384, 128
    assert pair_method(100, 100, 1, d, d1, k) == "direct"  # one query's candidates
    assert pair_method(100 * 25000, 5000, 25000, d, d1, k) == "embed"  # rerank depth 100 < ~370
    assert pair_method(1000 * 25000, 5000, 25000, d, d1, k) == "gram"  # depth 1000: u_q pays off
    assert pair_method(350 * 25000, 5000, 25000, d, d1, k) == "embed"  # below the 1.5x margin
    assert pair_method(400 * 25000, 5000, 25000, d, d1, k) == "gram"
    assert pair_method(100 * 10000, 10000, 10000, 18, 26, 8) == "direct"  # a CG-SAE's tiny rows


def test_dense_path_in_several_blocks():
    # d1 = 1100 makes the dense path's blocks 3 rows long: images and texts both span several.
    g = torch.Generator().manual_seed(4)
    d1 = 1100
    pre = torch.randn(P, d1, generator=g, dtype=torch.float64)
    top = pre.topk(K, dim=1)
    latents = torch.zeros_like(pre).scatter(1, top.indices, top.values.relu())
    masks = torch.rand(Q, d1, generator=g, dtype=torch.float64)
    decoder = torch.nn.functional.normalize(torch.randn(d1, D, generator=g, dtype=torch.float64), dim=1)
    b_pre, text = torch.randn(D, generator=g, dtype=torch.float64), torch.randn(Q, D, generator=g, dtype=torch.float64)
    args = (latents, masks, decoder, b_pre, text)
    torch.testing.assert_close(conditioned_scores(*args, method="dense"), _naive(*args), atol=1e-10, rtol=0)


@pytest.mark.parametrize("texts", [[0, 1, 2, 3], [0, 2, 4]])  # contiguous texts (mask rows as a view), or not
def test_pair_scores_embed_with_equal_pairs_per_text(texts):
    """A t2i rerank's layout, every text with the same number of pairs (the gather fast path)."""
    from vlctl.methods.tevi.scoring import pair_scores

    latents, masks, decoder, b_pre, text = _inputs(torch.float64, seed=4)
    g = torch.Generator().manual_seed(2)
    width = 6
    text_idx = torch.tensor(texts).repeat(width)  # rank-major, as rerank lists them
    image_idx = torch.stack([torch.randperm(P, generator=g)[:width] for _ in texts], 1).reshape(-1)
    full = _naive(latents, masks, decoder, b_pre, text)
    got = pair_scores(latents, masks, decoder, b_pre, text, image_idx, text_idx, support=K, text_chunk=2,
                      method="embed")
    torch.testing.assert_close(got, full[image_idx, text_idx], rtol=1e-10, atol=1e-10)


def test_pair_scores_of_no_pairs_is_empty_for_every_method():
    from vlctl.methods.tevi.scoring import PAIR_METHODS, pair_scores

    latents, masks, decoder, b_pre, text = _inputs(torch.float64, seed=5)
    none = torch.zeros(0, dtype=torch.long)
    for method in PAIR_METHODS:
        assert pair_scores(latents, masks, decoder, b_pre, text, none, none, support=K, method=method).shape == (0,)


def test_pair_scores_embed_in_worker_threads_equals_one_thread_and_keeps_the_modes():
    """pass 2 over image ranges in Python threads (several intra-op threads) gives exactly the
    one-thread scores, runs under the caller's inference mode and no-grad (both per thread), and
    leaves the intra-op thread count as it was."""
    from vlctl.methods.tevi.scoring import pair_scores

    latents, masks, decoder, b_pre, text = _inputs(torch.float32, seed=6)
    decoder.requires_grad_(True)  # as a learned decoder is: no graph may be built under no_grad / inference
    g = torch.Generator().manual_seed(3)
    image_idx = torch.randint(0, P, (200,), generator=g)
    text_idx = torch.randint(0, len(text), (200,), generator=g)
    outer = torch.get_num_threads()
    got = {}
    try:
        for threads, mode in ((1, torch.no_grad), (3, torch.no_grad), (3, torch.inference_mode)):
            torch.set_num_threads(threads)
            with mode():
                got[threads, mode] = pair_scores(latents, masks, decoder, b_pre, text, image_idx, text_idx,
                                                 support=K, method="embed")
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(outer)
    ref = got[1, torch.no_grad]
    assert not ref.requires_grad
    for out in got.values():
        assert torch.equal(out, ref)
    with torch.no_grad():
        full = _naive(latents, masks, decoder, b_pre, text)
    torch.testing.assert_close(ref, full[image_idx, text_idx], rtol=1e-5, atol=1e-5)


def test_conditioned_scores_in_worker_threads_equals_one_thread():
    """The no-autograd sparse path's image chunks in Python threads: exactly the one-thread scores,
    under no_grad and inference mode, with a learned (requires_grad) decoder."""
    latents, masks, decoder, b_pre, text = _inputs(torch.float32, seed=7)
    decoder.requires_grad_(True)
    outer = torch.get_num_threads()
    got = []
    try:
        for threads, mode in ((1, torch.no_grad), (3, torch.no_grad), (3, torch.inference_mode)):
            torch.set_num_threads(threads)
            with mode():
                got.append(conditioned_scores(latents, masks, decoder, b_pre, text, chunk_size=(1, 2), k=K,
                                              method="sparse"))
    finally:
        torch.set_num_threads(outer)
    assert all(torch.equal(g, got[0]) for g in got)
    with torch.no_grad():
        torch.testing.assert_close(got[0], _naive(latents, masks, decoder, b_pre, text), rtol=1e-5, atol=1e-5)

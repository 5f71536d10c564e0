"""The TopK SAE's sparse training path (vlctl.methods.sae.kernels) against plain dense autograd.

The dense reference below is the SAE's maths written the obvious way: pre (n, d1), a dense code z,
z @ W_D, AuxK on the pre-activations with live latents masked to -inf. Every loss and gradient of
`TopKSAE.forward` must match it; a short fit must end at the same FVU.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from vlctl.methods.sae.config import TopKSAEConfig
from vlctl.methods.sae.kernels import picked_encode, sparse_decode
from vlctl.methods.sae.model import SAEOutput, SparseAutoencoder, TopKSAE, _normalised_mse


def _topk_relu(pre, k):
    top = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, top.indices, F.relu(top.values))


def dense_forward(model: TopKSAE, x: torch.Tensor) -> SAEOutput:
    """The reference: dense autograd through every step, same dead-latent bookkeeping."""
    pre = (x - model.b_pre) @ model.W_E + model.b_E
    z = _topk_relu(pre, model.cfg.k)
    x_hat = z @ model.W_D + model.b_pre
    nmse = _normalised_mse(x, x_hat)
    dead = model.dead_mask
    n_aux = min(model.cfg.aux_k, int(dead.sum()))
    aux = pre.new_zeros(())
    if n_aux:
        z_aux = _topk_relu(pre.masked_fill(~dead, float("-inf")), n_aux)
        aux = _normalised_mse((x - x_hat).detach(), z_aux @ model.W_D)
    if model.training:
        with torch.no_grad():
            fired = (z != 0).any(0)
            model.samples_since_fired += x.shape[0]
            model.samples_since_fired[fired] = 0
    return SAEOutput(nmse + model.cfg.aux_coef * aux, nmse, aux, x_hat, z)


def _model(dtype, n_dead=0, concepts=False, aux_k=6, d=8, d1=24, k=4):
    cfg = TopKSAEConfig(d=d, d_latent=d1, k=k, aux_k=aux_k, dead_after=10, aux_coef=0.5, concepts_fixed=concepts)
    g = torch.Generator().manual_seed(3)
    model = TopKSAE(cfg, torch.randn(d1, d, generator=g) if concepts else None, seed=1)
    with torch.no_grad():
        model.b_pre.copy_(torch.randn(d, generator=g))
        model.b_E.copy_(0.3 * torch.randn(d1, generator=g))
        model.W_E.add_(0.5 * torch.randn(d, d1, generator=g))
        # The dead latents: some of them with a large b_E, so they are also top-k picks in some rows
        # (a position that gets both the TopK and the AuxK gradient).
        model.samples_since_fired[:n_dead] = 11
        model.b_E[:2].add_(1.5)
    return model.to(dtype)


def _grads(model, forward, x):
    model.zero_grad(set_to_none=True)
    out = forward(model, x)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out, grads


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("n_dead,concepts", [(0, False), (9, False), (3, False), (9, True)])
def test_loss_and_every_gradient_match_dense_autograd(dtype, tol, n_dead, concepts):
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(5)).to(dtype) + 0.4
    sparse_model, dense_model = _model(dtype, n_dead, concepts), _model(dtype, n_dead, concepts)
    sparse_out, sparse_g = _grads(sparse_model, TopKSAE.forward, x)
    dense_out, dense_g = _grads(dense_model, dense_forward, x)
    if n_dead:  # AuxK really contributes (with n_dead=3 < aux_k=6 every dead latent is picked)
        assert float(dense_out.aux.detach()) > 0
    for name in ("loss", "nmse", "aux", "x_hat", "z"):
        torch.testing.assert_close(getattr(sparse_out, name), getattr(dense_out, name), rtol=tol, atol=tol)
    expected = {"W_E", "b_E"} if concepts else {"W_E", "b_E", "W_D", "b_pre"}
    assert set(sparse_g) == set(dense_g) == expected
    for name in expected:
        torch.testing.assert_close(sparse_g[name], dense_g[name], rtol=tol, atol=tol, msg=name)
    assert torch.equal(sparse_model.samples_since_fired, dense_model.samples_since_fired)


def test_topk_and_auxk_overlap_sums_both_gradients():
    """A dead latent that is also a top-k pick gets the TopK and the AuxK gradient at one position."""
    model = _model(torch.float64, n_dead=9)
    x = torch.randn(40, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) + 0.4
    p = picked_encode(x, model.W_E, model.b_E, model.b_pre, 4, model.dead_mask, 6)
    overlap = (p.indices[:, :, None] == p.aux_indices[:, None, :]).any()
    assert overlap  # the fixture makes latents 0 and 1 dead and large
    assert bool(model.dead_mask[p.aux_indices].all())


def test_input_gradient_and_decode_match_dense():
    """The backward to x (unused by fit, but part of the op) and sparse_decode equal the dense forms."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, dtype=torch.float64, generator=g, requires_grad=True)
    W_E = torch.randn(5, 20, dtype=torch.float64, generator=g, requires_grad=True)
    b_E = torch.randn(20, dtype=torch.float64, generator=g, requires_grad=True)
    b_pre = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    W_D = torch.randn(20, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(12, 5, dtype=torch.float64, generator=g)

    p = picked_encode(x, W_E, b_E, b_pre, 3)
    (sparse_decode(p.indices, p.values.relu(), W_D) * w).sum().backward()
    got = [t.grad.clone() for t in (x, W_E, b_E, b_pre, W_D)]
    for t in (x, W_E, b_E, b_pre, W_D):
        t.grad = None
    ((_topk_relu((x - b_pre) @ W_E + b_E, 3) @ W_D) * w).sum().backward()
    for a, t in zip(got, (x, W_E, b_E, b_pre, W_D)):
        torch.testing.assert_close(a, t.grad, rtol=1e-12, atol=1e-12)


def test_short_fit_matches_dense_fit(monkeypatch, tmp_path):
    """fit with the sparse forward and with the dense reference: the same FVU, AuxK on along the way."""
    g = torch.Generator().manual_seed(1)
    dirs = torch.randn(12, 16, generator=g)
    x = torch.rand(1024, 12, generator=g).pow(4) @ dirs + 0.2
    kw = {"d_latent": 96, "k": 2, "aux_k": 8, "dead_after": 256, "lr": 5e-3, "epochs": 6, "batch_size": 128,
          "progress": False}
    sparse = SparseAutoencoder(**kw, out_dir=tmp_path / "sparse").fit(x, "enc")
    monkeypatch.setattr(TopKSAE, "forward", dense_forward)
    dense = SparseAutoencoder(**kw, out_dir=tmp_path / "dense").fit(x, "enc")
    for run in ("sparse", "dense"):  # AuxK was on during both fits
        log = [json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        assert max(r["aux"] for r in log) > 0
    assert abs(sparse.fvu_ - dense.fvu_) <= 0.01 * dense.fvu_
    torch.testing.assert_close(sparse.model_.W_D, dense.model_.W_D, rtol=1e-3, atol=1e-4)

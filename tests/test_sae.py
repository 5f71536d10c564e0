"""TopK sparse autoencoder: the module's maths, fitting through the training loop, CG-SAE, files."""

from __future__ import annotations

import json

import pytest
import torch

from vlctl.fsops import VlctlError
from vlctl.methods.sae.config import TopKSAEConfig
from vlctl.methods.sae.model import SparseAutoencoder, TopKSAE
from vlctl.methods.sae.rows import fraction_variance_unexplained, geometric_median

D, N_DIRS = 16, 8


def _synthetic(n=2048, seed=0):
    """x = nonnegative sparse combinations (3 of 8) of random unit directions in 16-d, plus an offset."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(N_DIRS, D, generator=g)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    sel = torch.rand(n, N_DIRS, generator=g).argsort(dim=1)[:, :3]
    coef = torch.zeros(n, N_DIRS).scatter(1, sel, torch.rand(n, 3, generator=g) + 0.5)
    return coef @ dirs + 0.3, dirs


@pytest.fixture(scope="module")
def fitted():
    x, _ = _synthetic()
    sae = SparseAutoencoder(d_latent=32, k=4, aux_k=8, dead_after=2000, lr=1e-2, epochs=30, batch_size=256)
    return sae.fit(x, "enc-a"), x


def _module(**kw):
    cfg = TopKSAEConfig(**{"d": 6, "d_latent": 10, "k": 3, "aux_k": 4, "dead_after": 5, **kw})
    torch.manual_seed(0)
    model = TopKSAE(cfg, seed=1)
    with torch.no_grad():
        model.b_pre.copy_(torch.randn(6))
        model.b_E.copy_(0.1 * torch.randn(10))
        model.W_E.add_(0.3 * torch.randn(6, 10))
    return model


def test_shapes_and_init():
    model = _module()
    assert model.W_E.shape == (6, 10) and model.W_D.shape == (10, 6)
    fresh = TopKSAE(model.cfg, seed=1)
    assert torch.equal(fresh.W_E, fresh.W_D.T)  # W_E starts as W_D^T
    torch.testing.assert_close(fresh.W_D.norm(dim=1), torch.ones(10))
    x = torch.randn(9, 6)
    out = model(x)
    assert out.z.shape == (9, 10) and out.x_hat.shape == (9, 6) and out.loss.shape == ()
    assert TopKSAEConfig(d=4, expansion=3, k=2).n_latents == 12


def test_topk_sparsity():
    model = _module()
    x = torch.randn(50, 6)
    pre = model.pre_activation(x)
    z = model.encode(x)
    assert ((z != 0).sum(1) <= 3).all()
    # the kept entries are the top-k pre-activations, ReLU'd
    top = pre.topk(3, dim=1)
    torch.testing.assert_close(z.gather(1, top.indices), top.values.relu())
    # with all pre-activations positive, exactly k are nonzero
    with torch.no_grad():
        model.b_E.fill_(100.0)
    assert ((model.encode(x) != 0).sum(1) == 3).all()


def test_project_decoder_grad_removes_parallel_component():
    model = _module().eval()  # eval: dead-latent counts (hence AuxK) stay fixed between the two passes
    x = torch.randn(20, 6)
    model(x).loss.backward()
    raw = model.W_D.grad.clone()
    w = model.W_D.detach()
    manual = torch.stack([raw[r] - (raw[r] @ w[r]) / (w[r] @ w[r]) * w[r] for r in range(10)])
    model.project_decoder_grad()
    torch.testing.assert_close(model.W_D.grad, manual)
    torch.testing.assert_close((model.W_D.grad * w).sum(1), torch.zeros(10), atol=1e-6, rtol=0)
    # the tensor hook `fit` uses gives the same gradient, and projecting again changes nothing
    model.zero_grad()
    handle = model.W_D.register_hook(model._project)
    model(x).loss.backward()
    handle.remove()
    torch.testing.assert_close(model.W_D.grad, manual)
    model.project_decoder_grad()
    torch.testing.assert_close(model.W_D.grad, manual)


def test_normalize_decoder():
    model = _module()
    with torch.no_grad():
        model.W_D.mul_(torch.linspace(0.5, 3, 10)[:, None])
    model.normalize_decoder()
    torch.testing.assert_close(model.W_D.norm(dim=1), torch.ones(10))


def test_auxk_zero_without_dead_latents():
    model = _module()
    assert model.n_dead == 0
    out = model(torch.randn(8, 6))
    assert out.aux.item() == 0.0 and not out.aux.requires_grad


def test_auxk_uses_only_dead_latents():
    model = _module(aux_k=2)
    dead = torch.tensor([1, 4, 7])
    with torch.no_grad():
        model.samples_since_fired[dead] = 100
    assert model.n_dead == 3
    x = torch.randn(12, 6)
    pre = model.pre_activation(x)
    x_hat = model.decode(model.encode(x))
    residual = (x - x_hat).detach()
    aux = model.aux_loss(pre, residual)
    # manual: top-2 of the dead latents' pre-activations, ReLU, decode without b_pre
    sub = pre[:, dead]
    top = sub.topk(2, dim=1)
    z = torch.zeros_like(pre)
    z[torch.arange(12)[:, None], dead[top.indices]] = top.values.relu()
    e_hat = z @ model.W_D
    want = (residual - e_hat).pow(2).sum() / (residual - residual.mean(0)).pow(2).sum()
    torch.testing.assert_close(aux, want)
    # only dead decoder rows / encoder columns receive gradient from AuxK
    model.zero_grad()
    aux.backward()
    live = torch.ones(10, dtype=torch.bool)
    live[dead] = False
    assert model.W_D.grad[live].abs().max() == 0 and model.W_D.grad[dead].abs().max() > 0
    assert model.W_E.grad[:, live].abs().max() == 0


def test_dead_latent_tracking():
    model = _module()
    with torch.no_grad():
        model.b_E.copy_(torch.tensor([50.0, 50.0, 50.0] + [-50.0] * 7))  # latents 0-2 always win
    model.train()
    model(torch.randn(4, 6))
    model(torch.randn(3, 6))
    assert model.samples_since_fired[:3].tolist() == [0, 0, 0]
    assert (model.samples_since_fired[3:] == 7).all() and model.n_dead == 7  # 7 > dead_after=5
    model.eval()
    model(torch.randn(4, 6))  # eval forward does not count
    assert (model.samples_since_fired[3:] == 7).all()


def test_geometric_median_brute_force():
    g = torch.Generator().manual_seed(0)
    pts = torch.cat([torch.randn(15, 2, generator=g), torch.tensor([[8.0, 8.0], [9.0, -7.0]])])
    m = geometric_median(pts)

    def cost(c):
        return (pts.double() - c).norm(dim=-1).sum(-1)

    grid = torch.stack(torch.meshgrid(torch.linspace(-3, 3, 601), torch.linspace(-3, 3, 601), indexing="ij"), -1)
    costs = (pts.double()[None, None] - grid.double()[:, :, None]).norm(dim=-1).sum(-1)
    best = grid.reshape(-1, 2)[costs.argmin()].double()
    assert (m - best).norm() < 0.02
    assert cost(m) <= costs.min() + 1e-9
    assert (m - pts.double().mean(0)).norm() > 0.3  # robust: not pulled to the mean by the outliers


def test_fvu_definition():
    x = torch.randn(30, 4)
    assert fraction_variance_unexplained(x, x) == 0.0
    assert abs(fraction_variance_unexplained(x, x.mean(0).expand_as(x)) - 1.0) < 1e-12


def test_fit_reaches_low_fvu(fitted):
    sae, x = fitted
    assert sae.fvu_ < 0.1
    assert abs(sae.fvu_ - fraction_variance_unexplained(x, sae.reconstruct(x))) < 1e-9
    torch.testing.assert_close(sae.model_.W_D.norm(dim=1), torch.ones(32))
    z = sae.encode(x.numpy())
    assert z.shape == (len(x), 32) and ((z != 0).sum(1) <= 4).all()
    assert sae.decode(z).shape == x.shape
    assert isinstance(sae.n_dead_, int) and sae.b_pre_.shape == (D,)


def test_save_load_round_trip(fitted, tmp_path):
    sae, x = fitted
    sae.save(tmp_path / "sae")
    loaded = SparseAutoencoder.load(tmp_path / "sae", encoder_id="enc-a")
    assert torch.equal(loaded.encode(x), sae.encode(x))
    assert torch.equal(loaded.reconstruct(x), sae.reconstruct(x))
    assert loaded.encoder_id_ == "enc-a" and loaded.fvu_ == sae.fvu_ and loaded.config_ == sae.config_
    assert SparseAutoencoder.load(tmp_path / "sae").encoder_id_ == "enc-a"  # no check asked


def test_load_refuses_other_encoder_and_mismatch(fitted, tmp_path):
    sae, _ = fitted
    path = sae.save(tmp_path / "sae")
    with pytest.raises(VlctlError, match="config.json.*enc-a.*enc-b"):
        SparseAutoencoder.load(path, encoder_id="enc-b")
    meta = json.loads((path / "config.json").read_text())
    meta["config"]["d_latent"] = 64
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(VlctlError, match="sae.safetensors"):
        SparseAutoencoder.load(path)


def test_cg_sae_trains_only_the_encoder():
    x, dirs = _synthetic(n=512, seed=1)
    concepts = 2.5 * dirs + 0.01 * torch.randn(N_DIRS, D, generator=torch.Generator().manual_seed(2))
    sae = SparseAutoencoder.from_concepts(
        concepts.numpy(), center=False, k=3, aux_k=4, dead_after=100, lr=1e-2, epochs=3, batch_size=128
    )
    sae.fit(x, "enc-a")
    model = sae.model_
    assert model.cfg.concepts_fixed and model.cfg.n_latents == N_DIRS
    assert "W_D" not in dict(model.named_parameters()) and "b_pre" not in dict(model.named_parameters())
    want = concepts / concepts.norm(dim=1, keepdim=True)
    assert torch.equal(model.W_D, want)  # bit-identical: never touched by the optimizer
    assert not torch.equal(model.W_E, want.T)  # the encoder trained away from its init W_D^T
    assert sae.fvu_ < 0.5


def test_cg_sae_centres_concepts_by_default():
    concepts = torch.randn(5, D, generator=torch.Generator().manual_seed(3)) + 4.0  # a shared offset
    sae = SparseAutoencoder.from_concepts(concepts, k=2)
    want = concepts - concepts.mean(0)
    torch.testing.assert_close(sae.concept_emb, want)
    with pytest.raises(VlctlError, match="concept embeddings are empty"):
        SparseAutoencoder.from_concepts(torch.zeros(0, D))


def test_bad_embeddings_are_refused(fitted):
    sae, x = fitted
    bad = x[:4].clone()
    bad[2, 1] = float("nan")
    with pytest.raises(VlctlError, match="NaN or Inf in 1 row"):
        sae.encode(bad)
    with pytest.raises(VlctlError, match="dimension 8, but the SAE was fitted on dimension 16"):
        sae.encode(x[:, :8])
    with pytest.raises(VlctlError, match="k=40 must be in"):
        SparseAutoencoder(d_latent=32, k=40).fit(x, "enc-a")


def test_resample_dead_latents_by_hand():
    model = _module()
    dead = torch.tensor([1, 4, 7])
    with torch.no_grad():
        model.samples_since_fired[dead] = 100
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(3))  # fewer inputs than dead latents: cycles
    residual = x - model.decode(model.encode(x))
    order = residual.norm(dim=1).argsort(descending=True)
    live = torch.tensor([i for i in range(10) if i not in dead.tolist()])
    enc_norm = model.W_E[:, live].norm(dim=0).mean()
    before_W_D, before_W_E = model.W_D.detach().clone(), model.W_E.detach().clone()
    assert model.resample_dead(x) == 3
    for j, r in enumerate(dead.tolist()):
        want = residual[order[j % 2]] / residual[order[j % 2]].norm()
        torch.testing.assert_close(model.W_D[r], want)
        torch.testing.assert_close(model.W_E[:, r], 0.2 * enc_norm * want)
        assert model.b_E[r] == 0
    torch.testing.assert_close(model.W_D[live], before_W_D[live])  # live latents untouched
    torch.testing.assert_close(model.W_E[:, live], before_W_E[:, live])
    assert model.n_dead == 0 and model.resample_dead(x) == 0


def test_fit_with_resampling_keeps_fewer_dead(fitted):
    x, _ = _synthetic(n=1024)
    common = {"d_latent": 48, "k": 2, "aux_k": 0, "dead_after": 256, "lr": 1e-2, "epochs": 8, "batch_size": 256}
    plain = SparseAutoencoder(**common).fit(x, "enc-a")
    resampled = SparseAutoencoder(**common, resample_every=4).fit(x, "enc-a")
    assert plain.n_dead_ > 0 and resampled.n_dead_ < plain.n_dead_, (plain.n_dead_, resampled.n_dead_)


def test_fit_resumes_from_its_checkpoint_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    import functools

    from vlctl.train import loop

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g) @ torch.randn(8, 8, generator=g)
    kw = {"d_latent": 32, "k": 4, "aux_k": 4, "epochs": 3, "batch_size": 16, "dead_after": 32, "init_b_pre": "mean"}
    whole = SparseAutoencoder(**kw, out_dir=tmp_path / "whole").fit(x, "t", checkpoint_every=4)
    real_train = loop.train
    monkeypatch.setattr(loop, "train", functools.partial(real_train, stop_after_steps=7))  # "killed" at step 7
    SparseAutoencoder(**kw, out_dir=tmp_path / "cut").fit(x, "t", checkpoint_every=4)
    monkeypatch.setattr(loop, "train", real_train)
    assert json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())["step"] == 7
    resumed = SparseAutoencoder(**kw, out_dir=tmp_path / "cut").fit(x, "t", checkpoint_every=4, resume=True)
    for (name, a), b in zip(whole.model_.state_dict().items(), resumed.model_.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(VlctlError, match="need out_dir"):
        SparseAutoencoder(**kw).fit(x, "t", resume=True)


def test_concept_started_sae_starts_at_the_concepts_and_trains_the_decoder():
    # TEVI §4.2's learned SAE: the CG-SAE's start (rows = normalised centred concepts), decoder trained.
    x, dirs = _synthetic(n=512, seed=1)
    concepts = 2.5 * dirs + 0.01 * torch.randn(N_DIRS, D, generator=torch.Generator().manual_seed(2)) + 1.0
    centred = concepts - concepts.mean(0)
    want = centred / centred.norm(dim=1, keepdim=True)
    sae = SparseAutoencoder.from_concepts(concepts.numpy(), fixed=False, k=3, aux_k=4, dead_after=100, lr=1e-2,
                                          epochs=1, batch_size=128)
    start = TopKSAE(sae._resolve(d=D), sae.concept_emb)  # what fit builds before its first step
    assert torch.equal(start.W_D.detach(), want) and torch.equal(start.W_E.detach(), want.T)
    assert "W_D" in dict(start.named_parameters())  # trainable, unlike the CG-SAE's buffer
    sae.fit(x, "enc-a")
    model = sae.model_
    assert model.cfg.concepts_init and not model.cfg.concepts_fixed and model.cfg.n_latents == N_DIRS
    assert not torch.equal(model.W_D.detach(), want)  # the decoder moved
    torch.testing.assert_close(model.W_D.detach().norm(dim=1), torch.ones(N_DIRS))  # on the unit sphere
    with pytest.raises(VlctlError, match="exclude each other"):
        SparseAutoencoder.Config(concepts_fixed=True, concepts_init=True)


@pytest.mark.parametrize("init", ["geometric_median", "mean"])
def test_fit_on_a_store_streams_its_rows(tmp_path, monkeypatch, init):
    """Issue 44: a store of many shards (or float16 rows) has no memory map to share, and a 10M-row
    store does not fit in memory as float64: the fit reads its rows batch by batch and block by
    block (`vlctl.methods.sae.rows`), never all of them. Blocks are global row ranges, so one shard
    or three give the same fit bit for bit; float16 rows fit as their float32 values do."""
    import numpy as np

    from vlctl.embeddings.search import IndexConfig
    from vlctl.embeddings.store import create_store
    from vlctl.embeddings.table import Table
    from vlctl.methods.sae import rows as rows_mod

    ENC = "test-encoder@0123456789abcdef"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((900, 16)).astype(np.float32) + 2.0 * rng.standard_normal(16).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    one = create_store(tmp_path / "one", ENC, 16, IndexConfig(kind="none")).add(x)
    three = create_store(tmp_path / "three", ENC, 16, IndexConfig(kind="none"))
    for part in np.array_split(x, 3):
        three = three.add(part)
    half = create_store(tmp_path / "half", ENC, 16, IndexConfig(kind="none", dtype="float16")).add(x)
    kw = {"k": 4, "d_latent": 32, "epochs": 3, "batch_size": 64, "seed": 0, "init_b_pre": init, "progress": False}

    def fit(source, encoder_id=None):
        return SparseAutoencoder(**kw).fit(source, encoder_id)

    in_memory = fit(x, ENC)  # < one block: the same sums as the store's
    monkeypatch.setattr(Table, "all", lambda self: pytest.fail("the fit read the whole store"))
    monkeypatch.setattr(rows_mod, "BLOCK", 128)  # 8 blocks, one spanning the shards' edges
    a, b = fit(one), fit(three)
    for name, t in a.model_.state_dict().items():
        assert torch.equal(t, b.model_.state_dict()[name]), name
        assert torch.allclose(t, in_memory.model_.state_dict()[name], atol=1e-5), name
    assert a.fvu_ == b.fvu_ and abs(a.fvu_ - in_memory.fvu_) < 1e-6
    assert abs(a.fvu_ - fraction_variance_unexplained(x, a.reconstruct(x))) < 1e-9
    rounded = x.astype(np.float16).astype(np.float32)
    h, r = fit(half), fit(rounded, ENC)
    assert all(torch.allclose(t, r.model_.state_dict()[n], atol=1e-5) for n, t in h.model_.state_dict().items())

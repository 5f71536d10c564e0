"""TEVI: the mask module, its two losses against naive references, fitting, scoring, files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

from vlctl.eval.editing import (
    concept_auc_matrix,
    conditioning_accuracy,
    latent_purity,
    leakage_accuracy,
    top_activating,
)
from vlctl.fsops import VlctlError
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.tevi.config import TeviConfig
from vlctl.methods.tevi.estimator import TEVI, TeviMask, _TeviTrainer, edit, warmup_steps, with_partners

D, S = 12, 6  # embedding dim, concepts


def _world(n=1536, seed=0):
    """Images = sum of 3 of 6 orthonormal concept directions; caption i names 2 of image i's 3
    concepts, and its text embedding is the sum of their directions plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.linalg.qr(torch.randn(D, D, generator=g))[0][:S]  # (S, D) orthonormal
    has = torch.rand(n, S, generator=g).argsort(1)[:, :3]
    present = torch.zeros(n, S).scatter(1, has, 1.0)
    named = torch.zeros(n, S).scatter(1, has[:, :2], 1.0)
    img = present @ dirs
    txt = named @ dirs + 0.05 * torch.randn(n, D, generator=g)
    return img, txt, dirs, present.bool(), named.bool()


@pytest.fixture(scope="module")
def world():
    img, txt, dirs, present, named = _world()
    sae = SparseAutoencoder.from_concepts(dirs, center=False, init_b_pre="zeros", k=3, aux_k=0, lr=1e-2, epochs=20,
                                          batch_size=256)
    sae.fit(img, "enc-a")
    assert sae.fvu_ < 0.05  # the concept directions explain the images
    return sae, img, txt, dirs, present, named


def _naive_scores(z, m, W, b, t):
    e = (z[:, None, :] * m[None, :, :]) @ W + b  # (P, Q, d): every image edited by every text
    return F.cosine_similarity(e, t[None, :, :], dim=-1)


def test_mask_init_and_range():
    cfg = TeviConfig(d=D, n_latents=S, hidden=8, mask_init_bias=-1.0, mask_temperature=0.5)
    mask = TeviMask(cfg)
    t = torch.randn(5, D)
    m = mask(t)
    assert m.shape == (5, S) and (m > 0).all() and (m < 1).all()
    nn.init.zeros_(mask.mlp[-1].weight)
    torch.testing.assert_close(mask(t), torch.full((5, S), torch.sigmoid(torch.tensor(-2.0)).item()))
    torch.testing.assert_close(mask(3 * t), mask(t))  # the text embedding's scale does not matter
    floored = TeviMask(TeviConfig(d=D, n_latents=S, hidden=8, mask_temperature=0.5, mask_floor=0.4))
    floored.load_state_dict(mask.state_dict())
    torch.testing.assert_close(floored(t), mask(t))  # training mode: the soft mask
    floored.eval()
    with torch.no_grad():  # logits on both sides of the floor (an unseeded normal_ was not always)
        floored.mlp[-1].bias.copy_(torch.linspace(-3.0, 3.0, S))
    mask.load_state_dict(floored.state_dict())
    soft, hard = mask(t), floored(t)
    assert (soft < 0.4).any() and (soft >= 0.4).any()
    torch.testing.assert_close(hard, torch.where(soft >= 0.4, soft, torch.zeros_like(soft)))
    with pytest.raises(VlctlError, match="mask_floor"):
        TeviConfig(mask_floor=1.0)
    with pytest.raises(VlctlError, match="conditioning"):
        TeviConfig(conditioning="all")


@pytest.mark.parametrize("conditioning", ["positive", "negative"])
def test_losses_match_naive_references(conditioning):
    g = torch.Generator().manual_seed(1)
    W = F.normalize(torch.randn(S, D, generator=g), dim=1)
    b = torch.randn(D, generator=g)
    z = torch.relu(torch.randn(7, S, generator=g))
    t = torch.randn(7, D, generator=g)
    mask = TeviMask(TeviConfig(d=D, n_latents=S, hidden=8, conditioning=conditioning, init_logit_scale=1.5))
    loss, _ = _TeviTrainer(mask, W, b, None)(z, t)
    m, s = mask(t), torch.tensor(1.5).exp()
    target = torch.arange(7)
    if conditioning == "positive":  # Eq. 10: image i edited by caption i, against every caption
        logits = s * F.normalize(edit(z, m, W, b), dim=1) @ F.normalize(t, dim=1).T
        want = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    else:  # Eq. 11: logits[i, j] = cos(e_{i|j}, t_j); text i against images j edited by text i
        logits = s * _naive_scores(z, m, W, b, t)
        want = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)


def test_fit_learns_to_keep_named_concepts(world):
    sae, img, txt, _dirs, present, named = world
    tevi = TEVI(hidden=32, lr=1e-2, epochs=15, batch_size=256).fit(img, txt, sae=sae)
    m = tevi.masks(txt)  # latents are the concepts (CG-SAE): one mask entry per concept
    kept_named = m[named].mean()
    kept_unnamed_present = m[present & ~named].mean()
    # b_pre = 0 here, so cosines only see the mask up to scale: compare named to unnamed.
    assert kept_unnamed_present < 0.2 * kept_named, (kept_named, kept_unnamed_present)
    # Editing raises the alignment of every image with its own caption.
    before = F.cosine_similarity(img, txt).mean()
    after = F.cosine_similarity(tevi.edit(img, txt), txt).mean()
    assert after > before + 0.05


def test_scores_and_rerank_match_naive(world):
    sae, img, txt, *_ = world
    tevi = TEVI(hidden=16, epochs=1, batch_size=256).fit(img, txt, sae=sae)
    x, t = img[:40], txt[:30]
    want = _naive_scores(sae.encode(x), tevi.masks(t), sae.model_.W_D, sae.model_.b_pre, t)
    got = tevi.scores(x, t, chunk_size=(7, 11))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    base = (F.normalize(x, dim=1) @ F.normalize(t, dim=1).T).numpy()
    def same_ranking(order, cand, exact):
        """The candidates, best first by the exact scores; an order among exact ties (the synthetic
        SAE gives some images equal scores, which two float paths round 1 ulp apart) is free."""
        assert sorted(order.tolist()) == sorted(cand.tolist())
        assert np.all(np.diff(exact[order]) <= 1e-5)

    rr = tevi.rerank(base, x, t, k=10, full_order=True, alpha=0.0)  # TEVI alone
    for q in range(30):
        cand = np.argsort(-base[:, q], kind="stable")[:10]
        same_ranking(rr.order[:10, q], cand, want[:, q].numpy())
        assert rr.order[10:, q].tolist() == np.argsort(-base[:, q], kind="stable")[10:].tolist()
    rr = tevi.rerank(base, x, t, k=10, direction="i2t", alpha=0.0)  # per image, its top-10 texts re-scored
    for p in range(40):
        cand = np.argsort(-base[p], kind="stable")[:10]
        same_ranking(rr.order[:, p], cand, want[p].numpy())
    with pytest.raises(VlctlError, match="direction must be 't2i' or 'i2t'"):
        tevi.rerank(base, x, t, direction="both")


def test_save_load_and_refusals(world, tmp_path):
    sae, img, txt, *_ = world
    tevi = TEVI(hidden=16, epochs=1, batch_size=256, conditioning="negative").fit(img, txt, sae=sae)
    tevi.save(tmp_path / "t")
    back = TEVI.load(tmp_path / "t", encoder_id="enc-a")
    assert back.conditioning == "negative"
    torch.testing.assert_close(back.scores(img[:20], txt[:20]), tevi.scores(img[:20], txt[:20]))
    with pytest.raises(VlctlError, match="fitted on embeddings of encoder 'enc-a', not 'enc-b'"):
        TEVI.load(tmp_path / "t", encoder_id="enc-b")
    with pytest.raises(VlctlError, match="dimension 8, but the SAE/mask was fitted on dimension 12"):
        back.scores(img[:5, :8], txt[:5, :8])
    bad = img[:5].clone()
    bad[0, 0] = float("inf")
    with pytest.raises(VlctlError, match="NaN or Inf"):
        back.edit(bad, txt[:5])
    with pytest.raises(VlctlError, match="encoder 'enc-b' cannot train a mask over an SAE fitted on 'enc-a'"):
        TEVI(epochs=1).fit(img, txt, sae=sae, encoder_id="enc-b")
    (tmp_path / "t" / "mask.safetensors").write_bytes(b"junk")
    with pytest.raises(VlctlError, match="mask.safetensors"):
        TEVI.load(tmp_path / "t")


def test_text_encoder_finetuning(world, tmp_path):
    sae, img, txt, *_ = world
    tokens = torch.arange(len(img)) % 50  # a toy "tokenizer": 50 caption ids
    text_encoder = nn.Embedding(50, D)
    before = text_encoder.weight.detach().clone()
    tevi = TEVI(hidden=16, epochs=1, batch_size=256, text_lr=1e-2).fit(img, sae=sae, text_encoder=text_encoder, texts=tokens)
    assert not torch.equal(tevi.text_encoder_.weight, before)  # the text tower trained at its own lr
    tevi.save(tmp_path / "ft")
    with pytest.raises(VlctlError, match="fine-tuned its text encoder"):
        TEVI.load(tmp_path / "ft")
    back = TEVI.load(tmp_path / "ft", text_encoder=nn.Embedding(50, D))
    assert torch.equal(back.text_encoder_.weight, tevi.text_encoder_.weight)
    with pytest.raises(VlctlError, match="exactly one of"):
        TEVI(epochs=1).fit(img, txt, sae=sae, text_encoder=text_encoder, texts=tokens)


def test_editing_metrics_by_hand():
    classes = np.eye(3)
    labels = np.array([0, 1, 2, 0])
    original = np.eye(3)[[0, 1, 2, 0]]
    edited = np.eye(3)[[0, 1, 0, 2]]  # images 2 and 3 misclassified after editing
    in_caption = np.array([True, True, False, False])
    r = conditioning_accuracy(original, edited, classes, labels, in_caption)
    assert r == {"original": 100.0, "in_caption": 100.0, "not_in_caption": 0.0, "chance": 100 / 3}
    swapped = np.eye(3)[[0, 2, 2, 1]]
    caption_labels = np.array([1, 2, -1, 1])
    leak = leakage_accuracy(swapped, classes, labels, caption_labels)
    # named pairs: 0 (pred 0 = image), 1 (pred 2 = caption), 3 (pred 1 = caption); all differ
    assert leak == pytest.approx({"image_accuracy": 100 / 3, "follows_image": 100 / 3, "follows_caption": 200 / 3,
                                  "n_pairs": 3})


def test_concept_auc_matrix_matches_sklearn():
    rng = np.random.default_rng(0)
    z = rng.random((50, 3))
    present = rng.random((50, 2)) > 0.5
    auc = concept_auc_matrix(z, present)
    want = [[100 * roc_auc_score(present[:, s], z[:, r]) for s in range(2)] for r in range(3)]
    np.testing.assert_allclose(auc, want)
    assert top_activating(z, 4).shape == (3, 4) and top_activating(z, 1)[0, 0] == z[:, 0].argmax()


def test_store_reranker_rescores_candidates_exactly(world, tmp_path):
    from vlctl.embeddings.store import create_gallery

    sae, img, txt, *_ = world
    tevi = TEVI(hidden=16, epochs=1, batch_size=256).fit(img, txt, sae=sae)
    gallery = create_gallery(tmp_path / "g", "enc-a", D)
    gallery = gallery.add(img[:300].numpy())  # add returns the re-opened gallery
    queries = F.normalize(txt[:4], dim=1).numpy()
    res = gallery.search(queries, k=5, reranker=tevi.store_reranker(alpha=0.0), candidates=50)
    codes = tevi.encode_gallery(gallery)
    cached = gallery.search(queries, k=5, reranker=tevi.store_reranker(codes, alpha=0.0), candidates=50)
    assert np.array_equal(cached.ids, res.ids) and np.allclose(cached.scores, res.scores, atol=1e-6)
    base = gallery.search(queries, k=50)
    exact = tevi.scores(F.normalize(img[:300], dim=1), txt[:4]).numpy()  # (300, 4); galleries store unit vectors
    for q in range(4):
        cand = base.ids[q]
        # This world has only 20 distinct images, so scores tie exactly and float rounding decides
        # among tied ids: compare each returned id's exact score, and the top-5 values.
        assert set(res.ids[q]) <= set(cand)
        np.testing.assert_allclose(res.scores[q], exact[res.ids[q], q], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res.scores[q], -np.sort(-exact[cand, q])[:5], rtol=1e-5, atol=1e-6)
    other = create_gallery(tmp_path / "o", "enc-b", D)
    other = other.add(img[:10].numpy())
    with pytest.raises(VlctlError, match="not 'enc-a'"):
        other.search(queries, k=2, reranker=tevi.store_reranker())


def test_group_mask_shares_one_value_per_group():
    groups = (0, 0, 1, 2, 2, 2)
    mask = TeviMask(TeviConfig(d=D, n_latents=S, hidden=8, latent_groups=groups))
    assert mask.mlp[-1].out_features == 3
    t = torch.randn(4, D)
    logits = mask.mlp(F.normalize(t, dim=-1))
    torch.testing.assert_close(mask(t), torch.sigmoid(logits)[:, list(groups)])
    with pytest.raises(VlctlError, match="latent_groups: one group per latent"):
        TeviConfig(n_latents=4, latent_groups=(0, 1))
    with pytest.raises(VlctlError, match="latent_groups: group ids must be 0..G-1"):
        TeviConfig(latent_groups=(0, 2, 2))


def test_mask_mass_penalty_adds_its_term_exactly():
    g = torch.Generator().manual_seed(2)
    W = F.normalize(torch.randn(S, D, generator=g), dim=1)
    b, z, t = torch.randn(D, generator=g), torch.relu(torch.randn(5, S, generator=g)), torch.randn(5, D, generator=g)
    plain = TeviMask(TeviConfig(d=D, n_latents=S, hidden=8, conditioning="both"))
    heavy = TeviMask(TeviConfig(d=D, n_latents=S, hidden=8, conditioning="both", mask_mass_coef=0.7))
    heavy.load_state_dict(plain.state_dict())
    loss0, _ = _TeviTrainer(plain, W, b, None)(z, t)
    loss1, mean_mask = _TeviTrainer(heavy, W, b, None)(z, t)
    torch.testing.assert_close(loss1, loss0 + 0.7 * plain(t).mean())
    torch.testing.assert_close(mean_mask, plain(t).mean())


def test_with_partners_adds_each_missing_partner_once():
    partners = np.array([3, -1, 0, 5, 3, 1])
    np.testing.assert_array_equal(with_partners(np.array([0, 2, 4]), partners), [0, 2, 4, 3])  # 0 is in already
    np.testing.assert_array_equal(with_partners(np.array([1]), partners), [1])  # no partner


def test_group_mask_and_partners_fit_keep_the_named_category(world):
    """Groups = the world's concepts in pairs; captions name 2 of the 3 concepts an image has. A
    group mask can only keep a whole pair: named pairs are kept, the others dropped."""
    sae, img, txt, _dirs, _present, named = world
    groups = (0, 0, 1, 1, 2, 2)
    partners = np.roll(np.arange(len(img)), 1)
    tevi = TEVI(hidden=32, lr=1e-2, epochs=15, batch_size=256, latent_groups=groups, mask_mass_coef=0.1)
    m = tevi.fit(img, txt, sae=sae, partners=partners).masks(txt)
    g_named = (named.float().reshape(len(img), 3, 2).sum(2) > 0)[:, [0, 0, 1, 1, 2, 2]]
    assert torch.equal(m[:, 0], m[:, 1]) and torch.equal(m[:, 4], m[:, 5])
    # At initialisation every value is sigmoid(0) = 0.5 (ratio 1); trained: 0.16 vs 0.41 (measured).
    assert m[~g_named].mean() < 0.5 * m[g_named].mean(), (m[g_named].mean(), m[~g_named].mean())
    with pytest.raises(VlctlError, match="partners must be"):
        TEVI(epochs=1).fit(img, txt, sae=sae, partners=np.arange(3))
    with pytest.raises(VlctlError, match="one group per latent needed, got 2 for n_latents=6"):
        TEVI(epochs=1, latent_groups=(0, 1)).fit(img, txt, sae=sae)


def test_latent_purity_by_hand():
    z = np.array([[1.0, 0.0, 0.0], [0.9, 0.0, 0.2], [0.0, 0.0, 0.5], [0.1, 0.0, 0.4]])
    present = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=bool)
    auc, best = latent_purity(z, present)
    # latent 0: fires on concept 0 exactly (AUC 100); latent 1 never fires; latent 2: concept 1
    # scores 0.5, 0.4 against 0, 0.2 -> AUC 100
    np.testing.assert_allclose(auc, [100.0, np.nan, 100.0])
    assert best.tolist() == [0, -1, 1]
    z2 = np.array([[1.0], [0.0], [1.0], [0.0]])  # fires on half of each concept: AUC 50 for both
    auc2, best2 = latent_purity(z2, present)
    assert auc2.tolist() == [50.0] and best2.tolist() == [0]


def test_paper_mask_is_three_relu_layers_and_a_plain_sigmoid():
    # The paper's f_m (App. A.1): 3 layers, hidden 256, ReLU, sigmoid; temperature 1 and no floor.
    mask = TeviMask(TeviConfig(d=D, n_latents=S, hidden=256, mask_temperature=1.0, mask_floor=0.0)).eval()
    kinds = [type(m) for m in mask.mlp]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert [(m.in_features, m.out_features) for m in mask.mlp if isinstance(m, nn.Linear)] == [(D, 256), (256, 256),
                                                                                                   (256, S)]
    t = torch.randn(7, D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(mask(t), torch.sigmoid(mask.mlp(F.normalize(t, dim=-1))))


def test_warmup_epochs_are_that_many_epochs_of_steps(world):
    from vlctl.train.config import LoopConfig

    cfg = TeviConfig(warmup_epochs=5, warmup_steps=3)
    assert warmup_steps(cfg, 1000, LoopConfig(batch_size=256)) == 3 + 5 * 3  # 3 full batches of 256 an epoch (drop_last)
    sae, img, txt, *_ = world
    n = 600  # 2 steps an epoch at batch 256: warmup_epochs=1 is warmup_steps=2, bit for bit
    by_epochs = TEVI(hidden=8, epochs=2, batch_size=256, lr=1e-2, warmup_epochs=1, holdout=0).fit(
        img[:n], txt[:n], sae=sae)
    by_steps = TEVI(hidden=8, epochs=2, batch_size=256, lr=1e-2, warmup_steps=2, holdout=0).fit(
        img[:n], txt[:n], sae=sae)
    no_warmup = TEVI(hidden=8, epochs=2, batch_size=256, lr=1e-2, holdout=0).fit(img[:n], txt[:n], sae=sae)
    for a, b in zip(by_epochs.mask_.parameters(), by_steps.mask_.parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(by_epochs.mask_.parameters(), no_warmup.mask_.parameters()))


def test_fit_keeps_the_sae_codes_sparse_and_scores_a_bounded_holdout():
    """Issue 45: the mask trains on the frozen SAE's codes kept as (n, k) indices and values, densified a
    batch at a time; dense they were n x d1 floats held for the whole fit (the scale rehearsal's tevi-coco
    was killed for memory at 566k pairs x 2,048 latents; the paper's 16,384 latents would need 37 GB)."""
    import re

    from vlctl.methods.tevi.estimator import _sparse_codes
    from vlctl.recipes.runner import measured

    def rss() -> int:
        with open("/proc/self/status") as f:
            return 1024 * int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))

    g = torch.Generator().manual_seed(0)
    n = 60_000  # x 4,092 latents: 982 MB of dense codes
    x, t = torch.randn(n, D, generator=g), torch.randn(n, D, generator=g)
    sae = SparseAutoencoder(k=4, expansion=341, aux_k=0, epochs=1, batch_size=4096).fit(x[:8192], "enc-a")
    idx, val = _sparse_codes(sae._check_fitted(), x[:1000], chunk=300)
    assert torch.equal(torch.zeros(1000, 4092).scatter_(1, idx.long(), val), sae.encode(x[:1000]))
    cost: dict = {}
    before = rss()
    with measured(cost):
        tevi = TEVI(hidden=8, epochs=1, batch_size=512).fit(x, t, sae=sae)
    assert cost["peak_rss_bytes"] - before < 300 * 2**20
    # 6,000 held-out images (10%): α is chosen on the first 2,000 and their captions, all pairs scored
    # (all 6,000 x 6,000 would grow as the square of the data: COCO's took over 8 GB)
    assert tevi.heldout_["n_images"] == tevi.heldout_["n_texts"] == 2000

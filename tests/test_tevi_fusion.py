"""Issue 41: TEVI never makes a retrieval worse without saying so. The held-out split (by image,
never trained on), the choice of the fusion weight α, the fused rerank (α = 1 is CLIP's order),
its message, the saved figures and the --alpha override."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vlctl.cli import main
from vlctl.eval.metrics import recall_at_k
from vlctl.fsops import VlctlError
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.tevi.estimator import TEVI, _data_hash
from vlctl.methods.tevi.fusion import ALPHAS, choose_alpha, fusion_note, heldout_figures, holdout_split, relevance

D, S = 16, 10


def _pairs(n_images=60, captions=2, seed=0):
    """Distinct images (sums of 3 of S weighted concept directions), each with `captions` captions
    naming 2 of its 3 concepts plus a little noise; rows of one image repeat its embedding."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.linalg.qr(torch.randn(D, D, generator=g))[0][:S]
    has = torch.rand(n_images, S, generator=g).argsort(1)[:, :3]
    w = 0.5 + 2.5 * torch.rand(n_images, 3, generator=g)
    img = torch.zeros(n_images, S).scatter(1, has, w) @ dirs
    image_of = np.repeat(np.arange(n_images), captions)
    named = torch.zeros(n_images, S).scatter(1, has[:, :2], w[:, :2]) @ dirs
    txt = named[image_of] + 0.05 * torch.randn(len(image_of), D, generator=g)
    return img[image_of], txt, image_of, dirs


@pytest.fixture(scope="module")
def sae():
    img, _, _, dirs = _pairs()
    return SparseAutoencoder.from_concepts(dirs, center=False, init_b_pre="zeros", k=3, aux_k=0, lr=1e-2, epochs=5,
                                           batch_size=64).fit(img, "enc-a")


def test_holdout_split_is_by_image_and_seeded():
    img, _, image_of, _ = _pairs(n_images=50, captions=3)
    train, held = holdout_split(img.numpy(), 0.1, seed=7)
    assert len(held) == 5 * 3 and len(train) + len(held) == 150 and not set(train) & set(held)
    assert not set(image_of[train]) & set(image_of[held])  # every caption of an image on its side
    again, _ = holdout_split(img.numpy(), 0.1, seed=7)
    other, _ = holdout_split(img.numpy(), 0.1, seed=8)
    assert np.array_equal(again, train) and not np.array_equal(other, train)
    assert len(holdout_split(img.numpy(), 0.0, 7)[1]) == 0
    # too few images to hold 2 out: every pair trains, with a warning, and the rerank stays CLIP's
    with pytest.warns(UserWarning, match="holdout 0.01: 50 distinct images give 0 to hold out"):
        train, held = holdout_split(img.numpy(), 0.01, 7)
    assert len(train) == len(img) and len(held) == 0
    with pytest.raises(VlctlError, match="holdout 0.99: 50 distinct images give 50 held-out images and none"):
        holdout_split(img.numpy(), 0.99, 7)


def test_fit_never_sees_the_held_out_pairs(sae, tmp_path, monkeypatch):
    from vlctl.train import loop

    seen = {}
    real = loop.train

    def spy(net, *, n_samples, **kw):
        seen.update(n=n_samples, data=kw["run_config"]["data"])
        return real(net, n_samples=n_samples, **kw)

    monkeypatch.setattr(loop, "train", spy)
    img, txt, _, _ = _pairs()
    tevi = TEVI(hidden=8, epochs=1, batch_size=32, out_dir=tmp_path / "run").fit(img, txt, sae=sae)
    train, held = holdout_split(img.numpy(), 0.1, seed=0)
    assert seen == {"n": len(train), "data": _data_hash(img[train], txt[train], None, None)}
    h = tevi.heldout_
    assert (h["n_images"], h["n_texts"]) == (6, len(held)) and set(h["by_alpha"]) == {f"{a:.1f}" for a in ALPHAS}


def test_heldout_figures_and_alpha_by_hand():
    # 3 images, 3 texts (text j of image j). CLIP gets text 0 and 1 wrong, TEVI text 2; half and half
    # gets them all right: the figures below are counted by hand.
    clip = torch.tensor([[0.5, 0.6, 0.1], [0.6, 0.5, 0.2], [0.1, 0.2, 0.9]])
    tevi = torch.tensor([[0.9, 0.1, 0.5], [0.1, 0.9, 0.4], [0.2, 0.3, 0.3]])
    f = heldout_figures(clip, tevi, np.arange(3), k=3)
    for name, s in (("clip", clip), ("tevi", tevi)):  # the exhaustive figures are `recall_at_k`'s
        assert f[name] == pytest.approx({k: v for k, v in recall_at_k(s, np.arange(3), ks=(1,)).items()})
    assert f["clip"] == {"t2i@1": pytest.approx(100 / 3), "i2t@1": pytest.approx(100 / 3)}
    assert f["tevi_rerank"] == f["by_alpha"]["0.0"] == {"t2i@1": pytest.approx(200 / 3), "i2t@1": 100.0}
    assert f["by_alpha"]["1.0"] == f["clip"] and f["by_alpha"]["0.5"] == {"t2i@1": 100.0, "i2t@1": 100.0}
    # the best mean is reached from 0.4 to 0.7 (by hand: 0.4·(0.5-0.6) + 0.6·(0.9-0.1) > 0 ... ); the largest wins
    best = max(a for a in ALPHAS if sum(f["by_alpha"][f"{a:.1f}"].values()) == 200)
    assert choose_alpha(f) == best < 1
    note = fusion_note(choose_alpha(f), f, "chosen")
    assert note == f"TEVI on held-out pairs: t2i@1 100.0 vs CLIP 33.3, i2t@1 100.0 vs CLIP 33.3, α = {best:g}"
    # TEVI that is CLIP's scores reversed loses at every α < 1: α = 1, and the line says so
    lost = heldout_figures(clip, -clip, np.arange(3), k=3)
    assert choose_alpha(lost) == 1.0
    assert fusion_note(1.0, lost, "chosen").endswith("TEVI did not beat CLIP at any α < 1: this is CLIP's ranking")
    assert "this is CLIP's ranking" in fusion_note(1.0, None, "chosen")


def test_relevance_counts_every_image_of_the_same_caption_text():
    # images 0, 1, 2; texts 0 and 1 are one caption text written for images 0 and 1, text 2 image 2's
    rel = relevance(np.array([0, 1, 2]), np.array([0, 0, 1]))
    assert rel.tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    assert relevance(np.array([0, 0, 1])).tolist() == [[True, True, False], [False, False, True]]
    # CLIP ranks image 1 first for text 0: right, since image 1 has that caption text too
    clip = torch.tensor([[0.5, 0.4, 0.1], [0.6, 0.5, 0.2], [0.1, 0.2, 0.9]])
    assert heldout_figures(clip, clip, np.arange(3), np.array([0, 0, 1]), k=3)["clip"]["t2i@1"] == 100.0
    assert heldout_figures(clip, clip, np.arange(3), k=3)["clip"]["t2i@1"] == pytest.approx(200 / 3)


def _losing_tevi(sae, img, txt) -> TEVI:
    """A mask that keeps nothing (sigmoid(-60) < mask_floor, lr ~ 0): every edited embedding is b_pre = 0,
    so TEVI's scores carry no information and it cannot beat CLIP at any α < 1."""
    return TEVI(hidden=8, epochs=1, batch_size=32, mask_init_bias=-60.0, lr=1e-12, mask_floor=0.5,
                holdout=0.2).fit(img, txt, sae=sae)


def test_tevi_that_must_lose_gives_clips_order(sae, tmp_path, capsys):
    from vlctl.embeddings.store import create_store

    img, txt, image_of, _ = _pairs()
    tevi = _losing_tevi(sae, img, txt)
    assert tevi.alpha_ == 1.0 and tevi.heldout_["tevi"]["t2i@1"] < tevi.heldout_["clip"]["t2i@1"]
    assert tevi.fusion_note().endswith("TEVI did not beat CLIP at any α < 1: this is CLIP's ranking")
    # the rerank keeps CLIP's order bit for bit
    x = torch.nn.functional.normalize(img[::2], dim=1).numpy()
    t = torch.nn.functional.normalize(txt, dim=1).numpy()
    base = x @ t.T
    rr = tevi.rerank(base, x, t, k=20)
    order = rr.order.numpy()
    assert np.array_equal(order, np.argsort(-base, axis=0, kind="stable")[:20])
    assert np.array_equal(rr.scores.numpy(), np.take_along_axis(base, order, 0))  # CLIP's scores, not TEVI's 0s
    assert (tevi.rerank(base, x, t, k=20, alpha=0.0).scores == 0).all()
    # the store search and `vlctl score tevi --rerank` do too, and say so
    store = create_store(tmp_path / "store", "enc-a", D).add(
        x, [{} for _ in x], texts=t, text_metadata=[{"text": f"t{j}", "image": int(i)} for j, i in enumerate(image_of)])
    q = t[:5]
    assert np.array_equal(store.search(q, k=10, reranker=tevi.store_reranker()).ids, store.search(q, k=10).ids)
    tevi.save(tmp_path / "tevi")
    args = ["score", "tevi", "--store", str(tmp_path / "store"), "--tevi", str(tmp_path / "tevi"), "--rerank", "20",
            "--out", str(tmp_path / "s.npz")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count("[vlctl] TEVI-rerank on held-out pairs") == 1 and "this is CLIP's ranking" in err
    s = np.load(tmp_path / "s.npz")
    assert np.array_equal(np.argsort(-s["scores"], 0, kind="stable")[:20],
                          np.argsort(-s["base_scores"], 0, kind="stable")[:20])


def test_alpha_saved_reloaded_and_overridden(sae, tmp_path, capsys):
    from vlctl.embeddings.store import create_store

    img, txt, image_of, _ = _pairs()
    tevi = _losing_tevi(sae, img, txt)
    tevi.save(tmp_path / "tevi")
    back = TEVI.load(tmp_path / "tevi", encoder_id="enc-a")
    assert back.alpha_ == tevi.alpha_ == 1.0 and back.heldout_ == tevi.heldout_
    assert back.fusion_note() == tevi.fusion_note()
    x = torch.nn.functional.normalize(img[::2], dim=1).numpy()
    t = torch.nn.functional.normalize(txt, dim=1).numpy()
    create_store(tmp_path / "store", "enc-a", D).add(
        x, [{} for _ in x], texts=t, text_metadata=[{"text": f"t{j}", "image": int(i)} for j, i in enumerate(image_of)])
    common = ["score", "tevi", "--store", str(tmp_path / "store"), "--tevi", str(tmp_path / "tevi"), "--rerank", "20",
              "--json"]
    assert main([*common, "--out", str(tmp_path / "a.npz"), "--alpha", "0"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["alpha"] == 0.0 and r["heldout"] == tevi.heldout_
    assert r["note"].startswith("TEVI on held-out pairs:") and r["note"].endswith("α = 0 (given)")
    want = tevi.rerank(x @ t.T, x, t, k=20, alpha=0.0).order.numpy()
    got = np.argsort(-np.load(tmp_path / "a.npz")["scores"], 0, kind="stable")[:20]
    assert np.array_equal(got, want)
    assert main([*common, "--out", str(tmp_path / "b.npz"), "--alpha", "1.5"]) == 2
    assert "--alpha must be <= 1" in capsys.readouterr().err
    assert main(["score", "tevi", "--store", str(tmp_path / "store"), "--tevi", str(tmp_path / "tevi"),
                 "--out", str(tmp_path / "c.npz"), "--alpha", "0.5"]) == 2
    assert "--alpha goes with --rerank" in capsys.readouterr().err
    # fit --alpha fixes it (still measuring), and the line says so
    fixed = TEVI(hidden=8, epochs=1, batch_size=32, alpha=0.3).fit(img, txt, sae=sae)
    assert fixed.alpha_ == 0.3 and fixed.heldout_["fused"] == fixed.heldout_["by_alpha"]["0.3"]
    assert fixed.fusion_note().endswith("α = 0.3 (fixed at fit)")
    # holdout 0: nothing measured, CLIP's ranking unless an alpha is given
    none = TEVI(hidden=8, epochs=1, batch_size=32, holdout=0.0).fit(img, txt, sae=sae)
    assert none.alpha_ == 1.0 and none.heldout_ is None and "no held-out figures" in none.fusion_note()

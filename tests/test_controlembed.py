"""ControlEmbed (vlctl.methods.controlembed.estimator): the hypernetwork, its loss, the estimator and its bad input."""

import math
import warnings

import numpy as np
import pytest
import torch

from vlctl.eval.metrics import mean_average_precision
from vlctl.fsops import VlctlError
from vlctl.methods.controlembed.config import ControlEmbedConfig
from vlctl.methods.controlembed.estimator import (
    AffineHyperNet,
    ControlEmbed,
    UntrainedAttributeWarning,
    kmeans_labels,
    normalize_rows,
)
from vlctl.methods.controlembed.fit import controlembed_loss
from vlctl.methods.controlembed.prompts import prompt_ensemble, text_subspace_projection

COND = {"color": np.array([1.0, 0.0, 0.0, 0.0]), "shape": np.array([0.0, 1.0, 0.0, 0.0])}


def toy_space(n=600, d=16, seed=0):
    """Embeddings where 'shape' (4 values) dominates the cosine geometry and 'color' (5 values)
    is present but weak: base retrieval by color is poor, a linear map can fix it."""
    rng = np.random.default_rng(seed)
    color, shape = rng.integers(0, 5, n), rng.integers(0, 4, n)
    x = 0.35 * rng.normal(size=(5, d))[color] + 1.0 * rng.normal(size=(4, d))[shape] + 0.2 * rng.normal(size=(n, d))
    return x.astype(np.float32), {"color": color, "shape": shape}


def query_map(q, g, y, n):
    ignore = np.zeros((n, len(g)), dtype=bool)
    ignore[np.arange(n), np.arange(n)] = True
    return mean_average_precision(q @ g.T, y[:n], y, ignore=ignore)


@pytest.fixture(scope="module")
def fitted():
    x, labels = toy_space()
    model = ControlEmbed(steps=150, align_weight=0.0, images_per_subclass=8, hidden=64).fit(
        x, labels, encoder_id="toy@1", category_emb=COND)
    return model, x, labels


# --- the hypernetwork --------------------------------------------------------------------------


@pytest.mark.parametrize("param", ["full", "lowrank", "translation"])
def test_hypernet_starts_at_identity(param):
    cfg = ControlEmbedConfig(embed_dim=6, cond_dim=4, hidden=8, parameterisation=param, rank=2)
    w, b = AffineHyperNet(cfg)(torch.randn(3, 4))
    assert w.shape == (3, 6, 6) and b.shape == (3, 6)
    assert torch.equal(w, torch.eye(6).expand(3, 6, 6)) and torch.equal(b, torch.zeros(3, 6))
    assert cfg.out_dim == {"full": 42, "lowrank": 30, "translation": 6}[param]


def test_lowrank_learns_from_the_identity():
    # U = V = 0 would be a saddle with zero gradient; the random V start gives U a gradient.
    net = AffineHyperNet(ControlEmbedConfig(embed_dim=6, cond_dim=4, hidden=8, parameterisation="lowrank", rank=2))
    w, _ = net(torch.randn(1, 4))
    (w * torch.randn(6, 6)).sum().backward()
    grad = net.mlp[4].bias.grad
    assert grad[:12].abs().sum() > 0  # U's slice


def test_bad_parameterisation_is_refused():
    with pytest.raises(VlctlError, match="parameterisation"):
        ControlEmbedConfig(parameterisation="diagonal")


# --- the loss ----------------------------------------------------------------------------------


def reference_loss(q, g, y, text, tau, omega):
    """The loss written out with python loops (module docstring of vlctl.methods.controlembed.estimator)."""
    n, k = len(q), len(text)
    sr_terms = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        denom = sum(math.exp(q[i] @ g[j] / tau) for j in others)
        pos = [j for j in others if y[j] == y[i]]
        if pos:
            sr_terms.append(-sum(math.log(math.exp(q[i] @ g[j] / tau) / denom) for j in pos) / len(pos))
    sr = sum(sr_terms) / len(sr_terms)
    i2t = -sum(math.log(math.exp(q[i] @ text[y[i]] / tau) / sum(math.exp(q[i] @ text[c] / tau) for c in range(k)))
               for i in range(n)) / n
    t2i_terms = []
    for c in range(k):
        members = [i for i in range(n) if y[i] == c]
        denom = sum(math.exp(text[c] @ q[i] / tau) for i in range(n))
        t2i_terms.append(-sum(math.log(math.exp(text[c] @ q[i] / tau) / denom) for i in members) / len(members))
    t2i = sum(t2i_terms) / k
    return sr + omega * (i2t + t2i), sr, i2t, t2i


def test_loss_matches_the_written_out_definition():
    rng = np.random.default_rng(3)
    q, g = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    y = np.array([0, 0, 1, 1, 1, 2, 2])
    text = normalize_rows(rng.normal(size=(3, 5)))
    loss, stats = controlembed_loss(torch.tensor(q), torch.tensor(g), torch.tensor(y), torch.tensor(text), 0.5, 0.1)
    ref, sr, i2t, t2i = reference_loss(q, g, y, text, 0.5, 0.1)
    assert float(loss) == pytest.approx(ref, rel=1e-10)
    assert (stats["sr"], stats["i2t"], stats["t2i"]) == pytest.approx((sr, i2t, t2i), rel=1e-10)
    # Without text (or omega = 0) only the StableRep term remains.
    loss, _ = controlembed_loss(torch.tensor(q), torch.tensor(g), torch.tensor(y), None, 0.5, 0.1)
    assert float(loss) == pytest.approx(sr, rel=1e-10)


def test_self_pair_is_masked():
    rng = np.random.default_rng(4)
    q, g = torch.tensor(rng.normal(size=(4, 3))), torch.tensor(rng.normal(size=(4, 3)))
    y = torch.tensor([0, 0, 1, 1])
    base, _ = controlembed_loss(q, g, y, None, 0.1, 0.0)
    g2 = g.clone()
    g2[0] = 100 * q[0]  # only q_0 . g_0 changes much (and the other rows' scores with g_0)
    changed, _ = controlembed_loss(q, g2, y, None, 0.1, 0.0)
    def q_term(gg):
        return -torch.log_softmax((q[0] @ gg[1:].T) / 0.1, 0)[0]

    assert torch.isclose(q_term(g), q_term(g2))  # row 0 does not see its own pair
    assert not torch.isclose(base, changed)


# --- the estimator -----------------------------------------------------------------------------


def test_fit_makes_the_weak_attribute_retrievable(fitted):
    model, x, labels = fitted
    g = normalize_rows(x)
    base = query_map(g[:200], g, labels["color"], 200)
    ours = query_map(model.transform(x[:200], "color"), g, labels["color"], 200)
    assert ours > base + 25, (base, ours)
    assert model.categories_ == ["color", "shape"] and model.subclasses_["color"] == [0, 1, 2, 3, 4]
    assert np.isfinite(model.final_loss_)


def test_translation_only_stays_near_base():
    x, labels = toy_space()
    g = normalize_rows(x)
    model = ControlEmbed(parameterisation="translation", steps=150, align_weight=0.0, images_per_subclass=8,
                         hidden=64).fit(x, labels, encoder_id="toy@1", category_emb=COND)
    w, _ = model.affine("color")
    assert np.array_equal(w, np.eye(16, dtype=np.float32))
    base = query_map(g[:200], g, labels["color"], 200)
    assert abs(query_map(model.transform(x[:200], "color"), g, labels["color"], 200) - base) < 5


def test_fit_is_deterministic(fitted):
    model, x, labels = fitted
    again = ControlEmbed(steps=150, align_weight=0.0, images_per_subclass=8, hidden=64).fit(
        x, labels, encoder_id="toy@1", category_emb=COND)
    assert np.array_equal(again.affine("color")[0], model.affine("color")[0])


def test_transform_compose_search_cluster(fitted):
    model, x, _ = fitted
    w, b = model.affine("color")
    assert model.affine("color")[0] is w  # cached
    q = normalize_rows(x[:5])
    np.testing.assert_allclose(model.transform(x[:5], "color"), q @ w + b, rtol=1e-6)
    ws, bs = model.affine("shape")
    np.testing.assert_allclose(model.compose(x[:5], "color", "shape"), 0.5 * (q @ w + b) + 0.5 * (q @ ws + bs), rtol=1e-5)
    np.testing.assert_allclose(model.compose(x[:5], "color", "shape", alpha=1.0), q @ w + b, rtol=1e-6)
    idx, scores = model.search(x[:3], x, "color", k=4)
    full = (normalize_rows(x[:3]) @ w + b) @ normalize_rows(x).T
    assert np.array_equal(idx, np.argsort(-full, axis=1, kind="stable")[:, :4])
    np.testing.assert_allclose(scores, np.take_along_axis(full, idx, 1), rtol=1e-6)
    pred = model.cluster(x, "color")
    assert pred.shape == (len(x),) and len(np.unique(pred)) == 5


def test_save_load_roundtrip_and_encoder_check(fitted, tmp_path):
    model, x, _ = fitted
    model.save(tmp_path / "m")
    assert {p.name for p in (tmp_path / "m").iterdir()} == {"controlembed.safetensors", "config.json"}
    back = ControlEmbed.load(tmp_path / "m", encoder_id="toy@1")
    np.testing.assert_array_equal(back.transform(x[:10], "shape"), model.transform(x[:10], "shape"))
    assert back.subclasses_ == model.subclasses_
    with pytest.raises(VlctlError, match=r"config.json.*fitted on embeddings of encoder 'toy@1', not 'other@2'"):
        ControlEmbed.load(tmp_path / "m", encoder_id="other@2")
    with pytest.raises(VlctlError, match="come from encoder 'other@2'"):
        back.transform(x[:2], "color", encoder_id="other@2")


def test_corrupt_saved_model_is_refused(fitted, tmp_path):
    model, _, _ = fitted
    model.save(tmp_path / "m")
    (tmp_path / "m" / "controlembed.safetensors").write_bytes(b"junk")
    with pytest.raises(VlctlError, match="controlembed.safetensors: cannot read"):
        ControlEmbed.load(tmp_path / "m")
    with pytest.raises(VlctlError, match="config.json: .*not found"):
        ControlEmbed.load(tmp_path / "nothing")


def test_gallery_of_another_dimension_is_refused(fitted):
    model, x, _ = fitted
    with pytest.raises(VlctlError, match="dimension 8, but ControlEmbed was fitted on dimension 16"):
        model.transform(np.ones((3, 8)), "color")
    with pytest.raises(VlctlError, match="gallery: dimension 8"):
        model.search(x[:2], np.ones((5, 8)), "color")


def test_untrained_attribute_warns_and_still_transforms(fitted):
    model, x, _ = fitted
    with pytest.warns(UntrainedAttributeWarning, match="'size' was not trained on"):
        out = model.transform(x[:3], "size", category_emb=np.array([0.0, 0.0, 1.0, 0.0]))
    assert out.shape == (3, 16) and np.isfinite(out).all()
    # Fitted on given category embeddings: a new text needs its embedding.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrainedAttributeWarning)
        with pytest.raises(VlctlError, match="pass category_emb"):
            model.transform(x[:3], "size")


def test_k_larger_than_gallery_is_refused(fitted):
    model, x, _ = fitted
    with pytest.raises(VlctlError, match="k=20 is larger than the gallery"):
        model.cluster(x[:10], "color", k=20)
    with pytest.raises(VlctlError, match=r"k=11 must lie in \[1, 10\]"):
        model.search(x[:1], x[:10], "color", k=11)


def test_min_images_per_subclass_drops_the_small_subclasses():
    """Issue 43: one subclass with a single image blocked the whole fit. min_images_per_subclass
    drops it, with a warning naming it: the fit is the one where its image has no label, with the
    subclass's row of class_text_emb left out."""
    x, labels = toy_space(n=60)
    lonely = labels["color"].copy()
    lonely[0] = 9
    text = np.random.default_rng(1).normal(size=(6, 16)).astype(np.float32)  # rows: subclasses 0-4, 9
    est = ControlEmbed(steps=3, hidden=8, images_per_subclass=2, min_images_per_subclass=2)
    with pytest.warns(UserWarning, match=r"labels\['color'\]: dropped 1 of 6 subclasses, those with fewer than 2 "
                      r"images \(their count in brackets\): 9 \(1\); their images sit out this category"):
        est.fit(x, {"color": lonely}, encoder_id="t", category_emb=COND, class_text_emb={"color": text})
    unlabelled = lonely.astype(object)
    unlabelled[0] = None
    ref = ControlEmbed(steps=3, hidden=8, images_per_subclass=2).fit(
        x, {"color": unlabelled}, encoder_id="t", category_emb=COND, class_text_emb={"color": text[:5]})
    assert est.subclasses_ == ref.subclasses_ == {"color": [0, 1, 2, 3, 4]}
    np.testing.assert_array_equal(est.class_text_emb_["color"], ref.class_text_emb_["color"])
    for a, b in zip(est.hypernet_.state_dict().values(), ref.hypernet_.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(VlctlError, match=r"labels\['color'\]: 0 of 6 subclasses have at least 15 images \(\[\]\), "
                       r"and a category needs 2"), pytest.warns(UserWarning, match="dropped 6 of 6"):
        ControlEmbed(steps=3, min_images_per_subclass=15).fit(x, {"color": lonely}, encoder_id="t",
                                                              category_emb=COND)


def test_bad_labels_are_refused():
    x, labels = toy_space(n=60)
    est = ControlEmbed(steps=2)
    with pytest.raises(VlctlError, match=r"labels\['size'\]: category has a single subclass"):
        est.fit(x, {**labels, "size": np.zeros(60)}, encoder_id="t", category_emb={**COND, "size": np.ones(4)})
    lonely = labels["color"].copy()
    lonely[0] = 9
    with pytest.raises(VlctlError, match=r"labels\['color'\]: subclass 9 has a single image"):
        est.fit(x, {"color": lonely}, encoder_id="t", category_emb=COND)
    with pytest.raises(VlctlError, match=r"--min-images-per-subclass 2, drops such subclasses"):
        est.fit(x, {"color": lonely}, encoder_id="t", category_emb=COND)
    with pytest.raises(VlctlError, match=r"labels\['color'\]: expected shape \(60,\)"):
        est.fit(x, {"color": labels["color"][:50]}, encoder_id="t", category_emb=COND)
    with pytest.raises(VlctlError, match=r"class_text_emb\['color'\]: expected shape \(5, 16\)"):
        est.fit(x, {"color": labels["color"]}, encoder_id="t", category_emb=COND,
                class_text_emb={"color": np.ones((4, 16))})
    with pytest.raises(VlctlError, match="NaN or Inf in 1 row"):
        est.fit(np.where(np.arange(60)[:, None] == 3, np.nan, x), labels, encoder_id="t", category_emb=COND)
    with pytest.raises(VlctlError, match="temperature: must be > 0"):
        ControlEmbed(temperature=0).fit(x, labels, encoder_id="t", category_emb=COND)
    with pytest.raises(VlctlError, match="images_per_subclass: must be >= 2, got 1"):
        ControlEmbed(images_per_subclass=1).fit(x, labels, encoder_id="t", category_emb=COND)
    with pytest.raises(VlctlError, match="not fitted"):
        ControlEmbed().transform(x, "color")


def test_alignment_and_zero_shot_classification():
    x, labels = toy_space(n=400)
    means = normalize_rows(np.stack([x[labels["color"] == c].mean(0) for c in range(5)]))
    rng = np.random.default_rng(1)
    text = {"color": normalize_rows(means + 0.3 * rng.normal(size=means.shape)),
            "shape": normalize_rows(np.stack([x[labels["shape"] == c].mean(0) for c in range(4)]))}
    model = ControlEmbed(steps=120, images_per_subclass=8, hidden=64, align_weight=0.1).fit(
        x, labels, encoder_id="toy", category_emb=COND, class_text_emb=text)
    pred = np.array(model.classify(x, "color"))
    from vlctl.eval.metrics import zero_shot_accuracy

    base = zero_shot_accuracy(x, text["color"], labels["color"])
    assert 100 * np.mean(pred == labels["color"]) >= base


def test_text_subspace_projection_is_an_orthogonal_projector():
    rng = np.random.default_rng(2)
    t = rng.normal(size=(3, 8))
    w, b = text_subspace_projection(t)
    np.testing.assert_allclose(w, w.T, atol=1e-6)
    np.testing.assert_allclose(w @ w, w, atol=1e-5)
    np.testing.assert_allclose(t @ w, t, atol=1e-5)
    assert np.allclose(b, 0) and np.trace(w) == pytest.approx(3, abs=1e-5)


def test_prompt_ensemble_averages_templates():
    table = {"a photo of red.": [1.0, 0.0], "a drawing of red.": [0.0, 1.0], "a photo of blue.": [3.0, 0.0],
             "a drawing of blue.": [3.0, 0.0]}
    out = prompt_ensemble(lambda texts: np.array([table[t] for t in texts]), ["red", "blue"],
                          ["a photo of {}.", "a drawing of {}."])
    np.testing.assert_allclose(out, [[2**-0.5, 2**-0.5], [1.0, 0.0]], rtol=1e-6)
    with pytest.raises(VlctlError, match="templates"):
        prompt_ensemble(lambda t: np.ones((len(t), 2)), ["red"], ["no slot"])


def test_kmeans_labels_checks_k():
    with pytest.raises(VlctlError, match="k: must be a positive integer"):
        kmeans_labels(np.ones((4, 2)), 0)


def test_minilm_condition_encoder_handles_paraphrases(tmp_path):
    """The default condition encoder (bundled MiniLM): a paraphrase gets a warning and a transform
    close to the trained name's; save/load keeps working without the caller's embeddings."""
    x, labels = toy_space(n=300)
    model = ControlEmbed(steps=60, align_weight=0.0, images_per_subclass=8, hidden=64).fit(x, labels, encoder_id="toy")
    assert model.condition_id_.startswith("all-MiniLM-L6-v2@")
    with pytest.warns(UntrainedAttributeWarning):
        w_hue, _ = model.affine("hue")
    w_color, _ = model.affine("color")
    w_shape, _ = model.affine("shape")
    assert np.linalg.norm(w_hue - w_color) < np.linalg.norm(w_hue - w_shape)
    model.save(tmp_path / "m")
    back = ControlEmbed.load(tmp_path / "m")
    with pytest.warns(UntrainedAttributeWarning):
        np.testing.assert_allclose(back.affine("hue")[0], w_hue, rtol=1e-5, atol=1e-6)


def test_cli_flags_are_the_config_fields():
    """The CLI's flags are exactly the estimator's Config fields, with the same defaults (one
    declaration: the Config; only the data-set fields embed_dim and cond_dim have no flag)."""
    import argparse
    import dataclasses

    from vlctl.cli.methods import fit_controlembed_args

    p = argparse.ArgumentParser()
    fit_controlembed_args(p)
    flags = {a.dest for a in p._actions}
    fields = {f.name: f for f in dataclasses.fields(ControlEmbed.Config)}
    assert set(ControlEmbed.DATA_FIELDS) == {"embed_dim", "cond_dim"}
    assert set(fields) - set(ControlEmbed.DATA_FIELDS) <= flags
    assert not set(ControlEmbed.DATA_FIELDS) & flags
    assert ControlEmbed().get_params() == {k: f.default for k, f in fields.items()}


def test_unlabelled_images_sit_out_their_category():
    """None = no label in a category: those images never enter its episodes, so what they hold
    cannot change the fit (the same weights with their rows replaced), and they still count in
    the categories where they are labelled."""
    x, labels = toy_space(n=60)
    color = labels["color"].astype(object)
    color[::4] = None
    garbage = x.copy()
    garbage[::4] = np.random.default_rng(5).normal(size=garbage[::4].shape)
    fits = [ControlEmbed(steps=4, seed=0).fit(data, {"color": color}, encoder_id="t", category_emb=COND)
            for data in (x, garbage)]
    for a, b in zip(fits[0].hypernet_.state_dict().values(), fits[1].hypernet_.state_dict().values()):
        assert torch.equal(a, b)
    both = ControlEmbed(steps=2).fit(x, {"color": color, "shape": labels["shape"]}, encoder_id="t",
                                      category_emb=COND)
    assert both.categories_ == ["color", "shape"]
    with pytest.raises(VlctlError, match=r"labels\['color'\]: no image has a label"):
        ControlEmbed(steps=2).fit(x, {"color": np.full(60, None)}, encoder_id="t", category_emb=COND)

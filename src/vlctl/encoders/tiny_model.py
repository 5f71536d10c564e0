"""The TinyCLIP model: a small CLIP trained from scratch (the TEVI paper's MAD CLIP and friends).

Readable, nanoGPT-style:

- image tower: a ViT (patch-embedding conv, class token, learned positional embedding, pre-LN
  transformer blocks, LayerNorm, linear projection of the class token to `embed_dim`);
- text tower, either
  (a) "transformer": a small causal transformer over word tokens (`WordTokenizer`, multi-word
      tokens such as "no swelling"), pooled at the <end> token, linear projection; or
  (b) "minilm": the frozen sentence-transformers all-MiniLM-L6-v2 plus a trainable linear
      projection, LiT-style (`encoders/minilm.py`);
- a learnable temperature `logit_scale` (log of the inverse temperature, initialised to
  log(1/0.07) and clamped to [0, log(100)] like CLIP).

Attention is written by hand (qkv linear, softmax) so each block can keep its attention
probabilities: with `model.record_attention = True` every block stores, in `block.attn_probs`, the
exact tensor (n, heads, T, T) that multiplies the values (not a copy, not detached), so
`torch.autograd.grad(score, [b.attn_probs for b in model.visual.blocks])` works (HilaCAM needs
this). With recording off, blocks on CUDA use `F.scaled_dot_product_attention` (same math,
faster there; on CPU the written-out math is as fast for T = 17 and is kept); the paths agree to
float rounding (tested).

Images: uint8 RGB (H, W, 3) -> float (3, S, S) scaled to [0, 1] then normalised with
mean = std = 0.5 per channel, i.e. to [-1, 1] (`IMAGE_MEAN`, `IMAGE_STD`). Images of another size
are resized (shorter side to S, bilinear with antialiasing) and centre-cropped.

The rest of TinyCLIP: configs in `tiny_config.py`, the loss in `loss.py`, save / load in
`tiny_pretrained.py`, the Encoder wrapper in `tiny_encoder.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.encoders.base import seeded_init
from vlctl.encoders.minilm import MiniLMText, MiniLMTokenizer
from vlctl.encoders.tiny_config import TinyCLIPConfig, get_config
from vlctl.encoders.tokenizer import END_ID, WordTokenizer
from vlctl.fsops import VlctlError
from vlctl.io import hash_state_dict

IMAGE_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
IMAGE_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)
MAX_LOGIT_SCALE = math.log(100.0)
# Fused attention (F.scaled_dot_product_attention) is used on CUDA when attention is not being
# recorded; on CPU the written-out math is as fast for our short sequences, so it is off there.
USE_SDPA_ON_CPU = False


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


def sincos_2d(side: int, width: int) -> torch.Tensor:
    """(side * side, width) 2D sin-cos position table, row-major like the flattened patch grid: the
    first width/2 channels encode the row, the rest the column, each as sin and cos of
    pos / 10000^(i / (width/4)) (MAE's `get_2d_sincos_pos_embed`)."""
    if width % 4:
        raise VlctlError(f"sincos2d positions need a vision_width divisible by 4, got {width}")
    omega = 1.0 / 10000 ** (torch.arange(width // 4, dtype=torch.float64) / (width // 4))
    grid = torch.arange(side, dtype=torch.float64)
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")

    def encode(pos: torch.Tensor) -> torch.Tensor:
        angle = pos.reshape(-1, 1) * omega
        return torch.cat([angle.sin(), angle.cos()], dim=1)

    return torch.cat([encode(rows), encode(cols)], dim=1).float()


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
        self.pool = cfg.vision_pool
        if self.pool == "cls_mean":  # created last: a 'cls' tower's initialisation is unchanged
            self.proj_patches = nn.Linear(w, cfg.embed_dim, bias=False)
            nn.init.normal_(self.proj_patches.weight, std=w**-0.5)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Images (n, 3, S, S) -> class token + patch tokens with positions added (n, 1 + patches, w)."""
        x = self.conv1(self.stem(x)).flatten(2).transpose(1, 2)  # (n, patches, w)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)

    def encode_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (n, T, w) -> embeddings (n, embed_dim), read at the class token (index 0), and
        with pool 'cls_mean' also at the mean of the patch tokens (none left: that term is 0)."""
        x = self.ln_pre(x)
        for b in self.blocks:
            x = b(x)
        out = self.proj(self.ln_post(x[:, 0]))
        if self.pool == "cls_mean" and x.shape[1] > 1:
            out = out + self.proj_patches(self.ln_post(x[:, 1:]).mean(1))
        return out

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
# Factory and identity
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
    with seeded_init(seed):
        return TinyCLIP(cfg)


def unwrap_model(model: nn.Module) -> TinyCLIP:
    """The TinyCLIP inside a DDP / DataParallel / torch.compile wrapper (or the model itself)."""
    m = getattr(model, "module", model)  # DDP / DataParallel
    m = getattr(m, "_orig_mod", m)  # torch.compile
    if not isinstance(m, TinyCLIP):
        raise VlctlError(f"expected a TinyCLIP model, got {type(model).__name__}")
    return m


def encoder_id(model: TinyCLIP, state: dict | None = None) -> str:
    """'tinyclip-<config name>@<first 16 hex of hash_state_dict>' (trainable weights + buffers)."""
    state = state if state is not None else model.state_dict()
    return f"tinyclip-{model.config.name}@{hash_state_dict(state)[:16]}"

"""OpenCLIP models (CLIP, SigLIP, ...) as vlctl Encoders, built with OpenCLIP's own factory.

    encoder = create_open_clip_encoder("ViT-B-32", pretrained="laion2b_s34b_b79k")
    encoder = create_open_clip_encoder("ViT-B-16-SigLIP", pretrained="/ckpt/open_clip_model.safetensors")
    encoder = create_open_clip_encoder("ViT-B-32")            # random init, seed 0
    encoder = create_open_clip_encoder("ViT-B-32", seed=3)    # random init, seed 3

Random weights are seeded (`seeded_init`: the same seed gives the same weights, and so the same
`id`, in every process, without touching the caller's RNG) and say so in the id:
'open_clip-ViT-B-32/random-seed3@<hash>'; loaded weights keep 'open_clip-ViT-B-32@<hash>'.

Model, image transform and tokenizer all come from `open_clip` (`create_model_and_transforms`,
`get_tokenizer`), so embeddings equal what OpenCLIP itself computes for the same weights.

Attention for relevancy maps: OpenCLIP runs its ViT blocks through fused kernels that never
materialise the attention probabilities, so `vision_attentions` swaps in, for the duration of one
forward, an attention written out from the block's own weights (nn.MultiheadAttention's
in_proj / out_proj), or, for timm towers (SigLIP), turns off timm's fused path and takes the
softmax output as it enters `attn @ v`. Either way the returned tensors are the ones the values
are multiplied with, so gradients reach them; the embeddings equal `model.encode_image` to float
rounding (tested).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.encoders.base import FrontDoor, check_keep, eval_mode, seeded_init
from vlctl.fsops import VlctlError
from vlctl.io import hash_state_dict

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# OpenCLIP architectures that ship with vlctl (open_clip's config JSON format), for offline tests
# and CPU smoke runs in any process: "open_clip:vlctl-tiny-vit" is a 2-layer ViT on 32 px images.
BUNDLED_CONFIGS = Path(__file__).parent / "configs" / "open_clip"


def register_bundled_configs() -> list[str]:
    """Make the architectures in BUNDLED_CONFIGS known to open_clip (idempotent); their names."""
    import open_clip

    names = sorted(p.stem for p in BUNDLED_CONFIGS.glob("*.json"))
    if names and not set(names) <= set(open_clip.list_models()):
        open_clip.add_model_config(BUNDLED_CONFIGS)
    return names


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for `precision` ("fp32" | "fp16" | "bf16"); fp32 is a no-op.

    The weights stay fp32 and autocast runs matmuls in the low precision, as open_clip's "amp"
    does; embeddings come out as float32 either way (callers cast).
    """
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise VlctlError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return precision


def run_batched(
    fn: Callable[..., torch.Tensor], x: torch.Tensor, batch_size: int, dim: int, device: torch.device,
    *aligned: torch.Tensor,
) -> torch.Tensor:
    """fn over `x` in chunks of `batch_size` on `device`; float32 results on the input's device.

    x: (n, ...) -> (n, dim). `aligned` tensors (n, ...) are chunked alongside and passed to fn after
    x's chunk (e.g. token removal's kept indices). Runs without gradients.
    """
    outs = []
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            rest = (a[i : i + batch_size].to(device) for a in aligned)
            outs.append(fn(x[i : i + batch_size].to(device), *rest).float().to(x.device))
    return torch.cat(outs) if outs else torch.zeros(0, dim, device=x.device)


def run_batched_by_length(
    fn: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor, ends: torch.Tensor, batch_size: int, dim: int,
    device: torch.device,
) -> torch.Tensor:
    """`run_batched(fn, tokens, ...)` with the rows batched in order of `ends` (n,), each row's
    last position the text tower needs, so a causal tower cut to each batch's longest text (see
    `encode_text_prefix`) runs about as many positions as its texts have; rows back in input order."""
    if len(tokens) <= batch_size:
        return run_batched(fn, tokens, batch_size, dim, device)
    order = ends.argsort(stable=True)
    out = run_batched(fn, tokens[order], batch_size, dim, device)
    return torch.empty_like(out).index_copy_(0, order.to(out.device), out)


def pil_from_array(image: np.ndarray):
    """uint8 (H, W, 3) or (H, W) array -> RGB PIL image (what open_clip / HF transforms take)."""
    from PIL import Image

    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise VlctlError(
            f"preprocess: expected a uint8 numpy array (H, W, 3), got {type(image).__name__}"
            f"{'' if not isinstance(image, np.ndarray) else ' of dtype ' + str(image.dtype)}"
        )
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[-1] == 3)):
        raise VlctlError(f"preprocess: expected an image of shape (H, W, 3), got {image.shape}")
    return Image.fromarray(image).convert("RGB")


# --------------------------------------------------------------------------------------------
# Attention recording
# --------------------------------------------------------------------------------------------


def _written_out_mha(block: nn.Module, store: list[torch.Tensor]) -> Callable:
    """A replacement for open_clip's `ResidualAttentionBlock.attention` that keeps the probabilities.

    Same math as nn.MultiheadAttention (packed in_proj, softmax(q k^T / sqrt(d_h)), out_proj);
    appends the (n, heads, T, T) probability tensor to `store` before multiplying it with v.
    """
    mha: nn.MultiheadAttention = block.attn
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        raise VlctlError(
            "vision_attentions: this OpenCLIP block's nn.MultiheadAttention variant "
            "(separate q/k/v projections or bias_k/add_zero_attn) is not supported"
        )

    def attention(q_x: torch.Tensor, k_x=None, v_x=None, attn_mask=None) -> torch.Tensor:
        if k_x is not None or v_x is not None:
            raise VlctlError("vision_attentions: cross-attention blocks are not supported")
        x = q_x if mha.batch_first else q_x.transpose(0, 1)  # (n, T, D)
        n, t, d = x.shape
        h = mha.num_heads
        q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).view(n, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        logits = (q * (d // h) ** -0.5) @ k.transpose(-2, -1)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros_like(attn_mask, dtype=logits.dtype).masked_fill(attn_mask, float("-inf"))
            logits = logits + attn_mask.to(logits.dtype)
        probs = logits.softmax(dim=-1)
        store.append(probs)  # the exact tensor multiplied with v below
        y = mha.out_proj((probs @ v).transpose(1, 2).reshape(n, t, d))
        return y if mha.batch_first else y.transpose(0, 1)

    return attention


@contextlib.contextmanager
def record_vision_attention(visual: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, every ViT block of `visual` appends its attention probabilities to the list.

    Supports open_clip's own VisionTransformer (blocks with nn.MultiheadAttention) and timm towers
    whose blocks use timm's `Attention` (SigLIP, EVA-less timm ViTs). Anything else is refused
    with a VlctlError rather than returning attention that is not the model's.
    """
    store: list[torch.Tensor] = []
    undo: list[Callable[[], None]] = []
    try:
        resblocks = getattr(getattr(visual, "transformer", None), "resblocks", None)
        trunk_blocks = getattr(getattr(visual, "trunk", None), "blocks", None)
        if resblocks is not None:
            for block in resblocks:
                if not isinstance(getattr(block, "attn", None), nn.MultiheadAttention):
                    raise VlctlError(
                        f"vision_attentions: OpenCLIP block type {type(block).__name__} "
                        f"(attention {type(block.attn).__name__}) is not supported; "
                        "supported: blocks with nn.MultiheadAttention"
                    )
                block.attention = _written_out_mha(block, store)  # instance attribute shadows the method
                undo.append(lambda b=block: b.__dict__.pop("attention", None))
        elif trunk_blocks is not None:
            for block in trunk_blocks:
                attn = getattr(block, "attn", None)
                if (
                    attn is None
                    or not hasattr(attn, "fused_attn")
                    or not isinstance(getattr(attn, "attn_drop", None), nn.Module)
                ):
                    raise VlctlError(f"vision_attentions: timm block {type(block).__name__} has no timm Attention")
                before = attn.fused_attn
                attn.fused_attn = False  # written-out softmax path; it feeds attn_drop(attn) into attn @ v
                handle = attn.attn_drop.register_forward_hook(lambda _m, _i, out: store.append(out))
                undo.append(lambda a=attn, f=before, hd=handle: (setattr(a, "fused_attn", f), hd.remove()))
        else:
            raise VlctlError(
                f"vision_attentions: image tower {type(visual).__name__} is not a ViT "
                "(no transformer.resblocks or trunk.blocks); relevancy maps need a ViT"
            )
        yield store
    finally:
        for fn in reversed(undo):
            fn()


def is_causal_text_tower(model: nn.Module) -> bool:
    """An OpenAI-style text tower (`open_clip.CLIP`: the plain causal mask, pooled at the argmax
    token, i.e. end of text), whose output at the end-of-text token never reads the positions
    after it. SigLIP and other bidirectional towers attend to the padding: every position counts."""
    import open_clip

    if not isinstance(model, open_clip.model.CLIP) or getattr(model, "text_pool_type", None) != "argmax":
        return False
    mask = getattr(model, "attn_mask", None)
    if mask is None or mask.ndim != 2 or not mask.shape[0] == mask.shape[1] == model.positional_embedding.shape[0]:
        return False
    above = torch.ones(mask.shape, dtype=torch.bool, device=mask.device).triu(1)
    return bool(torch.isneginf(mask[above]).all() and (mask[~above] == 0).all())


def causal_text_prefix(model: nn.Module, tokens: torch.Tensor) -> int | None:
    """How many leading positions of `tokens` (n, context) `model.encode_text` needs, when that is
    fewer than all: the batch's last end-of-text position + 1; None for any tower but a causal one
    (`is_causal_text_tower`) and when nothing would be cut."""
    if not is_causal_text_tower(model) or tokens.shape[1] != model.attn_mask.shape[0]:
        return None
    used = int(tokens.argmax(dim=-1).max()) + 1
    return used if used < tokens.shape[1] else None


def encode_text_prefix(model: nn.Module, tokens: torch.Tensor, used: int, normalize: bool) -> torch.Tensor:
    """`open_clip.CLIP.encode_text(tokens)` computed on the first `used` positions only (see
    `causal_text_prefix`): the same steps as open_clip's, on tokens[:, :used] with the positional
    embedding and causal mask cut to match.

    Why it is the same function: under the causal mask position i attends to positions <= i only,
    and every other step (embedding, layer norm, MLP) is per position, so the positions after the
    last end-of-text token change none before it, and the pooled one is before it. Equal to the
    full forward up to float rounding (the GEMMs have other shapes); for captions of ~15 tokens
    the text tower does ~5x less work than on all 77."""
    cast_dtype = model.transformer.get_cast_dtype()
    text = tokens[:, :used]
    x = model.token_embedding(text).to(cast_dtype) + model.positional_embedding[:used].to(cast_dtype)
    x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask[:used, :used]))
    x = x[torch.arange(x.shape[0], device=x.device), text.argmax(dim=-1)]  # open_clip's "argmax" pool
    proj = model.text_projection
    if proj is not None:
        x = proj(x) if isinstance(proj, nn.Linear) else x @ proj
    return F.normalize(x, dim=-1) if normalize else x


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


class OpenCLIPEncoder(FrontDoor):
    """An OpenCLIP model as a vlctl `Encoder` (see encoders/base.py), with the `FrontDoor` embed_* methods.

    Attributes:
        model: the open_clip model (CLIP / CustomTextCLIP), in eval mode, on `device`.
        model_name: OpenCLIP architecture name ("ViT-B-32", "ViT-B-16-SigLIP", ...).
        preprocess_pil: OpenCLIP's eval transform, PIL image -> (3, S, S) float tensor.
        preprocess: the same for a uint8 array (H, W, 3) (the Encoder protocol's form).
        device, precision: where and how encode_* run ("fp16"/"bf16" autocast, fp32 weights).
        batch_size: encode_* split their input into chunks of this many rows.
        seed: the seed of randomly initialised weights (part of `id`); None for loaded weights.
        spec: the canonical spec that rebuilds the encoder (set by `create_open_clip_encoder`).
    """

    def __init__(
        self,
        model: nn.Module,
        model_name: str,
        preprocess_pil: Callable,
        tokenizer: Callable,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
        batch_size: int = 256,
        seed: int | None = None,
        spec: str | None = None,
    ):
        self.model = model.eval()
        self.model_name = model_name
        self.seed = seed
        self.spec = spec
        self.preprocess_pil = preprocess_pil
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.precision = check_precision(precision)
        self.batch_size = int(batch_size)
        self._id: str | None = None
        self.embed_dim = int(self._probe_dim())

    def _probe_dim(self) -> int:
        proj = getattr(self.model, "text_projection", None)
        if isinstance(proj, nn.Linear):
            return proj.out_features
        if isinstance(proj, torch.Tensor):
            return proj.shape[1]
        with torch.no_grad(), eval_mode(self.model):  # e.g. CustomTextCLIP: ask the text tower
            return self.model.encode_text(self.tokenize(["a"]).to(self.device)).shape[-1]

    def __repr__(self) -> str:
        return f"OpenCLIPEncoder(model_name={self.model_name!r}, device={str(self.device)!r})"

    @property
    def id(self) -> str:
        """'open_clip-<model name>[/random-seed<N>]@<16 hex of the weights' content hash>' (computed once)."""
        if self._id is None:
            random = "" if self.seed is None else f"/random-seed{self.seed}"
            self._id = f"open_clip-{self.model_name}{random}@{hash_state_dict(self.model.state_dict())[:16]}"
        return self._id

    @property
    def image_size(self) -> int:
        size = getattr(self.model.visual, "image_size", None)
        return int(size[0] if isinstance(size, (tuple, list)) else size)

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        return self.preprocess_pil(pil_from_array(image))

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        if isinstance(texts, str):
            raise VlctlError("tokenize: expected a list of texts, got a single string")
        return self.tokenizer(list(texts))

    def encode_images(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        def fn(b: torch.Tensor) -> torch.Tensor:
            with autocast_for(self.device, self.precision):
                return self.model.encode_image(b, normalize=normalize)

        with eval_mode(self.model):
            return run_batched(fn, images, self.batch_size, self.embed_dim, self.device)

    def encode_texts(self, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        if not torch.is_tensor(tokens):
            tokens = self.tokenize(tokens)

        def fn(b: torch.Tensor) -> torch.Tensor:
            used = causal_text_prefix(self.model, b)  # short texts: the padding after them is never run
            with autocast_for(self.device, self.precision):
                if used is not None:
                    return encode_text_prefix(self.model, b, used, normalize)
                return self.model.encode_text(b, normalize=normalize)

        with eval_mode(self.model):
            if is_causal_text_tower(self.model):  # batches of texts of about equal length
                return run_batched_by_length(fn, tokens, tokens.argmax(-1), self.batch_size, self.embed_dim,
                                             self.device)
            return run_batched(fn, tokens, self.batch_size, self.embed_dim, self.device)

    def vision_attentions(
        self, images: torch.Tensor, normalize: bool = True
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(embeddings (n, d), [attention probabilities (n, heads, T, T) per ViT block]).

        T = 1 + n_patches for OpenCLIP ViTs (class token first); for timm towers, n_patches plus
        the tower's prefix tokens (SigLIP's have none). Runs in fp32 with gradients on, the images made to require grad if
        they don't, so the attentions are in the autograd graph even with frozen weights.
        """
        x = images.to(self.device)
        if not x.requires_grad:
            x = x.detach().float().requires_grad_(True)
        with torch.enable_grad(), eval_mode(self.model), record_vision_attention(self.model.visual) as store:
            emb = self.model.encode_image(x, normalize=normalize)
        return emb, list(store)

    def encode_images_keep(self, images: torch.Tensor, keep: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Token removal (see `SupportsTokenRemoval`): images (n, 3, S, S), keep (n, m) patch
        indices -> embeddings (n, d) from the class token plus the kept patch tokens.

        open_clip's own VisionTransformer only (class token first): its `_embeds` (conv1, class
        token, + positional embedding, patch dropout = identity in eval, ln_pre) runs on all
        tokens, then the kept ones are gathered. ln_pre normalises each token on its own, so
        gathering after it equals gathering right after the positional embedding. Then the
        transformer, `_pool` (ln_post + class-token or average pooling) and `proj`, as `forward` does.
        """
        visual = self.model.visual
        if not (hasattr(visual, "_embeds") and hasattr(visual, "transformer") and hasattr(visual, "_pool")):
            raise VlctlError(
                f"encode_images_keep: image tower {type(visual).__name__} of {self.model_name!r} is not "
                "open_clip's VisionTransformer; token removal is not supported for it"
            )
        if getattr(visual, "pool_type", None) not in ("tok", "avg") or getattr(visual, "attn_pool", None) is not None:
            raise VlctlError(
                f"encode_images_keep: {self.model_name!r} pools with {getattr(visual, 'pool_type', None)!r} / an "
                "attentional pooler; token removal supports class-token ('tok') or average ('avg') pooling"
            )
        gh, gw = visual.grid_size
        keep = check_keep(keep, images.shape[0], gh * gw)

        def fn(b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            with autocast_for(self.device, self.precision):
                x = visual._embeds(b)
                idx = torch.cat([k.new_zeros(k.shape[0], 1), k + 1], dim=1)  # token 0 is the class token
                x = x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
                pooled, _ = visual._pool(visual.transformer(x))
                if visual.proj is not None:
                    pooled = pooled @ visual.proj
            return F.normalize(pooled, dim=-1) if normalize else pooled

        with eval_mode(self.model):
            return run_batched(fn, images, self.batch_size, self.embed_dim, self.device, keep)


def split_spec(spec: str) -> tuple[str, str | None]:
    """'<model>[/<tag or checkpoint path>]' -> (model, pretrained or None).

    'ViT-B-32/laion2b_s34b_b79k' -> ('ViT-B-32', 'laion2b_s34b_b79k'); everything after the first
    '/' is the tag or path ('ViT-B-32//abs/ckpt.pt' -> '/abs/ckpt.pt'). 'hf-hub:org/repo' and
    'local-dir:/path' name the weights themselves and are kept whole.
    """
    if spec.startswith(("hf-hub:", "local-dir:")):
        return spec, None
    name, sep, rest = spec.partition("/")
    return name, (rest if sep and rest else None)


class _DropRandomInitWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()


@contextlib.contextmanager
def _quiet_random_init(random_init: bool) -> Iterator[None]:
    """Drop open_clip's "No pretrained weights loaded ... initialized randomly" warning when random
    weights are what the spec asked for (the encoder id says `random-seedN`); it tells the user nothing."""
    if not random_init:
        yield
        return
    flt, root = _DropRandomInitWarning(), logging.getLogger()  # open_clip logs it on the root logger
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)


class RandomWeightsWarning(UserWarning):
    """An OpenCLIP spec without a pretrained tag or a seed: random weights, which a user rarely means
    (issue 43: `open_clip:ViT-S-32` found flowers for "a photo of a tabby cat"). Given once per model
    in a process (`_TOLD_RANDOM`), whatever the warning filters."""


_TOLD_RANDOM: set[str] = set()  # the models whose RandomWeightsWarning was given


def create_open_clip_encoder(
    model_name: str,
    pretrained: str | None = None,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    batch_size: int = 256,
    seed: int | None = None,
) -> OpenCLIPEncoder:
    """Build an OpenCLIP model with open_clip's factory and wrap it as an Encoder.

    Args:
        model_name: an OpenCLIP architecture (`open_clip.list_models()`), or 'hf-hub:org/repo' /
            'local-dir:/path' as open_clip accepts them.
        pretrained: None (random init), an OpenCLIP pretrained tag
            (`open_clip.list_pretrained_tags_by_model(model_name)`), or a checkpoint file path
            (relative paths are made absolute).
        device, precision, batch_size: see OpenCLIPEncoder.
        seed: the seed of the random init (pretrained=None); None means 0. Refused with weights.

    The result's `spec` is canonical: 'open_clip:<model>?seed=<N>' (random),
    'open_clip:<model>/<tag>', 'open_clip:<model>/<absolute checkpoint path>'.

    Raises:
        VlctlError: unknown architecture (with close names), unknown tag, a checkpoint file that
        does not exist or does not match the architecture, a seed given with weights.
    """
    import open_clip

    check_precision(precision)
    register_bundled_configs()
    has_schema = model_name.startswith(("hf-hub:", "local-dir:"))
    if model_name.startswith("local-dir:"):
        model_name = "local-dir:" + str(Path(model_name[len("local-dir:") :]).expanduser().resolve())
    if not has_schema and model_name not in open_clip.list_models():
        close = difflib.get_close_matches(model_name, open_clip.list_models(), n=5)
        raise VlctlError(
            f"unknown OpenCLIP model {model_name!r}"
            + (f"; did you mean {close}?" if close else "; see open_clip.list_models()")
        )
    random_init = pretrained is None and not has_schema
    if seed is not None and not random_init:
        raise VlctlError(
            f"OpenCLIP {model_name!r}: ?seed={seed} names randomly initialised weights, but "
            f"{'the model name' if has_schema else repr(pretrained)} loads weights; drop the seed"
        )
    unasked = random_init and seed is None  # random weights the spec did not ask for by a seed
    if unasked:
        seed = 0
    if pretrained is not None and not has_schema:
        looks_like_path = Path(pretrained).suffix != "" or "/" in pretrained or Path(pretrained).exists()
        if looks_like_path:
            if not Path(pretrained).expanduser().is_file():
                raise VlctlError(f"{pretrained}: OpenCLIP checkpoint file not found")
            pretrained = str(Path(pretrained).expanduser().resolve())
        elif pretrained not in open_clip.list_pretrained_tags_by_model(model_name):
            raise VlctlError(
                f"unknown pretrained tag {pretrained!r} for OpenCLIP model {model_name!r}; known: "
                f"{open_clip.list_pretrained_tags_by_model(model_name)} (or give a checkpoint file)"
            )
    try:
        # The model is built on the CPU and then moved to `device`, so the seeded CPU generator
        # alone decides a random init.
        with seeded_init(seed) if random_init else contextlib.nullcontext(), _quiet_random_init(random_init):
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=pretrained, device=device
            )
        tokenizer = open_clip.get_tokenizer(model_name)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:600]
        if pretrained is not None and Path(pretrained).is_file():  # strict load_state_dict: keys / shapes
            raise VlctlError(
                f"{pretrained}: checkpoint does not match OpenCLIP architecture {model_name!r}: {first}"
            ) from None
        # A tag whose weights are neither in the local cache nor downloadable (offline machine).
        raise VlctlError(f"OpenCLIP {model_name!r} (pretrained={pretrained!r}): cannot load ({first})") from None
    except (OSError, ValueError, KeyError, ImportError) as e:
        raise VlctlError(f"OpenCLIP {model_name!r} (pretrained={pretrained!r}): cannot load ({e})") from None
    if unasked and model_name not in _TOLD_RANDOM:
        _TOLD_RANDOM.add(model_name)
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        example = f" (e.g. open_clip:{model_name}/{tags[0]})" if tags else ""
        warnings.warn(f"open_clip:{model_name} names no pretrained tag: its weights are random (seed 0), and so are its "
                      f"embeddings; name a tag{example} or a checkpoint file, or write open_clip:{model_name}?seed=0 "
                      "to ask for random weights", RandomWeightsWarning, stacklevel=2)
    if random_init:
        spec = f"open_clip:{model_name}?seed={seed}"
    else:
        spec = f"open_clip:{model_name}" + ("" if pretrained is None else f"/{pretrained}")
    return OpenCLIPEncoder(
        model, model_name, preprocess, tokenizer, device=device, precision=precision, batch_size=batch_size,
        seed=seed if random_init else None, spec=spec,
    )

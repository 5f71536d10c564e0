"""Hugging Face CLIP and SigLIP models as vlctl Encoders.

    encoder = create_hf_encoder("openai/clip-vit-base-patch32")     # hub name (from the local HF cache)
    encoder = create_hf_encoder("/models/siglip-base-patch16-224")  # a save_pretrained directory
    encoder = create_hf_encoder("/models/clip-config-only", seed=0)  # random init from a config

Random weights are only ever made on request: a directory with a config but no weights file is
refused unless a seed is given (spec 'hf:DIR?seed=N'), a seed is refused where weights exist, and
weights that do not cover the architecture are an error (transformers would silently fill the
gaps with random values). A seeded init is the same in every process (`seeded_init`) and says so
in the id: 'hf-clip/random-seed0@<hash>'.

Model, tokenizer and image processor are loaded with transformers' Auto classes from the same
name or directory. Texts are padded to the model's full context length: SigLIP was trained that
way and pools the last position; for CLIP (causal, pooled at the end-of-text token) padding does
not change the embedding, and a fixed length keeps token tensors stackable. CLIP's tower is then
run on each batch's positions up to its last end-of-text token only, texts batched by length.

Relevancy maps: `vision_attentions` switches the model to eager attention for that one forward
(fused SDPA kernels never materialise the probabilities) and returns transformers' own attention
outputs, which are the tensors multiplied with the values (after dropout, an identity in eval).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vlctl.encoders.base import FrontDoor, check_keep, eval_mode, seeded_init
from vlctl.encoders.open_clip_encoder import (
    autocast_for,
    check_precision,
    pil_from_array,
    run_batched,
    run_batched_by_length,
)
from vlctl.fsops import VlctlError
from vlctl.io import hash_state_dict

SUPPORTED_MODEL_TYPES = ("clip", "siglip", "siglip2")
# The files transformers loads weights from (transformers.utils' *_WEIGHTS_NAME / *_INDEX_NAME).
WEIGHTS_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)


@contextlib.contextmanager
def attention_implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Use attention implementation `name` ("eager", "sdpa", ...) inside the block, then restore."""
    before = getattr(model.config, "_attn_implementation", None)
    if before == name:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        if before is not None:
            model.set_attn_implementation(before)


class HFEncoder(FrontDoor):
    """A transformers CLIPModel / SiglipModel as a vlctl `Encoder` (see encoders/base.py), with
    the `FrontDoor` embed_* methods.

    Attributes:
        model: the transformers model in eval mode on `device`.
        processor: the image processor (resize, crop, normalise) loaded with the model.
        tokenizer: the tokenizer loaded with the model.
        context_length: tokens per text row (the text tower's max_position_embeddings).
        seed: the seed of randomly initialised weights (part of `id`); None for loaded weights.
        spec: the canonical spec that rebuilds the encoder (set by `create_hf_encoder`).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        processor,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
        batch_size: int = 256,
        seed: int | None = None,
        spec: str | None = None,
    ):
        self.model = model.eval()
        self.seed = seed
        self.spec = spec
        self.tokenizer = tokenizer
        self.processor = processor
        self.device = torch.device(device)
        self.precision = check_precision(precision)
        self.batch_size = int(batch_size)
        cfg = model.config
        self.model_type = cfg.model_type
        self.context_length = int(cfg.text_config.max_position_embeddings)
        # CLIP projects to projection_dim; SigLIP's text head to projection_size (= hidden_size by
        # default). Asking the model is simpler than knowing every family's config field.
        with torch.no_grad(), eval_mode(self.model):
            probe = torch.zeros(1, self.context_length, dtype=torch.long, device=self.device)
            self.embed_dim = int(self.model.get_text_features(input_ids=probe).pooler_output.shape[-1])
        self._id: str | None = None

    def __repr__(self) -> str:
        return f"HFEncoder(model_type={self.model_type!r}, device={str(self.device)!r})"

    @property
    def id(self) -> str:
        """'hf-<model_type>[/random-seed<N>]@<16 hex of the weights' content hash>' (computed once)."""
        if self._id is None:
            random = "" if self.seed is None else f"/random-seed{self.seed}"
            self._id = f"hf-{self.model_type}{random}@{hash_state_dict(self.model.state_dict())[:16]}"
        return self._id

    def preprocess_pil(self, image) -> torch.Tensor:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        return self.preprocess_pil(pil_from_array(image))

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        if isinstance(texts, str):
            raise VlctlError("tokenize: expected a list of texts, got a single string")
        out = self.tokenizer(
            list(texts), padding="max_length", truncation=True, max_length=self.context_length, return_tensors="pt"
        )
        return out["input_ids"]

    def _image_features(self, x: torch.Tensor, **kwargs):
        return self.model.get_image_features(pixel_values=x, **kwargs)

    def encode_images(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        def fn(b: torch.Tensor) -> torch.Tensor:
            with autocast_for(self.device, self.precision):
                e = self._image_features(b).pooler_output
            return torch.nn.functional.normalize(e.float(), dim=-1) if normalize else e

        with eval_mode(self.model):
            return run_batched(fn, images, self.batch_size, self.embed_dim, self.device)

    def _pooled_positions(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """(n,) the position CLIP's causal text tower pools per row, as transformers'
        CLIPTextTransformer picks it (the first end-of-text token; the highest id for configs with
        the old eos_token_id 2); None for SigLIP, which attends to every position and pools the last."""
        if self.model_type != "clip":
            return None
        eos = self.model.config.text_config.eos_token_id
        return tokens.argmax(-1) if eos == 2 else (tokens == eos).int().argmax(-1)

    def encode_texts(self, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        if not torch.is_tensor(tokens):
            tokens = self.tokenize(tokens)
        pooled = self._pooled_positions(tokens)

        def fn(b: torch.Tensor) -> torch.Tensor:
            if pooled is not None:
                # Causal: no position reads a later one, so the positions after the batch's last
                # pooled one (padding) change nothing pooled and are not run.
                b = b[:, : int(self._pooled_positions(b).max()) + 1]
            with autocast_for(self.device, self.precision):
                e = self.model.get_text_features(input_ids=b).pooler_output
            return torch.nn.functional.normalize(e.float(), dim=-1) if normalize else e

        with eval_mode(self.model):
            if pooled is not None:  # batches of texts of about equal length
                return run_batched_by_length(fn, tokens, pooled, self.batch_size, self.embed_dim, self.device)
            return run_batched(fn, tokens, self.batch_size, self.embed_dim, self.device)

    def vision_attentions(
        self, images: torch.Tensor, normalize: bool = True
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(embeddings (n, d), [attention probabilities (n, heads, T, T) per ViT layer]).

        T = 1 + n_patches for CLIP (class token), n_patches for SigLIP. Eager attention, fp32,
        gradients on (the images are made to require grad if they don't).
        """
        x = images.to(self.device)
        if not x.requires_grad:
            x = x.detach().float().requires_grad_(True)
        with torch.enable_grad(), eval_mode(self.model), attention_implementation(self.model, "eager"):
            out = self._image_features(x, output_attentions=True)
        emb = out.pooler_output
        if normalize:
            emb = torch.nn.functional.normalize(emb, dim=-1)
        if not out.attentions:
            raise VlctlError(f"vision_attentions: {self.model_type} model returned no attentions")
        return emb, list(out.attentions)

    def encode_images_keep(self, images: torch.Tensor, keep: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Token removal (see `SupportsTokenRemoval`): images (n, 3, S, S), keep (n, m) patch
        indices -> embeddings (n, d) from the class token plus the kept patch tokens.

        CLIP only: vision_model.embeddings (patches, class token, + position embedding) -> gather
        -> pre_layrnorm -> encoder -> post_layernorm on the class token -> visual_projection, the
        steps of CLIPVisionModel.forward and get_image_features. SigLIP has no class token (it
        pools with an attention head) and is refused.
        """
        if self.model_type != "clip":
            raise VlctlError(
                f"encode_images_keep: token removal needs a class-token ViT (CLIP); {self.model_type} is not supported"
            )
        vm = self.model.vision_model
        keep = check_keep(keep, images.shape[0], int(vm.embeddings.num_patches))

        def fn(b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            with autocast_for(self.device, self.precision):
                x = vm.embeddings(b)
                idx = torch.cat([k.new_zeros(k.shape[0], 1), k + 1], dim=1)  # token 0 is the class token
                x = x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
                x = vm.encoder(inputs_embeds=vm.pre_layrnorm(x)).last_hidden_state
                e = self.model.visual_projection(vm.post_layernorm(x[:, 0, :]))
            return torch.nn.functional.normalize(e.float(), dim=-1) if normalize else e

        with eval_mode(self.model):
            return run_batched(fn, images, self.batch_size, self.embed_dim, self.device, keep)


def create_hf_encoder(
    name_or_path: str | Path,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    batch_size: int = 256,
    seed: int | None = None,
) -> HFEncoder:
    """Load a Hugging Face CLIP / SigLIP model, its tokenizer and image processor (local files only).

    seed: None loads the weights; an integer initialises the architecture of a config-only
    directory (config.json, tokenizer files, no weights) at random with that seed.

    The result's `spec` is canonical: 'hf:<hub name or absolute directory>[?seed=<N>]'.

    Raises:
        VlctlError: a path that does not exist, a model type other than CLIP / SigLIP, weights
        that do not match the config, a directory without weights and no seed (or with weights
        and a seed), missing tokenizer files.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    src = str(name_or_path)
    looks_local = Path(src).exists() or src.startswith((".", "/", "~"))
    if looks_local and not Path(src).expanduser().is_dir():
        raise VlctlError(f"{src}: Hugging Face model directory not found")
    src = str(Path(src).expanduser().resolve()) if looks_local else src
    try:
        # local_files_only: nothing downloads at run time; a hub name must already be in the HF cache.
        config = AutoConfig.from_pretrained(src, local_files_only=True)
    except (OSError, ValueError) as e:
        raise VlctlError(f"{src}: cannot read a Hugging Face config ({str(e).splitlines()[0]})") from None
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise VlctlError(f"{src}: model_type {config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
    has_weights = _has_weights(src, looks_local)
    if seed is not None:
        if has_weights:
            raise VlctlError(
                f"{src}: ?seed={seed} asks for random weights, but this model has weights; drop the seed to load them"
            )
        with seeded_init(seed):  # built on the CPU, moved below
            model = AutoModel.from_config(config)
    else:
        if has_weights is False:
            raise VlctlError(
                f"{src}: no weights file ({', '.join(WEIGHTS_FILES[::2])}) next to its config; for a "
                f"randomly initialised {config.model_type} model name the seed: hf:{src}?seed=0"
            )
        try:
            model, loading_info = AutoModel.from_pretrained(src, local_files_only=True, output_loading_info=True)
        except (OSError, ValueError, RuntimeError) as e:
            raise VlctlError(
                f"{src}: weights do not load into the {config.model_type} architecture of its config "
                f"({' '.join(str(e).split())[:600]})"
            ) from None
        _refuse_uninitialised(loading_info, src)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=True)
    except (OSError, ValueError) as e:
        raise VlctlError(f"{src}: cannot load its tokenizer ({str(e).splitlines()[0]})") from None
    processor = _image_processor(src, config)
    return HFEncoder(
        model.to(device), tokenizer, processor, device=device, precision=precision, batch_size=batch_size,
        seed=seed, spec=f"hf:{src}" + ("" if seed is None else f"?seed={seed}"),
    )


def _has_weights(src: str, local: bool) -> bool | None:
    """Whether the model has a weights file: True / False for a directory or a hub name in the
    local HF cache; None when that cannot be told (from_pretrained then decides)."""
    if local:
        return any((Path(src) / f).is_file() for f in WEIGHTS_FILES)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = [try_to_load_from_cache(src, f) for f in WEIGHTS_FILES]
    if any(isinstance(f, str) for f in found):
        return True
    return None  # not cached (or cached as missing): let from_pretrained say what is wrong


def _refuse_uninitialised(info: dict, src: str) -> None:
    """transformers fills tensors missing from the checkpoint with random values and only logs it;
    a checkpoint of another architecture must be an error, not a silently random encoder."""
    missing = sorted(info.get("missing_keys", []) or [])
    mismatched = info.get("mismatched_keys", []) or []
    if missing or mismatched:
        raise VlctlError(
            f"{src}: checkpoint does not match its config: missing {missing[:5]}, "
            f"shape-mismatched {[m[0] if isinstance(m, tuple) else m for m in mismatched][:5]}"
        )


def _image_processor(src: str, config):
    from transformers import AutoImageProcessor, CLIPImageProcessor, SiglipImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(src, local_files_only=True)
    except (OSError, ValueError):
        # No preprocessor_config.json: the model family's standard processor at its image size.
        size = int(config.vision_config.image_size)
        if config.model_type == "clip":
            return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
        return SiglipImageProcessor(size={"height": size, "width": size})

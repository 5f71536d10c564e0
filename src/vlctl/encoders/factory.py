"""One factory for every encoder vlctl can run: `create(spec)`.

    create("open_clip:ViT-B-32/laion2b_s34b_b79k")   OpenCLIP architecture + pretrained tag
    create("open_clip:ViT-B-16-SigLIP//ckpt/x.pt")   OpenCLIP architecture + checkpoint file
    create("open_clip:ViT-B-32")                     OpenCLIP architecture, random init
    create("hf:openai/clip-vit-base-patch32")        Hugging Face CLIP / SigLIP (name or directory)
    create("tiny:runs/clip/model")                   our TinyCLIP (a save_pretrained directory)
    create("runs/clip/model")                        the same: a bare directory is a TinyCLIP

Every result satisfies the `Encoder` protocol (encoders/base.py), and its `id` is the architecture
plus a hash of the weights, so caches and galleries can tell embedding spaces apart.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vlctl.encoders.base import Encoder
from vlctl.io import VlctlError

SPEC_FORMS = (
    "open_clip:<model>[/<pretrained tag or checkpoint path>]",
    "hf:<name or path>",
    "tiny:<checkpoint dir>",
)


def create(spec: str, device: str | torch.device = "cpu", precision: str = "fp32", batch_size: int = 256) -> Encoder:
    """Build the encoder named by `spec` (see the module docstring for the forms).

    Args:
        spec: the encoder spec string.
        device: where the model runs ("cpu", "cuda", "cuda:1").
        precision: "fp32", or "fp16" / "bf16" autocast (weights stay fp32) for OpenCLIP / HF.
        batch_size: rows per forward pass inside encode_images / encode_texts.

    Raises:
        VlctlError: an unknown form or model, a missing checkpoint, or weights that do not match
        the architecture; the message names the spec and the problem.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise VlctlError(f"encoder spec must be a non-empty string, one of {list(SPEC_FORMS)}; got {spec!r}")
    kind, sep, rest = spec.partition(":")
    if sep and kind == "open_clip":
        from vlctl.encoders.open_clip_encoder import create_open_clip_encoder, split_spec

        model_name, pretrained = split_spec(rest)
        if not model_name:
            raise VlctlError(f"encoder spec {spec!r}: no OpenCLIP model name after 'open_clip:'")
        return create_open_clip_encoder(
            model_name, pretrained, device=device, precision=precision, batch_size=batch_size
        )
    if sep and kind == "hf":
        from vlctl.encoders.hf_encoder import create_hf_encoder

        if not rest:
            raise VlctlError(f"encoder spec {spec!r}: no model name or path after 'hf:'")
        return create_hf_encoder(rest, device=device, precision=precision, batch_size=batch_size)
    if sep and kind == "tiny":
        return _tiny(rest, device, batch_size)
    if Path(spec).is_dir():
        return _tiny(spec, device, batch_size)
    raise VlctlError(
        f"unknown encoder spec {spec!r}; expected one of {list(SPEC_FORMS)} (or a saved TinyCLIP directory)"
    )


def _tiny(path: str, device: str | torch.device, batch_size: int) -> Encoder:
    from vlctl.encoders.tiny_clip import TinyCLIPEncoder, load_pretrained

    if not path:
        raise VlctlError("encoder spec 'tiny:': no checkpoint directory after 'tiny:'")
    encoder = TinyCLIPEncoder(load_pretrained(path, map_location=device), batch_size=batch_size)
    encoder.device = torch.device(device)  # where input batches go (vlctl.data.cache reads this)
    return encoder

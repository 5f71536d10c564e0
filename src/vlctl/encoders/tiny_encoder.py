"""TinyCLIP as a vlctl `Encoder`: `TinyCLIPEncoder` and `load_tiny_encoder(dir)`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.encoders.base import FrontDoor, check_keep, eval_mode
from vlctl.encoders.tiny_config import TinyCLIPConfig
from vlctl.encoders.tiny_model import TinyCLIP, encoder_id, image_transform, preprocess_batch, unwrap_model
from vlctl.encoders.tiny_pretrained import load_pretrained
from vlctl.fsops import VlctlError


class TinyCLIPEncoder(FrontDoor):
    """A TinyCLIP as a vlctl `Encoder` (see encoders/base.py), with the `FrontDoor` embed_* methods.

    `encode_images` / `encode_texts` run in eval mode without gradients, in chunks of
    `batch_size`, and return embeddings on the device of their input. `id` is recomputed when
    the weights change (tracked by tensor version counters), so it always names the current space.
    `spec` is the spec the encoder was loaded from ('tiny:<absolute dir>'), None when it wraps an
    in-memory model.
    """

    def __init__(self, model: TinyCLIP, batch_size: int = 1024, spec: str | None = None):
        self.model = unwrap_model(model)
        self.spec = spec
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


def load_tiny_encoder(
    path: str | Path, map_location: str | torch.device = "cpu", batch_size: int = 1024
) -> TinyCLIPEncoder:
    """`load_pretrained` wrapped as an Encoder; its `spec` is 'tiny:<absolute directory>'."""
    return TinyCLIPEncoder(load_pretrained(path, map_location), batch_size=batch_size, spec=tiny_spec(path))


def tiny_spec(path: str | Path) -> str:
    """The canonical spec of a TinyCLIP directory: 'tiny:' + its absolute path."""
    return f"tiny:{Path(path).expanduser().resolve()}"

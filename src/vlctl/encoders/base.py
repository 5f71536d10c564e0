"""The Encoder protocol: what every image-text model in vlctl provides.

TinyCLIP (ours), and later OpenCLIP / Hugging Face adapters, implement it. Methods, caches and
indexes only ever talk to an Encoder, so they run unchanged on any of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn


@runtime_checkable
class Encoder(Protocol):
    """An image-text embedding model.

    Attributes:
        id: stable identity of the embedding space, "<architecture>@<weights sha256 prefix>".
            Two encoders with the same id produce the same embeddings; caches, checkpoints and
            fitted methods record it and refuse to be used with another id.
        embed_dim: dimension d of the joint embedding space.
        preprocess: maps one uint8 image array (H, W, 3) to a float tensor (3, S, S) as the
            image tower expects it.
    """

    id: str
    embed_dim: int
    preprocess: Callable[[np.ndarray], torch.Tensor]

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Texts -> token tensor (n, context_length) understood by `encode_texts`."""

    def encode_images(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Preprocessed images (n, 3, S, S) -> embeddings (n, d)."""

    def encode_texts(self, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Tokens (n, L) -> embeddings (n, d)."""

    def vision_attentions(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Encode images and return (embeddings (n, d), attention probabilities per ViT block).

        Each attention tensor has shape (n, heads, T, T) with T = 1 + n_patches, and is the exact
        tensor multiplied with the values inside the block (not a copy), so
        `torch.autograd.grad(score, attentions)` works; relevancy maps (HilaCAM) need this.
        """


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put `model` in eval mode for the block and restore its previous mode after (encoders are
    used for inference inside training code, e.g. relevancy maps, without changing its mode)."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)

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

from vlctl.io import VlctlError


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


@runtime_checkable
class SupportsTokenRemoval(Protocol):
    """An Encoder that can encode images from a subset of their patch tokens (3VL token removal).

    Kept out of `Encoder` itself so encoders without a ViT (or tests' stand-ins) still satisfy
    the base protocol; TinyCLIP, OpenCLIP ViTs and HF CLIP implement it.
    """

    def encode_images_keep(self, images: torch.Tensor, keep: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """Token removal: encode images (n, 3, S, S) from the class token plus the patch tokens
        `keep` (n, m) long, patch indices in 0..n_patches-1 (row-major over the patch grid) ->
        embeddings (n, d).

        Positional embeddings are added before the patches are gathered, so each kept token keeps
        its place in the image; then the transformer, final LayerNorm and projection run as usual.
        Keeping every patch reproduces `encode_images`; the result does not depend on the order of
        the indices within a row (m = 0: the class token alone). Runs without gradients.
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


def check_keep(keep: torch.Tensor, n_images: int, n_patches: int) -> torch.Tensor:
    """Validate token-removal indices for `SupportsTokenRemoval.encode_images_keep`; returns them as int64.

    keep: (n_images, m) integer patch indices, 0 <= index < n_patches, no repeats within a row
    (a repeated token would change the attention weights, i.e. not be "keeping" a patch).
    """
    keep = torch.as_tensor(keep)
    if keep.dtype.is_floating_point or keep.dtype == torch.bool or keep.dtype.is_complex:
        raise VlctlError(f"encode_images_keep: keep must hold integer patch indices, got dtype {keep.dtype}")
    if keep.ndim != 2 or keep.shape[0] != n_images:
        raise VlctlError(f"encode_images_keep: keep must have shape (n_images={n_images}, m), got {tuple(keep.shape)}")
    keep = keep.long()
    if keep.numel():
        lo, hi = int(keep.min()), int(keep.max())
        if lo < 0 or hi >= n_patches:
            raise VlctlError(
                f"encode_images_keep: patch indices must lie in [0, {n_patches - 1}], got values in [{lo}, {hi}]"
            )
        s = keep.sort(dim=1).values
        if bool((s[:, 1:] == s[:, :-1]).any()):
            raise VlctlError("encode_images_keep: a row of keep repeats a patch index")
    return keep

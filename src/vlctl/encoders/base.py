"""The Encoder protocol: what every image-text model in vlctl provides, and what they share.

TinyCLIP (ours), OpenCLIP and Hugging Face adapters implement it. Methods, caches and indexes only
ever talk to an Encoder, so they run unchanged on any of them.

Shared here: `FrontDoor` (the numpy-in / numpy-out `embed_texts` / `embed_images` of every
encoder class, written once), `seeded_init` (deterministic random initialisation that leaves the
caller's RNG alone), `eval_mode` and `check_keep`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from vlctl.fsops import VlctlError
from vlctl.images import DEFAULT_MAX_PIXELS, read_image, to_rgb


@runtime_checkable
class Encoder(Protocol):
    """An image-text embedding model.

    Attributes:
        id: stable identity of the embedding space, "<architecture>@<weights sha256 prefix>";
            randomly initialised weights say so and name their seed,
            "<architecture>/random-seed<N>@<hash>". Two encoders with the same id produce the
            same embeddings; caches, checkpoints and fitted methods record it and refuse to be
            used with another id.
        spec: the canonical spec string that rebuilds this encoder with `vlctl.load_encoder` /
            `vlctl.encoders.create` from any working directory (paths absolute, the seed of
            random weights explicit), e.g. "open_clip:ViT-B-32?seed=0", "tiny:/abs/runs/model";
            None for an encoder wrapped around an in-memory model (no spec rebuilds it). Not a
            protocol member, so stand-ins without it still satisfy `Encoder`; read it with
            `getattr(encoder, "spec", None)`.
        embed_dim: dimension d of the joint embedding space.
        preprocess: maps one uint8 image array (H, W, 3) to a float tensor (3, S, S) as the
            image tower expects it.

    The encoders vlctl builds also have the front door of `FrontDoor`: `embed_texts(texts)` and
    `embed_images(images)` -> L2-normalised float32 numpy arrays (n, d), taking PIL images, image
    file paths or uint8 arrays of any size.
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
    if not was:  # already in eval mode (`.eval()` sets every submodule): skip the walk over them
        yield
        return
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


@contextlib.contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Run the block with torch's CPU generator seeded with `seed`; the caller's RNG state is
    restored afterwards (as if the block had not run).

    Models are built on the CPU and moved after, so their random initialisation inside the block
    is a function of `seed` alone: the same seed gives the same weights in every process. Only the
    CPU generator is seeded and restored; CUDA generators are not touched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(int(seed))
        yield


# --------------------------------------------------------------------------------------------
# The front door: numpy in, numpy out
# --------------------------------------------------------------------------------------------


def _check_batch_size(batch_size: int | None, default: int) -> int:
    bs = default if batch_size is None else batch_size
    if isinstance(bs, bool) or not isinstance(bs, (int, np.integer)) or bs <= 0:
        raise VlctlError(f"batch_size must be a positive integer, got {batch_size!r}")
    return int(bs)


def _as_items(values: Any, what: str, single: tuple[type, ...]) -> list:
    """`values` as a list of items, refusing a lone item where a sequence of them was meant."""
    if isinstance(values, (*single, bytes)):
        raise VlctlError(f"{what}: expected a sequence of items, got a single {type(values).__name__}; pass [item]")
    if torch.is_tensor(values):
        raise VlctlError(
            f"{what}: got a torch tensor; pass a sequence of items (preprocessed image tensors go to encode_images)"
        )
    if not isinstance(values, Iterable):
        raise VlctlError(f"{what}: expected a sequence of items, got {type(values).__name__}")
    return list(values)


def _embeddings_to_numpy(emb: torch.Tensor, n: int, dim: int, what: str) -> np.ndarray:
    out = emb.detach().to("cpu", torch.float32).numpy()
    if out.shape != (n, dim):
        raise VlctlError(f"{what}: the encoder returned shape {out.shape}, expected {(n, dim)}")
    return out


class FrontDoor:
    """`embed_texts` / `embed_images` for an encoder class: plain Python / numpy in, numpy out.

    Mixed into TinyCLIPEncoder, OpenCLIPEncoder and HFEncoder; it needs only what the `Encoder`
    protocol provides (`tokenize`, `encode_texts`, `encode_images`, `preprocess`, `embed_dim`)
    plus `batch_size`, and uses `preprocess_pil` (PIL image -> tensor) where the encoder has one.
    Inputs are batched, run under `torch.inference_mode()`, moved to the encoder's device by
    `encode_*`, and come back as L2-normalised float32 arrays (n, d) on the CPU, identical to
    `encode_*(..., normalize=True)` on the same inputs.
    """

    batch_size: int
    embed_dim: int

    def embed_texts(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Texts -> embeddings (n, d) float32, unit norm.

        batch_size: texts tokenised and encoded per step (default: the encoder's batch_size).
        Raises VlctlError for an item that is not a string or that the tokenizer refuses, naming
        the item's index.
        """
        items = _as_items(texts, "embed_texts", (str,))
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise VlctlError(f"embed_texts: item {i}: expected a string, got {type(t).__name__} ({t!r:.80})")
        bs = _check_batch_size(batch_size, self.batch_size)
        out = np.empty((len(items), self.embed_dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(items), bs):
                chunk = items[start : start + bs]
                tokens = self._tokenize_chunk(chunk, start)
                emb = self.encode_texts(tokens, normalize=True)
                out[start : start + len(chunk)] = _embeddings_to_numpy(emb, len(chunk), self.embed_dim, "embed_texts")
        return out

    def _tokenize_chunk(self, chunk: list[str], start: int) -> torch.Tensor:
        try:
            return self.tokenize(chunk)
        except VlctlError as e:
            for j, text in enumerate(chunk):  # which text? tokenise them one by one to name it
                try:
                    self.tokenize([text])
                except VlctlError as one:
                    raise type(one)(f"embed_texts: item {start + j}: {one}") from None
            raise VlctlError(f"embed_texts: items {start}..{start + len(chunk) - 1}: {e}") from None

    def embed_images(
        self, images: Sequence[Any], batch_size: int | None = None, max_pixels: int = DEFAULT_MAX_PIXELS
    ) -> np.ndarray:
        """Images -> embeddings (n, d) float32, unit norm.

        Each item may be a PIL image (any mode; read as `vlctl.images.to_rgb` reads a file's), an image file path (str or
        os.PathLike; read with `vlctl.images.read_image`, at most `max_pixels` pixels), or a uint8
        numpy array (H, W, 3) (or grayscale (H, W)) of any size. The encoder's own preprocessing
        is applied: OpenCLIP's / the HF image processor's resize, crop and normalisation for
        those encoders; for TinyCLIP `image_transform` (shorter side resized to the model's S,
        bilinear with antialiasing, centre crop, to [-1, 1]). A (n, H, W, 3) uint8 array is a
        sequence of n images.

        batch_size: images read, preprocessed and encoded per step (default: the encoder's).
        Raises VlctlError (ImageDecodeError for files that do not decode) naming the item's index
        and the problem.
        """
        from PIL import Image

        if isinstance(images, np.ndarray) and images.ndim != 4:
            raise VlctlError(
                f"embed_images: got one array of shape {images.shape}; pass a sequence of images "
                "([array]) or a batch (n, H, W, 3)"
            )
        items = _as_items(images, "embed_images", (str, os.PathLike, Image.Image))
        bs = _check_batch_size(batch_size, self.batch_size)
        out = np.empty((len(items), self.embed_dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(items), bs):
                chunk = items[start : start + bs]
                x = torch.stack([self._front_preprocess(item, start + j, max_pixels) for j, item in enumerate(chunk)])
                emb = self.encode_images(x, normalize=True)
                out[start : start + len(chunk)] = _embeddings_to_numpy(emb, len(chunk), self.embed_dim, "embed_images")
        return out

    def _front_preprocess(self, item: Any, index: int, max_pixels: int) -> torch.Tensor:
        """One front-door image item -> the (3, S, S) tensor the image tower takes."""
        from PIL import Image

        where = f"embed_images: item {index}"
        if isinstance(item, (str, os.PathLike)):
            try:
                item = read_image(item, max_pixels)
            except VlctlError as e:
                raise type(e)(f"{where}: {e}") from None
        pil_fn = getattr(self, "preprocess_pil", None)
        try:
            if isinstance(item, Image.Image):
                rgb = to_rgb(item)  # as a file of these pixels would read: upright, 8-bit, alpha on white
                x = pil_fn(rgb) if pil_fn is not None else self.preprocess(np.asarray(rgb))
            elif isinstance(item, np.ndarray):
                if item.dtype != np.uint8:
                    raise VlctlError(f"expected a uint8 image array, got dtype {item.dtype}")
                if not (item.ndim == 2 or (item.ndim == 3 and item.shape[-1] in (1, 3))):
                    raise VlctlError(f"expected an image array of shape (H, W, 3), got {item.shape}")
                if item.shape[0] == 0 or item.shape[1] == 0:
                    raise VlctlError(f"image array of shape {item.shape} has no pixels")
                x = self.preprocess(item)
            else:
                raise VlctlError(
                    "expected a PIL image, an image file path or a uint8 numpy array (H, W, 3), "
                    f"got {type(item).__name__}"
                )
        except VlctlError as e:
            raise type(e)(f"{where}: {e}") from None
        except (OSError, ValueError, TypeError, RuntimeError) as e:  # PIL / transform failures
            raise VlctlError(f"{where}: cannot preprocess ({type(e).__name__}: {e})") from e
        if not torch.is_tensor(x) or x.ndim != 3:
            raise VlctlError(f"{where}: preprocessing gave {type(x).__name__} {getattr(x, 'shape', '')}, not (3, S, S)")
        return x

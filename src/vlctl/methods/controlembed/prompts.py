"""Text conditions of the methods: prompt ensembles, the bundled MiniLM sentence encoder (the
default condition encoder of ControlEmbed), and the training-free text-subspace baseline."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from vlctl.config import shorten, template_error
from vlctl.fsops import VlctlError
from vlctl.methods.base import as_matrix
from vlctl.methods.controlembed.config import DEFAULT_TEMPLATES


@functools.lru_cache(maxsize=1)
def _minilm():
    from vlctl.encoders.minilm import load_sentence_transformer

    return load_sentence_transformer()


def minilm_text_embeddings(texts: Sequence[str]) -> np.ndarray:
    """(n, 384) float32 L2-normalised all-MiniLM-L6-v2 sentence embeddings (the bundled weights)."""
    texts = list(texts)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise VlctlError(f"minilm_text_embeddings: expected non-empty strings, got {texts!r}")
    with torch.inference_mode():
        emb = _minilm().encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(emb, dtype=np.float32)


def minilm_id() -> str:
    from vlctl.encoders.minilm import minilm_fingerprint

    return "all-MiniLM-L6-v2@" + minilm_fingerprint()["weights_sha256"][:12]


def prompt_ensemble(
    encode_texts: Callable[[list[str]], np.ndarray], phrases: Sequence[str], templates: Sequence[str] = DEFAULT_TEMPLATES
) -> np.ndarray:
    """(K, D) normalised mean over `templates` of the text embeddings of each phrase, as CLIP
    ensembles prompts: row k = normalize(mean_t encode(template_t.format(phrases[k])))."""
    templates = list(templates)
    bad = [t for t in templates if not isinstance(t, str) or template_error(t)]
    if not templates or bad:
        raise VlctlError(f"templates: each must contain '{{}}' exactly once, where the subclass goes, and no other "
                         f"{{...}} field; got {shorten(repr(bad or templates))}")
    texts = [t.format(p) for p in phrases for t in templates]
    emb = np.asarray(encode_texts(texts), dtype=np.float64).reshape(len(phrases), len(templates), -1).mean(1)
    return (emb / np.linalg.norm(emb, axis=1, keepdims=True).clip(1e-12)).astype(np.float32)


def text_subspace_projection(class_text_emb: Any) -> tuple[np.ndarray, np.ndarray]:
    """Training-free baseline (the paper's CWP/LCR family): W = orthogonal projector onto the span
    of the category's subclass text embeddings (K, D), b = 0. Returns (W (D, D), b (D,))."""
    t = as_matrix(class_text_emb, "class_text_emb")
    u, s, _ = np.linalg.svd(t.T.astype(np.float64), full_matrices=False)
    basis = u[:, s > s.max() * 1e-6]  # (D, rank of the text set)
    return (basis @ basis.T).astype(np.float32), np.zeros(t.shape[1], dtype=np.float32)

"""VL-CheckList-style scoring of an encoder: each item is an image with a positive and a negative
text; the encoder gets it right when the positive is the closer one (`checklist_accuracy`)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["checklist_scores", "row_cosine"]


def row_cosine(a: Any, b: Any) -> np.ndarray:
    """(n,) float64 numpy: the row-wise dot products sum_d a[i, d] * b[i, d] of two torch tensors
    (broadcast), summed in their dtype, i.e. the cosines of unit-norm embeddings."""
    return (a * b).sum(-1).double().numpy()


def checklist_scores(enc: Any, x_all: Any, items: dict[str, list[dict]]) -> dict[str, np.ndarray]:
    """Per category, the (n, 2) scores [cos(image, positive), cos(image, negative)] of its items.

    Args:
        enc: an Encoder (`encode_images`, `tokenize`, `encode_texts`; unit-norm embeddings, so
            the row-wise dot product is the cosine).
        x_all: the preprocessed images the items index into.
        items: {category: [{"index": image row, "pos": text, "neg": text}, ...]}, e.g. from
            `vlctl.data.scenes.load_checklist`.

    Returns:
        {category: (n_items, 2) float64}: row i is [e_i . p_i, e_i . n_i] with e = the embedding of
        image items[i]["index"], p_i / n_i those of its positive / negative text.
        `checklist_accuracy` of it is the category's accuracy.
    """
    img = enc.encode_images(x_all)
    out = {}
    for c, its in items.items():
        idx = [it["index"] for it in its]
        p = enc.encode_texts(enc.tokenize([it["pos"] for it in its]))
        n = enc.encode_texts(enc.tokenize([it["neg"] for it in its]))
        out[c] = np.stack([row_cosine(img[idx], p), row_cosine(img[idx], n)], axis=1)
    return out

"""Evaluations of text-conditioned editing (docs/methods.md §1.4): pure functions over arrays.

All accuracies are percentages. A category's "class embeddings" are the text embeddings of its
values, (n_values, d); classification is `metrics.zero_shot_predict` (argmax cosine).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import rankdata

from vlctl.eval.metrics import zero_shot_predict


def _pct(hit: np.ndarray) -> float:
    return float(100.0 * hit.mean()) if hit.size else float("nan")


def conditioning_accuracy(
    original_emb: Any, edited_emb: Any, class_emb: Any, labels: Any, in_caption: Any
) -> dict[str, float]:
    """TEVI Tables A1/A2 for one category.

    original_emb, edited_emb: (N, d) image embeddings before and after editing (image i edited by
        its own caption); class_emb: (n_values, d); labels: (N,) true value index;
    in_caption: (N,) bool, whether image i's caption names this category.
    Returns {original: accuracy of original_emb over all N, in_caption: accuracy of edited_emb on
    the images whose caption names the category, not_in_caption: on the others, chance:
    100 / n_values}. Editing works when in_caption stays near original and not_in_caption falls
    to chance (the caption did not ask for the category, so the edit removes it).
    """
    labels, in_caption = np.asarray(labels), np.asarray(in_caption, dtype=bool)
    orig = zero_shot_predict(original_emb, class_emb) == labels
    edited = zero_shot_predict(edited_emb, class_emb) == labels
    return {
        "original": _pct(orig),
        "in_caption": _pct(edited[in_caption]),
        "not_in_caption": _pct(edited[~in_caption]),
        "chance": 100.0 / len(np.asarray(class_emb)),
    }


def leakage_accuracy(
    swapped_emb: Any, class_emb: Any, image_labels: Any, caption_labels: Any
) -> dict[str, float]:
    """The leakage control for one category: image i edited by ANOTHER image's caption.

    swapped_emb: (N, d) image i edited by caption π(i); image_labels: (N,) image i's true value;
    caption_labels: (N,) the value caption π(i) names, -1 where it does not name the category.
    On the pairs where the caption names a value that differs from the image's:
      follows_image  = % classified as the image's true value (editing that keeps the image),
      follows_caption = % classified as the caption's value (the mask writing its own labels in).
    `image_accuracy` is the accuracy against the image's labels over all pairs whose caption names
    the category (compare with `conditioning_accuracy(...)["in_caption"]`: how much survives).
    """
    image_labels, caption_labels = np.asarray(image_labels), np.asarray(caption_labels)
    pred = zero_shot_predict(swapped_emb, class_emb)
    named = caption_labels >= 0
    differ = named & (caption_labels != image_labels)
    return {
        "image_accuracy": _pct(pred[named] == image_labels[named]),
        "follows_image": _pct(pred[differ] == image_labels[differ]),
        "follows_caption": _pct(pred[differ] == caption_labels[differ]),
        "n_pairs": int(differ.sum()),
    }


def concept_auc_matrix(latents: Any, concept_present: Any) -> np.ndarray:
    """(d1, S) ROC-AUC (percent) of latent r's activation for "the image has concept s".

    latents: (N, d1) SAE codes; concept_present: (N, S) bool. Entry [r, s] is
    `metrics.roc_auc(latents[:, r], concept_present[:, s])`: 100 when the latent fires exactly on
    the concept, 50 when unrelated, 0 when it fires exactly on its absence. Computed as that
    Mann-Whitney statistic for all pairs at once: each latent's column is ranked once (ties
    averaged), and the positives' rank sums of every concept are one matrix product.
    """
    z, present = np.asarray(latents, dtype=np.float64), np.asarray(concept_present, dtype=bool)
    if not np.isfinite(z).all():
        raise ValueError("latents: NaN or Inf")
    n_pos = present.sum(0).astype(np.float64)  # (S,)
    n_neg = present.shape[0] - n_pos
    if (n_pos == 0).any() or (n_neg == 0).any():
        raise ValueError("concept_present: ROC AUC needs both classes in every concept column")
    ranks = rankdata(z, axis=0)  # (N, d1), "average" ties
    u = present.T.astype(np.float64) @ ranks - (n_pos * (n_pos + 1) / 2)[:, None]  # (S, d1)
    return (100.0 * u / (n_pos * n_neg)[:, None]).T


def latent_purity(latents: Any, concept_present: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-latent purity: the best-concept ROC-AUC (percent) of every latent that fires.

    latents: (N, d1) SAE codes; concept_present: (N, S) bool. Returns (best_auc (d1,), best_concept
    (d1,) int): for a latent nonzero on at least one row, max_s AUC[r, s] of `concept_auc_matrix`
    and the concept s reaching it (lowest s on ties); for a latent that never fires, NaN and -1.
    100 means the latent fires exactly on one concept; a latent mixing attributes stays far below.
    (A latent firing on a concept's absence scores high on the complementary concept when that is
    in the list, e.g. "no swelling" on MAD.) Concepts present in every row or in none have no AUC
    and are skipped.
    """
    z, present = np.asarray(latents, dtype=np.float64), np.asarray(concept_present, dtype=bool)
    live = (z != 0).any(0)
    usable = np.flatnonzero(present.any(0) & ~present.all(0))
    best_auc, best_concept = np.full(z.shape[1], np.nan), np.full(z.shape[1], -1, dtype=np.int64)
    if live.any() and len(usable):
        auc = concept_auc_matrix(z[:, live], present[:, usable])
        best_concept[live] = usable[auc.argmax(1)]
        best_auc[live] = auc.max(1)
    return best_auc, best_concept


def top_activating(latents: Any, n: int = 8) -> np.ndarray:
    """(d1, n) indices of the n images with the largest activation of each latent, largest first."""
    z = np.asarray(latents)
    return np.argsort(-z, axis=0, kind="stable")[:n].T

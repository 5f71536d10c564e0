"""TEVI fused with CLIP, so that TEVI never makes a retrieval worse without saying so (issue 41).

A rerank re-scores CLIP's top k candidates of each query by

    score = α · CLIP + (1 − α) · TEVI

CLIP's score is cos(image, text), TEVI's cos(e_{p|q}, t_q): two cosines, on the same scale, so the
plain convex mix needs no normalisation; a difference in their spread is what α, chosen on held-out
pairs, absorbs. α = 1 is CLIP's score itself, and the rerank then keeps CLIP's order exactly.

`TEVI.fit` holds out a share of the images, each with all its captions (`holdout_split`), measures
R@1 both ways on their pairs for every α of `ALPHAS` (`heldout_figures`) and keeps the best,
starting from α = 1 (`choose_alpha`). `fusion_note` is the one line every fused score prints.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from vlctl.fsops import VlctlError
from vlctl.methods.tevi.scoring import fuse, rerank

ALPHAS = tuple(round(1.0 - i / 10, 1) for i in range(11))  # 1.0, 0.9, ..., 0.0: CLIP alone first
HELDOUT_RERANK_K = 100  # CLIP's candidates per held-out query that the fused score reorders
CRITERION = "mean of the held-out t2i@1 and i2t@1 of the fused rerank; ties go to the larger α"


def holdout_split(image_emb: np.ndarray, share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows) of pairs whose image embeddings are the rows of `image_emb`:
    round(share · n_images) images chosen with `seed`, every caption of an image on its image's
    side, so no caption of a held-out image is trained on. Rows with equal image embeddings are one
    image (a store's pairs repeat the image's row for each of its captions)."""
    if share == 0:
        return np.arange(len(image_emb)), np.zeros(0, dtype=np.int64)
    _, image = np.unique(image_emb, axis=0, return_inverse=True)
    image = image.reshape(-1)
    n_images = int(image.max()) + 1
    n_held = round(share * n_images)
    if n_held < 2:  # R@1 over one image is 100 whatever the scores: nothing to choose alpha by
        warnings.warn(f"holdout {share}: {n_images} distinct images give {n_held} to hold out, and measuring "
                      "retrieval needs at least 2: every pair trains, and the rerank is CLIP's ranking unless "
                      "alpha is given", UserWarning, stacklevel=2)
        return np.arange(len(image_emb)), np.zeros(0, dtype=np.int64)
    if n_held >= n_images:
        raise VlctlError(f"holdout {share}: {n_images} distinct images give {n_held} held-out images and none to "
                         "train on; give a smaller share (holdout 0 trains on every pair)")
    held = np.isin(image, np.random.default_rng(seed).permutation(n_images)[:n_held])
    return np.flatnonzero(~held), np.flatnonzero(held)


def fused_order(clip: torch.Tensor, tevi: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    """(k, Q): per column of `clip` (P, Q), its top k rows by CLIP reordered by the fused score
    (`tevi` (P, Q) the TEVI scores of the same pairs)."""
    return rerank(clip, k, lambda cand, _: fuse(clip.gather(0, cand), tevi.gather(0, cand), alpha)).order


def relevance(image_of_text: np.ndarray, text_group: np.ndarray | None = None) -> torch.Tensor:
    """(P, Q) bool: text q is relevant to image p when p has a caption of the same text as q
    (`text_group` (Q,): equal ids for equal caption texts; None: every text its own). With unique
    captions that is q's own image alone; where captions repeat (MAD's "3 - red - large" describes
    many images) every image the same caption was written for counts, as its own does, instead of
    R@1 being a draw among images with identical captions."""
    image_of_text = np.asarray(image_of_text).reshape(-1)
    group = np.arange(len(image_of_text)) if text_group is None else np.asarray(text_group).reshape(-1)
    has = torch.zeros(int(image_of_text.max()) + 1, int(group.max()) + 1, dtype=torch.bool)
    has[torch.as_tensor(image_of_text), torch.as_tensor(group)] = True
    return has[:, torch.as_tensor(group)]


def heldout_figures(clip: torch.Tensor, tevi: torch.Tensor, image_of_text: np.ndarray,
                    text_group: np.ndarray | None = None, k: int = HELDOUT_RERANK_K) -> dict:
    """R@1 both ways (percent) on held-out pairs: CLIP (`clip` (P, Q) cosines), TEVI alone
    (`tevi` (P, Q), exhaustive), and the rerank of CLIP's top k by the fused score at every α of
    ALPHAS ("by_alpha", keyed "1.0" .. "0.0"; "0.0" is the TEVI-rerank). Relevance: `relevance`
    (`image_of_text` (Q,), `text_group` (Q,) equal for equal caption texts)."""
    relevant = relevance(image_of_text, text_group)

    def r1(t2i: torch.Tensor, i2t: torch.Tensor) -> dict:
        """R@1 of orders whose first row is each query's top hit (t2i: per text, i2t: per image).
        (`vlctl.eval.metrics.recall_from_order`, which this layer may not import, at k = 1.)"""
        return {"t2i@1": 100.0 * relevant.gather(0, t2i[:1]).double().mean().item(),
                "i2t@1": 100.0 * relevant.T.gather(0, i2t[:1]).double().mean().item()}

    def best(scores: torch.Tensor) -> torch.Tensor:  # each column's top row; ties to the lower index, as a rerank's
        return scores.argmax(dim=0, keepdim=True)

    by_alpha = {f"{a:.1f}": r1(fused_order(clip, tevi, k, a), fused_order(clip.T, tevi.T, k, a)) for a in ALPHAS}
    return {"n_images": int(clip.shape[0]), "n_texts": int(clip.shape[1]), "k": min(k, int(clip.shape[0])),
            "clip": r1(best(clip), best(clip.T)), "tevi": r1(best(tevi), best(tevi.T)),
            "tevi_rerank": by_alpha["0.0"], "by_alpha": by_alpha, "criterion": CRITERION}


def choose_alpha(figures: dict) -> float:
    """The α of ALPHAS with the best mean of held-out t2i@1 and i2t@1, the larger α on a tie: α < 1
    only where TEVI beats CLIP's ranking on the held-out pairs."""
    return max(ALPHAS, key=lambda a: (sum(figures["by_alpha"][f"{a:.1f}"].values()), a))


def model_alpha(given: float | None, figures: dict | None) -> float:
    """A fitted model's α: the one given (`TeviConfig.alpha`), else chosen on its held-out figures,
    else 1 (nothing held out: CLIP's ranking)."""
    return given if given is not None else choose_alpha(figures) if figures else 1.0


def fusion_note(alpha: float, figures: dict | None, how: str) -> str:
    """The line a fused score prints: the held-out figures at `alpha` against CLIP's, and whether
    this is CLIP's ranking. `how`: "chosen" (by `choose_alpha`), "fixed at fit" or "given"."""
    said = "" if how == "chosen" else f" ({how})"
    measured = figures["by_alpha"].get(f"{alpha:.1f}") if figures and round(alpha, 1) == alpha else None
    clip = figures["clip"] if figures else None

    def versus(f: dict) -> str:
        return ", ".join(f"{d}@1 {f[f'{d}@1']:.1f} vs CLIP {clip[f'{d}@1']:.1f}" for d in ("t2i", "i2t"))

    if alpha == 1:
        if figures is None:
            return (f"TEVI: no held-out figures (fitted with holdout 0, on too few images to hold 2 out, or by an "
                    f"older vlctl), α = 1{said}: this is CLIP's ranking (--alpha below 1 mixes TEVI's score in)")
        why = "TEVI did not beat CLIP at any α < 1" if how == "chosen" else f"α = 1{said}"
        return f"TEVI-rerank on held-out pairs: {versus(figures['tevi_rerank'])}; {why}: this is CLIP's ranking"
    if measured is None:
        return f"TEVI: α = {alpha:g}{said}, not measured on held-out pairs"
    return f"TEVI on held-out pairs: {versus(measured)}, α = {alpha:g}{said}"

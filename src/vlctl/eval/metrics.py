"""Evaluation metrics for embedding spaces: retrieval, mAP, clustering, zero-shot, ROC AUC,
recall of rankings given as orders, attribute relevance, checklist accuracy, and how many hard
negatives a caption set puts in random batches (`in_batch_hard_negatives`).

Pure functions over numpy arrays (torch tensors are accepted and converted). Summary figures
(recall, mAP, accuracies, AUC) are returned as percentages in [0, 100] so that every number in a
vlctl report reads the same way; `positive_pair_cosine` returns raw cosines.

Every function validates its inputs and raises ValueError naming the offending argument, because
a silently broadcast shape mismatch in an evaluation produces a plausible but wrong number.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import rankdata

__all__ = [
    "caption_relevance",
    "checklist_accuracy",
    "cluster_accuracy",
    "in_batch_hard_negatives",
    "mean_average_precision",
    "positive_pair_cosine",
    "recall_at_k",
    "recall_at_k_relevant",
    "recall_from_order",
    "roc_auc",
    "zero_shot_accuracy",
    "zero_shot_predict",
]

# Elements per chunk of a score matrix processed at once. Each chunk creates a few temporaries
# (booleans, float copies) of this many elements, so 2**22 keeps peak extra memory around
# 50 MB even for 5k x 25k score matrices (which themselves take 500 MB in float32).
_CHUNK_ELEMENTS = 1 << 22

_TIES = ("stable", "optimistic", "pessimistic")


# --------------------------------------------------------------------------------------------
# input conversion and validation


def _to_numpy(x: Any) -> np.ndarray:
    """numpy view of `x`; torch tensors are detached and moved to the CPU (without importing torch)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        try:
            x = x.numpy()
        except TypeError:  # bfloat16 / other dtypes numpy lacks
            x = x.float().numpy()
    return np.asarray(x)


def _float_array(x: Any, name: str, ndim: int, shape_doc: str) -> np.ndarray:
    a = _to_numpy(x)
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array {shape_doc}, got shape {a.shape}")
    if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
        a = a.astype(np.float64)
    elif not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"{name}: expected numbers, got dtype {a.dtype}")
    return a


def _check_finite(a: np.ndarray, name: str) -> None:
    if np.isnan(a).any():
        raise ValueError(f"{name}: contains NaN")


def _labels(x: Any, name: str, n: int, n_doc: str) -> np.ndarray:
    a = _to_numpy(x)
    if a.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},) to match {n_doc}, got {a.shape}")
    return a


def _index_array(x: Any, name: str, n: int, n_doc: str, high: int, high_doc: str) -> np.ndarray:
    a = _labels(x, name, n, n_doc)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        if a.size and np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        elif a.size:
            raise ValueError(f"{name}: expected integer indices, got dtype {a.dtype}")
        else:
            a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() >= high):
        raise ValueError(f"{name}: indices must lie in [0, {high}) ({high_doc}), got range [{a.min()}, {a.max()}]")
    return a.astype(np.int64, copy=False)


def _rows_per_chunk(row_len: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, row_len))


def _normalize_rows(a: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    # eps keeps an all-zero row at zero (cosine 0 with everything) instead of producing NaN.
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), eps)


# --------------------------------------------------------------------------------------------
# retrieval


def _rank_of_targets(block: np.ndarray, target: np.ndarray, ties: str) -> np.ndarray:
    """0-based rank of column `target[r]` within row r of `block` (c, m), scores descending."""
    rows = np.arange(block.shape[0])
    s = block[rows, target][:, None]
    rank = (block > s).sum(axis=1)
    if ties == "stable":
        # Tied items ahead of the target are those with a smaller index (stable descending sort).
        before = np.arange(block.shape[1])[None, :] < target[:, None]
        rank += ((block == s) & before).sum(axis=1)
    elif ties == "pessimistic":
        rank += (block == s).sum(axis=1) - 1
    return rank


def _best_relevant_ranks(S: np.ndarray, relevant_rows, ties: str) -> tuple[np.ndarray, np.ndarray]:
    """For each row (query) of S (n_query, n_cand): the rank of its best-ranked relevant item.

    `relevant_rows(r0, r1)` returns the boolean relevance mask of rows r0:r1, so that no full
    (n_query, n_cand) mask needs to exist. Under every tie rule the best-ranked relevant item is
    the one with the highest score and, among equal ones, the lowest index, so one rank per
    query suffices. Returns (ranks, has_relevant); ranks of queries without relevant items are
    meaningless.
    """
    n_query, n_cand = S.shape
    ranks = np.empty(n_query, dtype=np.int64)
    has = np.empty(n_query, dtype=bool)
    step = _rows_per_chunk(n_cand)
    for r0 in range(0, n_query, step):
        block = np.asarray(S[r0 : r0 + step])  # for S = scores.T a strided view: no copy
        _check_finite(block, "scores")
        rel = relevant_rows(r0, r0 + block.shape[0])
        best = np.where(rel, block, -np.inf).max(axis=1)
        # argmax of a boolean returns the first True: the lowest-index relevant item with the
        # best score (comparing with `best`, rather than taking the argmax of the -inf-filled
        # copy, stays correct when a true score is itself -inf).
        target = np.argmax(rel & (block == best[:, None]), axis=1)
        ranks[r0 : r0 + block.shape[0]] = _rank_of_targets(block, target, ties)
        has[r0 : r0 + block.shape[0]] = rel.any(axis=1)
    return ranks, has


def _check_ks_ties(ks: Iterable[int], ties: str) -> list[int]:
    ks = list(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"ks: expected positive integers, got {ks}")
    if ties not in _TIES:
        raise ValueError(f"ties: expected one of {_TIES}, got {ties!r}")
    return ks


def _recall_dict(i2t: tuple[np.ndarray, np.ndarray], t2i: tuple[np.ndarray, np.ndarray], ks: list[int]) -> dict:
    out: dict[str, float] = {}
    for name, (rank, has) in (("i2t", i2t), ("t2i", t2i)):
        for k in ks:
            out[f"{name}@{k}"] = 100.0 * float(np.mean(rank[has] < k)) if has.any() else float("nan")
    return out


def recall_at_k(
    scores: Any,
    image_of_text: Any,
    ks: Iterable[int] = (1, 5, 10),
    *,
    ties: str = "stable",
) -> dict[str, float]:
    """Image-text retrieval recall at k, in percent.

    Args:
        scores: (n_images, n_texts) similarity of image i and text j (higher = more similar).
            Note the orientation: images are rows (CLIP_benchmark uses texts as rows).
        image_of_text: (n_texts,) int, `image_of_text[j]` is the index of the image text j
            describes. An image may have any number of texts (e.g. 5 COCO captions).
        ks: cut-offs; each k >= 1. k larger than the number of candidates is allowed (the
            candidate list is simply shorter than k, so every query is a hit: 100).
        ties: how items with exactly equal scores are ordered.
            "stable" (default): ties are broken by index, lower index first, i.e. the order of
            a stable descending sort. rank(j) = #{scores > s_j} + #{scores == s_j, index < j}.
            "optimistic": rank(j) = #{scores > s_j} (the target wins every tie).
            "pessimistic": rank(j) = #{scores >= s_j} - 1 (the target loses every tie).
            Ranks are 0-based; "top k" means rank < k.

    Returns:
        dict with keys "i2t@k" then "t2i@k" for every k, values in [0, 100]:

        - t2i@k (text -> image retrieval): the percentage of texts j whose own image
          `image_of_text[j]` has rank < k among all n_images images ranked by scores[:, j].
        - i2t@k (image -> text retrieval): the percentage of images i for which AT LEAST ONE of
          their texts {j : image_of_text[j] == i} has rank < k among all n_texts texts ranked by
          scores[i, :]. Images without any text are left out of the i2t average (they cannot be
          retrieved correctly and are distractors only; they still count as candidates in t2i).

    These are CLIP_benchmark's definitions (`zeroshot_retrieval.recall_at_k(...) > 0`). Without
    ties the numbers are identical. CLIP_benchmark takes the top k with `torch.topk`, whose
    order among equal scores is unspecified (on CPU it is neither index order nor reproducible
    across sizes), so with ties its numbers are not well defined; here ties follow `ties`.

    Memory: the score matrix is processed in chunks of rows/columns (a few tens of MB of
    temporaries), so 5k x 25k matrices (or memmaps) are fine.
    """
    S = _float_array(scores, "scores", 2, "(n_images, n_texts)")
    n_images, n_texts = S.shape
    if n_images == 0 or n_texts == 0:
        raise ValueError(f"scores: needs at least one image and one text, got shape {S.shape}")
    img = _index_array(
        image_of_text, "image_of_text", n_texts, "scores.shape[1] (n_texts)", n_images, "n_images = scores.shape[0]"
    )
    ks = _check_ks_ties(ks, ties)
    images = np.arange(n_images)
    t2i = _best_relevant_ranks(S.T, lambda a, b: images[None, :] == img[a:b, None], ties)
    i2t = _best_relevant_ranks(S, lambda a, b: img[None, :] == images[a:b, None], ties)
    return _recall_dict(i2t, t2i, ks)


def recall_at_k_relevant(
    scores: Any,
    relevant: Any,
    ks: Iterable[int] = (1, 5, 10),
    *,
    ties: str = "stable",
) -> dict[str, float]:
    """Retrieval recall at k when any number of images and texts are relevant to each other.

    Args:
        scores: (n_images, n_texts) similarities, higher = more similar.
        relevant: (n_images, n_texts) boolean; relevant[i, j] says text j is a correct match
            for image i (e.g. it names only attribute values image i has).
        ks: cut-offs, each k >= 1 (k above the number of candidates gives 100).
        ties: "stable" (default), "optimistic" or "pessimistic", defined as in `recall_at_k`.

    Returns:
        dict with keys "i2t@k" then "t2i@k", values in [0, 100]:

        - i2t@k: the percentage of images i for which at least one text j with relevant[i, j]
          has rank < k among all texts ranked by scores[i, :].
        - t2i@k: the percentage of texts j for which at least one image i with relevant[i, j]
          has rank < k among all images ranked by scores[:, j].

        Queries without any relevant item are left out of their average (NaN if none is left).
        With relevant[i, j] = (image_of_text[j] == i) this equals `recall_at_k`.
    """
    S = _float_array(scores, "scores", 2, "(n_images, n_texts)")
    if S.shape[0] == 0 or S.shape[1] == 0:
        raise ValueError(f"scores: needs at least one image and one text, got shape {S.shape}")
    R = _to_numpy(relevant)
    if R.shape != S.shape:
        raise ValueError(f"relevant: expected shape {S.shape} to match scores, got {R.shape}")
    if R.dtype != bool:
        raise ValueError(f"relevant: expected a boolean mask, got dtype {R.dtype}")
    ks = _check_ks_ties(ks, ties)
    t2i = _best_relevant_ranks(S.T, lambda a, b: R.T[a:b], ties)
    i2t = _best_relevant_ranks(S, lambda a, b: R[a:b], ties)
    return _recall_dict(i2t, t2i, ks)


def mean_average_precision(
    scores: Any,
    query_labels: Any,
    gallery_labels: Any,
    ignore: Any = None,
) -> float:
    """Mean average precision of ranking a gallery for each query, in percent.

    Args:
        scores: (n_query, n_gallery) similarities, higher = ranked first.
        query_labels: (n_query,) labels (any comparable values: ints, strings).
        gallery_labels: (n_gallery,) labels. Gallery item g is relevant to query q iff
            query_labels[q] == gallery_labels[g].
        ignore: optional boolean (n_query, n_gallery); True pairs are removed from the ranking
            entirely (neither relevant nor counted in precision), e.g. a query's own entry when
            the query set is the gallery.

    Returns:
        100 * mean over queries of AP(q), where, with R(q) the relevant non-ignored items and
        P(s) = #{relevant items with score >= s} / #{non-ignored items with score >= s},

            AP(q) = (1 / |R(q)|) * sum over r in R(q) of P(score of r),

        i.e. the mean over relevant items of the precision at their rank (non-interpolated AP).
        Items with equal scores share one rank position, the last of their group (precision is
        taken after the whole tied group), which is exactly sklearn's
        `average_precision_score(relevant, scores)` including its tie handling.

        Queries with no relevant (non-ignored) item have undefined AP and are excluded from the
        mean; if no query has one, the result is NaN.
    """
    S = _float_array(scores, "scores", 2, "(n_query, n_gallery)")
    nq, ng = S.shape
    ql = _labels(query_labels, "query_labels", nq, "scores.shape[0] (n_query)")
    gl = _labels(gallery_labels, "gallery_labels", ng, "scores.shape[1] (n_gallery)")
    if ignore is not None:
        ign = _to_numpy(ignore)
        if ign.shape != S.shape:
            raise ValueError(f"ignore: expected shape {S.shape} to match scores, got {ign.shape}")
        if ign.dtype != bool:
            raise ValueError(f"ignore: expected a boolean mask, got dtype {ign.dtype}")
    if ng == 0:
        return float("nan")

    ap_sum, n_valid = 0.0, 0
    positions = np.arange(ng)
    step = _rows_per_chunk(ng)
    for q0 in range(0, nq, step):
        block = np.asarray(S[q0 : q0 + step])
        _check_finite(block, "scores")
        rel = ql[q0 : q0 + step, None] == gl[None, :]
        valid = np.ones_like(rel) if ignore is None else ~ign[q0 : q0 + step]
        # Ignored pairs stay in the sort but add to neither the true-positive nor the item
        # counts below, so where they land (even inside a tie group) changes nothing.
        rel &= valid

        # Any order within a tie group gives the same counts at its end, so the sort need not be
        # stable (numpy's default sort is about 2x faster than its stable one here).
        order = np.argsort(-block, axis=1)
        s_sorted = np.take_along_axis(block, order, axis=1)
        rel_sorted = np.take_along_axis(rel, order, axis=1)
        tp = np.cumsum(rel_sorted, axis=1)
        seen = np.cumsum(np.take_along_axis(valid, order, axis=1), axis=1)

        # Index of the last item of each item's tie group: a right-to-left running minimum of
        # the positions where the score changes.
        is_last = np.ones_like(rel_sorted)
        is_last[:, :-1] = s_sorted[:, :-1] != s_sorted[:, 1:]
        group_end = np.minimum.accumulate(np.where(is_last, positions, ng)[:, ::-1], axis=1)[:, ::-1]

        tp_end = np.take_along_axis(tp, group_end, axis=1)
        seen_end = np.take_along_axis(seen, group_end, axis=1)
        precision = np.divide(tp_end, seen_end, out=np.zeros(tp_end.shape), where=seen_end > 0)
        n_rel = rel.sum(axis=1)
        has = n_rel > 0
        ap_sum += float(((precision * rel_sorted).sum(axis=1)[has] / n_rel[has]).sum())
        n_valid += int(has.sum())
    if n_valid == 0:
        return float("nan")
    return 100.0 * ap_sum / n_valid


# --------------------------------------------------------------------------------------------
# clustering, zero-shot classification, detection


def cluster_accuracy(y_true: Any, y_pred: Any) -> float:
    """Clustering accuracy under the best one-to-one matching of clusters to classes, in percent.

    Args:
        y_true: (n,) class labels, any values np.unique can sort (ints, strings).
        y_pred: (n,) cluster ids, any such values; need not share values with y_true.

    Returns:
        100 * max over one-to-one maps m from cluster ids to classes of
        (1/n) * #{i : m(y_pred[i]) == y_true[i]}.
        The map is found with the Hungarian algorithm (scipy.optimize.linear_sum_assignment)
        on the cluster x class contingency table. With more clusters than classes the surplus
        clusters match no class (all their items count as errors), and with fewer clusters some
        classes stay unmatched.
    """
    t = _to_numpy(y_true)
    if t.ndim != 1:
        raise ValueError(f"y_true: expected a 1-D array, got shape {t.shape}")
    p = _labels(y_pred, "y_pred", t.shape[0], "len(y_true)")
    if t.shape[0] == 0:
        raise ValueError("y_true: empty")
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    table = np.zeros((pi.max() + 1, ti.max() + 1), dtype=np.int64)
    np.add.at(table, (pi.ravel(), ti.ravel()), 1)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return 100.0 * float(table[rows, cols].sum()) / t.shape[0]


def _emb_pair(a: Any, a_name: str, a_doc: str, b: Any, b_name: str, b_doc: str) -> tuple[np.ndarray, np.ndarray]:
    A = _float_array(a, a_name, 2, a_doc)
    B = _float_array(b, b_name, 2, b_doc)
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"{b_name}: embedding dimension {B.shape[1]} does not match {a_name}'s {A.shape[1]}")
    _check_finite(A, a_name)
    _check_finite(B, b_name)
    return A, B


def zero_shot_predict(image_emb: Any, class_emb: Any) -> np.ndarray:
    """Zero-shot class of each image: argmax over classes of the cosine similarity.

    Args:
        image_emb: (n, d) image embeddings.
        class_emb: (c, d) one embedding per class (e.g. the normalised mean of its prompt
            embeddings).

    Returns:
        (n,) int64, pred[i] = argmax_c cos(image_emb[i], class_emb[c]). Both sides are
        L2-normalised here, so unnormalised inputs are fine; an all-zero row has cosine 0 with
        everything. Equal cosines resolve to the lowest class index (np.argmax).
    """
    X, C = _emb_pair(image_emb, "image_emb", "(n, d)", class_emb, "class_emb", "(n_classes, d)")
    if C.shape[0] == 0:
        raise ValueError("class_emb: needs at least one class")
    X, C = _normalize_rows(X), _normalize_rows(C)
    pred = np.empty(X.shape[0], dtype=np.int64)
    step = _rows_per_chunk(C.shape[0])
    for i0 in range(0, X.shape[0], step):
        pred[i0 : i0 + step] = np.argmax(X[i0 : i0 + step] @ C.T, axis=1)
    return pred


def zero_shot_accuracy(image_emb: Any, class_emb: Any, labels: Any) -> float:
    """Zero-shot top-1 accuracy, in percent.

    100 * (1/n) * #{i : zero_shot_predict(image_emb, class_emb)[i] == labels[i]}, where
    `labels` (n,) are class indices into the rows of `class_emb`.
    """
    X = _to_numpy(image_emb)
    C = _to_numpy(class_emb)
    n = X.shape[0] if X.ndim == 2 else -1
    n_classes = C.shape[0] if C.ndim == 2 else 0
    pred = zero_shot_predict(X, C)
    y = _index_array(labels, "labels", n, "image_emb.shape[0]", n_classes, "the number of classes = class_emb.shape[0]")
    if n == 0:
        raise ValueError("image_emb: no images")
    return 100.0 * float(np.mean(pred == y))


def roc_auc(scores: Any, positives: Any) -> float:
    """Area under the ROC curve, in percent, computed as the Mann-Whitney U statistic.

    Args:
        scores: (n,) scores, higher = more likely positive.
        positives: (n,) boolean (or 0/1) ground truth; both classes must be present.

    Returns:
        100 * (sum of the ranks of the positives - n_pos (n_pos + 1) / 2) / (n_pos * n_neg),
        with ranks 1..n of the ascending scores and tied scores given their average rank. This
        equals the probability that a random positive scores above a random negative, ties
        counting one half, and equals 100 * sklearn.metrics.roc_auc_score(positives, scores).
    """
    s = _float_array(scores, "scores", 1, "(n,)")
    y = _labels(positives, "positives", s.shape[0], "len(scores)")
    if y.dtype != bool:
        if not np.all(np.isin(y, (0, 1))):
            raise ValueError(f"positives: expected booleans or 0/1, got values {np.unique(y)[:5]}")
        y = y.astype(bool)
    _check_finite(s, "scores")
    n_pos = int(y.sum())
    n_neg = y.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"positives: ROC AUC needs both classes, got {n_pos} positives and {n_neg} negatives")
    ranks = rankdata(s)  # "average" method: ties share the mean of their ranks
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return 100.0 * float(u / (n_pos * n_neg))


def positive_pair_cosine(image_emb: Any, text_emb: Any) -> np.ndarray:
    """Row-wise cosine similarity of matched pairs: out[i] = cos(image_emb[i], text_emb[i]).

    Args:
        image_emb: (n, d).
        text_emb: (n, d), row i paired with image row i.

    Returns:
        (n,) float64 in [-1, 1]; an all-zero row gives 0.
    """
    A, B = _emb_pair(image_emb, "image_emb", "(n, d)", text_emb, "text_emb", "(n, d)")
    if A.shape[0] != B.shape[0]:
        raise ValueError(f"text_emb: {B.shape[0]} rows do not match image_emb's {A.shape[0]} (pairs are row-aligned)")
    A = _normalize_rows(A.astype(np.float64))
    B = _normalize_rows(B.astype(np.float64))
    return np.einsum("nd,nd->n", A, B)


# --------------------------------------------------------------------------------------------
# rankings given as orders, attribute relevance, checklist accuracy


def recall_from_order(order: Any, relevant: Any, ks: Iterable[int] = (1, 5, 10)) -> dict[str, float]:
    """Recall@k, in percent, of rankings given as orders (e.g. a rerank's output).

    Args:
        order: (m, n_queries) int, usually m = n_candidates; column q lists query q's candidates
            best first (column = query, as `TEVI.rerank` returns it).
        relevant: (n_candidates, n_queries) bool; relevant[c, q] marks candidate c correct for q.
        ks: cut-offs.

    Returns:
        {"@k": 100 * mean over queries q of [first(q) < k]} for every k, where first(q) is the
        smallest rank r with relevant[order[r, q], q] (m when there is none): a query hits at k
        when any of its first k candidates is relevant. There are no ties: the order is the
        ranking.
    """
    order, relevant = _to_numpy(order), _to_numpy(relevant)
    if order.ndim != 2 or relevant.ndim != 2 or order.shape[1] != relevant.shape[1]:
        raise ValueError(f"order, relevant: expected (m, n_queries) and (n_candidates, n_queries), got "
                         f"{order.shape} and {relevant.shape}")
    if relevant.dtype != bool:
        raise ValueError(f"relevant: expected a boolean mask, got dtype {relevant.dtype}")
    hits = np.take_along_axis(relevant, order, axis=0)  # (n_candidates, n_queries), in rank order
    first = np.where(hits.any(0), hits.argmax(0), len(order))  # rank of the first relevant one
    return {f"@{k}": float(100.0 * (first < k).mean()) for k in ks}


def caption_relevance(img_vals: Any, cap_vals: Any) -> np.ndarray:
    """Which captions are correct for which images, from attribute values.

    Args:
        img_vals: (n_images, n_attributes) int, the index of each image's value per attribute.
        cap_vals: (n_texts, n_attributes) int, the index of the value each caption names per
            attribute, -1 where the caption does not name that attribute.

    Returns:
        (n_images, n_texts) bool: relevant[i, j] = all over attributes c of
        (cap_vals[j, c] == -1 or cap_vals[j, c] == img_vals[i, c]), i.e. image i has every
        attribute value caption j names (a caption naming nothing fits every image).
    """
    img_vals, cap_vals = _to_numpy(img_vals), _to_numpy(cap_vals)
    if img_vals.ndim != 2 or cap_vals.ndim != 2 or img_vals.shape[1] != cap_vals.shape[1]:
        raise ValueError(f"img_vals, cap_vals: expected (n_images, n_attributes) and (n_texts, n_attributes), got "
                         f"{img_vals.shape} and {cap_vals.shape}")
    named = cap_vals >= 0
    rel = np.ones((len(img_vals), len(cap_vals)), dtype=bool)
    for c in range(cap_vals.shape[1]):
        rel &= ~named[None, :, c] | (img_vals[:, None, c] == cap_vals[None, :, c])
    return rel


def checklist_accuracy(scores: Any) -> float:
    """VL-CheckList-style accuracy, in percent.

    Args:
        scores: (n, 2) [score of the positive text, score of the negative text] per item (e.g.
            cos(image, positive), cos(image, negative): `vlctl.eval.checklist.checklist_scores`).

    Returns:
        100 * mean over items of [scores[i, 0] > scores[i, 1]] (strictly: a tie is a miss); NaN
        for no items.
    """
    scores = _to_numpy(scores)
    if scores.ndim != 2 or scores.shape[1] != 2:
        raise ValueError(f"scores: expected (n, 2) [positive, negative] scores, got shape {scores.shape}")
    return 100.0 * float((scores[:, 0] > scores[:, 1]).mean()) if len(scores) else float("nan")


def in_batch_hard_negatives(captions: Iterable[str], batch_size: int) -> dict[str, float]:
    """How many hard negatives plain contrastive training meets among its own batches.

    Two distinct captions (words split on whitespace, lower-cased) form a
    - "one_word" pair: the same number of words, differing at exactly one position ("a red cube"
      / "a blue cube": the one-word negative of a 3VL tree), or a
    - "rebound" pair: the same multiset of words in another order ("a red cube and a blue
      sphere" / "a blue cube and a red sphere": the same words bound differently).
    Identical captions form neither. With n captions shuffled into batches of B, a pair shares a
    batch with probability (B - 1) / (n - 1), so the expected count per batch is
    pairs * B (B - 1) / (n (n - 1)) (exact, no sampling).

    Returns {"n", "batch_size", "pairs", "one_word_pairs", "rebound_pairs", "one_word_per_batch",
    "rebound_per_batch", "one_word_share", "rebound_share"} (shares in percent of all pairs).
    """
    from collections import Counter

    words = [tuple(str(c).lower().split()) for c in captions]
    n = len(words)
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    counts = Counter(words)
    # one_word: distinct captions sharing every word but position j (a key per masked position)
    masked: Counter = Counter()
    for w, c in counts.items():
        for j in range(len(w)):
            masked[(j, w[:j] + w[j + 1:])] += c
    same_at_all_but = sum(c * (c - 1) // 2 for c in masked.values())
    identical = sum(c * (c - 1) // 2 for c in counts.values())
    # an identical pair shares all len(w) masked keys, a one-word pair exactly one, others none
    one_word = same_at_all_but - sum(len(w) * c * (c - 1) // 2 for w, c in counts.items())
    bags: Counter = Counter(tuple(sorted(w)) for w in words)
    rebound = sum(c * (c - 1) // 2 for c in bags.values()) - identical
    pairs = n * (n - 1) // 2
    b = min(batch_size, n)
    per_batch = b * (b - 1) / (n * (n - 1)) if n > 1 else 0.0
    return {"n": n, "batch_size": b, "pairs": pairs, "one_word_pairs": one_word, "rebound_pairs": rebound,
            "one_word_per_batch": one_word * per_batch, "rebound_per_batch": rebound * per_batch,
            "one_word_share": 100.0 * one_word / pairs if pairs else 0.0,
            "rebound_share": 100.0 * rebound / pairs if pairs else 0.0}

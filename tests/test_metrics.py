"""Tests for vlctl.eval.metrics: hand-computed references, ties, and cross-checks against
sklearn and a CLIP_benchmark-style torch.topk implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from vlctl.eval import metrics
from vlctl.eval.metrics import (
    cluster_accuracy,
    mean_average_precision,
    positive_pair_cosine,
    recall_at_k,
    recall_at_k_relevant,
    roc_auc,
    zero_shot_accuracy,
    zero_shot_predict,
)

# --------------------------------------------------------------------------------------------
# recall_at_k

# 3 images x 4 texts; texts 0 and 1 describe image 0, text 2 image 1, text 3 image 2.
S_SMALL = np.array(
    [
        [0.9, 0.1, 0.8, 0.0],
        [0.2, 0.3, 0.7, 0.1],
        [0.5, 0.6, 0.4, 0.2],
    ]
)
IMG_SMALL = np.array([0, 0, 1, 2])


def test_recall_hand_computed():
    # t2i ranks (column-wise): text0 -> 0, text1 -> 2, text2 -> 1, text3 -> 0.
    # i2t best own-text ranks (row-wise): image0 -> 0 (text0), image1 -> 0, image2 -> 3.
    r = recall_at_k(S_SMALL, IMG_SMALL, ks=(1, 2, 3, 4))
    assert r["t2i@1"] == pytest.approx(50.0)
    assert r["t2i@2"] == pytest.approx(75.0)
    assert r["t2i@3"] == pytest.approx(100.0)
    assert r["i2t@1"] == pytest.approx(200 / 3)
    assert r["i2t@3"] == pytest.approx(200 / 3)
    assert r["i2t@4"] == pytest.approx(100.0)
    assert list(r) == ["i2t@1", "i2t@2", "i2t@3", "i2t@4", "t2i@1", "t2i@2", "t2i@3", "t2i@4"]


def test_recall_k_larger_than_n_is_100():
    r = recall_at_k(S_SMALL, IMG_SMALL, ks=(10, 1000))
    assert r == {"i2t@10": 100.0, "i2t@1000": 100.0, "t2i@10": 100.0, "t2i@1000": 100.0}


def test_recall_multi_caption_image_any_text_counts():
    # Image 0 has texts 0..4, image 1 texts 5..9. Image 0's best own text is text 4, the
    # third-best text overall (behind texts 5 and 6 of image 1): a miss at k=1, 2, a hit at 3.
    img = np.repeat([0, 1], 5)
    S = np.zeros((2, 10))
    S[0] = [0.1, 0.2, 0.0, 0.05, 0.6, 0.9, 0.8, 0.3, 0.3, 0.3]
    S[1] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0]
    r = recall_at_k(S, img, ks=(1, 2, 3))
    assert (r["i2t@1"], r["i2t@2"], r["i2t@3"]) == (50.0, 50.0, 100.0)


def test_recall_ties():
    S = np.ones((2, 2))
    img = np.array([0, 1])
    # stable: index order among ties, so text 0 / image 0 win their tie, the others lose it.
    assert recall_at_k(S, img, ks=(1,)) == {"i2t@1": 50.0, "t2i@1": 50.0}
    assert recall_at_k(S, img, ks=(1,), ties="optimistic") == {"i2t@1": 100.0, "t2i@1": 100.0}
    assert recall_at_k(S, img, ks=(1,), ties="pessimistic") == {"i2t@1": 0.0, "t2i@1": 0.0}
    assert recall_at_k(S, img, ks=(2,), ties="pessimistic") == {"i2t@2": 100.0, "t2i@2": 100.0}


def test_recall_i2t_tie_with_own_texts_prefers_lowest_index():
    S = np.array([[0.5, 0.5, 0.5, 0.5]])
    img = np.array([0, 0, 0, 0])
    assert recall_at_k(S, img, ks=(1,))["i2t@1"] == 100.0
    # Image 0 owns texts 1 and 3; its four texts tie. Stable order is 0,1,2,3: text 1 has
    # rank 1. Image 1 owns texts 0 and 2; text 1 leads its row and texts 0, 2, 3 tie behind
    # it, so text 0 has rank 1. Both miss at k=1 and hit at k=2.
    S2 = np.array([[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, 0.0]])
    img2 = np.array([1, 0, 1, 0])
    r = recall_at_k(S2, img2, ks=(1, 2))
    assert (r["i2t@1"], r["i2t@2"]) == (0.0, 100.0)


def _reference_recall(S, img, k):
    """Loop reference: full stable descending sorts."""
    n_images, n_texts = S.shape
    t2i = np.mean([np.where(np.argsort(-S[:, j], kind="stable") == img[j])[0][0] < k for j in range(n_texts)])
    hits = []
    for i in range(n_images):
        own = np.where(img == i)[0]
        if len(own) == 0:
            continue
        order = np.argsort(-S[i], kind="stable")
        hits.append(np.isin(order[:k], own).any())
    return 100 * np.mean(hits), 100 * t2i


def _clip_benchmark_recall(S, img, k):
    """CLIP_benchmark's zeroshot_retrieval.recall_at_k, transcribed (texts as rows)."""
    scores = torch.as_tensor(S.T)
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(img)), torch.as_tensor(img)] = True

    def rec(sc, pos, k):
        nb_q, nb_c = sc.shape
        topk = torch.topk(sc, k, dim=1)[1]
        onehot = torch.nn.functional.one_hot(topk, num_classes=nb_c)
        tp = (onehot * pos.view(nb_q, 1, nb_c)).sum(dim=(1, 2))
        return tp / pos.sum(dim=1)

    t2i = (rec(scores, positive, k) > 0).float().mean().item() * 100
    i2t = (rec(scores.T, positive.T, k) > 0).float().mean().item() * 100
    return i2t, t2i


@pytest.mark.parametrize("seed", [0, 1])
def test_recall_matches_reference_with_ties_and_chunking(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n_images, n_texts = 13, 40
    img = rng.integers(0, n_images, n_texts)
    S = rng.integers(0, 4, (n_images, n_texts)).astype(np.float32)  # many ties
    # Tiny chunks so that the chunk loops run several times with ragged ends.
    monkeypatch.setattr(metrics, "_CHUNK_ELEMENTS", 50)
    r = recall_at_k(S, img, ks=(1, 3, 7))
    for k in (1, 3, 7):
        i2t, t2i = _reference_recall(S, img, k)
        assert r[f"i2t@{k}"] == pytest.approx(i2t)
        assert r[f"t2i@{k}"] == pytest.approx(t2i)


def test_recall_matches_clip_benchmark_without_ties():
    rng = np.random.default_rng(3)
    n_images = 20
    img = np.repeat(np.arange(n_images), 5)  # 5 captions per image, like COCO
    S = rng.standard_normal((n_images, len(img)))
    r = recall_at_k(torch.as_tensor(S), torch.as_tensor(img), ks=(1, 5, 10))
    for k in (1, 5, 10):
        i2t, t2i = _clip_benchmark_recall(S, img, k)
        assert r[f"i2t@{k}"] == pytest.approx(i2t, abs=1e-4)
        assert r[f"t2i@{k}"] == pytest.approx(t2i, abs=1e-4)


def test_recall_images_without_text_excluded_from_i2t_but_distract_t2i():
    # Image 2 has no text. Images 0 and 1 find their texts first (i2t@1 = 100; image 2 would
    # miss, were it counted). For text 1, image 2 outranks image 1: a t2i miss at k=1.
    S = np.array([[0.5, 0.1], [0.4, 0.8], [0.1, 0.9]])
    r = recall_at_k(S, [0, 1], ks=(1, 2))
    assert r == {"i2t@1": 100.0, "i2t@2": 100.0, "t2i@1": 50.0, "t2i@2": 100.0}


def test_recall_validation():
    with pytest.raises(ValueError, match="image_of_text"):
        recall_at_k(S_SMALL, [0, 0, 1])
    with pytest.raises(ValueError, match="image_of_text"):
        recall_at_k(S_SMALL, [0, 0, 1, 3])  # image index out of range
    with pytest.raises(ValueError, match="scores"):
        recall_at_k(S_SMALL[0], IMG_SMALL)
    with pytest.raises(ValueError, match="scores"):
        recall_at_k(np.where(S_SMALL > 0.85, np.nan, S_SMALL), IMG_SMALL)
    with pytest.raises(ValueError, match="ks"):
        recall_at_k(S_SMALL, IMG_SMALL, ks=(0,))
    with pytest.raises(ValueError, match="ties"):
        recall_at_k(S_SMALL, IMG_SMALL, ties="random")


def test_recall_relevant_hand_computed():
    # Image 0 matches texts 0 and 2, image 1 matches text 2 only, image 2 matches nothing.
    S = np.array(
        [
            [0.2, 0.9, 0.5],
            [0.3, 0.1, 0.8],
            [0.9, 0.0, 0.1],
        ]
    )
    rel = np.array([[True, False, True], [False, False, True], [False, False, False]])
    r = recall_at_k_relevant(S, rel, ks=(1, 2))
    # i2t: image 0's best relevant text is text 2 (rank 1), image 1's is text 2 (rank 0);
    # image 2 is left out. t2i: text 0 -> image 0 at rank 2 (miss at 2); text 1 has no
    # relevant image (left out); text 2 -> image 1 at rank 0.
    assert r == {"i2t@1": 50.0, "i2t@2": 100.0, "t2i@1": 50.0, "t2i@2": 50.0}
    assert np.isnan(recall_at_k_relevant(S, np.zeros((3, 3), bool), ks=(1,))["t2i@1"])


@pytest.mark.parametrize("seed", [0, 1])
def test_recall_relevant_equals_recall_for_one_image_per_text(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 9, 25)
    S = rng.integers(0, 3, (9, 25)).astype(np.float64)  # ties
    rel = np.arange(9)[:, None] == img[None, :]
    monkeypatch.setattr(metrics, "_CHUNK_ELEMENTS", 40)
    for ties in ("stable", "optimistic", "pessimistic"):
        assert recall_at_k_relevant(S, rel, (1, 2, 5), ties=ties) == recall_at_k(S, img, (1, 2, 5), ties=ties)


def test_recall_relevant_matches_loop_reference():
    rng = np.random.default_rng(5)
    S = rng.integers(0, 4, (11, 14)).astype(np.float32)
    rel = rng.random((11, 14)) < 0.15
    r = recall_at_k_relevant(S, rel, ks=(1, 3))
    for k in (1, 3):
        i2t = [
            np.isin(np.argsort(-S[i], kind="stable")[:k], np.where(rel[i])[0]).any() for i in range(11) if rel[i].any()
        ]
        t2i = [
            np.isin(np.argsort(-S[:, j], kind="stable")[:k], np.where(rel[:, j])[0]).any()
            for j in range(14)
            if rel[:, j].any()
        ]
        assert r[f"i2t@{k}"] == pytest.approx(100 * np.mean(i2t))
        assert r[f"t2i@{k}"] == pytest.approx(100 * np.mean(t2i))


def test_recall_relevant_validation():
    with pytest.raises(ValueError, match="relevant"):
        recall_at_k_relevant(np.zeros((2, 3)), np.zeros((3, 2), bool))
    with pytest.raises(ValueError, match="relevant"):
        recall_at_k_relevant(np.zeros((2, 3)), np.zeros((2, 3)))


# --------------------------------------------------------------------------------------------
# mean_average_precision


def test_map_hand_computed():
    scores = np.array([[0.9, 0.8, 0.7, 0.1], [0.9, 0.8, 0.7, 0.1]])
    # query "a": relevant at ranks 1 and 3 -> (1/1 + 2/3) / 2; query "b": ranks 2, 4 -> 1/2.
    m = mean_average_precision(scores, ["a", "b"], ["a", "b", "a", "b"])
    assert m == pytest.approx(100 * ((1 + 2 / 3) / 2 + 0.5) / 2)


def test_map_ties_share_the_last_rank_of_their_group():
    # Items 0 (relevant) and 1 tie: precision for item 0 is taken after both, 1/2; item 2: 2/3.
    m = mean_average_precision([[0.5, 0.5, 0.1]], [0], [0, 1, 0])
    assert m == pytest.approx(100 * (0.5 + 2 / 3) / 2)
    assert m == pytest.approx(100 * average_precision_score([1, 0, 1], [0.5, 0.5, 0.1]))


def test_map_ignore_mask_removes_pairs():
    scores = np.array([[1.0, 0.2, 0.5]])
    labels_g = ["a", "a", "b"]
    # Without ignore: a(1.0) P=1, b, a(0.2) P=2/3.
    assert mean_average_precision(scores, ["a"], labels_g) == pytest.approx(100 * (1 + 2 / 3) / 2)
    # Ignoring the self match leaves b(0.5), a(0.2): AP = 1/2.
    ignore = np.array([[True, False, False]])
    assert mean_average_precision(scores, ["a"], labels_g, ignore=ignore) == pytest.approx(50.0)


def test_map_queries_without_relevant_items_are_excluded():
    scores = np.array([[0.9, 0.1], [0.3, 0.2]])
    # Query "z" has no relevant item: only query "a" (AP 1) counts.
    assert mean_average_precision(scores, ["a", "z"], ["a", "b"]) == pytest.approx(100.0)
    # A query whose only relevant item is ignored also has none.
    ignore = np.array([[False, False], [True, False]])
    assert mean_average_precision(scores, ["a", "a"], ["a", "b"], ignore=ignore) == pytest.approx(100.0)
    assert np.isnan(mean_average_precision(scores, ["y", "z"], ["a", "b"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_matches_sklearn(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    nq, ng = 17, 30
    ql = rng.integers(0, 4, nq)
    gl = rng.integers(0, 4, ng)
    scores = np.round(rng.standard_normal((nq, ng)), 1)  # rounding creates ties
    ignore = rng.random((nq, ng)) < 0.2
    monkeypatch.setattr(metrics, "_CHUNK_ELEMENTS", 70)
    aps = []
    for q in range(nq):
        keep = ~ignore[q]
        rel = gl[keep] == ql[q]
        if rel.any():
            aps.append(average_precision_score(rel, scores[q, keep]))
    assert mean_average_precision(scores, ql, gl, ignore=ignore) == pytest.approx(100 * np.mean(aps))
    aps = [average_precision_score(gl == ql[q], scores[q]) for q in range(nq) if (gl == ql[q]).any()]
    assert mean_average_precision(torch.as_tensor(scores), ql, gl) == pytest.approx(100 * np.mean(aps))


def test_map_validation():
    s = np.zeros((2, 3))
    with pytest.raises(ValueError, match="query_labels"):
        mean_average_precision(s, [0], [0, 1, 2])
    with pytest.raises(ValueError, match="gallery_labels"):
        mean_average_precision(s, [0, 1], [0, 1])
    with pytest.raises(ValueError, match="ignore"):
        mean_average_precision(s, [0, 1], [0, 1, 2], ignore=np.zeros((3, 2), bool))
    with pytest.raises(ValueError, match="ignore"):
        mean_average_precision(s, [0, 1], [0, 1, 2], ignore=np.zeros((2, 3)))


# --------------------------------------------------------------------------------------------
# cluster_accuracy


def test_cluster_accuracy_hand_computed():
    # Best map: cluster 1 -> class 0 (2), cluster 0 -> class 1 (2), cluster 2 -> class 2 (1).
    assert cluster_accuracy([0, 0, 1, 1, 2, 2], [1, 1, 0, 0, 0, 2]) == pytest.approx(500 / 6)
    assert cluster_accuracy([0, 1, 2], [2, 0, 1]) == pytest.approx(100.0)


def test_cluster_accuracy_strings_and_unequal_counts():
    # One cluster for two classes: it can match only one of them.
    assert cluster_accuracy(["cat", "cat", "dog"], [7, 7, 7]) == pytest.approx(200 / 3)
    # More clusters than classes: only one cluster maps to the single class.
    assert cluster_accuracy([5, 5, 5, 5], ["a", "b", "c", "c"]) == pytest.approx(50.0)
    assert cluster_accuracy(np.array(["x", "y", "y"]), torch.tensor([3, 9, 9])) == pytest.approx(100.0)


def test_cluster_accuracy_validation():
    with pytest.raises(ValueError, match="y_pred"):
        cluster_accuracy([0, 1, 2], [0, 1])
    with pytest.raises(ValueError, match="y_true"):
        cluster_accuracy([], [])


# --------------------------------------------------------------------------------------------
# zero-shot


def test_zero_shot_normalises_both_sides():
    classes = np.array([[10.0, 10.0], [0.0, 1.0]])
    img = np.array([[0.1, 1.0]])
    # A raw dot product would pick class 0 (11 vs 1); the cosine picks class 1 (0.77 vs 0.99).
    assert img @ classes.T @ [1, -1] > 0
    assert zero_shot_predict(img, classes).tolist() == [1]


def test_zero_shot_accuracy_hand_computed():
    img = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.1], [3.0, 0.1]])
    classes = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    assert zero_shot_predict(img, classes).tolist() == [0, 1, 1, 0]
    assert zero_shot_accuracy(img, classes, [0, 1, 0, 0]) == pytest.approx(75.0)


def test_zero_shot_validation():
    img = np.ones((3, 4))
    with pytest.raises(ValueError, match="class_emb"):
        zero_shot_predict(img, np.ones((2, 5)))
    with pytest.raises(ValueError, match="labels"):
        zero_shot_accuracy(img, np.ones((2, 4)), [0, 1])
    with pytest.raises(ValueError, match="labels"):
        zero_shot_accuracy(img, np.ones((2, 4)), [0, 1, 2])  # class 2 does not exist
    with pytest.raises(ValueError, match="image_emb"):
        zero_shot_predict(np.ones(4), np.ones((2, 4)))


# --------------------------------------------------------------------------------------------
# roc_auc


def test_roc_auc_hand_computed():
    # sklearn's documented example: AUC 0.75.
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(75.0)
    # A tie between a positive and a negative counts one half.
    assert roc_auc([0.5, 0.5], [True, False]) == pytest.approx(50.0)
    assert roc_auc([0.5, 0.5, 0.9], [True, False, False]) == pytest.approx(25.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_roc_auc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(200) < 0.3
    s = np.round(rng.standard_normal(200) + y, 1)  # ties
    assert roc_auc(torch.as_tensor(s), y) == pytest.approx(100 * roc_auc_score(y, s))


def test_roc_auc_validation():
    with pytest.raises(ValueError, match="positives"):
        roc_auc([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="positives"):
        roc_auc([0.1, 0.2], [1, 2])
    with pytest.raises(ValueError, match="positives"):
        roc_auc([0.1, 0.2, 0.3], [1, 0])


# --------------------------------------------------------------------------------------------
# positive_pair_cosine


def test_positive_pair_cosine():
    out = positive_pair_cosine([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0]], [[0.0, 1.0], [2.0, 2.0], [4.0, 3.0]])
    np.testing.assert_allclose(out, [0.0, 1.0, 0.96])
    out = positive_pair_cosine(torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16), torch.tensor([[-1.0, -2.0]]))
    np.testing.assert_allclose(out, [-1.0])


def test_positive_pair_cosine_validation():
    with pytest.raises(ValueError, match="text_emb"):
        positive_pair_cosine(np.ones((3, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="text_emb"):
        positive_pair_cosine(np.ones((3, 2)), np.ones((3, 4)))


# --------------------------------------------------------------------------------------------
# recall_from_order, caption_relevance, checklist_accuracy (and eval.checklist)


def test_recall_from_order_hand_computed():
    # 3 candidates x 2 queries; query 0 ranks 2, 0, 1 (relevant: 0 -> first hit at rank 1),
    # query 1 ranks 1, 2, 0 (relevant: none)
    order = np.array([[2, 1], [0, 2], [1, 0]])
    relevant = np.array([[True, False], [False, False], [False, False]])
    assert metrics.recall_from_order(order, relevant, ks=(1, 2, 3)) == {"@1": 0.0, "@2": 50.0, "@3": 50.0}
    with pytest.raises(ValueError, match="boolean"):
        metrics.recall_from_order(order, relevant.astype(int))
    with pytest.raises(ValueError, match="n_queries"):
        metrics.recall_from_order(order, relevant[:, :1])


def test_caption_relevance():
    img = np.array([[0, 1], [1, 1]])  # image 0: attribute values (0, 1); image 1: (1, 1)
    cap = np.array([[0, -1], [-1, 1], [1, 0], [-1, -1]])  # names a0=0 | a1=1 | a0=1, a1=0 | nothing
    want = np.array([[True, True, False, True], [False, True, False, True]])
    np.testing.assert_array_equal(metrics.caption_relevance(img, cap), want)
    with pytest.raises(ValueError, match="n_attributes"):
        metrics.caption_relevance(img, cap[:, :1])


def test_checklist_accuracy_and_scores():
    from vlctl.eval.checklist import checklist_scores

    assert metrics.checklist_accuracy(np.array([[0.5, 0.1], [0.2, 0.2], [0.1, 0.3], [0.9, 0.0]])) == 50.0
    assert np.isnan(metrics.checklist_accuracy(np.zeros((0, 2))))
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        metrics.checklist_accuracy(np.zeros((3, 3)))

    class Enc:  # unit vectors: images as given, texts by their first character
        def encode_images(self, x):
            return torch.as_tensor(x, dtype=torch.float32)

        def tokenize(self, texts):
            return list(texts)

        def encode_texts(self, tokens):
            return torch.tensor([{"a": [1.0, 0.0], "b": [0.0, 1.0]}[t[0]] for t in tokens])

    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    items = {"cat": [{"index": 0, "pos": "a", "neg": "b"}, {"index": 1, "pos": "a", "neg": "b"}]}
    scores = checklist_scores(Enc(), x, items)
    np.testing.assert_array_equal(scores["cat"], [[1.0, 0.0], [0.0, 1.0]])
    assert scores["cat"].dtype == np.float64 and metrics.checklist_accuracy(scores["cat"]) == 50.0


def test_in_batch_hard_negatives_counts_pairs_exactly():
    """One-word and rebound pairs against a brute-force count; expected per batch = pairs B(B-1)/(n(n-1))."""
    import itertools

    from vlctl.eval.metrics import in_batch_hard_negatives

    caps = ["a red cube", "a blue cube", "a red cube", "cube red a", "A red sphere and a blue cube",
            "a blue sphere and a red cube", "a blue sphere and a red cube", "x", "a red cube left of a ball"]
    r = in_batch_hard_negatives(caps, 4)
    words = [tuple(c.lower().split()) for c in caps]
    one = sum(a != b and len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
              for a, b in itertools.combinations(words, 2))
    reb = sum(a != b and sorted(a) == sorted(b) for a, b in itertools.combinations(words, 2))
    assert (r["one_word_pairs"], r["rebound_pairs"]) == (one, reb) == (2, 4)
    n = len(caps)
    assert r["pairs"] == n * (n - 1) // 2
    assert r["one_word_per_batch"] == pytest.approx(one * 4 * 3 / (n * (n - 1)))
    assert r["rebound_share"] == pytest.approx(100 * reb / r["pairs"])
    # the expectation matches shuffled batches (Monte Carlo, loose)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(3000):
        order = rng.permutation(n)
        batches = [order[i:i + 4] for i in range(0, n - n % 4, 4)]
        seen.append(np.mean([sum(words[a] != words[b] and sorted(words[a]) == sorted(words[b])
                                 for a, b in itertools.combinations(bt, 2)) for bt in batches]))
    assert np.mean(seen) == pytest.approx(r["rebound_per_batch"], rel=0.1)
    assert in_batch_hard_negatives([], 4)["one_word_per_batch"] == 0.0

"""ControlEmbed: a text-conditioned hypernetwork of affine maps over a frozen embedding space
(docs/methods.md §2).

A 3-layer MLP `H` takes the normalised text embedding t of an attribute *category* ("color")
and returns an affine map of the D-dim image space:

    W, b = H(t)          W (D, D), b (D,)
    v'   = W^T v + b     (column vectors; for a row vector q this is q W + b)

Parameterisations of W (all start exactly at W = I, b = 0, so training starts from the base
space): 'full' (W = I + Delta, Delta a free D x D output), 'lowrank' (W = I + U V^T, U and V
(D, r), so D = 768 stays small) and 'translation' (W = I, only b: the paper's ablation).

The output layer. Unfactored (head_rank 0), one Linear maps the hidden layer to the map's
hidden x (D^2 + D) parameters ('full'): 67M weights at D = 512, which every step reads and writes
with their two AdamW moments (300 steps took 146 s and 3.4 GB). Factored (head_rank k > 0), a
code c = Q h (Q: k x hidden, no bias) feeds P c + b (P: out x k): the maps then span a
(k + 1)-dim affine family, k independent maps (on a toy 4-category task k = 8 matched the
unfactored layer's mAP, k = 4 fell behind). Q starts random at the scale where an AdamW step on
P moves the map as far as one on the unfactored layer (`_code_scale`); P starts at zero, so
W = I still. head_rank None (default): unfactored up to 2^22 weights (D <= 127 at hidden 256,
every recipe's model), else k = 8.

Uses. Retrieval: only the query is transformed and scored against the untouched gallery,
`(q W + b) . g` (an asymmetric bilinear metric: the gallery index is never recomputed).
Clustering: k-means on `normalize(G W + b)`, one clustering per attribute. Composition:
`alpha (q W_a + b_a) + (1 - alpha) (q W_b + b_b)`. Zero-shot classification: cosine of the
transformed embedding with the subclass text embeddings.

Training (on cached embeddings, with the project's training loop; `vlctl.methods.controlembed.fit`,
also data-parallel under torchrun, and resumable from its checkpoint): every step is one episode of
ONE category, drawn class-balanced (m images of each of its subclasses). With q'_i the
transformed and g_j the frozen embeddings of the episode and y the subclass:

    L_SR = mean_i  -1/|P(i)| sum_{j in P(i)} log softmax_{k != i}(q'_i . g_k / tau)_j,
           P(i) = {j != i : y_j = y_i}                    (StableRep multi-positive; self masked)
    L_i2t = mean_i  -log softmax_c(q'_i . t_c / tau)_{y_i}          over the episode's subclasses c
    L_t2i = mean_c  -1/|I(c)| sum_{i in I(c)} log softmax_i(t_c . q'_i / tau)_i,  I(c) = {i : y_i = c}
    L = L_SR + omega (L_i2t + L_t2i)

t_c is the subclass's text embedding averaged over prompt templates (`prompt_ensemble`). The
paper writes the alignment terms with one text per image; with several images per subclass in a
batch that target is ambiguous, so we use one text per subclass and the multi-positive form on
the text side.

The text of a category goes through a *condition encoder*: by default the frozen
all-MiniLM-L6-v2 sentence embedding (bundled, offline), which also embeds paraphrases ("hue"
for "color") for the generalisation test; or embeddings the caller gives (`category_emb`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.artifacts import legacy_document, not_this_class
from vlctl.config import shorten
from vlctl.fsops import VlctlError
from vlctl.io import read_json
from vlctl.methods.base import Estimator, as_matrix, embedding_set
from vlctl.methods.controlembed.config import CONTROLEMBED_DATA_FIELDS, ControlEmbedConfig
from vlctl.methods.controlembed.fit import fit_hypernet
from vlctl.methods.controlembed.prompts import minilm_id, minilm_text_embeddings

__all__ = [
    "AffineHyperNet",
    "ControlEmbed",
    "UntrainedAttributeWarning",
    "kmeans_labels",
    "normalize_rows",
]

WEIGHTS_FILE = "controlembed.safetensors"
CONFIG_FILE = "config.json"


class UntrainedAttributeWarning(UserWarning):
    """A transform was asked for an attribute text the hypernetwork was not trained on."""


# --- the hypernetwork --------------------------------------------------------------------------


def _code_scale(hidden: int, k: int) -> float:
    """Q ~ U(-a, a) with a = sqrt(3 hidden) / k, so that ||Q h||_1 ~ ||h||_1 for a hidden vector h.

    An AdamW step moves every weight of the output layer by about lr with the sign of its gradient
    g_o h_j (resp. g_o c_j), so the map's parameter o moves by about lr ||h||_1 (resp. lr ||c||_1).
    With Q entries of variance a^2 / 3 = hidden / k^2, each c_j = Q_j . h has standard deviation
    ||h|| sqrt(hidden) / k, and ||c||_1 ~ k (0.8 ||h|| sqrt(hidden) / k) ~ ||h||_1 (h >= 0 with
    ||h||_1 ~ 0.8 sqrt(hidden) ||h||): the factored head trains the map at the unfactored one's pace.
    """
    return math.sqrt(3 * hidden) / k


class AffineHyperNet(nn.Module):
    """MLP (Linear, ReLU, Linear, ReLU, output): text embeddings (n, cond_dim) -> W (n, D, D), b (n, D).

    The output is one Linear(hidden, out_dim) (code_dim 0) or Linear(hidden, k, no bias) then
    Linear(k, out_dim) (module docstring). The last layer's weight is zero, so at initialisation
    W = I and b = 0 exactly. For 'lowrank' its bias gives V a fixed random start (U = 0): with
    U = V = 0 neither would ever get a gradient.
    """

    def __init__(self, cfg: ControlEmbedConfig, seed: int = 0):
        super().__init__()
        if cfg.embed_dim is None or cfg.cond_dim is None:
            raise VlctlError("AffineHyperNet: the config's embed_dim and cond_dim (from the data) are not set")
        self.cfg = cfg
        k = cfg.code_dim
        gen = torch.Generator().manual_seed(seed)
        # skip_init: every weight is set below; nn.Linear's default init of a (D^2 + D) x hidden
        # layer would cost a second (67M uniform draws at D = 512) and is overwritten.
        linear = functools.partial(torch.nn.utils.skip_init, nn.Linear)
        head = [linear(cfg.hidden, cfg.out_dim)] if k == 0 else [linear(cfg.hidden, k, bias=False),
                                                                 linear(k, cfg.out_dim)]
        self.mlp = nn.Sequential(
            linear(cfg.cond_dim, cfg.hidden), nn.ReLU(),
            linear(cfg.hidden, cfg.hidden), nn.ReLU(),
            *head,
        )
        with torch.no_grad():
            for layer in self.mlp[:3:2]:
                bound = layer.in_features**-0.5
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.zero_()
            out = self.mlp[-1]
            out.weight.zero_()
            out.bias.zero_()
            if cfg.parameterisation == "lowrank":
                d, r = cfg.embed_dim, cfg.rank
                out.bias[d * r : 2 * d * r] = torch.randn(d * r, generator=gen) * d**-0.5
            if k > 0:
                a = _code_scale(cfg.hidden, k)
                self.mlp[4].weight.uniform_(-a, a, generator=gen)

    def forward(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d, r, n = self.cfg.embed_dim, self.cfg.rank, cond.shape[0]
        out = self.mlp(F.normalize(cond, dim=-1))
        eye = torch.eye(d, dtype=out.dtype, device=out.device).expand(n, d, d)
        b = out[:, -d:]
        if self.cfg.parameterisation == "full":
            return eye + out[:, : d * d].view(n, d, d), b
        if self.cfg.parameterisation == "lowrank":
            u, v = out[:, : d * r].view(n, d, r), out[:, d * r : 2 * d * r].view(n, d, r)
            return eye + u @ v.transpose(1, 2), b
        return eye, b


# --- array helpers -------------------------------------------------------------------------------


def normalize_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(1e-12)


def kmeans_labels(x: Any, k: int, seed: int = 0, n_init: int = 1, threads: int | None = 1) -> np.ndarray:
    """k-means (scikit-learn, k-means++ init, `n_init` restarts) cluster ids (n,) of the rows of x (n, D).

    `threads` caps scikit-learn's OpenMP threads (None: its default). One thread by default: on a
    shared 2-core machine, 5,000 x 512 took 0.34 s with one thread and 4.1 s with two (measured).
    """
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    x = as_matrix(x, "embeddings")
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise VlctlError(f"k: must be a positive integer, got {k!r}")
    if k > len(x):
        raise VlctlError(f"k={k} is larger than the gallery ({len(x)} embeddings)")
    with threadpool_limits(threads):
        return KMeans(n_clusters=int(k), n_init=n_init, random_state=seed).fit_predict(x)


# --- the estimator -------------------------------------------------------------------------------


class ControlEmbed(Estimator):
    """ControlEmbed: `ControlEmbed(...).fit(store, labels)` or `.fit(emb, labels, encoder_id=...)`.

    Hyperparameters: `ControlEmbed.Config` (= `vlctl.methods.controlembed.config.ControlEmbedConfig`;
    embed_dim and cond_dim come from the data). Runtime options: progress, out_dir (the loop's run
    directory; temporary when None).

    Learned state (after fit/load): `hypernet_`, `config_`, `encoder_id_`, `embed_dim_`,
    `categories_` (trained category names), `subclasses_` {category: [subclass, ...]},
    `category_emb_` {category: (cond_dim,)}, `class_text_emb_` {category: (K, D)} (or None),
    `condition_id_` (which text encoder made the category embeddings), `final_loss_`.
    """

    Config = ControlEmbedConfig
    DATA_FIELDS = CONTROLEMBED_DATA_FIELDS
    WEIGHTS_FILE = WEIGHTS_FILE

    # -- fitting ---------------------------------------------------------------------------------

    def fit(
        self,
        source: Any,
        labels: Mapping[str, Sequence[Any]],
        *,
        encoder_id: str | None = None,
        class_text_emb: Mapping[str, Any] | None = None,
        category_emb: Mapping[str, Any] | None = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> ControlEmbed:
        """Train one hypernetwork for all categories of `labels`; returns self.

        source: the frozen image embeddings (normalised here): a store, or an (N, D) array from
            encoder `encoder_id`.
        labels: {category: (N,) subclass of each image, None where an image has no label in that
            category (it then sits out that category's episodes)}; every category needs >= 2
            subclasses and every subclass >= 2 images (a positive besides the image itself), or
            min_images_per_subclass drops the smaller subclasses.
        class_text_emb: {category: (K, D) text embedding of each of the labels' subclasses, rows in
            sorted subclass order; those of dropped subclasses are left out} (`prompt_ensemble`);
            required when align_weight > 0.
        category_emb: {category: (cond_dim,)}; default: MiniLM embeddings of the category names.
        checkpoint_every: write the training loop's checkpoint into `out_dir` every this many steps;
            resume: continue from it (refused for another config, encoder, data or number of
            ranks), with the same result as the uninterrupted fit.

        Under torchrun every rank calls fit and the episodes' anchors are split over the ranks
        (`vlctl.methods.controlembed.fit`): the one-process fit up to float rounding.
        """
        data = embedding_set(source, encoder_id=encoder_id)
        encoder_id = data.encoder_id
        x = normalize_rows(data.image)
        n, d = x.shape
        if not labels:
            raise VlctlError("labels: no categories given")
        categories = list(labels)
        subclasses, members, rows = {}, {}, {}
        for cat in categories:
            y = np.asarray(labels[cat])
            if y.shape != (n,):
                raise VlctlError(f"labels[{cat!r}]: expected shape ({n},) to match embeddings, got {y.shape}")
            # None = no label in this category (real datasets label images per category): such an
            # image takes no part in this category's episodes, and still in the others'.
            labelled = np.flatnonzero([v is not None for v in y]) if y.dtype == object else np.arange(n)
            if len(labelled) == 0:
                raise VlctlError(f"labels[{cat!r}]: no image has a label in this category")
            values, inverse, counts = np.unique(y[labelled].tolist() if y.dtype == object else y,
                                                return_inverse=True, return_counts=True)
            values = [v.item() if hasattr(v, "item") else v for v in values]
            if len(values) < 2:
                raise VlctlError(f"labels[{cat!r}]: category has a single subclass ({values}); "
                                 "retrieval and clustering by it are meaningless")
            kept = self._kept_subclasses(cat, values, counts)
            rows[cat] = kept, values
            subclasses[cat] = [values[k] for k in kept]
            members[cat] = [labelled[inverse == k] for k in kept]
        text = self._class_texts(class_text_emb, rows, d)
        if category_emb is None:
            cond, condition_id = minilm_text_embeddings(categories), minilm_id()
        else:
            missing = [c for c in categories if c not in category_emb]
            if missing:
                raise VlctlError(f"category_emb: no embedding for categories {missing}")
            cond = as_matrix(np.stack([np.asarray(category_emb[c], dtype=np.float32) for c in categories]),
                              "category_emb")
            condition_id = "given"

        cfg = self._resolve(embed_dim=d, cond_dim=cond.shape[1])
        cfg = dataclasses.replace(cfg, head_rank=cfg.code_dim)  # the saved config names the layer it built
        net = AffineHyperNet(cfg, seed=cfg.seed)
        final_loss = fit_hypernet(net, cfg, x, categories, members, cond, text, encoder_id=encoder_id,
                                  progress=self.progress, out_dir=self.out_dir, checkpoint_every=checkpoint_every,
                                  resume=resume)
        self._set_fitted(net.cpu().eval(), encoder_id, categories, subclasses,
                         dict(zip(categories, cond)), text, condition_id)
        self.final_loss_ = final_loss
        return self

    def _kept_subclasses(self, cat: str, values: list, counts: np.ndarray) -> np.ndarray:
        """Indices of the subclasses `values` (with `counts` images each) that category `cat` trains
        on: all, or with min_images_per_subclass those with that many images (a warning names the
        others). A subclass of one image is refused: it has no positive besides itself."""
        least = self.config.min_images_per_subclass
        kept = np.flatnonzero(counts >= least)
        if len(kept) < len(values):
            dropped = [f"{values[k]!r} ({counts[k]})" for k in np.flatnonzero(counts < least)]
            warnings.warn(f"labels[{cat!r}]: dropped {len(dropped)} of {len(values)} subclasses, those with fewer "
                          f"than {least} images (their count in brackets): {shorten(', '.join(dropped), 300)}; "
                          "their images sit out this category", stacklevel=3)
        if len(kept) < 2:
            raise VlctlError(f"labels[{cat!r}]: {len(kept)} of {len(values)} subclasses have at least {least} images "
                             f"({[values[k] for k in kept]}), and a category needs 2 (lower min_images_per_subclass, "
                             "the flag --min-images-per-subclass)")
        lonely = [values[k] for k in kept if counts[k] < 2]
        if lonely:
            raise VlctlError(f"labels[{cat!r}]: subclass {lonely[0]!r} has a single image; every subclass needs a "
                             "positive besides the image itself (min_images_per_subclass 2, the flag "
                             "--min-images-per-subclass 2, drops such subclasses)")
        return kept

    @staticmethod
    def _class_texts(class_text_emb, rows: dict, d: int) -> dict[str, np.ndarray] | None:
        """Each category's `class_text_emb` (one row per subclass of the labels), normalised, with the
        rows of the subclasses it trains on; `rows`: {category: (kept indices, every subclass)}."""
        if class_text_emb is None:
            return None
        out = {}
        for cat, (kept, values) in rows.items():
            if cat not in class_text_emb:
                raise VlctlError(f"class_text_emb: no subclass text embeddings for category {cat!r}")
            t = as_matrix(class_text_emb[cat], f"class_text_emb[{cat!r}]")
            if t.shape != (len(values), d):
                raise VlctlError(f"class_text_emb[{cat!r}]: expected shape ({len(values)}, {d}) (one row per "
                                 f"subclass, in sorted order {values}), got {t.shape}")
            out[cat] = normalize_rows(t[kept])
        return out

    def _set_fitted(self, net, encoder_id, categories, subclasses, category_emb, class_text_emb, condition_id):
        self.hypernet_ = net
        self.config_ = net.cfg
        self.encoder_id_ = encoder_id
        self.embed_dim_ = net.cfg.embed_dim
        self.categories_ = list(categories)
        self.subclasses_ = subclasses
        self.category_emb_ = category_emb
        self.class_text_emb_ = class_text_emb
        self.condition_id_ = condition_id
        self._affine_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _check_fitted(self) -> AffineHyperNet:
        if not hasattr(self, "hypernet_"):
            raise VlctlError("ControlEmbed is not fitted; call fit() or load() first")
        return self.hypernet_

    # -- using the maps ------------------------------------------------------------------------

    def affine(self, attribute: str, category_emb: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(W (D, D), b (D,)) for the attribute text; cached per text for trained categories and
        for texts embedded by the condition encoder. An attribute the model was not trained on
        gets a UntrainedAttributeWarning and still its transform (the hypernetwork generalises to
        paraphrases, not to unrelated attributes)."""
        net = self._check_fitted()
        if category_emb is None and attribute in self._affine_cache:
            return self._affine_cache[attribute]
        if attribute not in self.categories_:
            warnings.warn(f"attribute {attribute!r} was not trained on (trained: {self.categories_}); "
                          "applying the transform its text embedding gives", UntrainedAttributeWarning, stacklevel=2)
        if category_emb is not None:
            cond = np.asarray(category_emb, dtype=np.float32).reshape(1, -1)
        elif attribute in self.category_emb_:
            cond = np.asarray(self.category_emb_[attribute], dtype=np.float32)[None]
        elif self.condition_id_ == "given":
            raise VlctlError(f"attribute {attribute!r}: the model was fitted on given category embeddings; "
                             "pass category_emb for a new attribute text")
        else:
            if self.condition_id_ != minilm_id():
                raise VlctlError(f"attribute {attribute!r}: the model's category embeddings come from "
                                 f"{self.condition_id_!r}, but the installed MiniLM is {minilm_id()!r}")
            cond = minilm_text_embeddings([attribute])
        if cond.shape[1] != net.cfg.cond_dim:
            raise VlctlError(f"category_emb: dimension {cond.shape[1]}, the hypernetwork takes {net.cfg.cond_dim}")
        with torch.no_grad():
            w, b = net(torch.from_numpy(cond))
        out = (w[0].numpy().astype(np.float32), b[0].numpy().astype(np.float32))
        if category_emb is None:
            self._affine_cache[attribute] = out
        return out

    def _input(self, embeddings: Any, encoder_id: str | None, name: str = "embeddings") -> np.ndarray:
        self._check_fitted()
        if encoder_id is not None and encoder_id != self.encoder_id_:
            raise VlctlError(f"{name}: come from encoder {encoder_id!r}, but ControlEmbed was fitted on "
                             f"{self.encoder_id_!r}; maps of one space are meaningless in another")
        x = as_matrix(embeddings, name)
        if x.shape[1] != self.embed_dim_:
            raise VlctlError(f"{name}: dimension {x.shape[1]}, but ControlEmbed was fitted on dimension "
                             f"{self.embed_dim_} (encoder {self.encoder_id_!r})")
        return normalize_rows(x)

    def transform(self, embeddings: Any, attribute: str, *, encoder_id: str | None = None,
                  category_emb: Any = None) -> np.ndarray:
        """(n, D) -> (n, D): q W + b for each normalised row q (not renormalised)."""
        x = self._input(embeddings, encoder_id)
        w, b = self.affine(attribute, category_emb)
        return x @ w + b

    def compose(self, embeddings: Any, attribute_a: str, attribute_b: str, alpha: float = 0.5, *,
                encoder_id: str | None = None) -> np.ndarray:
        """Training-free composition: alpha (q W_a + b_a) + (1 - alpha) (q W_b + b_b), (n, D)."""
        if not 0 <= alpha <= 1:
            raise VlctlError(f"alpha: must lie in [0, 1], got {alpha}")
        x = self._input(embeddings, encoder_id)
        (wa, ba), (wb, bb) = self.affine(attribute_a), self.affine(attribute_b)
        return alpha * (x @ wa + ba) + (1 - alpha) * (x @ wb + bb)

    def search(self, query: Any, gallery: Any, attribute: str, k: int = 10, *,
               encoder_id: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Query mode: transform only the queries (n_q, D), score the untouched normalised gallery
        (N, D). Returns (indices (n_q, k), scores (n_q, k)), best first."""
        q = self.transform(query, attribute, encoder_id=encoder_id)
        g = self._input(gallery, encoder_id, "gallery")
        if not 1 <= k <= len(g):
            raise VlctlError(f"k={k} must lie in [1, {len(g)}] (the gallery size)")
        scores = q @ g.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return top, np.take_along_axis(scores, top, axis=1)

    def cluster(self, gallery: Any, attribute: str, k: int | None = None, *, seed: int = 0, n_init: int = 1,
                encoder_id: str | None = None) -> np.ndarray:
        """Global mode: k-means on normalize(G W + b); k defaults to the category's subclass count."""
        if k is None:
            if attribute not in self.subclasses_:
                raise VlctlError(f"attribute {attribute!r} was not trained on: give k (the number of clusters)")
            k = len(self.subclasses_[attribute])
        return kmeans_labels(normalize_rows(self.transform(gallery, attribute, encoder_id=encoder_id)), k, seed, n_init)

    def classify(self, embeddings: Any, attribute: str, *, encoder_id: str | None = None) -> list:
        """Text-based zero-shot classification of the transformed embeddings against the
        category's subclass text embeddings (fitted with class_text_emb): subclass per row, the
        argmax of the cosines (ties: the first subclass)."""
        if self.class_text_emb_ is None or attribute not in self.class_text_emb_:
            raise VlctlError(f"attribute {attribute!r}: no subclass text embeddings stored (fit with class_text_emb)")
        z = normalize_rows(self.transform(embeddings, attribute, encoder_id=encoder_id))
        pred = np.argmax(z @ normalize_rows(self.class_text_emb_[attribute]).T, axis=1)
        return [self.subclasses_[attribute][p] for p in pred]

    # -- files (vlctl.artifacts): config.json + controlembed.safetensors (hypernetwork, category
    # embeddings, subclass text embeddings)

    def _artifact_state(self):
        net = self._check_fitted()
        tensors = {f"hypernet.{k}": v for k, v in net.state_dict().items()}
        tensors["category_emb"] = torch.from_numpy(np.stack([self.category_emb_[c] for c in self.categories_]))
        for c, t in (self.class_text_emb_ or {}).items():
            tensors[f"class_text_emb.{c}"] = torch.from_numpy(np.ascontiguousarray(t))
        state = {"condition_id": self.condition_id_, "categories": self.categories_, "subclasses": self.subclasses_,
                 "has_class_text_emb": self.class_text_emb_ is not None, "final_loss": getattr(self, "final_loss_", None)}
        return tensors, state, None

    @classmethod
    def _from_artifact(cls, config, encoder_id, tensors, state, path, *, cfg_path):
        w_path = path / WEIGHTS_FILE
        try:
            categories, subclasses = list(state["categories"]), dict(state["subclasses"])
            condition_id, has_text = state["condition_id"], state["has_class_text_emb"]
        except (KeyError, TypeError, ValueError) as e:
            raise VlctlError(f"{cfg_path}: corrupt ControlEmbed config (missing or bad field {e})") from None
        net = AffineHyperNet(config)
        state_dict = {k.removeprefix("hypernet."): v for k, v in tensors.items() if k.startswith("hypernet.")}
        expected = net.state_dict()
        bad = sorted(set(expected) ^ set(state_dict)) + [
            f"{k} {list(state_dict[k].shape)} vs {list(expected[k].shape)}"
            for k in sorted(set(expected) & set(state_dict)) if state_dict[k].shape != expected[k].shape
        ]
        cond = tensors.get("category_emb")
        if cond is None or tuple(cond.shape) != (len(categories), config.cond_dim):
            bad.append(f"category_emb {None if cond is None else list(cond.shape)} vs "
                       f"{[len(categories), config.cond_dim]}")
        text = None
        if has_text:
            text = {c: tensors.get(f"class_text_emb.{c}") for c in categories}
            bad += [f"class_text_emb.{c}" for c, t in text.items()
                    if t is None or tuple(t.shape) != (len(subclasses.get(c, [])), config.embed_dim)]
        if bad:
            raise VlctlError(f"{w_path}: weights do not match {cfg_path}: {bad}")
        net.load_state_dict(state_dict)
        est = cls(dataclasses.replace(config, embed_dim=None, cond_dim=None))
        est._set_fitted(net.eval(), encoder_id, categories, subclasses,
                        {c: cond[i].numpy() for i, c in enumerate(categories)},
                        {c: t.numpy() for c, t in text.items()} if text is not None else None, condition_id)
        est.final_loss_ = state.get("final_loss")
        return est

    @classmethod
    def _legacy_document(cls, path: Path):
        # vlctl 0.1: config.json {"method": "controlembed", "config": hypernetwork, "encoder_id",
        # "condition_id", "categories", "subclasses", "has_class_text_emb", "training", "final_loss"};
        # its output layer is the unfactored one (head_rank 0).
        cfg_path = path / CONFIG_FILE
        if not cfg_path.is_file():
            return None
        meta = read_json(cfg_path, "ControlEmbed config")
        if not isinstance(meta, dict) or meta.get("method") != "controlembed":
            raise not_this_class(cls, cfg_path)
        try:
            names = {f.name for f in dataclasses.fields(cls.Config)}
            training = {k: v for k, v in dict(meta["training"]).items() if k in names}
            state = {k: meta[k] for k in ("condition_id", "categories", "subclasses", "has_class_text_emb")}
            return legacy_document(cls, cfg_path, {**meta["config"], **training, "head_rank": 0}, meta["encoder_id"],
                                   {**state, "final_loss": meta.get("final_loss")})
        except (KeyError, TypeError, ValueError) as e:
            raise VlctlError(f"{cfg_path}: corrupt ControlEmbed config (missing or bad field {e})") from None


"""TEVI (docs/methods.md §1.3): text-conditioned editing of image embeddings through SAE latents.

A frozen SAE codes each image embedding as sparse latents z (TopK). A caption q is mapped by a
3-layer ReLU MLP to a mask m_q = sigmoid(f_m(t_q)) over the latents; the edited embedding of
image p conditioned on q is e_{p|q} = W_D^T (z_p ⊙ m_q) + b_pre and the retrieval score is
cos(e_{p|q}, e_{t,q}). The mask is trained with InfoNCE, either with positive conditioning
(Eq. 10: image i edited by its own caption, against every text) or negative conditioning
(Eq. 11: every image of the batch edited by every text; `conditioned_scores` makes that exact
and cheap).

The scoring kernels (all pairs without an (n_images, n_texts, d) tensor, listed pairs, rerank)
are in `vlctl.methods.tevi.scoring`; this module holds the mask, its training and the estimator.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.artifacts import legacy_document, load_checked_state, read_weights
from vlctl.config import config_to_dict
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_safetensors, hash_state_dict, read_json
from vlctl.methods.base import Estimator, as_matrix, as_tensor, embedding_set, is_store_like
from vlctl.methods.tevi.config import TEVI_DATA_FIELDS, TeviConfig
from vlctl.methods.tevi.fusion import fusion_note, heldout_figures, holdout_split, model_alpha
from vlctl.methods.tevi.scoring import (
    Reranked,
    TopKCodes,
    conditioned_scores,
    fuse,
    pair_scores,
    rerank_conditioned,
)

__all__ = ["TEVI", "TeviMask", "edit"]


# --- the mask ----------------------------------------------------------------------------------

# Held-out images scored against all held-out captions to choose α: every pair is scored, so the cost is
# the square of their number; COCO's 10% holdout (11k images x 57k captions) took over 8 GB.
HELDOUT_SCORED_IMAGES = 2_000


class TeviMask(nn.Module):
    """f_m: text embedding (n, d) -> mask (n, d1) in [0, 1], a 3-layer ReLU MLP, plus the InfoNCE
    temperature it is trained with. The input is L2-normalised first: CLIP text embeddings are
    only meaningful up to scale. With `latent_groups` the MLP has one output per group and every
    latent of a group gets its group's value: the mask can keep or drop a category, never one
    value of it."""

    def __init__(self, cfg: TeviConfig):
        super().__init__()
        if cfg.d is None or cfg.n_latents is None:
            raise VlctlError("TeviMask: the config's d and n_latents (from the SAE) are not set")
        self.cfg = cfg
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d, cfg.hidden), nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.n_latents if cfg.latent_groups is None else max(cfg.latent_groups) + 1),
        )  # fmt: skip
        groups = torch.as_tensor(cfg.latent_groups if cfg.latent_groups is not None else [], dtype=torch.long)
        self.register_buffer("groups", groups, persistent=False)
        nn.init.constant_(self.mlp[-1].bias, cfg.mask_init_bias)
        self.logit_scale = nn.Parameter(torch.tensor(float(cfg.init_logit_scale)), requires_grad=cfg.learn_logit_scale)

    def forward(self, text_emb: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (n, d1). In eval mode, values below `mask_floor` are zeroed."""
        m = torch.sigmoid(self.mlp(F.normalize(text_emb, dim=-1)) / self.cfg.mask_temperature)
        if self.cfg.latent_groups is not None:
            m = m[:, self.groups]  # (n, G) -> (n, d1)
        if not self.training and self.cfg.mask_floor > 0:
            m = m * (m >= self.cfg.mask_floor)
        return m

    def scale(self) -> torch.Tensor:
        return self.logit_scale.clamp(0.0, math.log(100.0)).exp()


def edit(latents: torch.Tensor, masks: torch.Tensor, decoder: torch.Tensor, b_pre: torch.Tensor) -> torch.Tensor:
    """Edited embeddings, row by row: (n, d1), (n, d1), (d1, d), (d,) -> (n, d) = (z ⊙ m) W_D + b_pre."""
    return (latents * masks) @ decoder + b_pre


def warmup_steps(cfg: TeviConfig, n_pairs: int, loop_cfg: Any) -> int:
    """The loop's warmup: `cfg.warmup_steps` + `cfg.warmup_epochs` epochs of `n_pairs` pairs at the
    loop's batch size (one process)."""
    from vlctl.train.loop import steps_per_epoch

    return cfg.warmup_steps + cfg.warmup_epochs * steps_per_epoch(n_pairs, loop_cfg)


def with_partners(idx: np.ndarray, partners: np.ndarray) -> np.ndarray:
    """A batch's rows `idx` followed by the partners of its pairs (`partners[idx]`, -1 = none) that
    are not in it yet, each once, in ascending order: a pair twice in a batch would be its own
    false negative in the InfoNCE."""
    extra = partners[idx]
    return np.concatenate([idx, np.setdiff1d(extra[extra >= 0], idx)])


class _TeviTrainer(nn.Module):
    """What the training loop optimises: the mask (and optionally a text encoder) over a frozen SAE
    decoder. forward((latents, texts)) -> InfoNCE loss over the global batch."""

    def __init__(self, mask: TeviMask, decoder: torch.Tensor, b_pre: torch.Tensor, text_encoder: nn.Module | None):
        super().__init__()
        self.mask = mask
        self.text_encoder = text_encoder
        self.register_buffer("decoder", decoder.detach().clone())
        self.register_buffer("b_pre", b_pre.detach().clone())

    def forward(self, latents: torch.Tensor, texts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from vlctl.encoders.loss import all_gather_with_grad, clip_loss

        t = self.text_encoder(texts) if self.text_encoder is not None else texts  # (n, d)
        m = self.mask(t)  # (n, d1)
        s = self.mask.scale()
        mode = self.mask.cfg.conditioning
        loss = 0.0
        if mode in ("positive", "both"):
            e = edit(latents, m, self.decoder, self.b_pre)
            loss = loss + clip_loss(F.normalize(e, dim=-1), F.normalize(t, dim=-1), s)
        if mode in ("negative", "both"):
            # S[i, j] = cos(e_{i|j}, t_j): row i is image i against every text (the image->text
            # term), column i is text i against every image edited by text i (text->image).
            z, m_all, t_all = all_gather_with_grad(latents), all_gather_with_grad(m), all_gather_with_grad(t)
            S = s * conditioned_scores(z, m_all, self.decoder, self.b_pre, t_all, chunk_size=1024)
            target = torch.arange(S.shape[0], device=S.device)
            loss = loss + (F.cross_entropy(S, target) + F.cross_entropy(S.T, target)) / 2
        if mode == "both":
            loss = loss / 2
        if self.mask.cfg.mask_mass_coef > 0:
            loss = loss + self.mask.cfg.mask_mass_coef * m.mean()
        return loss, m.mean()


# --- the estimator -----------------------------------------------------------------------------

MASK_FILE = "mask.safetensors"
TEXT_ENCODER_FILE = "text_encoder.safetensors"
LEGACY_CONFIG_FILE = "tevi.json"  # vlctl 0.1 (now config.json)
SAE_DIR = "sae"


def _data_hash(x: torch.Tensor, captions: torch.Tensor, partners: np.ndarray | None, text_encoder: dict | None) -> str:
    """Content hash of the mask fit's data: image embeddings, captions (embeddings or the text
    encoder's inputs), partners, and the initial weights of a fine-tuned text encoder."""
    state = {"x": x, "captions": captions, **({"partners": torch.from_numpy(partners)} if partners is not None else {}),
             **{f"text_encoder.{k}": v for k, v in (text_encoder or {}).items()}}
    return hash_state_dict(state)


def _embeddings(x: Any, name: str, d: int | None = None) -> torch.Tensor:
    t = as_tensor(as_matrix(x, name))
    if d is not None and t.shape[1] != d:
        raise VlctlError(f"{name} have dimension {t.shape[1]}, but the SAE/mask was fitted on dimension {d}")
    return t


class TEVI(Estimator):
    """TEVI over a fitted SAE: `TEVI(conditioning="negative").fit(store, sae=sae)`, or
    `.fit(image_emb, text_emb, sae=sae)` with captions paired row by row.

    `sae` is a fitted `SparseAutoencoder` (learned or CG-SAE); it stays frozen. Hyperparameters:
    `TEVI.Config` (= `vlctl.methods.tevi.config.TeviConfig`; d and n_latents come from the SAE).
    Runtime options: progress, out_dir. Learned state: `mask_` (TeviMask), `config_`, `sae_`, `encoder_id_`, `text_encoder_`
    (when fine-tuned), `alpha_` (the rerank's fusion weight, `vlctl.methods.tevi.fusion`) and
    `heldout_` (R@1 on the held-out pairs; None with holdout 0).

    Text-encoder fine-tuning: pass `text_encoder` (a module mapping a batch of `texts` to (n, d)
    embeddings, e.g. a TinyCLIP text tower) and `texts` (its inputs, e.g. token ids) to `fit`;
    it trains at `text_lr` beside the mask. Without it the text embeddings are fixed inputs.
    """

    Config = TeviConfig
    # latent_groups comes from the SAE's latents (a CG-SAE's categories): passed in Python, no CLI flag.
    DATA_FIELDS = TEVI_DATA_FIELDS
    WEIGHTS_FILE = MASK_FILE

    def fit(
        self,
        source: Any,
        text_emb: Any = None,
        *,
        sae: Any = None,
        encoder_id: str | None = None,
        text_encoder: nn.Module | None = None,
        texts: Any = None,
        partners: Any = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> TEVI:
        """Train the mask on pairs (image i, caption i) of `source`: a store with captions, or an
        (n, d) image array with `text_emb` (n, d), fixed. Or the captions are `texts` (n, ...) run
        through `text_encoder`, which is then fine-tuned at `text_lr`. The embeddings' encoder
        (`encoder_id` with arrays; default: the SAE's) must be the SAE's. Returns self.

        `checkpoint_every` (steps) writes the training loop's checkpoint into `out_dir`; `resume`
        continues from it, refused when it was written for another config, encoder, SAE, data or
        initial text encoder, with the same result as the uninterrupted fit."""
        from vlctl.methods.sae.model import SparseAutoencoder
        from vlctl.train.config import LoopConfig
        from vlctl.train.loop import default_param_groups, train

        if isinstance(source, SparseAutoencoder):
            raise VlctlError("TEVI.fit: the first argument is the embeddings (a store or an array); pass the SAE as "
                             "sae=, e.g. fit(image_emb, text_emb, sae=sae)")
        if sae is None:
            raise VlctlError("TEVI.fit: pass the fitted SparseAutoencoder the mask acts on as sae=")
        if (checkpoint_every or resume) and self.out_dir is None:
            raise VlctlError("TEVI.fit: checkpoint_every / resume need out_dir (where the checkpoint lives)")
        sae_model = sae._check_fitted()
        if (text_encoder is None) != (texts is None) or (text_encoder is not None and text_emb is not None):
            raise VlctlError("fit: pass exactly one of text_emb (fixed captions) or text_encoder + texts (fine-tuned)")
        if encoder_id is None and not is_store_like(source):
            encoder_id = sae.encoder_id_
        data = embedding_set(source, encoder_id=encoder_id, text_emb=text_emb, paired=text_encoder is None,
                             name="image embeddings")
        if data.encoder_id != sae.encoder_id_:
            raise VlctlError(f"embeddings of encoder {data.encoder_id!r} cannot train a mask over an SAE fitted on "
                             f"{sae.encoder_id_!r}")
        d, d1 = sae_model.cfg.d, sae_model.cfg.n_latents
        x = _embeddings(data.image, "image embeddings", d)
        if text_encoder is None:
            captions = _embeddings(data.text, "text embeddings", d)
        else:
            captions = torch.as_tensor(texts)
        if len(captions) != len(x):
            raise VlctlError(f"fit: {len(x)} image embeddings but {len(captions)} captions; pair them row by row")
        if partners is not None:
            partners = np.asarray(partners)
            if partners.shape != (len(x),) or partners.dtype.kind not in "iu" or (partners >= len(x)).any() \
                    or (partners < -1).any():
                raise VlctlError(f"fit: partners must be ({len(x)},) row indices (-1 = none), got shape "
                                 f"{partners.shape}, dtype {partners.dtype}")

        cfg = self._resolve(d=d, n_latents=d1)  # TeviConfig refuses latent_groups of another length
        train_rows, held_rows = holdout_split(x.numpy(), cfg.holdout, cfg.seed)
        held_x, held_captions = x[held_rows], captions[held_rows]
        if len(held_rows):  # the mask never sees a held-out pair, nor a partner that is one
            x, captions = x[train_rows], captions[train_rows]
            if partners is not None:
                new_row = np.full(len(partners) + 1, -1, dtype=np.int64)  # last entry: partner -1 stays -1
                new_row[train_rows] = np.arange(len(train_rows))
                partners = new_row[partners[train_rows]]
        # The frozen SAE's codes, computed once and kept sparse (each row's k kept latents); each batch is
        # densified. Dense they are n x d1 floats: 566k COCO pairs x 16,384 latents = 37 GB at the paper's
        # size (the scale rehearsal's tevi-coco was killed for memory at 2,048 latents).
        code_idx, code_val = _sparse_codes(sae_model, x)
        torch.manual_seed(cfg.seed)
        mask = TeviMask(cfg)
        net = _TeviTrainer(mask, sae_model.W_D, sae_model.b_pre, text_encoder)
        run_config = {"tevi": config_to_dict(cfg), "encoder_id": sae.encoder_id_}
        if self.out_dir is not None:  # a checkpoint that outlives the fit: what a resume must find again
            # (the trainer's state holds the SAE decoder: resumed over another SAE it would be swapped)
            run_config.update(sae=hash_state_dict(sae_model.state_dict()), data=_data_hash(
                x, captions, partners, None if text_encoder is None else text_encoder.state_dict()))
        groups = default_param_groups(mask, cfg.weight_decay)
        if text_encoder is not None:
            groups.append({"params": [p for p in text_encoder.parameters() if p.requires_grad],
                           "lr": cfg.text_lr, "weight_decay": 0.0})

        def make_batch(idx: np.ndarray, epoch: int):
            if partners is not None:
                idx = with_partners(idx, partners)
            idx = torch.as_tensor(idx)
            return torch.zeros(len(idx), d1).scatter_(1, code_idx[idx].long(), code_val[idx]), captions[idx]

        def loss_fn(model: nn.Module, batch):
            loss, mean_mask = model(*batch)
            return loss, {"mask_mean": float(mean_mask.detach())}

        n = len(x)
        loop_cfg = LoopConfig(
            epochs=cfg.epochs, batch_size=min(cfg.batch_size, n), lr=cfg.lr, weight_decay=cfg.weight_decay,
            warmup_steps=cfg.warmup_steps, seed=cfg.seed, progress=self.progress, log_every=50,
            checkpoint_every=checkpoint_every,
        )  # fmt: skip
        if cfg.warmup_epochs:
            loop_cfg = dataclasses.replace(loop_cfg, warmup_steps=warmup_steps(cfg, n, loop_cfg))
        tmp = tempfile.TemporaryDirectory(prefix="vlctl-tevi-") if self.out_dir is None else None
        try:
            train(net, n_samples=n, make_batch=make_batch, loss_fn=loss_fn, cfg=loop_cfg,
                  out_dir=tmp.name if tmp else self.out_dir, param_groups=groups, device=cfg.device,
                  run_config=run_config, resume=resume)
        finally:
            if tmp is not None:
                tmp.cleanup()
        self.mask_ = mask.cpu().eval()
        self.config_ = cfg
        self.text_encoder_ = None if text_encoder is None else text_encoder.cpu().eval()
        self.sae_ = sae
        self.encoder_id_ = sae.encoder_id_
        self.heldout_ = self._measure(*_first_images(held_x, held_captions, HELDOUT_SCORED_IMAGES)) \
            if len(held_rows) else None
        self.alpha_ = model_alpha(cfg.alpha, self.heldout_)
        if self.heldout_:
            self.heldout_["fused"] = self.heldout_["by_alpha"].get(f"{self.alpha_:.1f}")
        return self

    @torch.no_grad()
    def _measure(self, x: torch.Tensor, captions: torch.Tensor) -> dict:
        """`heldout_figures` of held-out pairs (x[i], captions[i]), each distinct row of x one image
        and each distinct caption embedding one caption text."""
        images, image_of_text = np.unique(x.numpy(), axis=0, return_inverse=True)
        _, text_group = np.unique(captions.numpy(), axis=0, return_inverse=True)
        t = captions if self.text_encoder_ is None else self.text_encoder_(captions)
        clip = F.normalize(torch.as_tensor(images), dim=1) @ F.normalize(t, dim=1).T  # cosines, as a store's
        return heldout_figures(clip, self.scores(images, t), image_of_text.reshape(-1), text_group.reshape(-1))

    def fusion_note(self, alpha: float | None = None) -> str:
        """The line a fused score prints (`vlctl.methods.tevi.fusion.fusion_note`): at `alpha`, or
        at the model's own `alpha_` (chosen on the held-out pairs, or fixed at fit)."""
        self._check_fitted()
        how = "given" if alpha is not None else "fixed at fit" if self.config_.alpha is not None else "chosen"
        return fusion_note(self._alpha(alpha), getattr(self, "heldout_", None), how)

    def fusion(self, alpha: float | None = None) -> dict:
        """What a fused score reports: {"alpha", "heldout" (`heldout_`), "note" (`fusion_note`)}."""
        return {"alpha": self._alpha(alpha), "heldout": getattr(self, "heldout_", None), "note": self.fusion_note(alpha)}

    def _alpha(self, alpha: float | None) -> float:
        """The fusion weight a rerank uses: `alpha`, else the model's."""
        return self.alpha_ if alpha is None else alpha

    # -- inference

    def _check_fitted(self) -> TeviMask:
        if not hasattr(self, "mask_"):
            raise VlctlError("TEVI is not fitted; call fit() or load() first")
        return self.mask_

    @torch.no_grad()
    def masks(self, text_emb: Any) -> torch.Tensor:
        """(Q, d) text embeddings -> (Q, d1) masks."""
        mask = self._check_fitted()
        return mask(_embeddings(text_emb, "text embeddings", mask.cfg.d))

    @torch.no_grad()
    def edit(self, image_emb: Any, text_emb: Any) -> torch.Tensor:
        """Image i edited by text i: (n, d), (n, d) -> (n, d) (unnormalised)."""
        mask = self._check_fitted()
        x = _embeddings(image_emb, "image embeddings", mask.cfg.d)
        m = self.masks(text_emb)
        if len(m) != len(x):
            raise VlctlError(f"edit: {len(x)} images but {len(m)} texts; edit pairs them row by row")
        sae = self.sae_.model_
        return edit(sae.encode(x), m, sae.W_D, sae.b_pre)

    @torch.no_grad()
    def scores(self, image_emb: Any, text_emb: Any, chunk_size: int | tuple[int, int] | None = None) -> torch.Tensor:
        """(P, d), (Q, d) -> (P, Q) exact TEVI scores cos(e_{p|q}, t_q), via `conditioned_scores`."""
        mask = self._check_fitted()
        x = _embeddings(image_emb, "image embeddings", mask.cfg.d)
        t = _embeddings(text_emb, "text embeddings", mask.cfg.d)
        sae = self.sae_.model_
        return conditioned_scores(sae.encode(x), mask(t), sae.W_D, sae.b_pre, t, chunk_size=chunk_size, k=sae.cfg.k)

    @torch.no_grad()
    def rerank(self, base_scores: Any, image_emb: Any, text_emb: Any, k: int = 100, direction: str = "t2i",
               full_order: bool = False, alpha: float | None = None) -> Reranked:
        """Rank by `base_scores` (P, Q) (CLIP cosine), re-score the top k by α · base + (1 − α) · TEVI:
        `alpha` (0: TEVI alone, 1: the base order kept), default the model's `alpha_`.

        direction "t2i": per text (column), its top-k images are re-scored; `order` is (k, Q).
        direction "i2t": per image (row), its top-k texts are re-scored; `order` is (k, P), column
        p holding image p's texts. `full_order` extends `order` to every candidate. See
        `vlctl.methods.tevi.scoring.rerank`."""
        mask = self._check_fitted()
        x = _embeddings(image_emb, "image embeddings", mask.cfg.d)
        t = _embeddings(text_emb, "text embeddings", mask.cfg.d)
        sae = self.sae_.model_
        z, m = sae.encode(x), mask(t)
        base = torch.as_tensor(np.asarray(base_scores))
        return rerank_conditioned(base, k, z, m, sae.W_D, sae.b_pre, t, support=sae.cfg.k, full_order=full_order,
                                  direction=direction, alpha=self._alpha(alpha))

    @torch.no_grad()
    def encode_gallery(self, gallery: Any, batch_size: int = 4096) -> TopKCodes:
        """SAE codes of every gallery row as (indices, values), each (n, K), computed once so that
        reranking a query only gathers its candidates' codes (the SAE encoder is the costly
        part: d·d1 per row)."""
        self._check_fitted()
        gallery.check_encoder(self.encoder_id_)
        sae = self.sae_.model_
        idx, vals = [], []
        for i0 in range(0, len(gallery), batch_size):
            rows = np.arange(i0, min(i0 + batch_size, len(gallery)))
            z = sae.encode(_embeddings(gallery.vectors(rows), f"{gallery.path} embeddings", sae.cfg.d))
            top = z.topk(sae.cfg.k, dim=1)
            idx.append(top.indices)
            vals.append(top.values)
        d1 = sae.cfg.n_latents
        empty = torch.zeros(0, sae.cfg.k)
        return TopKCodes(torch.cat(idx) if idx else empty.long(), torch.cat(vals) if vals else empty, d1)

    def store_reranker(self, codes: TopKCodes | None = None,
                       alpha: float | None = None) -> Callable[[np.ndarray, np.ndarray, Any], np.ndarray]:
        """A `vlctl.embeddings.results.Reranker`: re-scores a store search's candidates by
        α · cosine + (1 − α) · TEVI (exact TEVI scores), the queries being text embeddings; `alpha`
        default the model's `alpha_` (1: the cosine, CLIP's ranking). Refuses a store of another
        encoder. `codes`: the store's SAE codes from `encode_gallery` (else encoded per query).
        The function's `fusion` is what to show with its results (`fusion`)."""
        mask = self._check_fitted()
        sae = self.sae_.model_
        a = self._alpha(alpha)

        @torch.no_grad()
        def rerank_fn(queries: np.ndarray, candidate_ids: np.ndarray, gallery: Any) -> np.ndarray:
            from vlctl.embeddings.results import exact_rerank

            gallery.check_encoder(self.encoder_id_)
            clip = exact_rerank(queries, candidate_ids, gallery)
            if a == 1:
                return clip
            ids = np.asarray(candidate_ids, dtype=np.int64)  # (q, c); -1 = no candidate
            valid = ids >= 0
            rows = np.unique(ids[valid])
            if codes is not None:
                if len(codes.indices) != len(gallery):
                    raise VlctlError(f"{gallery.path}: SAE codes cover {len(codes.indices)} rows, gallery has "
                                     f"{len(gallery)}; re-run encode_gallery after adding")
                r = torch.as_tensor(rows)
                z = torch.zeros(len(rows), codes.n_latents).scatter_(1, codes.indices[r], codes.values[r])
            else:
                z = sae.encode(_embeddings(gallery.vectors(rows), f"{gallery.path} embeddings", mask.cfg.d))
            t = _embeddings(queries, "query embeddings", mask.cfg.d)
            image_pos = np.searchsorted(rows, ids[valid])
            text_pos = np.nonzero(valid)[0]  # query of each valid candidate (row-major order)
            s = pair_scores(z, mask(t), sae.W_D, sae.b_pre, t, torch.as_tensor(image_pos), torch.as_tensor(text_pos),
                            support=sae.cfg.k)
            out = np.full(ids.shape, -np.inf, dtype=np.float32)
            out[valid] = fuse(clip[valid], s.numpy(), a)
            return out

        rerank_fn.fusion = self.fusion(alpha)
        return rerank_fn

    # -- files (vlctl.artifacts): config.json, mask.safetensors, sae/ (the frozen SAE) and, if
    # fine-tuned, text_encoder.safetensors

    def _artifact_state(self):
        mask = self._check_fitted()
        text_encoder = self.text_encoder_

        def write_extra(tmp: Path) -> None:
            self.sae_.save(tmp / SAE_DIR)
            if text_encoder is not None:
                atomic_save_safetensors(tmp / TEXT_ENCODER_FILE, dict(text_encoder.state_dict()))

        if not hasattr(self, "config_"):  # assembled by hand (mask_ set directly): nothing held out
            self.config_ = dataclasses.replace(self.config, **{f: getattr(mask.cfg, f) for f in self.DATA_FIELDS})
            self.alpha_, self.heldout_ = model_alpha(self.config_.alpha, None), None
        state = {"text_encoder_finetuned": text_encoder is not None, "alpha": self.alpha_, "heldout": self.heldout_}
        return dict(mask.state_dict()), state, write_extra

    @classmethod
    def load(cls, path: str | Path, encoder_id: str | None = None, text_encoder: nn.Module | None = None) -> TEVI:
        """Load a saved TEVI; refuse it if it was fitted on another encoder than `encoder_id`, or if
        its weights do not match its config. A fine-tuned text encoder is loaded into
        `text_encoder` (same architecture), which is then required."""
        return super().load(path, encoder_id, text_encoder=text_encoder)

    @classmethod
    def _from_artifact(cls, config, encoder_id, tensors, state, path, *, cfg_path, text_encoder=None):
        from vlctl.methods.sae.model import SparseAutoencoder

        sae = SparseAutoencoder.load(path / SAE_DIR, encoder_id=encoder_id)
        if (sae.config_.d, sae.config_.n_latents) != (config.d, config.n_latents):
            raise VlctlError(f"{cfg_path}: mask is for d={config.d}, d1={config.n_latents} but {path / SAE_DIR} has "
                             f"d={sae.config_.d}, d1={sae.config_.n_latents}")
        mask = TeviMask(config)
        load_checked_state(mask, tensors, path / MASK_FILE, cfg_path)
        est = cls(dataclasses.replace(config, d=None, n_latents=None))  # latent_groups stays: not from data
        est.mask_, est.config_, est.sae_, est.encoder_id_ = mask.eval(), config, sae, encoder_id
        est.text_encoder_ = None
        # A model saved before issue 41 has no held-out figures: CLIP's ranking unless an alpha is given.
        est.alpha_, est.heldout_ = state.get("alpha", 1.0), state.get("heldout")
        if state.get("text_encoder_finetuned"):
            if text_encoder is None:
                raise VlctlError(f"{path}: TEVI fine-tuned its text encoder; pass the same architecture as text_encoder")
            load_checked_state(text_encoder, read_weights(path / TEXT_ENCODER_FILE), path / TEXT_ENCODER_FILE, cfg_path)
            est.text_encoder_ = text_encoder.eval()
        return est

    @classmethod
    def _legacy_document(cls, path: Path):
        # vlctl 0.1: tevi.json {"config": mask config, "encoder_id", "training", "text_encoder_finetuned"}.
        cfg_path = path / LEGACY_CONFIG_FILE
        if not cfg_path.is_file():
            return None
        meta = read_json(cfg_path, "TEVI config")
        try:
            train_meta = {k: v for k, v in meta.get("training", {}).items()
                          if k in ("lr", "text_lr", "epochs", "batch_size", "seed")}
            return legacy_document(cls, cfg_path, {**meta["config"], **train_meta}, meta["encoder_id"],
                                   {"text_encoder_finetuned": bool(meta.get("text_encoder_finetuned"))})
        except (KeyError, TypeError, AttributeError) as e:
            raise VlctlError(f"{cfg_path}: corrupt TEVI config ({e!r})") from None


@torch.no_grad()
def _sparse_codes(model: nn.Module, x: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """The TopK SAE's codes of `x` as (n, k) int32 latent indices and (n, k) values, `chunk` rows at a
    time: neither the codes nor one pass's pre-activations are ever n x d1."""
    parts = [model.encode_topk(x[i:i + chunk]) for i in range(0, len(x), chunk)]
    return (torch.cat([p[0] for p in parts]).int() if parts else torch.zeros(0, model.cfg.k, dtype=torch.int32),
            torch.cat([p[1] for p in parts]) if parts else torch.zeros(0, model.cfg.k))


def _first_images(x: torch.Tensor, captions: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs (x[i], captions[i]) of the first `n` distinct images of x (rows equal in x are one
    image; np.unique's order), all their captions kept."""
    _, image = np.unique(x.numpy(), axis=0, return_inverse=True)
    keep = torch.as_tensor(image.reshape(-1) < n)
    return x[keep], captions[keep]

"""TopK sparse autoencoder over image embeddings (docs/methods.md §1.1; CG-SAE §1.2).

Follows OpenAI's `sparse_autoencoder/model.py` (Gao et al. 2025, "Scaling and evaluating sparse
autoencoders"):

    pre  = W_E^T (x - b_pre) + b_E                    (d1,)   pre-activations
    z    = ReLU(TopK(pre))                             (d1,)   at most k nonzeros
    x~   = W_D^T z + b_pre                             (d,)

W_E is (d, d1), W_D is (d1, d) with unit-norm rows (one latent direction per row). W_E starts as
W_D^T. Training keeps the decoder rows on the unit sphere: the gradient component parallel to
each row is removed before the optimizer step and the rows are renormalised after it.

Loss = normalised MSE + aux_coef * AuxK, where AuxK reconstructs the (detached) residual x - x~
from the top aux_k *dead* latents, so dead latents get a gradient towards useful directions.

CG-SAE (`concepts_fixed=True`): d1 = number of concepts, W_D fixed to the normalised concept text
embeddings (a buffer, never trained), b_pre fixed after its initialisation; only W_E and b_E train.

`SparseAutoencoder` is the estimator around the `TopKSAE` module (the contract of
`vlctl.methods.base`): `fit` runs the project's training loop (`vlctl.train.loop.train`),
`save`/`load` (`vlctl.artifacts`) write a directory with `sae.safetensors` + `config.json` that
records which encoder's embeddings the SAE was fitted on.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from vlctl.artifacts import legacy_document, load_checked_state, not_this_class
from vlctl.config import config_to_dict
from vlctl.fsops import VlctlError
from vlctl.io import read_json
from vlctl.methods.base import Estimator, as_matrix, as_tensor, embedding_set
from vlctl.methods.sae.config import SAE_DATA_FIELDS, TopKSAEConfig
from vlctl.methods.sae.kernels import picked_encode, sparse_decode
from vlctl.methods.sae.rows import Rows, column_mean, geometric_median, streamed_fvu
from vlctl.train.distributed import is_distributed

WEIGHTS_FILE = "sae.safetensors"
CONFIG_FILE = "config.json"


# --- metrics -----------------------------------------------------------------------------------


# --- the module --------------------------------------------------------------------------------


class SAEOutput(NamedTuple):
    loss: torch.Tensor  # () nmse + aux_coef * aux
    nmse: torch.Tensor  # () normalised reconstruction error of the batch
    aux: torch.Tensor  # () AuxK loss (0 when no latent is dead)
    x_hat: torch.Tensor  # (n, d)
    z: torch.Tensor  # (n, d1)


def _normalised_mse(target: torch.Tensor, pred: torch.Tensor, ddp: bool = False) -> torch.Tensor:
    """sum ||target - pred||^2 / sum ||target - mean(target)||^2 over the batch: the batch FVU.

    Dividing by the batch variance makes the loss scale-free (1 = predicting the batch mean), so
    lr and aux_coef mean the same for any embedding scale. The denominator carries no gradient.
    `ddp`: the batch is one rank's share of a global batch; the denominator is the global batch's
    variance and the numerator is scaled by the world size, so DDP's average of the ranks'
    gradients is the one-process gradient of the global batch (and the mean of the ranks' values
    its FVU).
    """
    sse = (target - pred).pow(2).sum()
    if not ddp:
        return sse / (target - target.mean(0)).pow(2).sum().detach().clamp_min(1e-12)
    with torch.no_grad():
        stats = torch.cat([target.sum(0), target.pow(2).sum().reshape(1), target.new_tensor([len(target)])])
        dist.all_reduce(stats)
        total, squares, n = stats[:-2], stats[-2], stats[-1]
        var = (squares - total.pow(2).sum() / n).clamp_min(1e-12)
    return sse * dist.get_world_size() / var


class TopKSAE(nn.Module):
    """TopK SAE. Buffers: `b_pre` is a parameter unless concepts_fixed; `W_D` likewise;
    `samples_since_fired` (d1,) counts training samples since each latent was last nonzero.

    Under DDP the counts are per rank (DDP broadcasts rank 0's buffers at each forward), so a
    latent counts as fired only when it fires on rank 0's shard: dead-latent detection is then
    slightly conservative, never wrong about a latent that fires nowhere."""

    def __init__(self, cfg: TopKSAEConfig, concept_emb: torch.Tensor | None = None, seed: int = 0):
        super().__init__()
        if cfg.d is None:
            raise VlctlError("TopKSAE: the config's d (embedding dimension) is not set")
        self.cfg = cfg
        d, d1 = cfg.d, cfg.n_latents
        if cfg.concepts_fixed or (cfg.concepts_init and concept_emb is not None):
            if concept_emb is None or tuple(concept_emb.shape) != (d1, d):
                got = None if concept_emb is None else tuple(concept_emb.shape)
                raise VlctlError(f"CG-SAE needs concept embeddings of shape ({d1}, {d}), got {got}")
            w_dec = concept_emb.detach().float().clone()
        else:
            w_dec = torch.randn(d1, d, generator=torch.Generator().manual_seed(seed))
        w_dec = w_dec / w_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
        if cfg.concepts_fixed:
            # Fixed directions: buffers are saved with the model but never seen by the optimizer.
            self.register_buffer("W_D", w_dec)
            self.register_buffer("b_pre", torch.zeros(d))
        else:
            self.W_D = nn.Parameter(w_dec)  # (d1, d)
            self.b_pre = nn.Parameter(torch.zeros(d))  # (d,)
        self.W_E = nn.Parameter(w_dec.T.clone())  # (d, d1): starts as the decoder's transpose
        self.b_E = nn.Parameter(torch.zeros(d1))  # (d1,)
        self.register_buffer("samples_since_fired", torch.zeros(d1, dtype=torch.long))

    # -- encode / decode

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (n, d1): W_E^T (x - b_pre) + b_E.

        Inference keeps the literal form (the scores TEVI and the shipped stages compute from these
        latents stay bit-identical to before); training's `picked_encode` folds b_pre into the bias."""
        return (x - self.b_pre) @ self.W_E + self.b_E

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (n, d1) with at most k nonzeros per row: ReLU(TopK(pre))."""
        return self._topk_relu(self.pre_activation(x), self.cfg.k)

    def encode_topk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, d) -> (indices, values), each (n, k): `encode`'s kept latents, without its dense output."""
        top = self.pre_activation(x).topk(self.cfg.k, dim=-1)
        return top.indices, F.relu(top.values)

    @staticmethod
    def _topk_relu(pre: torch.Tensor, k: int) -> torch.Tensor:
        # Keep the k largest pre-activations, ReLU them (a kept negative value becomes 0), zero the rest.
        top = pre.topk(k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, F.relu(top.values))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """(n, d1) -> (n, d): W_D^T z + b_pre."""
        return z @ self.W_D + self.b_pre

    # -- training

    @property
    def dead_mask(self) -> torch.Tensor:
        """(d1,) bool: latents that have not fired for more than `dead_after` training samples."""
        return self.samples_since_fired > self.cfg.dead_after

    @property
    def n_dead(self) -> int:
        return int(self.dead_mask.sum())

    def aux_loss(self, pre: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """AuxK: reconstruct `residual` (n, d), detached x - x~, from the top aux_k DEAD latents of
        `pre` (n, d1) -> () normalised MSE. Exactly 0 (and no gradient) when no latent is dead.

        Live latents are set to -inf before TopK so they can never be picked; if fewer than aux_k
        latents are dead the -inf picks become 0 after the ReLU. No b_pre: the residual has none.
        """
        dead = self.dead_mask
        n_aux = self._n_aux(dead)
        if n_aux == 0:
            return pre.new_zeros(())
        z_aux = self._topk_relu(pre.masked_fill(~dead, float("-inf")), n_aux)
        return _normalised_mse(residual, z_aux @ self.W_D)

    def _n_aux(self, dead: torch.Tensor) -> int:
        return min(self.cfg.aux_k, int(dead.sum())) if self.cfg.aux_k > 0 else 0

    def forward(self, x: torch.Tensor) -> SAEOutput:
        """(n, d) -> losses and reconstructions; in training mode also updates dead-latent counts.

        The same maths as `decode(encode(x))` and `aux_loss(pre_activation(x), ...)`, computed
        sparsely (`vlctl.methods.sae.kernels`): one dense GEMM for the pre-activations, then only
        the k (and aux_k) picked latents in the decodes and in every gradient. `z` comes back
        dense and detached (the losses carry the gradients)."""
        dead = self.dead_mask
        n_aux = self._n_aux(dead)
        picked = picked_encode(x, self.W_E, self.b_E, self.b_pre, self.cfg.k, dead, n_aux)
        codes = F.relu(picked.values)  # (n, k): a kept negative pre-activation becomes 0
        x_hat = sparse_decode(picked.indices, codes, self.W_D) + self.b_pre
        ddp = self.training and is_distributed()  # every rank's counts are equal, so every rank takes the same branches
        nmse = _normalised_mse(x, x_hat, ddp)
        if n_aux:
            # AuxK: the top n_aux dead latents reconstruct the detached residual (no b_pre).
            aux = _normalised_mse((x - x_hat).detach(), sparse_decode(picked.aux_indices, F.relu(picked.aux_values),
                                                                      self.W_D), ddp)
        else:
            aux = x.new_zeros(())
        with torch.no_grad():
            z = torch.zeros(len(x), self.W_E.shape[1], dtype=codes.dtype, device=codes.device)
            z.scatter_(1, picked.indices, codes)
            if self.training:
                fired = torch.zeros_like(dead).index_fill_(0, picked.indices[codes != 0], True)
                seen = x.shape[0]
                if ddp:  # fired on any rank, and the global batch's samples: the same counts on every rank
                    both = torch.cat([fired.long(), torch.tensor([seen], device=fired.device)])
                    dist.all_reduce(both)
                    fired, seen = both[:-1] > 0, int(both[-1])
                self.samples_since_fired += seen
                self.samples_since_fired[fired] = 0
        return SAEOutput(nmse + self.cfg.aux_coef * aux, nmse, aux, x_hat, z)

    @torch.no_grad()
    def resample_dead(self, x: torch.Tensor) -> int:
        """Re-initialise the dead latents from the batch x (n, d) -> how many were re-initialised.

        Each dead latent r gets the direction of the residual x - x~ of one of the inputs worst
        reconstructed (largest residual first, cycling when there are more dead latents than
        inputs): W_D[r] = that unit residual, W_E[:, r] = the same direction scaled to 0.2 x the
        mean norm of the live encoder columns (so it starts below the live latents' TopK values),
        b_E[r] = 0, and its not-fired count restarts. Anthropic's "resampling"; the optimizer's
        moments of these rows are left as they are (the loop owns the optimizer)."""
        dead = self.dead_mask.nonzero().flatten()
        if len(dead) == 0 or self.cfg.concepts_fixed:
            return 0
        residual = x - self.decode(self.encode(x))
        err = residual.norm(dim=1)
        worst = err.argsort(descending=True)[torch.arange(len(dead)) % len(x)]
        direction = residual[worst] / err[worst, None].clamp_min(1e-12)  # (n_dead, d)
        live = ~self.dead_mask
        enc_norm = self.W_E[:, live].norm(dim=0).mean() if live.any() else torch.tensor(1.0)
        self.W_D[dead] = direction
        self.W_E[:, dead] = 0.2 * enc_norm * direction.T
        self.b_E[dead] = 0.0
        self.samples_since_fired[dead] = 0
        return len(dead)

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Put every decoder row back on the unit sphere (after each optimizer step)."""
        self.W_D.div_(self.W_D.norm(dim=1, keepdim=True).clamp_min(1e-12))

    def _project(self, grad: torch.Tensor) -> torch.Tensor:
        # g_r <- g_r - (g_r . w_r / ||w_r||^2) w_r: an exact (idempotent) projection, so applying it
        # twice (hook + project_decoder_grad) changes nothing. Row dots by einsum and one addcmul:
        # no (d1, d) temporaries but the result (3x faster than the literal form, measured on 1 thread).
        w = self.W_D.detach()
        coef = torch.einsum("ij,ij->i", grad, w) / torch.linalg.vector_norm(w, dim=1).square().clamp_min(1e-24)
        return torch.addcmul(grad, w, coef[:, None], value=-1)

    @torch.no_grad()
    def project_decoder_grad(self) -> None:
        """Remove from W_D.grad the component parallel to each decoder row (before the step): the
        unit-norm constraint makes that component meaningless, and Adam would otherwise amplify it."""
        if isinstance(self.W_D, nn.Parameter) and self.W_D.grad is not None:
            self.W_D.grad.copy_(self._project(self.W_D.grad))


class FitLoss:
    """The `loss_fn` that `SparseAutoencoder.fit` hands the training loop: `(net, batch) -> (loss,
    metrics)` for one step (benchmarks/peers.py times this same step)."""

    def __init__(self, cfg: TopKSAEConfig):
        self.cfg, self.step = cfg, 0

    def __call__(self, net: nn.Module, batch: torch.Tensor):
        # The loop has no "after optimizer.step()" hook, so the renormalisation of the previous
        # step happens here, before the forward that uses the weights: the same sequence
        # (step, normalise, forward) as the reference, exactly. The final step's renormalisation
        # is done after the loop.
        sae = getattr(net, "module", net)
        if not self.cfg.concepts_fixed:
            sae.normalize_decoder()
        self.step += 1
        if self.cfg.resample_every and self.step % self.cfg.resample_every == 0:
            sae.resample_dead(batch)
        out = net(batch)
        return out.loss, {"nmse": float(out.nmse.detach()), "aux": float(out.aux.detach()), "n_dead": sae.n_dead}


# --- the estimator -----------------------------------------------------------------------------


def _as_tensor(x: Any, name: str = "embeddings") -> torch.Tensor:
    """Array-like (n, d) -> float32 tensor (`vlctl.methods.base.as_matrix`'s checks)."""
    return as_tensor(as_matrix(x, name))


class SparseAutoencoder(Estimator):
    """TopK SAE: `SparseAutoencoder(k=...).fit(store)` or `.fit(emb, encoder_id)`.

    Hyperparameters: `SparseAutoencoder.Config` (= `vlctl.methods.sae.config.TopKSAEConfig`; d
    comes from the data, concepts_fixed from `from_concepts`). Runtime options: progress, out_dir
    (the training loop's run directory; a temporary one when None). Learned state (after
    fit/load): `model_`, `config_` (the config with d), `b_pre_` (d,), `n_dead_`, `fvu_` (on the
    training embeddings), `encoder_id_`.
    """

    Config = TopKSAEConfig
    DATA_FIELDS = SAE_DATA_FIELDS
    WEIGHTS_FILE = WEIGHTS_FILE
    concept_emb: torch.Tensor | None = None  # CG-SAE: the (S, d) decoder rows, set by from_concepts

    @classmethod
    def from_concepts(cls, concept_text_emb: Any, center: bool = True, config: TopKSAEConfig | None = None,
                      fixed: bool = True, **kwargs) -> SparseAutoencoder:
        """CG-SAE: one latent per concept, decoder rows fixed to the normalised text embeddings
        `concept_text_emb` (S, d). Only the encoder (W_E, b_E) trains.

        fixed=False: the same start (decoder rows at the normalised, centred concept embeddings,
        W_E their transpose) but every weight trains (`concepts_init`): TEVI §4.2's learned SAE,
        "the setup from Sec. 3.3; however, we no longer fix the decoder weights".

        center: subtract the mean concept embedding before normalising (the default). CLIP's
        modality gap puts every text embedding on a large common offset that image embeddings do
        not share; b_pre already carries the images' centre, so the rows must carry only what
        distinguishes the concepts. Measured on MAD (TinyCLIP mad-quick, 26 concepts): un-centred
        rows reconstruct with FVU 0.72 and chance-level zero-shot accuracy, centred rows with FVU
        0.18 and the original accuracy. center=False is the paper's literal definition."""
        if "d_latent" in kwargs or "expansion" in kwargs:
            raise VlctlError("from_concepts: d_latent is the number of concepts; do not pass d_latent/expansion")
        concepts = _as_tensor(concept_text_emb, "concept embeddings")
        if center:
            if len(concepts) < 2:
                raise VlctlError("from_concepts: centring needs at least 2 concepts (or pass center=False)")
            concepts = concepts - concepts.mean(0)
        flags = {"concepts_fixed": True} if fixed else {"concepts_init": True}
        est = cls(config, d_latent=concepts.shape[0], **flags, **kwargs)
        est.concept_emb = concepts
        return est

    def fit(self, source: Any, encoder_id: str | None = None, *, checkpoint_every: int = 0,
            resume: bool = False) -> SparseAutoencoder:
        """Train on the image embeddings of `source` (a store, or an (n, d) array from encoder
        `encoder_id`); returns self. `checkpoint_every` (steps) writes the loop's checkpoint into
        `out_dir`; `resume` continues from it (refused for another config or data), with the same
        result as the uninterrupted fit."""
        if (checkpoint_every or resume) and self.out_dir is None:
            raise VlctlError("SparseAutoencoder.fit: checkpoint_every / resume need out_dir (where the checkpoint lives)")
        from vlctl.train.config import LoopConfig
        from vlctl.train.loop import train

        data = embedding_set(source, encoder_id=encoder_id, rows=True)
        encoder_id = data.encoder_id
        rows = Rows(data.image)  # a store's rows stream from its shards (`vlctl.methods.sae.rows`)
        n, d = rows.shape
        cfg = self._resolve(d=d)
        from_concepts = cfg.concepts_fixed or cfg.concepts_init
        if from_concepts and self.concept_emb is None:
            raise VlctlError("concepts_fixed / concepts_init: such an SAE is made with "
                             "SparseAutoencoder.from_concepts(concept_emb)")
        if from_concepts and self.concept_emb.shape[1] != d:
            raise VlctlError(f"concept embeddings have dim {self.concept_emb.shape[1]}, image embeddings {d}")
        model = TopKSAE(cfg, self.concept_emb if from_concepts else None, seed=cfg.seed)
        with torch.no_grad():
            if cfg.init_b_pre == "geometric_median":
                model.b_pre.copy_(geometric_median(rows).float())
            elif cfg.init_b_pre == "mean":
                model.b_pre.copy_(column_mean(rows))

        def make_batch(idx: np.ndarray, epoch: int) -> torch.Tensor:
            return rows.batch(idx)

        loss_fn = FitLoss(cfg)
        # Parallel-gradient removal as a tensor hook: it rewrites W_D's gradient during backward,
        # i.e. before the loop's optimizer.step() (and before clipping), exactly like
        # project_decoder_grad() called between backward and step.
        handle = None if cfg.concepts_fixed else model.W_D.register_hook(model._project)
        loop_cfg = LoopConfig(
            epochs=cfg.epochs,
            batch_size=min(cfg.batch_size, n),
            lr=cfg.lr,
            weight_decay=0.0,  # SAEs are trained without weight decay (OpenAI reference)
            betas=(0.9, 0.999),
            warmup_steps=cfg.warmup_steps,
            seed=cfg.seed,
            progress=self.progress,
            log_every=50,
            checkpoint_every=checkpoint_every,
        )
        tmp = tempfile.TemporaryDirectory(prefix="vlctl-sae-") if self.out_dir is None else None
        try:
            train(
                model,
                n_samples=n,
                make_batch=make_batch,
                loss_fn=loss_fn,
                cfg=loop_cfg,
                out_dir=tmp.name if tmp else self.out_dir,
                run_config={"sae": config_to_dict(cfg), "encoder_id": encoder_id},
                device=cfg.device,
                resume=resume,
            )
        finally:
            if handle is not None:
                handle.remove()
            if tmp is not None:
                tmp.cleanup()
        model.normalize_decoder()
        model.eval()
        self._set_fitted(model.cpu(), encoder_id)
        self.fvu_ = streamed_fvu(rows, self.reconstruct)
        return self

    def _set_fitted(self, model: TopKSAE, encoder_id: str) -> None:
        self.model_ = model
        self.config_ = model.cfg
        self.encoder_id_ = encoder_id
        self.b_pre_ = model.b_pre.detach()
        self.n_dead_ = model.n_dead

    def _check_fitted(self) -> TopKSAE:
        if not hasattr(self, "model_"):
            raise VlctlError("SparseAutoencoder is not fitted; call fit() or load() first")
        return self.model_

    def _input(self, x: Any, model: TopKSAE) -> torch.Tensor:
        x = _as_tensor(x)
        if x.shape[1] != model.cfg.d:
            raise VlctlError(f"embeddings have dimension {x.shape[1]}, but the SAE was fitted on dimension "
                             f"{model.cfg.d} (encoder {self.encoder_id_!r})")
        return x

    @torch.no_grad()
    def encode(self, x: Any) -> torch.Tensor:
        """(n, d) -> (n, d1) sparse latents (at most k nonzeros per row)."""
        model = self._check_fitted()
        return model.encode(self._input(x, model))

    @torch.no_grad()
    def decode(self, z: Any) -> torch.Tensor:
        """(n, d1) -> (n, d)."""
        return self._check_fitted().decode(torch.as_tensor(z).float())

    @torch.no_grad()
    def reconstruct(self, x: Any) -> torch.Tensor:
        """(n, d) -> (n, d): decode(encode(x))."""
        model = self._check_fitted()
        return model.decode(model.encode(self._input(x, model)))

    # -- what the latents mean (vlctl.methods.sae.describe; `vlctl inspect sae`)

    def describe(self, store: Any, vocabulary: Any = None, k: int = 16, *, n_names: int = 5, encoder: Any = None,
                 as_frame: bool = False):
        """Every latent named with text and shown with its top images: one dict per latent (latent,
        live, frequency, mean_activation, names [{name, cosine, margin, auc}], top_images,
        top_values), as `vlctl inspect sae` writes latents.jsonl; with as_frame=True a pandas
        DataFrame of those rows (as sklearn's fetch_* functions: explicit, so the type returned never
        depends on what is installed).

        store: a vlctl store of this SAE's encoder; its images are encoded in chunks, its captions
        give the vocabulary and the AUC check. vocabulary: more names (a list, or a file with one a
        line). encoder: the store's encoder (default: rebuilt from the store's spec). Sets
        `latent_names_` (each latent's top name) and `description_` (rows and summary, with the
        shuffled-decoder control), which `latents_of` reads."""
        from vlctl.methods.sae.describe import describe_store, read_vocabulary, store_encoder

        model = self._check_fitted()
        if as_frame:  # refused before the work, not after it
            try:
                import pandas as pd
            except ImportError:
                raise VlctlError("describe(as_frame=True) needs pandas (pip install pandas)") from None
        extra = read_vocabulary(vocabulary) if isinstance(vocabulary, (str, Path)) else list(vocabulary or ())
        encoder = store_encoder(store, encoder)
        desc = describe_store(model, self.encoder_id_, store, extra, encoder, k, n_names,
                              progress=self.progress)
        self.description_, self._encoder = desc, encoder
        self.latent_names_ = [r["names"][0]["name"] if r["names"] else None for r in desc.rows]
        return pd.DataFrame(desc.rows) if as_frame else desc.rows

    def latents_of(self, image: Any) -> list[dict]:
        """The latents active in one image, largest first: [{latent, value, name}]. `image` is an embedding
        (d,) of this SAE's encoder, or an image (file path, PIL image, uint8 array) embedded by the
        encoder of the last `describe`; names are those `describe` gave (None before it)."""
        from vlctl.methods.sae.describe import active_names

        model = self._check_fitted()
        if isinstance(image, (np.ndarray, torch.Tensor)) and image.ndim == 1:  # an embedding; images are 2-D or 3-D
            x = self._input(image[None], model)[0].numpy()
        else:
            encoder = getattr(self, "_encoder", None)
            if encoder is None:
                raise VlctlError("latents_of: pass an embedding (d,), or call describe(store) first so the SAE has "
                                 "its store's encoder to embed an image with")
            x = encoder.embed_images([image])[0]
        return active_names(model, x, getattr(self, "latent_names_", None))

    # -- files (vlctl.artifacts): config.json + sae.safetensors (the module's state dict)

    def _artifact_state(self):
        return dict(self._check_fitted().state_dict()), {"fvu": getattr(self, "fvu_", None), "n_dead": self.n_dead_}, None

    @classmethod
    def _from_artifact(cls, config, encoder_id, tensors, state, path, *, cfg_path):
        w_path = path / WEIGHTS_FILE
        concept = tensors.get("W_D") if config.concepts_fixed else None
        try:
            model = TopKSAE(config, concept)
        except VlctlError as e:
            raise VlctlError(f"{w_path}: weights do not match {cfg_path}: {e}") from None
        load_checked_state(model, tensors, w_path, cfg_path)
        model.eval()
        est = cls(dataclasses.replace(config, d=None))
        if config.concepts_fixed:
            est.concept_emb = model.W_D.clone()
        est._set_fitted(model, encoder_id)
        if state.get("fvu") is not None:
            est.fvu_ = float(state["fvu"])
        return est

    @classmethod
    def _legacy_document(cls, path: Path):
        # vlctl 0.1: config.json {"config": architecture, "encoder_id", "fvu", "n_dead", "training"}.
        cfg_path = path / CONFIG_FILE
        if not cfg_path.is_file():
            return None
        meta = read_json(cfg_path, "SAE config")
        if not isinstance(meta, dict) or "method" in meta or "n_dead" not in meta:
            raise not_this_class(cls, cfg_path)
        try:
            train_meta = {k: v for k, v in meta.get("training", {}).items()
                          if k in ("lr", "epochs", "batch_size", "seed")}
            return legacy_document(cls, cfg_path, {**meta["config"], **train_meta}, meta["encoder_id"],
                                   {"fvu": meta.get("fvu"), "n_dead": meta.get("n_dead")})
        except (KeyError, TypeError, AttributeError) as e:
            raise VlctlError(f"{cfg_path}: corrupt SAE config ({e!r})") from None

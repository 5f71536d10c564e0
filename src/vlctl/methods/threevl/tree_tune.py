"""3VL fine-tuning (docs/methods.md §3.2): the tree loss, the baselines' losses and `TreeTuner`.

The LoRA adapters it trains (`LoRALinear`, `add_lora`, peft adapters for OpenCLIP and Hugging Face
CLIP, the MiniLM backbone adapters of LiT TinyCLIPs, saving and loading them) are
`vlctl.methods.threevl.lora`.

Losses (image and text embeddings unit norm; s = the model's logit scale exp(t)):
- `L_contrast`: symmetric CLIP InfoNCE (`vlctl.encoders.loss.clip_loss`).
- `tree_loss`: for sample i and tree level l with candidates {P_il, N_il1..N_ilK} (mask for
  padding), CE_il = -log softmax_k(s cos(I_i, T_ilk))[positive]. Levels without a negative are
  ignored; per sample the valid levels are aggregated by "sum" (the paper, Eq. 2's L_tree) or
  "mean" (the authors' code); the batch loss is the mean over samples.
- `negclip_loss`: NegCLIP (Yuksekgonul et al. 2023): each caption's one hard negative is added to
  the text batch as extra columns of the image->text CE (n x 2n logits, missing negatives
  masked); text->image CE over the captions only; the mean of the two.
- 3VL: L = alpha L_tree + (1 - alpha) L_contrast (alpha = 0.5).

`TreeTuner(mode=...)` (the estimator contract of `vlctl.methods.base`) fine-tunes the LoRA
adapters of a TinyCLIP with the project's one training loop (`vlctl.train.loop.train`);
`pretrain_clip` trains the base TinyCLIP contrastively.

Trees are precomputed once (`tree_tensors`: padded token tensor (N, L, 1 + K, C) and mask
(N, L, 1 + K)).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vlctl.artifacts import legacy_document
from vlctl.config import config_to_dict
from vlctl.fsops import VlctlError
from vlctl.io import atomic_dir, atomic_save_safetensors, atomic_write_json, read_json
from vlctl.methods.base import Estimator
from vlctl.methods.threevl.config import REDUCTIONS, TreeTuneConfig
from vlctl.methods.threevl.lora import (
    ADAPTER_FORMAT,
    MINILM_LORA_INFO,
    add_lora,
    add_lora_lit,
    base_fingerprint,
    is_lit,
    load_adapters,
    load_minilm_lora,
    lora_parameters,
    merge_lora,
    minilm_lora_parameters,
    save_adapters,
    save_minilm_lora,
    tower_targets,
)

# --- losses --------------------------------------------------------------------------------------


def tree_loss(image_emb: torch.Tensor, tree_emb: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor | float,
              reduction: str = "sum") -> torch.Tensor:
    """3VL tree loss.

    image_emb (n, d), tree_emb (n, L, 1 + K, d) (candidate 0 = the level's positive), mask
    (n, L, 1 + K) bool (valid candidates). CE_il = logsumexp_k(s c_ilk) - s c_il0 over valid k;
    levels with no valid negative are ignored; per sample "sum" or "mean" over its valid levels
    (0 if none); mean over samples.
    """
    if reduction not in REDUCTIONS:
        raise VlctlError(f"tree_loss: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    logits = scale * torch.einsum("nd,nlkd->nlk", image_emb, tree_emb)
    logits = logits.masked_fill(~mask, float("-inf"))
    level_ok = mask[..., 0] & mask[..., 1:].any(dim=-1)  # (n, L)
    ce = torch.logsumexp(logits, dim=-1) - logits[..., 0]
    ce = torch.where(level_ok, ce, torch.zeros_like(ce))
    per_sample = ce.sum(dim=1)
    if reduction == "mean":
        per_sample = per_sample / level_ok.sum(dim=1).clamp(min=1)
    return per_sample.mean()


def negclip_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, neg_emb: torch.Tensor, neg_mask: torch.Tensor,
                 scale: torch.Tensor | float) -> torch.Tensor:
    """NegCLIP: image->text CE over [captions; hard negatives] (n x 2n, masked where a caption has
    no negative), text->image CE over the captions (n x n); their mean.
    image_emb, text_emb, neg_emb (n, d); neg_mask (n,) bool."""
    n = image_emb.shape[0]
    texts = torch.cat([text_emb, neg_emb], dim=0)
    i2t = scale * image_emb @ texts.t()
    col_ok = torch.cat([torch.ones(n, dtype=torch.bool, device=neg_mask.device), neg_mask])
    i2t = i2t.masked_fill(~col_ok[None, :], float("-inf"))
    t2i = scale * text_emb @ image_emb.t()
    labels = torch.arange(n, device=image_emb.device)
    return 0.5 * (F.cross_entropy(i2t, labels) + F.cross_entropy(t2i, labels))


def contrastive_loss(image_emb: torch.Tensor, text_emb: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric CLIP InfoNCE (see loss.clip_loss)."""
    from vlctl.encoders.loss import clip_loss

    return clip_loss(image_emb, text_emb, scale)


# --- trees as tensors ----------------------------------------------------------------------------


def tree_tensors(trees: Sequence[list[dict]], tokenize, max_levels: int = 8, max_negatives: int = 8,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad/flatten caption trees into (tokens (N, L, 1 + K, C) int64, mask (N, L, 1 + K) bool).

    `trees[i]` is TreeGenerator.tree(caption_i): levels coarse -> fine, each {"positive",
    "negatives"}. Levels beyond `max_levels` keep the finest ones (the last level is the
    caption); more than `max_negatives` negatives are subsampled (seeded by (seed, i, level)).
    0 = no cap (the paper's trees). Texts are tokenized once (unique texts).
    """
    max_negatives = max_negatives or np.iinfo(np.int64).max
    levels = [list(t)[-max_levels:] if max_levels else list(t) for t in trees]
    n_l = max((len(t) for t in levels), default=1) or 1
    n_k = max((min(len(lv["negatives"]), max_negatives) for t in levels for lv in t), default=0)
    texts: dict[str, int] = {}
    index = np.full((len(levels), n_l, 1 + n_k), -1, dtype=np.int64)
    for i, t in enumerate(levels):
        for l, lv in enumerate(t):
            negs = list(lv["negatives"])
            if len(negs) > max_negatives:
                pick = np.random.default_rng([seed, i, l]).choice(len(negs), max_negatives, replace=False)
                negs = [negs[j] for j in sorted(pick)]
            for k, text in enumerate([lv["positive"], *negs]):
                index[i, l, k] = texts.setdefault(text, len(texts))
    if not texts:
        raise VlctlError("tree_tensors: no tree texts")
    table = tokenize(list(texts))
    mask = torch.from_numpy(index >= 0)
    tokens = table[torch.from_numpy(np.maximum(index, 0))]
    return tokens, mask


# --- training ------------------------------------------------------------------------------------


def trim_padding(tokens: torch.Tensor) -> torch.Tensor:
    """Token rows (m, C) cut after the last non-pad column. Exact for the causal word-level text
    tower (its feature is read at <end>, which attends only to earlier positions) and much
    cheaper when the context is sized for long texts (Anchor's "AP or AN") but captions are short."""
    from vlctl.encoders.tokenizer import PAD_ID

    n = int((tokens != PAD_ID).sum(dim=1).max()) if tokens.numel() else tokens.shape[1]
    return tokens[:, : max(n, 1)]


def patch_keep(idx: np.ndarray, epoch: int, seed: int, n_patches: int, p: float) -> torch.Tensor | None:
    """FLIP-style patch dropout (Li et al. 2023) for a batch, or None (keep everything).

    With probability p (drawn from (seed, epoch, first index)) the batch keeps a fraction
    U(0.3, 0.8) of the patches, a random subset per image drawn from sample_rng(seed, epoch, i):
    a from-scratch tiny ViT otherwise never sees an image with tokens removed and token removal
    (3VL's Anchor / HilaCAM tests) measures its breakdown rather than the maps.
    Returns (n, m) sorted patch indices.
    """
    from vlctl.train.loop import sample_rng

    if p <= 0:
        return None
    rng = np.random.default_rng([seed, epoch, int(idx[0]), 7])
    if rng.random() >= p:
        return None
    m = max(1, round(rng.uniform(0.3, 0.8) * n_patches))
    rows = [np.sort(sample_rng(seed, epoch, int(i)).permutation(n_patches)[:m]) for i in idx]
    return torch.from_numpy(np.stack(rows)).long()


def _image_embedding(m, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    if keep is None:
        return m.encode_image(x, normalize=True)
    return F.normalize(m.visual.forward_keep(x, keep), dim=-1)


def _encode_unique(model, tokens: torch.Tensor) -> torch.Tensor:
    """Text embeddings (unit norm) of token rows (m, C), each distinct row encoded once."""
    uniq, inverse = torch.unique(trim_padding(tokens), dim=0, return_inverse=True)
    return model.encode_text(uniq, normalize=True)[inverse]


def _images_and_captions(source: Any, captions: Sequence[str] | None) -> tuple[Any, list[str]]:
    """TreeTuner's data: an object with `.images` and `.texts`, or an images array and `captions`."""
    if hasattr(source, "images") and hasattr(source, "texts"):
        if captions is not None:
            raise VlctlError("TreeTuner.fit: the source brings its captions (.texts); do not pass captions too")
        images, captions = source.images, source.texts
    else:
        images = source
    if captions is None:
        raise VlctlError("TreeTuner.fit: no captions (pass captions=, or a source with .images and .texts)")
    captions = list(captions)
    if len(images) != len(captions):
        raise VlctlError(f"TreeTuner.fit: {len(images)} images but {len(captions)} captions")
    return images, captions


class TreeTuner(Estimator):
    """Fine-tune LoRA adapters of a TinyCLIP on captioned images with one of MODES.

    `TreeTuner(mode="tree", ...).fit(images, captions, model=tinyclip, trees=...)`. Unlike the other
    methods TreeTuner learns from images and captions, not from embeddings: it changes the encoder
    that makes the embeddings, so its first argument is the data that encoder reads (an object
    with `.images` (N, S, S, 3) uint8 and `.texts`, or the images with `captions=`), and the
    embedding space it belongs to is the base model's: `encoder_id_` (= `base_id_`,
    `tiny_model.encoder_id(model)` before the adapters).

    Hyperparameters: `TreeTuner.Config` (= TreeTuneConfig). After fit: `model_` the adapted model
    (LoRA modules; `model` itself, modified in place), `merged_` the plain TinyCLIP with merged
    weights, `result_` the loop's TrainResult. save/load (`vlctl.artifacts`): config.json,
    adapters/ (adapter weights + adapter.json, `load_adapters`) and model/ (`merged_`,
    `tiny_pretrained.save_pretrained`). `load(dir, base=...)` rebuilds `model_` on the base model.
    """

    Config = TreeTuneConfig
    REPLACES_DIR = False  # the directory also holds the training run (OUT/run of `vlctl fit tree`)

    def fit(self, source: Any, captions: Sequence[str] | None = None, *, model: nn.Module,
            trees: Sequence[list[dict]] | None = None, negatives: Sequence[str | None] | None = None,
            out_dir: str | Path | None = None, checkpoint_every: int = 0, resume: bool = False) -> TreeTuner:
        """images (N, S, S, 3) uint8 and captions (N,) (`source`, see the class docstring); trees (N,)
        for mode 'tree'; negatives (N,) (None = no negative for that caption) for 'negclip'. `model`
        is modified (adapters added). out_dir: the loop's run directory (default: the constructor's;
        a temporary one when neither is given), where `checkpoint_every` (steps) writes the loop's
        checkpoint and which `resume` continues, to the weights of the uninterrupted fit."""
        import tempfile

        from vlctl.encoders import tiny_model
        from vlctl.train.config import LoopConfig
        from vlctl.train.loop import train

        if isinstance(source, nn.Module):
            raise VlctlError("TreeTuner.fit: the first argument is the data (images, or an object with .images and "
                             ".texts); pass the encoder as model=, e.g. fit(images, captions, model=model)")
        images, captions = _images_and_captions(source, captions)
        cfg = self.config
        n = len(captions)
        out_dir = out_dir if out_dir is not None else self.out_dir
        if out_dir is None and (resume or checkpoint_every):
            raise VlctlError("TreeTuner.fit: checkpoint_every / resume need the out_dir of the run")
        self.base_id_ = self.encoder_id_ = tiny_model.encoder_id(model)
        lit = is_lit(model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            if not lit:
                add_lora(model, cfg.rank, cfg.lora_alpha, tower_targets(cfg.towers))
            else:
                add_lora_lit(model, cfg.rank, cfg.lora_alpha, cfg.towers, cfg.minilm_layers, cfg.seed)
        pos_tokens = model.tokenize(captions)
        extra: dict = {}
        if cfg.mode == "tree":
            if trees is None or len(trees) != n:
                raise VlctlError("TreeTuner.fit: mode 'tree' needs one tree per caption")
            extra["tree_tokens"], extra["tree_mask"] = tree_tensors(trees, model.tokenize, cfg.max_levels,
                                                                    cfg.max_negatives, cfg.seed)
        elif cfg.mode == "negclip":
            if negatives is None or len(negatives) != n:
                raise VlctlError("TreeTuner.fit: mode 'negclip' needs one negative (or None) per caption")
            ok = torch.tensor([neg is not None for neg in negatives])
            filled = [neg if neg is not None else c for neg, c in zip(negatives, captions)]
            extra["neg_tokens"], extra["neg_mask"] = model.tokenize(filled), ok

        def make_batch(idx: np.ndarray, epoch: int):
            t = torch.as_tensor(idx)
            batch = {"x": tiny_model.preprocess_batch(np.asarray(images[idx])), "pos": pos_tokens[t],
                     "keep": patch_keep(idx, epoch, cfg.seed, model.config.n_patches, cfg.patch_dropout)}
            return {**batch, **{k: v[t] for k, v in extra.items()}}

        def loss_fn(m, b):
            img = _image_embedding(m, b["x"], b["keep"])
            txt = m.encode_text(trim_padding(b["pos"]), normalize=True)
            scale = m.scale()
            contrast = contrastive_loss(img, txt, scale)
            if cfg.mode == "contrastive":
                return contrast
            if cfg.mode == "negclip":
                neg = m.encode_text(trim_padding(b["neg_tokens"]), normalize=True)
                return negclip_loss(img, txt, neg, b["neg_mask"], scale)
            tok, mask = b["tree_tokens"], b["tree_mask"]
            emb = torch.zeros(*mask.shape, img.shape[1], dtype=img.dtype, device=img.device)
            emb[mask] = _encode_unique(m, tok[mask])
            lt = tree_loss(img, emb, mask, scale, cfg.level_reduction)
            return cfg.alpha * lt + (1 - cfg.alpha) * contrast, {"tree": float(lt.detach()),
                                                                  "contrast": float(contrast.detach())}

        loop = LoopConfig(epochs=cfg.epochs, batch_size=min(cfg.batch_size, n), lr=cfg.lr,
                          weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps, seed=cfg.seed,
                          threads=cfg.threads, progress=self.progress, log_every=10, checkpoint_every=checkpoint_every)
        params = list(lora_parameters(model).values()) + list(minilm_lora_parameters(model).values())
        groups = [{"params": params, "lr": cfg.lr, "weight_decay": cfg.weight_decay}]
        # As recorded before `device` was a field, so a run checkpointed then still resumes.
        # (minilm_layers only where it applies, so runs of word-level models record what they did before)
        skip = {"device"} if lit else {"device", "minilm_layers"}
        run_config = {"tree_tune": {k: v for k, v in config_to_dict(cfg).items() if k not in skip}, "base": self.base_id_}
        tmp = tempfile.TemporaryDirectory(prefix="vlctl-tree-") if out_dir is None else None
        try:
            self.result_ = train(model, n_samples=n, make_batch=make_batch, loss_fn=loss_fn, cfg=loop,
                                 out_dir=tmp.name if tmp else out_dir, param_groups=groups, resume=resume,
                                 device=cfg.device, run_config=run_config)
        finally:
            if tmp is not None:
                tmp.cleanup()
        model.cpu().eval()
        self.config_ = cfg
        self.model_ = model
        self.merged_ = merge_lora(model).eval()
        self.steps_, self.final_loss_ = self.result_.steps, self.result_.final_loss
        return self

    def _check_fitted(self) -> nn.Module:
        if not hasattr(self, "merged_"):
            raise VlctlError("TreeTuner is not fitted; call fit() or load() first")
        return self.merged_

    # -- files (vlctl.artifacts): config.json, adapters/ and model/

    def _artifact_state(self):
        from vlctl.encoders import tiny_pretrained

        merged = self._check_fitted()
        model = getattr(self, "model_", None)

        def write_extra(tmp: Path) -> None:
            tiny_pretrained.save_pretrained(merged, tmp / "model")
            extra = {"tree_tune": config_to_dict(self.config_)}
            if model is not None and lora_parameters(model):
                save_adapters(model, tmp / "adapters", base_id=self.base_id_, extra=extra)
            elif model is not None:  # a LiT model with adapters on the text backbone only
                with atomic_dir(tmp / "adapters") as a:
                    atomic_write_json(a / "adapter.json", {"format": ADAPTER_FORMAT, "base_encoder_id": self.base_id_,
                                                           "base_fingerprint": base_fingerprint(model),
                                                           "tensors": [], **extra})
            else:  # loaded without its base model: write back what was read
                with atomic_dir(tmp / "adapters") as a:
                    atomic_save_safetensors(a / "adapters.safetensors", self.adapters_)
                    atomic_write_json(a / "adapter.json", {**self.adapter_info_, **extra})
            if getattr(merged.text, "lora", None) is not None:
                save_minilm_lora(merged, tmp / "adapters")

        return {}, {"steps": self.steps_, "final_loss": self.final_loss_}, write_extra

    @classmethod
    def load(cls, path: str | Path, encoder_id: str | None = None, base: nn.Module | None = None) -> TreeTuner:
        """Load a saved TreeTuner: `merged_` (the fine-tuned TinyCLIP) and the adapter weights; with
        `base` (the base TinyCLIP, refused unless it is the one the adapters were trained on) also
        `model_`, the base with the adapters added. `encoder_id` is the base encoder's id."""
        return super().load(path, encoder_id, base=base)

    @classmethod
    def _from_artifact(cls, config, encoder_id, tensors, state, path, *, cfg_path, base=None):
        from vlctl.artifacts import read_weights
        from vlctl.encoders import tiny_pretrained

        est = cls(config)
        est.config_, est.base_id_, est.encoder_id_ = config, encoder_id, encoder_id
        est.steps_, est.final_loss_ = state.get("steps"), state.get("final_loss")
        est.adapter_info_ = read_json(path / "adapters" / "adapter.json", "LoRA adapter.json")
        w = path / "adapters" / "adapters.safetensors"
        est.adapters_ = read_weights(w) if w.is_file() or not (path / "adapters" / MINILM_LORA_INFO).is_file() else {}
        est.merged_ = tiny_pretrained.load_pretrained(path / "model")
        lit_adapters = (path / "adapters" / MINILM_LORA_INFO).is_file()
        if lit_adapters:
            load_minilm_lora(est.merged_, path / "adapters")
        if base is not None:
            if est.adapters_:
                est.model_ = load_adapters(base, path / "adapters", tower_targets("visual" if is_lit(base)
                                                                                  else config.towers)).eval()
            else:
                est.model_ = base.eval()
            if lit_adapters:
                load_minilm_lora(est.model_, path / "adapters")
        return est

    @classmethod
    def _legacy_document(cls, path: Path):
        # Written before config.json: adapters/adapter.json records the config and the base id.
        doc_path = path / "adapters" / "adapter.json"
        if not doc_path.is_file() or (path / "config.json").is_file():
            return None
        doc = read_json(doc_path, "LoRA adapter.json")
        if not isinstance(doc, dict) or "tree_tune" not in doc or "base_encoder_id" not in doc:
            raise VlctlError(f"{doc_path}: no tree_tune config; refit with `vlctl fit tree`")
        return legacy_document(cls, doc_path, doc["tree_tune"], doc["base_encoder_id"], {})


def pretrain_clip(images: np.ndarray, captions: Sequence[str], model_config, out_dir: str | Path, *, epochs: int,
                  batch_size: int, lr: float, temperature_lr: float = 1e-2, warmup_steps: int = 50,
                  weight_decay: float = 0.1, seed: int = 0, threads: int = 0, resume: bool = False,
                  patch_dropout: float = 0.0):
    """Train a TinyCLIP from scratch contrastively on (images, captions) with the one loop
    (`vlctl.train.clip.train_clip_arrays`: token rows trimmed of padding, FLIP patch dropout
    `patch_keep`, on the CPU); saves out_dir/model (TinyCLIP save_pretrained) and returns the model."""
    from vlctl.encoders import tiny_model, tiny_pretrained
    from vlctl.train.clip import train_clip_arrays
    from vlctl.train.config import LoopConfig

    model = tiny_model.create_model(model_config, seed=seed)
    tokens = model.tokenize(list(captions))
    n_patches = model.config.n_patches
    loop = LoopConfig(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                      warmup_steps=warmup_steps, seed=seed, threads=threads, progress=False, log_every=20,
                      checkpoint_every=200)
    train_clip_arrays(model, images, tokens, out_dir, loop, temperature_lr=temperature_lr, text_batch=trim_padding,
                      patch_keep=lambda idx, epoch: patch_keep(idx, epoch, seed, n_patches, patch_dropout),
                      resume=resume, device="cpu",
                      run_config={"model": config_to_dict(model.config), "n": len(captions),
                                  "patch_dropout": patch_dropout})
    model.eval()
    tiny_pretrained.save_pretrained(model, Path(out_dir) / "model")
    return model

"""`vlctl fit sae`, `vlctl fit tevi`, `vlctl score tevi`: the TEVI pipeline over any embedding
cache written by `vlctl embed` (image embeddings, and caption embeddings paired row by row)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from vlctl.config import add_config_args, config_from_args, opt
from vlctl.io import VlctlError


@dataclasses.dataclass(frozen=True)
class FitTrainConfig:
    lr: float = opt(1e-3, "peak learning rate")
    epochs: int = opt(50, "passes over the embeddings")
    batch_size: int = opt(4096, "batch size")
    warmup_steps: int = opt(0, "linear warmup steps")
    seed: int = opt(0, "seed of the initialisation and data order")
    device: str = opt("cpu", "cpu or cuda")


def _open(cache_dir: str, need_texts: bool):
    from vlctl.data.cache import open_cache

    cache = open_cache(cache_dir)
    if cache.image_emb is None:
        raise VlctlError(f"{cache_dir}: the embedding cache holds no image embeddings")
    if need_texts:
        if cache.text_emb is None:
            raise VlctlError(f"{cache_dir}: the embedding cache holds no text embeddings")
        if len(cache.text_emb) != len(cache.image_emb):
            raise VlctlError(f"{cache_dir}: {len(cache.image_emb)} images but {len(cache.text_emb)} texts; "
                             "TEVI pairs image i with caption i")
    return cache


def _cmd_fit_sae(args: argparse.Namespace) -> dict:
    from vlctl.methods.sae import _ARCH_FIELDS, SparseAutoencoder, TopKSAEConfig

    cache = _open(args.cache, need_texts=False)
    arch = config_from_args(TopKSAEConfig, args)
    kwargs = {**{f: getattr(arch, f) for f in _ARCH_FIELDS}, **dataclasses.asdict(config_from_args(FitTrainConfig, args))}
    if args.concepts:
        from vlctl.encoders import create

        if not args.encoder:
            raise VlctlError("--concepts needs --encoder: the concepts are embedded with the cache's text encoder")
        encoder = create(args.encoder)
        if encoder.id != cache.encoder_id:
            raise VlctlError(f"{args.encoder}: encoder {encoder.id!r} is not the cache's {cache.encoder_id!r}")
        lines = [ln.strip() for ln in Path(args.concepts).read_text().splitlines() if ln.strip()]
        if not lines:
            raise VlctlError(f"{args.concepts}: empty concept list (one concept per line)")
        import torch

        with torch.no_grad():
            concepts = encoder.encode_texts(encoder.tokenize(lines)).numpy()
        for f in ("expansion", "d_latent"):
            kwargs.pop(f)
        sae = SparseAutoencoder.from_concepts(concepts, progress=True, **kwargs)
    else:
        sae = SparseAutoencoder(progress=True, **kwargs)
    sae.fit(np.asarray(cache.image_emb), cache.encoder_id)
    sae.save(args.out)
    return {"out": str(args.out), "fvu": sae.fvu_, "dead_latents": sae.n_dead_, "n_latents": sae.config_.n_latents}


def _cmd_fit_tevi(args: argparse.Namespace) -> dict:
    from vlctl.methods.sae import SparseAutoencoder
    from vlctl.methods.tevi import TEVI, TeviConfig

    cache = _open(args.cache, need_texts=True)
    sae = SparseAutoencoder.load(args.sae, encoder_id=cache.encoder_id)
    cfg = config_from_args(TeviConfig, args)
    train = config_from_args(FitTrainConfig, args)
    tevi = TEVI(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(TeviConfig) if f.name not in ("d", "n_latents")},
                **dataclasses.asdict(train), progress=True)
    tevi.fit(sae, np.asarray(cache.image_emb), np.asarray(cache.text_emb))
    tevi.save(args.out)
    return {"out": str(args.out)}


def _cmd_score_tevi(args: argparse.Namespace) -> dict:
    from vlctl.eval.metrics import recall_at_k
    from vlctl.io import atomic_save_npz
    from vlctl.methods.tevi import TEVI

    cache = _open(args.cache, need_texts=True)
    tevi = TEVI.load(args.tevi, encoder_id=cache.encoder_id)
    img, txt = np.asarray(cache.image_emb), np.asarray(cache.text_emb)
    base = img @ txt.T
    if args.rerank:
        rr = tevi.rerank(base, img, txt, k=args.rerank)
        order = rr.order.numpy()
        # Scores whose per-text ranking is the reranked one: rank-based, best = n_images.
        scores = np.empty_like(base)
        np.put_along_axis(scores, order, np.arange(len(img), 0, -1, dtype=base.dtype)[:, None], axis=0)
    else:
        scores = tevi.scores(img, txt).numpy()
    atomic_save_npz(args.out, scores=scores, base_scores=base)
    result = {"out": str(args.out), "shape": list(scores.shape)}
    paired = np.arange(len(img))
    result["recall_clip"] = recall_at_k(base, paired)
    result["recall_tevi" + ("_rerank" if args.rerank else "")] = {
        k: v for k, v in recall_at_k(scores, paired).items() if k.startswith("t2i") or not args.rerank}
    return result


def register(fit_sub, score_sub, add) -> None:
    """Add `sae` and `tevi` to the `vlctl fit` subparsers and `tevi` to `vlctl score`'s."""
    from vlctl.methods.sae import TopKSAEConfig
    from vlctl.methods.tevi import TeviConfig

    p = add(fit_sub, "sae", "fit a TopK SAE (or a CG-SAE with --concepts) on a cache's image embeddings", _cmd_fit_sae)
    p.add_argument("--cache", required=True, help="embedding cache directory (from `vlctl embed`)")
    p.add_argument("--out", required=True, help="SAE directory to write (sae.safetensors + config.json)")
    p.add_argument("--concepts", help="CG-SAE: text file, one concept per line; decoder rows fixed to their embeddings")
    p.add_argument("--encoder", help="the cache's encoder spec (tiny:DIR, open_clip:..., hf:...; needed with --concepts)")
    add_config_args(p, TopKSAEConfig, exclude=("d", "concepts_fixed"))
    add_config_args(p, FitTrainConfig)

    p = add(fit_sub, "tevi", "train TEVI's caption-conditioned mask over a fitted SAE", _cmd_fit_tevi)
    p.add_argument("--cache", required=True, help="embedding cache with images and their captions (row i = pair i)")
    p.add_argument("--sae", required=True, help="SAE directory from `vlctl fit sae` (same encoder as the cache)")
    p.add_argument("--out", required=True, help="TEVI directory to write")
    add_config_args(p, TeviConfig, exclude=("d", "n_latents"))
    add_config_args(p, FitTrainConfig)

    p = add(score_sub, "tevi", "TEVI scores of every cached image against every cached caption", _cmd_score_tevi)
    p.add_argument("--cache", required=True, help="embedding cache with images and captions")
    p.add_argument("--tevi", required=True, help="TEVI directory from `vlctl fit tevi`")
    p.add_argument("--out", required=True, help="output .npz: scores (n_images, n_texts) and base_scores (CLIP)")
    p.add_argument("--rerank", type=int, default=0, help="rerank CLIP's top K per caption instead of scoring all "
                   "pairs (scores then rank-encode the reranked order)")

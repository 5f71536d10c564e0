"""Zero-shot image-text retrieval: recall@k both ways, as CLIP_benchmark defines it, plus RoCOCO.

    vlctl eval retrieval --encoder open_clip:ViT-B-32/laion2b_s34b_b79k --dataset coco \\
        --root coco/ --annotations coco_karpathy_test.json --json
    vlctl eval retrieval --encoder hf:/models/siglip --dataset rococo --root coco/ \\
        --annotations same_concept.json --out rococo.json

Pure metric functions (`retrieval_recall`, `rococo_recall`) take embeddings; `evaluate_retrieval`
loads a dataset, embeds every image and caption with an encoder and calls them. `register(sub,
add)` adds `vlctl eval retrieval` to vlctl's parser.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.config import config_to_dict, opt, validate_config
from vlctl.fsops import VlctlError

DATASETS = ("coco", "flickr", "karpathy", "rococo")
_SHOWN = 10  # failed images named in an error


def _unit_rows(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x.detach().cpu().float().numpy() if hasattr(x, "detach") else x, dtype=np.float32)
    if a.ndim != 2 or 0 in a.shape:
        raise VlctlError(f"{name}: expected a non-empty (n, d) array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise VlctlError(f"{name}: contains NaN or inf")
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)


def retrieval_recall(
    image_emb: Any, text_emb: Any, image_of_text: Any, ks: Iterable[int] = (1, 5, 10)
) -> dict[str, float]:
    """Recall@k of image -> text and text -> image retrieval, in percent (CLIP_benchmark's definition).

    Args:
        image_emb: (n_images, d) image embeddings; L2-normalised here.
        text_emb: (n_texts, d) caption embeddings; L2-normalised here.
        image_of_text: (n_texts,) int, the image each caption describes (any number per image:
            COCO has 5 or 6, one Flickr30k image 6 ...).
        ks: cut-offs.

    Returns:
        {"i2t@k": ..., "t2i@k": ...} for every k, in [0, 100], with scores = cosine similarity
        s(i, j) = <image_i, text_j> / (|image_i| |text_j|):

        - t2i@k (CLIP_benchmark's "image_retrieval_recall@k"): mean over ALL captions j of
          1[image_of_text[j] is among the k images with the highest s(., j)].
        - i2t@k (CLIP_benchmark's "text_retrieval_recall@k"): mean over ALL images i of
          1[at least one caption of image i is among the k captions with the highest s(i, .)].
          An image without captions counts as a miss, as in CLIP_benchmark (0 / 0 there is NaN,
          and NaN > 0 is False); the loaders never produce one.

        CLIP_benchmark reports fractions in [0, 1]; these are the same numbers times 100.
        Ties: CLIP_benchmark's `torch.topk` leaves the order among exactly equal scores
        unspecified; here the lower index wins (`vlctl.eval.metrics.recall_at_k`, ties="stable").
        Without exact ties the numbers are identical.
    """
    from vlctl.eval.metrics import recall_at_k  # scipy: imported on use, `vlctl --help` stays instant

    img, txt = _unit_rows(image_emb, "image_emb"), _unit_rows(text_emb, "text_emb")
    if img.shape[1] != txt.shape[1]:
        raise VlctlError(f"image_emb has dimension {img.shape[1]}, text_emb {txt.shape[1]}")
    owner = np.asarray(image_of_text)
    out = recall_at_k(img @ txt.T, owner, ks)
    n_with = len(np.unique(owner))
    if n_with < len(img):  # CLIP_benchmark counts caption-less images as misses
        out.update({k: v * n_with / len(img) for k, v in out.items() if k.startswith("i2t@")})
    return out


def rococo_recall(
    image_emb: Any,
    original_emb: Any,
    image_of_original: Any,
    altered_emb: Any,
    image_of_altered: Any,
    ks: Iterable[int] = (1, 5, 10),
) -> dict[str, Any]:
    """RoCOCO: retrieval with the altered captions added to the caption pool as distractors.

    RoCOCO's same-concept set gives each COCO image its original captions (5, or 6) plus 5
    altered ones: words swapped for others of the same concept, so the caption no longer
    describes the image. Embeddings are L2-normalised; s = cosine similarity.

    Args:
        image_emb: (n_images, d).
        original_emb: (n_orig, d) the original captions; image_of_original: (n_orig,) their images.
        altered_emb: (n_alt, d) the altered captions; image_of_altered: (n_alt,) the image each
            was made from.
        ks: cut-offs.

    Returns:
        {
          "clean": retrieval_recall over the originals only (the ordinary COCO numbers),
          "with_altered": {
            "i2t@k": mean over images i of 1[some ORIGINAL caption of i is among the k captions
                with the highest s(i, .) in the pool originals + altered]; altered captions are
                never correct, so one ranked above the originals pushes them down;
            "t2i@k": mean over ORIGINAL captions of 1[its image is in the top k images]; the
                altered captions are not queries (they describe no image). The image gallery
                is unchanged, so this equals clean t2i@k; it is reported for completeness.
          },
          "altered_top1": percent of images whose highest-scored caption in the whole pool
              (originals + altered, of every image; ties: originals first) is an altered one,
          "own_altered_beats_original": percent of images i whose best own altered caption
              scores strictly higher than its best own original caption,
          "drop": {"i2t@k": clean i2t@k - with_altered i2t@k},
        }
        All in percent.
    """
    from vlctl.eval.metrics import recall_at_k_relevant

    img = _unit_rows(image_emb, "image_emb")
    orig, alt = _unit_rows(original_emb, "original_emb"), _unit_rows(altered_emb, "altered_emb")
    n_img, n_orig = len(img), len(orig)
    own_o, own_a = np.asarray(image_of_original, dtype=np.int64), np.asarray(image_of_altered, dtype=np.int64)
    for name, own, emb in (("image_of_original", own_o, orig), ("image_of_altered", own_a, alt)):
        if own.shape != (len(emb),):
            raise VlctlError(f"{name}: expected shape ({len(emb)},), got {own.shape}")
        if own.size and (own.min() < 0 or own.max() >= n_img):
            raise VlctlError(f"{name}: image indices must lie in [0, {n_img})")
    ks = list(ks)
    clean = retrieval_recall(img, orig, own_o, ks)
    scores = img @ np.concatenate([orig, alt]).T  # (n_images, n_orig + n_alt): originals first
    relevant = np.zeros(scores.shape, dtype=bool)
    relevant[own_o, np.arange(n_orig)] = True
    pooled = recall_at_k_relevant(scores, relevant, ks)
    has = np.zeros(n_img, dtype=bool)
    has[own_o] = True
    if not has.all():  # as in retrieval_recall: caption-less images are misses
        pooled.update({k: v * has.sum() / n_img for k, v in pooled.items() if k.startswith("i2t@")})
    altered_top1 = 100.0 * float(np.mean(np.argmax(scores, axis=1) >= n_orig))  # argmax: first max wins
    best_o = np.full(n_img, -np.inf)
    np.maximum.at(best_o, own_o, scores[own_o, np.arange(n_orig)])
    best_a = np.full(n_img, -np.inf)
    np.maximum.at(best_a, own_a, scores[own_a, n_orig + np.arange(len(alt))])
    beats = 100.0 * float(np.mean(best_a > best_o))
    return {
        "clean": clean,
        "with_altered": pooled,
        "altered_top1": altered_top1,
        "own_altered_beats_original": beats,
        "drop": {f"i2t@{k}": clean[f"i2t@{k}"] - pooled[f"i2t@{k}"] for k in ks},
    }


# --------------------------------------------------------------------------------------------
# Embedding a dataset with an encoder


@dataclasses.dataclass(frozen=True)
class RetrievalConfig:
    """How `vlctl eval retrieval` embeds the data."""

    batch_size: int = opt(64, "images / captions per forward pass", ge=1, le=4096)
    workers: int = opt(0, "DataLoader worker processes decoding images (0 = decode in the main process)", ge=0, le=256)
    device: str = opt("cpu", "torch device for the encoder", check="device")
    precision: str = opt("fp32", "'fp32', or 'fp16' / 'bf16' autocast on GPU", choices=("fp32", "fp16", "bf16"))
    ks: tuple[int, ...] = opt((1, 5, 10), "recall cut-offs k", ge=1, le=10**6, min_len=1)

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise VlctlError(f"RetrievalConfig.batch_size must be a positive integer, got {self.batch_size!r}")
        if self.precision not in ("fp32", "fp16", "bf16"):
            raise VlctlError(f"RetrievalConfig.precision must be fp32, fp16 or bf16, got {self.precision!r}")
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise VlctlError(f"RetrievalConfig.ks must be positive integers, got {self.ks!r}")
        validate_config(self)  # then every field in its declared range (the opt() above)


def embed_texts(encoder: Any, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """(n, d) float32 L2-normalised text embeddings, in batches."""
    import torch

    out = []
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            emb = encoder.encode_texts(encoder.tokenize(list(texts[s : s + batch_size])), normalize=True)
            out.append(emb.detach().float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, int(encoder.embed_dim)), np.float32)


def embed_images_strict(encoder: Any, paths: Sequence[str | os.PathLike], cfg: RetrievalConfig,
                        progress: bool = True) -> np.ndarray:
    """(n, d) image embeddings of every path, or a VlctlError naming the images that failed.

    A benchmark cannot skip images (the numbers would no longer be the benchmark's), unlike
    `vlctl index`, which skips and lists them.
    """
    from vlctl.embeddings.extract import embed_image_files
    from vlctl.embeddings.extract_config import ExtractConfig

    res = embed_image_files(encoder, paths, ExtractConfig(batch_size=cfg.batch_size, workers=cfg.workers), progress)
    if res.failures:
        shown = "; ".join(reason for _, reason in res.failures[:_SHOWN])
        more = f" ... ({len(res.failures) - _SHOWN} more)" if len(res.failures) > _SHOWN else ""
        raise VlctlError(f"{len(res.failures)} of {len(paths)} benchmark images could not be read: {shown}{more}")
    return res.embeddings


def evaluate_retrieval(
    encoder: Any,
    dataset: str,
    annotations: str | os.PathLike,
    root: str | os.PathLike,
    split: str | None = "test",
    cfg: RetrievalConfig | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Load `dataset` ("coco" / "flickr" / "karpathy": `load_karpathy`; "rococo": `load_rococo`),
    embed its images and captions with `encoder`, and return the recall dict with counts and timing.

    Missing image files are the loader's VlctlError (how many, which, the root it looked in).
    """
    from vlctl.data.loaders.retrieval import load_karpathy, load_rococo

    cfg = cfg or RetrievalConfig()
    if dataset not in DATASETS:
        raise VlctlError(f"--dataset must be one of {list(DATASETS)}, got {dataset!r}")
    start = time.perf_counter()
    if dataset == "rococo":
        original, altered = load_rococo(annotations, root=root)
        if original.images != altered.images:
            raise VlctlError(f"{annotations}: original and altered captions name different images")
        data = original
    else:
        data, altered = load_karpathy(annotations, split=split, root=root), None
    if not data.images:
        raise VlctlError(f"{annotations}: no images to evaluate")
    image_emb = embed_images_strict(encoder, data.image_paths(), cfg, progress)
    text_emb = embed_texts(encoder, data.captions, cfg.batch_size)
    result: dict[str, Any] = {
        "dataset": dataset,
        "annotations": str(annotations),
        "root": str(Path(root)),
        "split": None if dataset == "rococo" else split,
        "encoder_id": encoder.id,
        "n_images": data.n_images,
        "n_captions": len(data.captions),
    }
    if altered is None:
        result["recall"] = retrieval_recall(image_emb, text_emb, data.image_of_text, cfg.ks)
    else:
        alt_emb = embed_texts(encoder, altered.captions, cfg.batch_size)
        result["n_altered_captions"] = len(altered.captions)
        result.update(rococo_recall(image_emb, text_emb, data.image_of_text, alt_emb, altered.image_of_text, cfg.ks))
        result["recall"] = result.pop("with_altered")
    result["config"] = config_to_dict(cfg)
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result

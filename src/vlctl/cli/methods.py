"""`vlctl fit sae | tevi | controlembed | tree`, `vlctl score tevi`, `vlctl cluster`: the methods
over a store written by `vlctl embed` / `vlctl index` (image embeddings, and caption embeddings
paired row by row where the source had captions)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from vlctl.config import add_config_args, config_from_args, config_to_dict, opt
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
    from vlctl.embeddings.cache import open_cache

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


def fit_sae(args: argparse.Namespace) -> dict:
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


def fit_tevi(args: argparse.Namespace) -> dict:
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


def score_tevi(args: argparse.Namespace) -> dict:
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


def fit_sae_args(p: argparse.ArgumentParser) -> None:
    from vlctl.methods.sae import TopKSAEConfig

    p.add_argument("--cache", required=True, help="embedding cache directory (from `vlctl embed`)")
    p.add_argument("--out", required=True, help="SAE directory to write (sae.safetensors + config.json)")
    p.add_argument("--concepts", help="CG-SAE: text file, one concept per line; decoder rows fixed to their embeddings")
    p.add_argument("--encoder", help="the cache's encoder spec (tiny:DIR, open_clip:..., hf:...; needed with --concepts)")
    add_config_args(p, TopKSAEConfig, exclude=("d", "concepts_fixed"))
    add_config_args(p, FitTrainConfig)


def fit_tevi_args(p: argparse.ArgumentParser) -> None:
    from vlctl.methods.tevi import TeviConfig

    p.add_argument("--cache", required=True, help="embedding cache with images and their captions (row i = pair i)")
    p.add_argument("--sae", required=True, help="SAE directory from `vlctl fit sae` (same encoder as the cache)")
    p.add_argument("--out", required=True, help="TEVI directory to write")
    add_config_args(p, TeviConfig, exclude=("d", "n_latents"))
    add_config_args(p, FitTrainConfig)


def score_tevi_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", required=True, help="embedding cache with images and captions")
    p.add_argument("--tevi", required=True, help="TEVI directory from `vlctl fit tevi`")
    p.add_argument("--out", required=True, help="output .npz: scores (n_images, n_texts) and base_scores (CLIP)")
    p.add_argument("--rerank", type=int, default=0, help="rerank CLIP's top K per caption instead of scoring all "
                   "pairs (scores then rank-encode the reranked order)")


def fit_controlembed(args: argparse.Namespace) -> dict:
    from vlctl.config import config_to_dict
    from vlctl.data.mad import load_mad, mad_dataset_id
    from vlctl.data.shapes import VALUES, label_indices, subclass_phrase
    from vlctl.embeddings.cache import embed
    from vlctl.encoders import load_encoder
    from vlctl.methods.hyper import ControlEmbed, ControlEmbedParams, prompt_ensemble

    encoder = load_encoder(args.encoder)
    data = load_mad(args.data)
    if data["meta"].get("format") != "vlctl-shapes":
        raise VlctlError(f"{args.data}: fit controlembed reads shapes directories (vlctl data shapes)")
    cache = embed(encoder, images=data["images"], data_id=mad_dataset_id(args.data), root=args.cache, progress=False)
    categories = args.categories or list(VALUES)

    def encode_texts(texts: list[str]):
        import torch

        with torch.inference_mode():
            return encoder.encode_texts(encoder.tokenize(texts)).numpy()

    labels = {c: label_indices(data["labels"], c) for c in categories}
    text = {c: prompt_ensemble(encode_texts, [subclass_phrase(c, VALUES[c][k]) for k in sorted(set(labels[c]))],
                               args.templates) for c in categories}
    params = config_from_args(ControlEmbedParams, args)
    model = ControlEmbed(**config_to_dict(params), progress=not args.json).fit(
        cache.image_emb, labels, encoder_id=encoder.id, class_text_emb=text)
    model.save(args.out)
    return {"out": str(args.out), "encoder_id": encoder.id, "categories": categories, "final_loss": model.final_loss_}


def fit_controlembed_args(p: argparse.ArgumentParser) -> None:
    from vlctl.methods.hyper import DEFAULT_TEMPLATES, ControlEmbedParams

    p.add_argument("--encoder", required=True, help="encoder directory (a saved TinyCLIP model/)")
    p.add_argument("--data", required=True, help="shapes directory (vlctl data shapes)")
    p.add_argument("--out", required=True, help="model directory (controlembed.safetensors + config.json)")
    p.add_argument("--cache", required=True, help="embedding cache root (the images are embedded once)")
    p.add_argument("--categories", nargs="+", default=None, help="categories to train on (default: all four)")
    p.add_argument("--templates", nargs="+", default=list(DEFAULT_TEMPLATES),
                   help="prompt templates with {} for the subclass, averaged per subclass")
    add_config_args(p, ControlEmbedParams)


def _open_cluster_source(path: str, data: str | None):
    """GALLERY -> (embeddings (N, D), encoder id, kind, image of row i for contact sheets or None).

    A `vlctl index` gallery (manifest.json) holds the image paths in its metadata; an embedding
    cache (meta.json, `vlctl embed`) holds only embeddings, so its images come from the dataset
    directory `--data` (its memmap), which must be the data the cache was embedded from.
    """
    root = Path(path)
    if (root / "manifest.json").is_file():
        from vlctl.embeddings.store import open_gallery

        gallery = open_gallery(root)
        if len(gallery) == 0:
            raise VlctlError(f"{root}: the gallery is empty; nothing to cluster")
        return gallery.embeddings(), gallery.encoder_id, "gallery", lambda ids: [
            m.get("path", "") for m in gallery.metadata(ids)]
    if (root / "meta.json").is_file():
        from vlctl.embeddings.cache import open_cache

        cache = open_cache(root)
        if cache.image_emb is None:
            raise VlctlError(f"{root}: the embedding cache holds no image embeddings")
        images = None
        if data is not None:
            from vlctl.data.mad import load_mad, mad_dataset_id

            if mad_dataset_id(data) != cache.meta["data_id"]:
                raise VlctlError(f"{data}: not the data the cache {root} was embedded from (data id "
                                 f"{mad_dataset_id(data)!r}, the cache records {cache.meta['data_id']!r})")
            arr = load_mad(data)["images"]
            if len(arr) != len(cache.image_emb):
                raise VlctlError(f"{data}: {len(arr)} images, the cache {root} holds {len(cache.image_emb)}")
            images = lambda ids: [arr[i] for i in ids]
        return cache.image_emb, cache.encoder_id, "cache", images
    raise VlctlError(f"{root}: neither a gallery (no manifest.json; build one with `vlctl index`) nor an "
                     "embedding cache (no meta.json; `vlctl embed`)")


def cluster(args: argparse.Namespace) -> dict:
    import numpy as np

    from vlctl.io import atomic_write_json
    from vlctl.methods.hyper import ControlEmbed, normalize_rows

    if (args.gallery is None) == (args.gallery_flag is None):
        raise VlctlError("cluster: give the gallery once, as GALLERY or --gallery")
    source = args.gallery if args.gallery is not None else args.gallery_flag
    if args.per_sheet < 1:
        raise VlctlError(f"--per-sheet must be >= 1, got {args.per_sheet}")
    emb, encoder_id, kind, images_of = _open_cluster_source(source, args.data)
    model = ControlEmbed.load(args.controlembed)
    if model.encoder_id_ != encoder_id:
        raise VlctlError(f"{source}: embeddings come from encoder {encoder_id!r}, but the ControlEmbed model "
                         f"{args.controlembed} was fitted on {model.encoder_id_!r}; maps of one embedding space are "
                         "meaningless in another (fit ControlEmbed on this gallery's encoder)")
    ids = model.cluster(emb, args.attribute, args.k, seed=args.seed, encoder_id=encoder_id)
    k = args.k if args.k is not None else len(model.subclasses_[args.attribute])  # cluster() checked both
    # The space k-means ran in (ControlEmbed.cluster's own): "nearest the centre" is measured there.
    z = normalize_rows(model.transform(emb, args.attribute, encoder_id=encoder_id))
    texts = (model.class_text_emb_ or {}).get(args.attribute)
    clusters = []
    for c in range(k):
        members = np.flatnonzero(ids == c)
        info: dict = {"id": c, "size": len(members)}
        if len(members):
            centre = z[members].mean(0)
            dist = np.linalg.norm(z[members] - centre, axis=1)
            info["nearest"] = members[np.argsort(dist, kind="stable")[: args.per_sheet]].tolist()
            if texts is not None:
                best = np.argmax(texts @ (centre / max(np.linalg.norm(centre), 1e-12)))
                info["subclass"] = model.subclasses_[args.attribute][best]
        clusters.append(info)
    result = {"attribute": args.attribute, "k": k, "model": str(args.controlembed), "gallery": str(source),
              "gallery_kind": kind, "encoder_id": encoder_id, "seed": args.seed, "n_images": len(ids),
              "cluster_sizes": {c["id"]: c["size"] for c in clusters if c["size"]}}
    if not args.out:
        return result
    out = Path(args.out)
    record = {**result, "cluster_of_image": ids.tolist(), "clusters": clusters}
    if kind == "gallery" and images_of is not None:
        record["images"] = images_of(np.arange(len(ids)))
    if out.suffix.lower() == ".json":  # the pre-contact-sheet form: only the cluster of every image
        atomic_write_json(out, record)
        return {**result, "out": str(out)}
    sheets, unreadable = [], 0
    if images_of is not None:
        from vlctl.report.contact_sheet import write_contact_sheet

        width = max(2, len(str(k - 1)))
        for info in clusters:
            name = f"cluster_{info['id']:0{width}d}.png"
            title = f"{args.attribute}: cluster {info['id']} of {k} · {info['size']} images"
            if "subclass" in info:
                title += f" · nearest subclass: {info['subclass']}"
            sheet = write_contact_sheet(images_of(info.get("nearest", [])), out / name, title,
                                        thumb=args.thumb, cols=args.cols)
            info["sheet"], info["unreadable"] = name, [info["nearest"][p] for p, _ in sheet.unreadable]
            unreadable += len(sheet.unreadable)
            sheets.append(name)
        keep = set(sheets)
        for old in out.glob("cluster_*.png"):  # sheets of an earlier run with more clusters
            if old.name not in keep:
                old.unlink()
    record["contact_sheets"] = sheets
    atomic_write_json(out / "clusters.json", record)  # last: its presence marks a complete output
    result.update(out=str(out), contact_sheets=len(sheets), unreadable_images=unreadable)
    if images_of is None:
        result["note"] = "no contact sheets: an embedding cache holds no images; pass --data DIR (its dataset)"
    return result


def cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("gallery", nargs="?", default=None,
                   help="gallery directory (vlctl index), or an embedding cache directory (vlctl embed)")
    p.add_argument("--gallery", dest="gallery_flag", default=None, help="the same as GALLERY")
    p.add_argument("--controlembed", "--model", dest="controlembed", required=True,
                   help="ControlEmbed model directory (vlctl fit controlembed), fitted on the gallery's encoder")
    p.add_argument("--attribute", required=True, help="attribute category text, e.g. shape")
    p.add_argument("--k", type=int, default=None, help="clusters (default: the category's number of subclasses)")
    p.add_argument("--seed", type=int, default=0, help="k-means seed (default: 0)")
    p.add_argument("--out", default=None, help="output directory: clusters.json and cluster_NN.png contact sheets "
                   "(a path ending in .json writes only the cluster of every image there)")
    p.add_argument("--per-sheet", type=int, default=32,
                   help="images per contact sheet: those nearest the cluster centre (default: 32)")
    p.add_argument("--thumb", type=int, default=96, help="thumbnail side in pixels (default: 96)")
    p.add_argument("--cols", type=int, default=8, help="thumbnails per row (default: 8)")
    p.add_argument("--data", default=None, help="for an embedding cache: the dataset directory it was embedded "
                   "from (its images go on the contact sheets)")


def fit_tree(args) -> dict:
    from vlctl.config import config_from_args
    from vlctl.data.scenes import SCENE_OPPOSITES, load_scenes, vocabulary
    from vlctl.encoders import tiny_clip
    from vlctl.methods.tree_tune import TreeTuneConfig, TreeTuner
    from vlctl.methods.trees import TreeGenerator

    cfg = config_from_args(TreeTuneConfig, args)
    data = load_scenes(args.data)
    captions = [lab["caption"] for lab in data["labels"]]
    model = tiny_clip.load_pretrained(args.encoder)
    trees = negatives = None
    if cfg.mode != "contrastive":
        gen = TreeGenerator(seed=cfg.seed, opposites=SCENE_OPPOSITES, vocabulary=set(vocabulary()))
        uniq = sorted(set(captions))
        if cfg.mode == "tree":
            by = dict(zip(uniq, gen.trees(uniq)))
            trees = [by[c] for c in captions]
        else:
            by = {c: gen.random_negative(c) for c in uniq}
            negatives = [None if by[c] is None else by[c][0] for c in captions]
    tuner = TreeTuner(**config_to_dict(cfg)).fit(model, data["images"], captions, Path(args.out) / "run",
                                                 trees=trees, negatives=negatives, resume=args.resume)
    tuner.save(args.out)
    return {"out": str(args.out), "mode": cfg.mode, "steps": tuner.result_.steps, "final_loss": tuner.result_.final_loss,
            "base_encoder_id": tuner.base_id_}


def fit_tree_args(p: argparse.ArgumentParser) -> None:
    from vlctl.methods.tree_tune import TreeTuneConfig

    p.add_argument("--encoder", required=True, help="base TinyCLIP model directory (save_pretrained)")
    p.add_argument("--data", required=True, help="scenes directory (vlctl data scenes), e.g. the finetune split")
    p.add_argument("--out", required=True, help="output: adapters/ (adapter weights only) and model/ (merged TinyCLIP)")
    p.add_argument("--resume", action="store_true", help="continue OUT/run/checkpoint (config must match)")
    add_config_args(p, TreeTuneConfig)

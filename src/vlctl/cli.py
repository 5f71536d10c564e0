"""`vlctl` command line. Each subcommand's flags are generated from its config dataclass.

Imports of heavy modules happen inside the handlers so `vlctl --help` is instant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vlctl.config import add_config_args, config_from_args
from vlctl.io import VlctlError


def _cmd_data_mad(args: argparse.Namespace) -> dict:
    from vlctl.data.mad import MadConfig, generate_mad

    out = generate_mad(config_from_args(MadConfig, args), args.out)
    return {"out": str(out)}


def _cmd_train_clip(args: argparse.Namespace) -> dict:
    from vlctl.train.clip import ClipTrainConfig, train_clip
    from vlctl.train.distributed import destroy_distributed
    from vlctl.train.loop import LoopConfig

    result = train_clip(
        args.data,
        args.out,
        cfg=config_from_args(ClipTrainConfig, args),
        loop=config_from_args(LoopConfig, args),
        resume=args.resume,
    )
    # Only on success: after a failure on one rank a barrier here would wait for the others.
    destroy_distributed()
    return {"out": str(args.out), "steps": result.steps, "seconds": result.seconds}


def _cmd_embed(args: argparse.Namespace) -> dict:
    from vlctl.data.cache import embed
    from vlctl.data.mad import load_mad, mad_dataset_id
    from vlctl.encoders import load_encoder

    encoder = load_encoder(args.encoder)
    data = load_mad(args.data)
    cache = embed(
        encoder,
        images=data["images"],
        texts=[lab["caption"] for lab in data["labels"]],
        data_id=mad_dataset_id(args.data),
        root=args.out,
        batch_size=args.batch_size,
    )
    return {"cache": str(cache.path), "hit": cache.hit, "n_images": cache.meta["n_images"]}


def _cmd_reproduce(args: argparse.Namespace) -> dict:
    from vlctl.recipes import RECIPES, run_recipe

    names = sorted(RECIPES) if args.name == "all" else [args.name]
    # `all` shares one stage cache, so later recipes reuse earlier ones' stages (tevi-mad: the CLIP).
    stages = args.stages or (Path(args.out) / "stages" if args.name == "all" else None)
    reports = {}
    for name in names:
        out = Path(args.out) / name if args.name == "all" else Path(args.out)
        reports[name] = str(run_recipe(name, out, quick=args.quick, force=args.force, stages=stages))
        print(f"[vlctl] {name}: report at {reports[name]}", file=sys.stderr)
    return {"reports": reports}


# --- ControlEmbed and its shapes benchmark (issue 4) -------------------------------------------


def _cmd_data_shapes(args: argparse.Namespace) -> dict:
    from vlctl.data.shapes import ShapesConfig, generate_shapes

    return {"out": str(generate_shapes(config_from_args(ShapesConfig, args), args.out))}


def _cmd_fit_controlembed(args: argparse.Namespace) -> dict:
    from vlctl.config import config_to_dict
    from vlctl.data.cache import embed
    from vlctl.data.mad import load_mad, mad_dataset_id
    from vlctl.data.shapes import VALUES, label_indices, subclass_phrase
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


def _open_cluster_source(path: str, data: str | None):
    """GALLERY -> (embeddings (N, D), encoder id, kind, image of row i for contact sheets or None).

    A `vlctl index` gallery (manifest.json) holds the image paths in its metadata; an embedding
    cache (meta.json, `vlctl embed`) holds only embeddings, so its images come from the dataset
    directory `--data` (its memmap), which must be the data the cache was embedded from.
    """
    root = Path(path)
    if (root / "manifest.json").is_file():
        from vlctl.index.gallery import open_gallery

        gallery = open_gallery(root)
        if len(gallery) == 0:
            raise VlctlError(f"{root}: the gallery is empty; nothing to cluster")
        return gallery.embeddings(), gallery.encoder_id, "gallery", lambda ids: [
            m.get("path", "") for m in gallery.metadata(ids)]
    if (root / "meta.json").is_file():
        from vlctl.data.cache import open_cache

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


def _cmd_cluster(args: argparse.Namespace) -> dict:
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


def _register_controlembed(sub, data_sub, fit_sub, add) -> None:
    """`vlctl data shapes`, `vlctl fit controlembed`, `vlctl cluster`."""
    from vlctl.data.shapes import ShapesConfig
    from vlctl.methods.hyper import DEFAULT_TEMPLATES, ControlEmbedParams

    p = add(data_sub, "shapes", "generate the Clevr-4-like shapes set (color, texture, count, shape; ControlEmbed)",
            _cmd_data_shapes)
    p.add_argument("--out", required=True, help="output directory (written atomically)")
    add_config_args(p, ShapesConfig)

    p = add(fit_sub, "controlembed", "fit the ControlEmbed hypernetwork on a shapes set's embeddings",
            _cmd_fit_controlembed)
    p.add_argument("--encoder", required=True, help="encoder directory (a saved TinyCLIP model/)")
    p.add_argument("--data", required=True, help="shapes directory (vlctl data shapes)")
    p.add_argument("--out", required=True, help="model directory (controlembed.safetensors + config.json)")
    p.add_argument("--cache", required=True, help="embedding cache root (the images are embedded once)")
    p.add_argument("--categories", nargs="+", default=None, help="categories to train on (default: all four)")
    p.add_argument("--templates", nargs="+", default=list(DEFAULT_TEMPLATES),
                   help="prompt templates with {} for the subclass, averaged per subclass")
    add_config_args(p, ControlEmbedParams)

    p = add(sub, "cluster", "cluster a gallery by one attribute (ControlEmbed global mode: k-means on G W + b) "
            "and draw a contact sheet per cluster", _cmd_cluster)
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


def build_parser() -> argparse.ArgumentParser:
    from vlctl import __version__

    parser = argparse.ArgumentParser(prog="vlctl", description="Controllable vision-language embedding spaces.")
    parser.add_argument("--version", action="version", version=f"vlctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(subparsers, name: str, help_: str, handler) -> argparse.ArgumentParser:
        p = subparsers.add_parser(name, help=help_, description=help_)
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        p.set_defaults(handler=handler)
        return p

    data = sub.add_parser("data", help="generate synthetic datasets", description="Generate synthetic datasets.")
    data_sub = data.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    from vlctl.data.mad import MadConfig

    p = add(data_sub, "mad", "generate the MAD dataset (MNIST digits with attributes; TEVI)", _cmd_data_mad)
    p.add_argument("--out", required=True, help="output directory (written atomically)")
    add_config_args(p, MadConfig)

    tr = sub.add_parser("train", help="train models", description="Train models (works under torchrun).")
    tr_sub = tr.add_subparsers(dest="model_kind", required=True, metavar="MODEL")
    from vlctl.train.clip import ClipTrainConfig
    from vlctl.train.loop import LoopConfig

    p = add(tr_sub, "clip", "train a TinyCLIP from scratch on a captioned dataset", _cmd_train_clip)
    p.add_argument("--data", required=True, help="dataset directory (MAD format)")
    p.add_argument("--out", required=True, help="run directory (checkpoint/, model/, log.jsonl)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint (config must match)")
    add_config_args(p, ClipTrainConfig)
    add_config_args(p, LoopConfig)

    p = add(sub, "embed", "embed a dataset's images and captions into the cache", _cmd_embed)
    p.add_argument("--encoder", required=True, help="encoder directory (a saved TinyCLIP model/)")
    p.add_argument("--data", required=True, help="dataset directory (MAD format)")
    p.add_argument("--out", required=True, help="cache root; the entry is keyed by encoder, data and preprocessing")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default: 256)")

    # `fit METHOD` and `score METHOD`: one subparser each, shared by every method's commands.
    fit = sub.add_parser("fit", help="fit a method on cached embeddings", description="Fit a method on embeddings.")
    fit_sub = fit.add_subparsers(dest="method", required=True, metavar="METHOD")
    score = sub.add_parser("score", help="score cached embeddings with a fitted method",
                           description="Score cached embeddings with a fitted method.")
    score_sub = score.add_subparsers(dest="method", required=True, metavar="METHOD")
    from vlctl.methods import cli as methods_cli

    methods_cli.register(fit_sub, score_sub, add)  # vlctl fit sae / fit tevi / score tevi

    from vlctl.recipes import RECIPES

    p = add(sub, "reproduce", "run a paper reproduction recipe stage by stage, with caching", _cmd_reproduce)
    p.add_argument("name", choices=sorted(RECIPES) + ["all"], help="recipe name, or 'all'")
    p.add_argument("--quick", action="store_true", help="the small CPU version (minutes)")
    p.add_argument("--out", required=True, help="output directory: results.json, report.md/html, figures/, arrays/")
    p.add_argument("--force", action="store_true", help="recompute every stage instead of reusing cached ones")
    p.add_argument("--stages", default=None, help="stage cache directory (default OUT/stages); point recipes at the "
                   "same one to share stages, e.g. tevi-mad reuses mad-clip's trained CLIP")

    # Each part of vlctl registers its own commands (handlers import their heavy modules lazily).
    from vlctl.eval.retrieval import register as register_eval
    from vlctl.index.cli import register as register_index
    from vlctl.methods.relevancy import register as register_explain
    from vlctl.methods.tree_tune import register as register_tree_tune
    from vlctl.methods.trees import register as register_tree

    register_index(sub, add)  # vlctl index / vlctl search
    _register_controlembed(sub, data_sub, fit_sub, add)  # vlctl data shapes / fit controlembed / cluster
    register_tree(sub, add)  # vlctl tree
    register_eval(sub, add)  # vlctl eval retrieval
    register_explain(sub, add)  # vlctl explain
    register_tree_tune(data_sub, fit_sub, add)  # vlctl data scenes / fit tree
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.handler(args)
    except VlctlError as e:
        print(f"vlctl: error: {e}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    elif result:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0

"""`vlctl fit sae | tevi | controlembed | tree`, `vlctl score tevi`, `vlctl cluster`: the methods
over a store written by `vlctl embed` / `vlctl index` (image embeddings, and caption embeddings
paired row by row where the source had captions)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from vlctl.cli.output import add_output_args
from vlctl.config import add_config_args, config_from_args
from vlctl.fsops import VlctlError


def _open(path: str, need_texts: bool):
    """The store at `path` (`vlctl embed` / `vlctl index`), with image rows, and captions if needed."""
    from vlctl.embeddings.store import open_store

    store = open_store(path)
    if store.image_emb is None:
        raise VlctlError(f"{path}: the store holds no image embeddings")
    if need_texts and store.text_emb is None:
        raise VlctlError(f"{path}: the store holds no captions (text rows); embed a source with captions, e.g. "
                         "a folder with --annotations captions.csv")
    return store


def _finite(path: str, emb, what: str = "image embeddings") -> np.ndarray:
    """The (n, d) embeddings of the store at `path` as float32, refusing NaN/Inf naming the store."""
    from vlctl.methods.base import as_matrix

    return as_matrix(emb, f"{path}: {what}")


def _store_arg(p: argparse.ArgumentParser, help_: str) -> None:
    from vlctl.cli.args import in_path

    p.add_argument("--store", "--cache", dest="store", required=True, type=in_path("store directory", "dir"),
                   help=help_ + " (`vlctl embed` / `vlctl index`)")


def fit_sae(args: argparse.Namespace) -> dict:
    from vlctl.methods.sae.model import SparseAutoencoder

    cache = _open(args.store, need_texts=False)
    cfg = config_from_args(SparseAutoencoder.Config, args)
    if args.concepts:
        from vlctl.encoders.factory import create
        from vlctl.io import read_text_utf8

        if not args.encoder:
            raise VlctlError("--concepts needs --encoder: the concepts are embedded with the cache's text encoder")
        lines = [ln.strip() for ln in read_text_utf8(args.concepts, "concepts file").splitlines() if ln.strip()]
        if not lines:
            raise VlctlError(f"{args.concepts}: empty concept list (one concept per line)")
        encoder = create(args.encoder)
        if encoder.id != cache.encoder_id:
            raise VlctlError(f"{args.encoder}: encoder {encoder.id!r} is not the cache's {cache.encoder_id!r}")
        import torch

        with torch.no_grad():
            concepts = encoder.encode_texts(encoder.tokenize(lines)).numpy()
        # --concepts-init: the rows start at the concepts and train (TEVI's learned SAE); else fixed (a CG-SAE)
        sae = SparseAutoencoder.from_concepts(concepts, config=cfg, fixed=not cfg.concepts_init, progress=True)
    elif cfg.concepts_init:
        raise VlctlError("--concepts-init needs --concepts: the concepts the decoder rows start at")
    else:
        sae = SparseAutoencoder(cfg, progress=True)
    sae.fit(cache)
    sae.save(args.out)
    return {"out": str(args.out), "fvu": sae.fvu_, "dead_latents": sae.n_dead_, "n_latents": sae.config_.n_latents}


def fit_tevi(args: argparse.Namespace) -> dict:
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    cache = _open(args.store, need_texts=True)
    image_emb, text_emb = cache.pairs()  # one row per caption: TEVI learns from image-caption pairs
    image_emb, text_emb = _finite(args.store, image_emb), _finite(args.store, text_emb, "text embeddings")
    sae = SparseAutoencoder.load(args.sae, encoder_id=cache.encoder_id)
    tevi = TEVI(config_from_args(TEVI.Config, args), progress=True)
    tevi.fit(image_emb, text_emb, sae=sae, encoder_id=cache.encoder_id)
    tevi.save(args.out)
    return {"out": str(args.out), **tevi.fusion()}


def alpha_arg(p: argparse.ArgumentParser, what: str) -> None:
    """--alpha of the commands that rerank with TEVI (`vlctl.methods.tevi.fusion`)."""
    from vlctl.config import flag_type

    p.add_argument("--alpha", type=flag_type(float, {"ge": 0, "le": 1}, "alpha"), default=None,
                   help=f"with {what}: the fused score alpha*CLIP + (1-alpha)*TEVI at this alpha (1: CLIP's ranking, "
                   "0: TEVI alone) instead of the one the model chose on its held-out pairs")


def score_tevi(args: argparse.Namespace) -> dict:
    from vlctl.eval.metrics import recall_at_k
    from vlctl.io import atomic_save_npz
    from vlctl.methods.tevi.estimator import TEVI

    store = _open(args.store, need_texts=True)
    tevi = TEVI.load(args.tevi, encoder_id=store.encoder_id)
    img, txt = _finite(args.store, store.image_emb), _finite(args.store, store.text_emb, "text embeddings")
    image_of_text = store.image_of_text()
    base = img @ txt.T
    if args.alpha is not None and not args.rerank:
        raise VlctlError("--alpha goes with --rerank K (the fused rerank); without it every pair gets TEVI's score")
    if args.rerank:  # >= 1: the flag's type refuses the rest
        k = min(args.rerank, len(img))
        # (k, n_texts): each caption's top k by CLIP, reordered by the fused score
        order = tevi.rerank(base, img, txt, k=k, alpha=args.alpha).order.numpy()
        # Scores whose per-text ranking is the reranked one: the top k get k, k-1, ..., 1; the rest
        # keep CLIP's order below them.
        scores = base - base.max() - 1.0
        np.put_along_axis(scores, order, np.arange(k, 0, -1, dtype=base.dtype)[:, None], axis=0)
    else:
        scores = tevi.scores(img, txt).numpy()
    atomic_save_npz(args.out, scores=scores, base_scores=base, image_of_text=image_of_text)
    result = {"out": str(args.out), "shape": list(scores.shape)}
    result["recall_clip"] = recall_at_k(base, image_of_text)
    result["recall_tevi" + ("_rerank" if args.rerank else "")] = {
        k: v for k, v in recall_at_k(scores, image_of_text).items() if k.startswith("t2i") or not args.rerank}
    if args.explain:  # issue 46: each of the first N captions' top image, its latents the mask kept and dropped
        from vlctl.methods.tevi.explain import explain_line, explain_results

        q = np.arange(min(args.explain, txt.shape[0]))
        top = scores[:, q].argmax(0)
        texts = store.texts
        result["explain"] = [{"caption": int(j), "text": texts[j], "image": int(i), **e[0]}
                             for j, i, e in zip(q, top, explain_results(tevi, store, txt[q], top[:, None]))]
        if not args.json:
            for e in result.pop("explain"):
                print(f"caption {e['caption']} {e['text']!r} -> image {e['image']}: {explain_line(e)}")
    if args.rerank:
        result.update(tevi.fusion(args.alpha))
        if not args.json:  # the one line of held-out figures; --json has them as fields
            print(f"[vlctl] {result.pop('note')}", file=sys.stderr)
            result.pop("heldout")
    return result


def fit_sae_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path, text_arg
    from vlctl.methods.sae.config import SAE_DATA_FIELDS, TopKSAEConfig

    _store_arg(p, "the store whose image embeddings the SAE learns")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="SAE directory to write (sae.safetensors + config.json)")
    add_output_args(p)
    p.add_argument("--concepts", type=in_path("concepts file", "file"),
                   help="CG-SAE: text file, one concept per line; decoder rows fixed to their embeddings "
                   "(with --concepts-init: started there, then trained)")
    p.add_argument("--encoder", type=text_arg("spec"),
                   help="the store's encoder spec (tiny:DIR, open_clip:..., hf:...; needed with --concepts)")
    add_config_args(p, TopKSAEConfig, exclude=(*SAE_DATA_FIELDS, "concepts_fixed"))


def fit_tevi_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path
    from vlctl.methods.tevi.config import TEVI_DATA_FIELDS, TeviConfig

    _store_arg(p, "a store with images and their captions")
    p.add_argument("--sae", required=True, type=in_path("SAE directory", "dir"),
                   help="SAE directory from `vlctl fit sae` (same encoder as the cache)")
    p.add_argument("--out", required=True, type=out_path("dir"), help="TEVI directory to write")
    add_output_args(p)
    add_config_args(p, TeviConfig, exclude=TEVI_DATA_FIELDS)


def score_tevi_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import MAX_K, in_path, int_arg, out_path

    _store_arg(p, "a store with images and captions")
    p.add_argument("--tevi", required=True, type=in_path("TEVI directory", "dir"),
                   help="TEVI directory from `vlctl fit tevi`")
    p.add_argument("--out", required=True, type=out_path("file"),
                   help="output .npz: scores (n_images, n_texts) and base_scores (CLIP)")
    rerank = int_arg(0, MAX_K)
    rerank.vlctl_phrase = f"must be >= 1 (candidates per caption; 0 = score every pair) and <= {MAX_K}"
    p.add_argument("--rerank", type=rerank, default=0, help="rerank CLIP's top K per caption by the fused score "
                   "alpha*CLIP + (1-alpha)*TEVI instead of scoring all pairs by TEVI (scores then rank-encode the "
                   f"reranked order; 1..{MAX_K}, 0 = off)")
    alpha_arg(p, "--rerank")
    p.add_argument("--explain", type=int_arg(0, MAX_K), default=0, help="for the first N captions, the top image's "
                   "latents the caption's mask kept and dropped, named with the store's vocabulary (default: 0, none)")


_NOT_LABELS = ("path", "relpath", "captions", "row", "key", "shard", "split")  # row fields that are no attribute


def _read_labels(store, labels_file: str | None, image_column: str | None) -> list[dict]:
    """One dict of attribute values per image row: the store's own fields, or those of a label CSV /
    TSV / JSONL (an image column, then one column per attribute) matched to the rows by path."""
    from pathlib import Path

    rows = store.metadata()
    if labels_file is None:
        return [{k: v for k, v in r.items() if k not in _NOT_LABELS} for r in rows]
    from vlctl.data.loaders.common import IMAGE_COLUMNS, _pick, _read_table

    path = Path(labels_file)
    cols, table = _read_table(path)
    img_col = _pick(cols, image_column, IMAGE_COLUMNS, path, "image path")
    by_name: dict[str, dict] = {}
    for n, row in enumerate(table, 1):
        name = row.get(img_col)
        if not isinstance(name, str) or not name:
            raise VlctlError(f"{path}: row {n} has no {img_col!r}")
        by_name[name] = {k: v for k, v in row.items() if k != img_col and v not in (None, "")}
    out, matched = [], 0
    for r in rows:
        keys = [r.get("relpath"), r.get("path"), Path(r.get("path", "")).name]
        hit = next((by_name[k] for k in keys if k in by_name), None)
        matched += hit is not None
        out.append(hit or {})
    if not matched:
        example = next(iter(by_name), "")
        raise VlctlError(f"{path}: no {img_col!r} value names an image of the store {store.path} (e.g. {example!r}; "
                         f"the store's rows are named like {rows[0].get('relpath') or rows[0].get('path')!r})")
    return out


def fit_controlembed(args: argparse.Namespace) -> dict:
    from vlctl.encoders.factory import create
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.methods.controlembed.prompts import prompt_ensemble

    store = _open(args.store, need_texts=False)
    cfg = config_from_args(ControlEmbed.Config, args)
    if args.rank is not None and cfg.parameterisation != "lowrank":
        raise VlctlError(f"--rank applies to --parameterisation lowrank only (here: {cfg.parameterisation})")
    if cfg.parameterisation == "lowrank" and cfg.rank > store.dim:
        raise VlctlError(f"--rank must be <= the store's embedding dimension {store.dim}, got {cfg.rank}")
    spec = args.encoder or store.encoder_spec
    if not spec:
        raise VlctlError(f"{args.store}: the store records no encoder spec; pass --encoder SPEC")
    fields = _read_labels(store, args.labels, args.image_column)  # before the encoder loads: bad labels fail fast
    found = sorted({k for f in fields for k, v in f.items() if isinstance(v, (str, int))})
    if not found:
        raise VlctlError(f"{args.labels}: no attribute column besides the image column" if args.labels else
                         f"{args.store}: its rows carry no attribute labels; give --labels FILE (an image column and "
                         "one column per attribute), or embed with --annotations")
    categories = args.categories or found
    unknown = [c for c in categories if c not in found]
    if unknown:
        raise VlctlError(f"{args.labels or args.store}: no labels for attribute(s) {', '.join(unknown)}; the "
                         f"labelled attributes are {', '.join(found)}")
    keep = np.array([all(c in f for c in categories) for f in fields])
    if keep.sum() < 4:
        raise VlctlError(f"{args.labels or args.store}: only {int(keep.sum())} images are labelled in every "
                         f"attribute of {', '.join(categories)}; ControlEmbed needs at least two images per subclass")
    labels = {c: [str(f[c]) for f, k in zip(fields, keep) if k] for c in categories}
    encoder = create(spec)
    store.check_encoder(encoder.id)  # the class prompts must be embedded in the store's space
    shapes = str(store.info.get("data_id", "")).startswith("shapes-")  # the shapes set's own phrasing

    def phrase(category: str, value: str) -> str:
        if shapes:
            from vlctl.data.shapes import subclass_phrase

            return subclass_phrase(category, value)
        return value

    text = {c: prompt_ensemble(lambda t: encoder.embed_texts(t), [phrase(c, v) for v in sorted(set(labels[c]))],
                               args.templates) for c in categories}
    model = ControlEmbed(cfg, progress=not args.json).fit(
        _finite(args.store, store.image_emb)[keep], labels, encoder_id=encoder.id, class_text_emb=text)
    model.save(args.out)
    return {"out": str(args.out), "encoder_id": encoder.id, "categories": categories, "images": int(keep.sum()),
            "unlabelled_images": int((~keep).sum()), "final_loss": model.final_loss_}


def fit_controlembed_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import TEMPLATE, in_path, out_path, text_arg
    from vlctl.methods.controlembed.config import CONTROLEMBED_DATA_FIELDS, DEFAULT_TEMPLATES, ControlEmbedConfig

    _store_arg(p, "the store of the images to learn the attributes from")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="model directory (controlembed.safetensors + config.json)")
    add_output_args(p)
    p.add_argument("--labels", default=None, type=in_path("labels file", "file"), help="a CSV / TSV / JSONL with an image column (path relative to the "
                   "folder that was embedded, or the file name) and one column per attribute (default: the attribute "
                   "fields the store's rows carry, e.g. from `vlctl embed --annotations` or a generated set)")
    p.add_argument("--image-column", default=None, type=text_arg("column"), help="the --labels column naming the "
                   "image (default: the first of filepath, image, image_path, path, file, filename)")
    p.add_argument("--encoder", default=None, type=text_arg("spec"),
                   help="encoder spec for the subclass prompts (default: the store's)")
    p.add_argument("--categories", nargs="+", default=None, type=text_arg("attribute"),
                   help="attributes to train on (default: every labelled one)")
    p.add_argument("--templates", nargs="+", default=list(DEFAULT_TEMPLATES), type=TEMPLATE,
                   help="prompt templates with {} for the subclass, averaged per subclass")
    add_config_args(p, ControlEmbedConfig, exclude=CONTROLEMBED_DATA_FIELDS)


def _open_cluster_source(path: str, data: str | None):
    """STORE -> (embeddings (N, D), encoder id, kind, image of rows `ids` for contact sheets or None).

    A store of files names each image's path in its rows; a store of a generated set names the
    set's directory (or `--data` does), whose memory-mapped images must be the ones embedded.
    """
    store = _open(path, need_texts=False)
    kind, images = store_images(store, path, data)
    return _finite(path, store.image_emb), store.encoder_id, kind, images


def store_images(store, path: str, data: str | None):
    """(kind, image of rows `ids` or None) of a store: "files" (its rows name image files),
    "generated" (the generated set it names, or `data`; checked to be the one embedded) or
    "embeddings" (no images). `vlctl cluster` and `vlctl inspect sae` draw their sheets from it."""
    images, kind = None, "embeddings"
    if "path" in store.metadata([0])[0]:
        images, kind = (lambda ids: [m.get("path", "") for m in store.metadata(ids)]), "files"
    elif data is not None or store.info.get("source"):
        from vlctl.data.source import open_source

        source = open_source(data or store.info["source"])
        if source.data_id != store.info.get("data_id") or len(source) != len(store):
            raise VlctlError(f"{source.name}: not the data the store {path} was embedded from (data id "
                             f"{source.data_id!r}, the store records {store.info.get('data_id')!r})")
        images, kind = (lambda ids: [source.array[i] for i in ids]), "generated"
    return kind, images


def cluster(args: argparse.Namespace) -> dict:
    import numpy as np

    from vlctl.io import atomic_write_json
    from vlctl.methods.controlembed.estimator import ControlEmbed, normalize_rows

    if (args.store is None) == (args.store_flag is None):
        raise VlctlError("cluster: give the store once, as STORE or --store")
    source = args.store if args.store is not None else args.store_flag
    if args.per_sheet * args.thumb**2 > MAX_SHEET_PIXELS:  # each flag is in range; their sheet must be too
        raise VlctlError(f"--per-sheet {args.per_sheet} x --thumb {args.thumb}: a contact sheet of "
                         f"{args.per_sheet * args.thumb**2:,} pixels exceeds the limit of {MAX_SHEET_PIXELS:,}; "
                         "lower either")
    emb, encoder_id, kind, images_of = _open_cluster_source(source, args.data)
    model = ControlEmbed.load(args.controlembed)
    if model.encoder_id_ != encoder_id:
        raise VlctlError(f"{source}: embeddings come from encoder {encoder_id!r}, but the ControlEmbed model "
                         f"{args.controlembed} was fitted on {model.encoder_id_!r}; maps of one embedding space are "
                         "meaningless in another (fit ControlEmbed on this store's encoder)")
    if args.k is None and args.attribute not in model.subclasses_:  # the CLI's words: the flag, not cluster()'s k
        raise VlctlError(f"--attribute {args.attribute}: not trained on (trained: {', '.join(model.categories_)}), so "
                         "it has no number of subclasses to cluster into: give --k")
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
    result = {"attribute": args.attribute, "k": k, "model": str(args.controlembed), "store": str(source),
              "store_kind": kind, "encoder_id": encoder_id, "seed": args.seed, "n_images": len(ids),
              "cluster_sizes": {c["id"]: c["size"] for c in clusters if c["size"]}}
    if not args.out:
        return result
    out = Path(args.out)
    record = {**result, "cluster_of_image": ids.tolist(), "clusters": clusters}
    if kind == "files":
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
        result["note"] = "no contact sheets: the store names no images; pass --data DIR (the set it was embedded from)"
    return result


MAX_THUMB = 1024  # pixels of a contact sheet thumbnail's side
MAX_SHEET_PIXELS = 1 << 28  # --per-sheet x --thumb^2: about 800 MB of RGB


def cluster_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import SEED, in_path, int_arg, out_path, text_arg

    store = in_path("store directory", "dir")
    p.add_argument("store", nargs="?", default=None, type=store, help="store directory (vlctl embed / vlctl index)")
    p.add_argument("--store", "--gallery", dest="store_flag", default=None, type=store, help="the same as STORE")
    p.add_argument("--controlembed", "--model", dest="controlembed", required=True,
                   type=in_path("ControlEmbed model directory", "dir"),
                   help="ControlEmbed model directory (vlctl fit controlembed), fitted on the store's encoder")
    p.add_argument("--attribute", required=True, type=text_arg("attribute"),
                   help="attribute category text, e.g. shape")
    p.add_argument("--k", type=int_arg(1, 100_000), default=None,
                   help="clusters (default: the category's number of subclasses)")
    p.add_argument("--seed", type=SEED, default=0, help="k-means seed (default: 0)")
    p.add_argument("--out", default=None, type=out_path("dir-or-json"), help="output directory: clusters.json and "
                   "cluster_NN.png contact sheets (a path ending in .json writes only the cluster of every image there)")
    p.add_argument("--per-sheet", type=int_arg(1, 4096), default=32,
                   help="images per contact sheet: those nearest the cluster centre (default: 32; 1..4096)")
    p.add_argument("--thumb", type=int_arg(8, MAX_THUMB), default=128,
                   help=f"thumbnail side in pixels (default: 128; 8..{MAX_THUMB})")
    p.add_argument("--cols", type=int_arg(1, 256), default=8, help="thumbnails per row (default: 8; 1..256)")
    p.add_argument("--data", default=None, type=in_path("dataset directory", "dir"), help="for a store of a generated set: the set's directory, if it moved "
                   "since it was embedded (its images go on the contact sheets)")


def _scenes_dir(args: argparse.Namespace) -> str:
    """The scenes directory of `fit tree`: --data, or the generated set a --store was embedded from
    (TreeTuner fine-tunes the encoder, so it learns from the pixels and captions, not embeddings)."""
    if (args.data is None) == (args.store is None):
        raise VlctlError("fit tree: give the scenes as --data DIR or as --store STORE (a store of a scenes set)")
    if args.data is not None:
        return args.data
    store = _open(args.store, need_texts=True)
    source = store.info.get("source")
    if not source or not str(store.info.get("data_id", "")).startswith("scenes-"):
        raise VlctlError(f"{args.store}: not a store of a scenes set (vlctl data scenes); TreeTuner fine-tunes a "
                         "TinyCLIP on the set's images and captions")
    from vlctl.data.scenes import scenes_dataset_id

    if scenes_dataset_id(source) != store.info["data_id"]:
        raise VlctlError(f"{source}: changed since the store {args.store} was embedded from it (data id "
                         f"{scenes_dataset_id(source)!r}, the store records {store.info['data_id']!r})")
    return source


def fit_tree(args) -> dict:
    from vlctl.captions.trees import TreeGenerator
    from vlctl.config import config_from_args
    from vlctl.data.scenes import SCENE_OPPOSITES, load_scenes, vocabulary
    from vlctl.encoders import tiny_pretrained
    from vlctl.methods.threevl.tree_tune import TreeTuner

    cfg = config_from_args(TreeTuner.Config, args)
    data = load_scenes(_scenes_dir(args))
    captions = [lab["caption"] for lab in data["labels"]]
    model = tiny_pretrained.load_pretrained(args.encoder)
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
    tuner = TreeTuner(cfg).fit(data["images"], captions, model=model, trees=trees, negatives=negatives,
                               out_dir=Path(args.out) / "run", resume=args.resume)
    tuner.save(args.out)
    return {"out": str(args.out), "mode": cfg.mode, "steps": tuner.result_.steps, "final_loss": tuner.result_.final_loss,
            "base_encoder_id": tuner.base_id_}


def fit_tree_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path
    from vlctl.methods.threevl.config import TreeTuneConfig

    p.add_argument("--encoder", required=True, type=in_path("TinyCLIP model directory", "dir"),
                   help="base TinyCLIP model directory (save_pretrained)")
    p.add_argument("--data", default=None, type=in_path("scenes directory", "dir"),
                   help="scenes directory (vlctl data scenes), e.g. the finetune split")
    p.add_argument("--store", default=None, type=in_path("store directory", "dir"), help="or a store of a scenes set (`vlctl embed SCENES_DIR`): its images "
                   "and captions are read from the set it names")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="output: adapters/ (adapter weights only) and model/ (merged TinyCLIP)")
    add_output_args(p)
    p.add_argument("--resume", action="store_true", help="continue OUT/run/checkpoint (config must match)")
    add_config_args(p, TreeTuneConfig)

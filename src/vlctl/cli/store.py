"""`vlctl embed`, `vlctl index`, `vlctl search`: the embeddings store.

    vlctl embed photos/ --encoder open_clip:ViT-B-32/laion2b_s34b_b79k --out store/
    vlctl index photos/ --encoder hf:/models/siglip --out store/ --annotations labels.csv --index-kind hnsw
    vlctl search store/ --text "a red bicycle" -k 10 --json
    vlctl search store/ --image query.jpg
    vlctl search store/ --embedding query.npy
    vlctl search laion_part/ --text "a red bicycle" --encoder open_clip:ViT-B-32/laion2b_s34b_b79k
    vlctl store convert old_store/ new_store/
    vlctl index store/ --backend milvus:photos.db       # a Milvus collection from the store (resumable)
    vlctl search --backend milvus:photos.db --text "a red bicycle"
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from vlctl.cli.output import add_output_args
from vlctl.config import add_config_args, config_from_args
from vlctl.fsops import VlctlError

_INDEX_PREFIX = "index-"  # IndexConfig fields become --index-kind, --index-nlist, ...


def _index_config(args: argparse.Namespace, default_kind: str):
    """The IndexConfig from --index-* flags over `default_kind`; with no flag, None for an existing
    store (it keeps its own index) and `default_kind` for a new one."""
    from pathlib import Path

    from vlctl.embeddings.search import IndexConfig

    if _any_index_flag(args):
        return config_from_args(IndexConfig, args, base=IndexConfig(kind=default_kind), prefix=_INDEX_PREFIX)
    return None if (Path(args.out) / "manifest.json").is_file() else IndexConfig(kind=default_kind)


def _embed_into_store(args: argparse.Namespace, default_kind: str) -> dict:
    from vlctl.data.loaders.common import MissingImagesError
    from vlctl.data.source import open_source
    from vlctl.embeddings.build import embed_source
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.encoders.factory import create
    from vlctl.train.distributed import destroy_distributed, init_distributed

    try:
        source = open_source(args.source, args.annotations, args.image_column, args.caption_column,
                             on_missing="skip" if args.skip_missing else "error")
    except MissingImagesError as e:
        raise VlctlError(f"{e} (--skip-missing drops them)") from None
    if not len(source):
        raise VlctlError(f"{args.source}: no images found (extensions: jpg, jpeg, png, webp, bmp, gif, tif)")
    extract = config_from_args(ExtractConfig, args)
    index_config = _index_config(args, default_kind)
    device = args.device
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: one shard of the images per rank
        device = str(init_distributed("cuda" if args.device.startswith("cuda") else "cpu").device)
    encoder = create(args.encoder, device=device, precision=args.precision, batch_size=extract.batch_size)
    store, report = embed_source(encoder, source, args.out, index_config, extract,
                                 encoder_spec=getattr(encoder, "spec", args.encoder), progress=not args.no_progress,
                                 strict=args.strict)
    destroy_distributed()  # only on success: after a failure on one rank a barrier would wait forever
    if store is None:  # a torchrun rank other than 0; rank 0 reports
        return report
    report = {
        "store": str(store.path),
        "encoder_id": store.encoder_id,
        "index": store.config.kind,
        "missing_annotated_images": source.missing,
        **report,
    }
    if not args.json:  # the failures and notes are listed at the end (vlctl.cli.listing)
        report = {k: v for k, v in report.items() if k != "missing_annotated_images"}
    return report


def embed(args: argparse.Namespace) -> dict:
    return _embed_into_store(args, EMBED_KIND)


def index(args: argparse.Namespace) -> dict:
    if args.backend is not None:
        return _fill_backend(args)
    missing = [f for f, v in (("--encoder", args.encoder), ("--out", args.out)) if v is None]
    if missing:  # required unless --backend
        raise VlctlError(f"the following arguments are required: {', '.join(missing)} (or --backend milvus:..., "
                         "to fill a Milvus collection from a store; see vlctl index --help)")
    return _embed_into_store(args, INDEX_KIND)


_MILVUS_PREFIX = "milvus-"  # MilvusConfig fields become --milvus-index, --milvus-ef, ...


def _fill_backend(args: argparse.Namespace) -> dict:
    """`vlctl index STORE --backend milvus:...`: the store's rows into a Milvus collection."""
    from vlctl.embeddings.milvus import MilvusConfig, fill
    from vlctl.embeddings.store import open_store

    given = [f for f in dataclasses.fields(MilvusConfig) if getattr(args, _MILVUS_PREFIX + f.name) is not None]
    if args.encoder is not None or args.out is not None:
        raise VlctlError("index --backend: SOURCE is a store, filled into the backend as it is; --encoder and --out "
                         "go with images (embed them into a store first)")
    config = config_from_args(MilvusConfig, args, prefix=_MILVUS_PREFIX) if given else None
    return fill(open_store(args.source), args.backend, config, progress=not args.no_progress)


def open_searchable(store: str | None, backend: str | None):
    """The store directory or the Milvus collection (`--backend`) a command searches."""
    if (store is None) == (backend is None):
        raise VlctlError("give a STORE directory or --backend milvus:..., one of them")
    if backend is not None:
        from vlctl.embeddings.milvus import open_milvus

        return open_milvus(backend)
    from vlctl.embeddings.store import open_store

    return open_store(store)


def _load_query_embedding(path: str):
    import numpy as np

    try:
        q = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise VlctlError(f"{path}: cannot read a query embedding .npy ({e})") from None
    if q.ndim == 2 and q.shape[0] == 1:
        q = q[0]
    if q.ndim != 1:
        raise VlctlError(f"{path}: expected one embedding of shape (dim,) or (1, dim), got {q.shape}")
    if not np.issubdtype(q.dtype, np.number) or np.iscomplexobj(q):
        raise VlctlError(f"{path}: expected a real-valued embedding, got dtype {q.dtype}")
    if not np.isfinite(q).all():
        raise VlctlError(f"{path}: the query embedding holds NaN or Inf")
    return q


def _tevi_reranker(path: str, store, alpha: float | None = None):
    """The TEVI directory of `--rerank tevi:DIR` -> a Reranker (refused unless fitted on the store's encoder)."""
    from vlctl.methods.tevi.estimator import TEVI

    return TEVI.load(path, encoder_id=store.encoder_id).store_reranker(alpha=alpha)


def _check_query_flags(args: argparse.Namespace) -> None:
    """Refuse a flag the query kind would ignore: the hits would silently equal a plain search.
    ControlEmbed's attribute map moves an image embedding (its query mode), so --attribute goes
    with --image; TEVI re-scores a caption's candidates, so --rerank goes with --text."""
    if args.attribute is not None and args.image is None:
        raise VlctlError("--attribute goes with --image: ControlEmbed maps an image query by an attribute (a text "
                         "or embedding query has no such map); drop --attribute, or query by --image")
    if args.controlembed is not None and args.attribute is None:
        raise VlctlError("--controlembed is used only with --attribute NAME (and --image); add --attribute")
    if args.rerank is not None and args.text is None:
        raise VlctlError("--rerank goes with --text: TEVI re-scores a caption's candidates; drop --rerank")


def search(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from vlctl.encoders.factory import create
    from vlctl.images import read_image

    _check_query_flags(args)
    if args.alpha is not None and not args.rerank:
        raise VlctlError("--alpha goes with --rerank tevi:DIR (the fused rerank)")
    store = open_searchable(args.store, args.backend)
    if args.embedding is not None:  # a raw query vector: no encoder needed (a clip-retrieval folder's is maybe unknown)
        result = store.search(_load_query_embedding(args.embedding), k=args.k)
        query: dict = {"embedding": args.embedding}
    else:
        spec = args.encoder or store.encoder_spec
        if not spec:
            raise VlctlError(f"{store.path}: the store records no encoder spec; pass --encoder SPEC")
        encoder = create(spec, device=args.device)
        store.adopt_encoder(encoder.id, spec)  # a clip-retrieval folder that named none: the user's, recorded beside it
        store.check_encoder(encoder.id)  # the same spec may now point at other weights
        if args.text is not None:
            kw = {}
            if args.rerank:
                kw = {"reranker": _tevi_reranker(args.rerank, store, args.alpha), "candidates": args.rerank_candidates}
            result = store.search_texts(encoder, [args.text], k=args.k, **kw)
            query = {"text": args.text, **({"rerank": f"tevi:{args.rerank}", **kw["reranker"].fusion}
                                           if args.rerank else {})}
            if args.rerank and not args.json:  # the one line of held-out figures; --json has them as fields
                print(f"[vlctl] {query['note']}", file=sys.stderr)
        else:
            image = read_image(args.image)
            pre = getattr(encoder, "preprocess_pil", None)
            x = pre(image) if pre is not None else encoder.preprocess(np.asarray(image))
            if args.attribute:
                # ControlEmbed query mode: only the query moves, (q W + b) . g over the frozen store.
                from vlctl.methods.controlembed.estimator import ControlEmbed

                if not args.controlembed:
                    raise VlctlError("--attribute needs --controlembed DIR (a model from `vlctl fit controlembed`)")
                model = ControlEmbed.load(args.controlembed, encoder_id=store.encoder_id)
                with torch.no_grad():
                    q_emb = encoder.encode_images(torch.as_tensor(x)[None], normalize=True).cpu().numpy()
                result = store.search(model.transform(q_emb, args.attribute, encoder_id=store.encoder_id), k=args.k)
                query = {"image": args.image, "attribute": args.attribute}
            else:
                result = store.search_images(encoder, torch.as_tensor(x)[None], k=args.k)
                query = {"image": args.image}
    hits = [{"rank": r + 1, **h} for r, h in enumerate(result.hits(store)[0])]
    if args.explain:  # issue 46: the named latents the caption's mask kept and dropped, per hit
        from vlctl.methods.tevi.estimator import TEVI
        from vlctl.methods.tevi.explain import explain_results

        if not (args.rerank and args.text is not None):
            raise VlctlError("--explain goes with --text and --rerank tevi:DIR (it explains TEVI's mask)")
        hits = [h for h in hits if h["id"] >= 0]
        tevi = TEVI.load(args.rerank, encoder_id=store.encoder_id)
        [expl] = explain_results(tevi, store, encoder.embed_texts([args.text]), [[h["id"] for h in hits]], encoder)
        for h, e in zip(hits, expl):
            h["explain"] = e
    if args.json:
        return {"store": str(store.path), "encoder_id": store.encoder_id, "query": query, "hits": hits}
    for h in hits:
        print(f"{h['rank']:>4}  {h['score']:.4f}  {h.get('path', h['id'])}")
        if "explain" in h:
            from vlctl.methods.tevi.explain import explain_line

            print(f"      {explain_line(h['explain'])}")
    return {}


def _spec_help() -> str:
    from vlctl.encoders.factory import SPEC_FORMS

    return "encoder spec: " + " | ".join(SPEC_FORMS)


def _backend_arg(p: argparse.ArgumentParser, help: str) -> None:
    from vlctl.cli.args import text_arg

    p.add_argument("--backend", default=None, type=text_arg("backend"), help=help + ": milvus:PATH.db (Milvus Lite, "
                   "one machine), milvus:http(s)://HOST:PORT or milvus:HOST:PORT (a Milvus server or cluster), "
                   "then #COLLECTION (default vlctl); see docs/deployment.md")


def _source_args(p: argparse.ArgumentParser, default_kind: str, backend: bool = False) -> None:
    from vlctl.cli.args import device_arg, in_path, out_path, source_arg, strict_arg, text_arg
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.embeddings.search import IndexConfig

    spec_help = _spec_help()
    p.add_argument("source", type=source_arg,
                   help="a folder of images (recursive), a CSV/TSV/JSONL of image path + caption, "
                   "WebDataset .tar shards (shards-{000..009}.tar), or a generated set (vlctl data ...)")
    # Not required with --backend (`index` checks): then SOURCE is a store.
    p.add_argument("--encoder", required=not backend, type=text_arg("spec"), help=spec_help)
    p.add_argument("--out", required=not backend, type=out_path("dir"),
                   help="store directory (created, or added to: new images only)")
    add_output_args(p)
    p.add_argument(
        "--annotations",
        default=None,
        type=in_path("annotation file", "file"),
        help="for a folder: a CSV / TSV / JSONL naming images (paths relative to the folder) with a caption "
        "column and attribute columns (every other column, e.g. color, becomes a field of the image's row)",
    )
    p.add_argument("--image-column", default=None, type=text_arg("column"), help="the annotation column with the "
                   "image path (default: the first of filepath, image, image_path, path, file, filename)")
    p.add_argument("--caption-column", default=None, type=text_arg("column"), help="the annotation column with the caption (default: the "
                   "first of title, caption, text, captions, description)")
    p.add_argument(
        "--skip-missing", action="store_true", help="drop annotated images that are not on disk instead of failing"
    )
    p.add_argument("--device", default="cpu", type=device_arg, help="torch device for the encoder (default: cpu)")
    p.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "fp16", "bf16"],
        help="autocast precision on the device (default: fp32)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    strict_arg(p)
    add_config_args(p, ExtractConfig)
    add_config_args(p, IndexConfig, prefix=_INDEX_PREFIX, defaults={"kind": default_kind}, exclude=("dtype",))
    _dtype_arg(p)
    if backend:
        from vlctl.embeddings.milvus import MilvusConfig

        _backend_arg(p, "instead of embedding images: SOURCE is a store, whose rows fill this collection (only "
                     "the rows it lacks; the --milvus-* flags set a new collection's index)")
        add_config_args(p, MilvusConfig, prefix=_MILVUS_PREFIX)


def _dtype_arg(p: argparse.ArgumentParser) -> None:
    """--dtype: IndexConfig.dtype under its own short name (the rows' storage, not the index's)."""
    p.add_argument("--dtype", dest=_INDEX_PREFIX + "dtype", default=None, choices=["float32", "float16"],
                   help="stored dtype of a new store's embeddings: float16 halves the shards; search and every method "
                   "compute in float32 (default: float32)")


# The index kind each command writes by default (its help says so): `embed` exact numpy search,
# `index` a FAISS index.
EMBED_KIND, INDEX_KIND = "none", "flat"


def embed_args(p: argparse.ArgumentParser) -> None:
    _source_args(p, EMBED_KIND)


def index_args(p: argparse.ArgumentParser) -> None:
    _source_args(p, INDEX_KIND, backend=True)


def search_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import MAX_K, device_arg, in_path, int_arg, text_arg
    from vlctl.cli.methods import alpha_arg

    spec_help = _spec_help()
    p.add_argument("store", nargs="?", default=None, type=in_path("store directory", "dir"),
                   help="store directory (made by `vlctl embed` or `vlctl index`); or --backend")
    _backend_arg(p, "search this collection instead of a store directory (filled by `vlctl index STORE --backend`)")
    q = p.add_mutually_exclusive_group(required=True)
    q.add_argument("--text", type=text_arg(), help="query text")
    q.add_argument("--image", type=in_path("query image", "file"), help="query image file")
    q.add_argument("--embedding", type=in_path("query embedding .npy", "file"),
                   help="query embedding: a .npy file of shape (dim,) or (1, dim)")
    p.add_argument("--attribute", default=None, type=text_arg("attribute"), help="with --image: search by this "
                   "attribute only (e.g. color), ControlEmbed query mode; needs --controlembed")
    p.add_argument("--controlembed", default=None, type=in_path("ControlEmbed model directory", "dir"),
                   help="ControlEmbed model directory (vlctl fit controlembed)")
    p.add_argument("--rerank", default=None, type=_rerank_spec, help="with --text: re-score the top candidates "
                   "with tevi:DIR (a TEVI fitted on the store's encoder)")
    alpha_arg(p, "--rerank")
    p.add_argument("--rerank-candidates", type=int_arg(1, MAX_K), default=100,
                   help=f"candidates the reranker sees (default: 100; at most {MAX_K})")
    p.add_argument("--explain", action="store_true", help="with --rerank tevi:DIR: under each hit, the image's "
                   "latents the caption's mask kept and dropped, named with the store's vocabulary")
    p.add_argument("-k", type=int_arg(1, MAX_K), default=10, help=f"number of results (default: 10; at most {MAX_K})")
    p.add_argument("--encoder", default=None, type=text_arg("spec"),
                   help=spec_help + " (default: the one recorded in the store)")
    p.add_argument("--device", default="cpu", type=device_arg, help="torch device for the encoder (default: cpu)")


def _rerank_spec(text: str) -> str:
    """`--rerank tevi:DIR` -> DIR, as a path that `check_paths` finds to be a directory after parsing."""
    from vlctl.cli.args import PathArg
    from vlctl.config import shorten

    kind, _, path = text.partition(":")
    if kind != "tevi" or not path:
        raise argparse.ArgumentTypeError(f"must be tevi:DIR (a directory written by `vlctl fit tevi`), got "
                                         f"{shorten(repr(text))}")
    return PathArg(path, "in", "dir", "TEVI directory")


def convert(args: argparse.Namespace) -> dict:
    from vlctl.embeddings.build import convert_store

    store = convert_store(args.source, args.out, _index_config(args, "none") if _any_index_flag(args) else None)
    return {"store": str(store.path), "from": str(args.source), "images": len(store), "texts": len(store.texts_table),
            "index": store.config.kind, "dtype": store.config.dtype}


def _any_index_flag(args: argparse.Namespace) -> bool:
    from vlctl.embeddings.search import IndexConfig

    return any(getattr(args, _INDEX_PREFIX + f.name, None) is not None for f in dataclasses.fields(IndexConfig))


def convert_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path
    from vlctl.embeddings.search import IndexConfig

    p.add_argument("source", type=in_path("store or clip-retrieval folder", "dir"),
                   help="a store of an older vlctl (emb-*.npy, meta-*.jsonl) or a clip-retrieval folder (img_emb/, "
                   "metadata/); read, never changed")
    p.add_argument("out", type=out_path("dir"), help="the new store directory")
    add_output_args(p)
    add_config_args(p, IndexConfig, prefix=_INDEX_PREFIX, exclude=("dtype",))
    _dtype_arg(p)

"""`vlctl inspect sae`: what a fitted SAE learned. Every latent named with text (the vocabulary the
store's encoder embeds), shown with its top images, checked against the store's captions
(`vlctl.methods.sae.describe`; the output: `vlctl.report.latents`)."""

from __future__ import annotations

import argparse

from vlctl.cli.output import add_output_args


def inspect_sae(args: argparse.Namespace) -> dict:
    from vlctl.cli.methods import _open, store_images
    from vlctl.methods.sae.describe import describe_store, read_vocabulary
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.report.latents import write_inspection

    store = _open(args.store, need_texts=False)
    sae = SparseAutoencoder.load(args.sae, encoder_id=store.encoder_id)
    extra = read_vocabulary(args.vocabulary) if args.vocabulary else []
    if args.vocabulary and not extra:
        from vlctl.fsops import VlctlError

        raise VlctlError(f"{args.vocabulary}: empty vocabulary file (one name per line)")
    _, images_of = store_images(store, args.store, args.data) if args.sheets else ("", None)
    desc = describe_store(sae.model_, sae.encoder_id_, store, extra, k=args.k, n_names=args.names,
                          min_count=args.min_count, max_vocabulary=args.max_vocabulary, shuffle_seed=args.seed,
                          progress=True)
    summary = write_inspection(args.out, desc.rows, desc.summary, images_of, args.sheets, args.thumb, args.cols,
                               title=f"SAE latents: {args.sae} on {args.store}")
    result = {"out": str(args.out), **{k: v for k, v in summary.items() if k != "dead_latents"}}
    if not args.json:  # a line per count, not the list of every dead latent
        result["dead_latents_listed_in"] = f"{args.out}/report.md"
    else:
        result["dead_latents"] = summary["dead_latents"]
    return result


def inspect_sae_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import SEED, in_path, int_arg, out_path
    from vlctl.cli.methods import MAX_THUMB, _store_arg

    _store_arg(p, "the store whose images the latents are shown with and whose captions name and check them")
    p.add_argument("--sae", required=True, type=in_path("SAE directory", "dir"),
                   help="SAE directory from `vlctl fit sae` (fitted on the store's encoder)")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="output directory: latents.jsonl, summary.json, report.md / report.html, sheets/")
    add_output_args(p)
    p.add_argument("--vocabulary", default=None, type=in_path("vocabulary file", "file"),
                   help="more names, one per line (UTF-8), added to the store's caption phrases (or, for a store "
                   "without captions, to the shipped list of common visual words)")
    p.add_argument("--k", type=int_arg(1, 1000), default=16, help="top images per latent (default: 16; 1..1000)")
    p.add_argument("--names", type=int_arg(1, 100), default=5, help="names per latent (default: 5; 1..100)")
    p.add_argument("--min-count", type=int_arg(1, 10**9), default=2,
                   help="a caption phrase is a name when at least this many captions mention it (default: 2)")
    p.add_argument("--max-vocabulary", type=int_arg(1, 1_000_000), default=5000,
                   help="at most this many caption phrases, the most frequent (default: 5000)")
    p.add_argument("--sheets", type=int_arg(0, 10**7), default=64,
                   help="contact sheets of the top images of this many live latents, the most frequent first "
                   "(default: 64; 0: none)")
    p.add_argument("--thumb", type=int_arg(8, MAX_THUMB), default=64,
                   help=f"thumbnail side in pixels (default: 64; 8..{MAX_THUMB})")
    p.add_argument("--cols", type=int_arg(1, 256), default=8, help="thumbnails per row (default: 8; 1..256)")
    p.add_argument("--data", default=None, type=in_path("dataset directory", "dir"),
                   help="for a store of a generated set: the set's directory, if it moved since it was embedded")
    p.add_argument("--seed", type=SEED, default=0, help="seed of the shuffled-decoder control (default: 0)")



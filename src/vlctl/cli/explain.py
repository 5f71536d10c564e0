"""`vlctl explain` (relevancy maps) and `vlctl tree` (3VL caption trees)."""

from __future__ import annotations

import argparse

from vlctl.config import add_config_args, config_from_args


def explain_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import blocks_arg, device_arg, in_path, out_path, text_arg
    from vlctl.encoders.factory import SPEC_FORMS

    p.add_argument("--encoder", required=True, type=text_arg("spec"), help="encoder spec: " + " | ".join(SPEC_FORMS))
    p.add_argument("image", type=in_path("image file", "file"), help="image file (any format PIL reads)")
    p.add_argument("positive", type=text_arg(), help="the (positive) text")
    p.add_argument("negative", nargs="?", default=None, type=text_arg(),
                   help="a negative text: adds the negative, Anchor and DiRe maps")
    p.add_argument("--out", required=True, type=out_path("dir"), help="output directory (PNG overlays + maps.npz)")
    p.add_argument("--blocks", default="all", type=blocks_arg,
                   help="ViT blocks to accumulate: all | last | an integer start block")
    p.add_argument(
        "--anchor", default=None, type=text_arg(),
        help="anchor text (default: vlctl.captions.trees.anchor_text(positive, negative))"
    )
    p.add_argument("--device", default="cpu", type=device_arg, help="torch device for the encoder (default: cpu)")
    p.add_argument("--fit", choices=("letterbox", "crop"), default="letterbox",
                   help="letterbox: pad the image to a square so the maps cover all of it (default); "
                   "crop: the encoder's centre crop (the sides are never seen)")


def _parse_blocks(s: str):
    from vlctl.fsops import VlctlError

    if s in ("all", "last"):
        return s
    try:
        return int(s)
    except ValueError:
        raise VlctlError(f"--blocks must be 'all', 'last' or an integer start block, got {s!r}") from None


def explain(args: argparse.Namespace) -> dict:
    from vlctl.encoders.factory import create
    from vlctl.methods.threevl.explain import load_image
    from vlctl.report.overlays import write_explain

    blocks = _parse_blocks(args.blocks)
    image = load_image(args.image)
    encoder = create(args.encoder, device=args.device)
    return write_explain(encoder, image, args.positive, args.negative, args.out, blocks=blocks, anchor=args.anchor,
                         fit=getattr(args, "fit", "letterbox"))


def tree_args(p: argparse.ArgumentParser) -> None:
    from vlctl.captions.trees import TreeConfig
    from vlctl.cli.args import in_path, text_arg

    p.add_argument("captions", nargs="*", metavar="CAPTION", type=text_arg("caption"),
                   help="English captions, each quoted")
    p.add_argument("--file", default=None, type=in_path("captions file", "file"),
                   help="a UTF-8 text file with one caption per line (blank lines skipped)")
    add_config_args(p, TreeConfig)


def _read_captions(args: argparse.Namespace) -> list[str]:
    from pathlib import Path

    from vlctl.fsops import VlctlError
    from vlctl.io import read_text_utf8

    captions = list(args.captions)
    if args.file is not None:
        text = read_text_utf8(Path(args.file), "captions file")
        captions += [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not captions:
        raise VlctlError("tree: give one or more captions, or --file FILE with one caption per line")
    return captions


def tree(args: argparse.Namespace) -> dict:
    from vlctl.captions.trees import TreeConfig, TreeGenerator

    cfg = config_from_args(TreeConfig, args)
    captions = _read_captions(args)
    # One generator for every caption: spaCy and WordNet load once, and the captions parse in batches.
    gen = TreeGenerator(seed=cfg.seed, wordnet_dir=cfg.wordnet_dir, cache_path=cfg.cache, max_words=cfg.max_words)
    trees = gen.trees(captions, details=True)
    results = [{"caption": c, "seed": cfg.seed,
                "levels": [{k: lv[k] for k in ("positive", "negatives", "negative_pos")} for lv in levels]}
               for c, levels in zip(captions, trees)]
    if args.json:
        return results[0] if len(results) == 1 else {"trees": results}
    for caption, levels in zip(captions, trees):
        if len(captions) > 1:
            print(f"# {caption}")
        for k, lv in enumerate(levels, 1):
            print(f"L{k}  {lv['positive']}")
            for neg, (word, repl, pos, stage) in zip(lv["negatives"], lv["replaced"]):
                print(f"      - {neg}    [{pos}: {word} -> {repl}, {stage}]")
            for word, pos in lv["missed"]:
                print(f"      (no negative for {word!r}, {pos})")
    summary = {"levels": sum(len(t) for t in trees), "negatives": sum(len(lv["negatives"]) for t in trees for lv in t)}
    return summary if len(captions) == 1 else {"captions": len(captions), **summary}

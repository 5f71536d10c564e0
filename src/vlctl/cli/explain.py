"""`vlctl explain` (relevancy maps) and `vlctl tree` (3VL caption trees)."""

from __future__ import annotations

import argparse

from vlctl.config import add_config_args, config_from_args


def explain_args(p: argparse.ArgumentParser) -> None:
    from vlctl.encoders.factory import SPEC_FORMS

    p.add_argument("--encoder", required=True, help="encoder spec: " + " | ".join(SPEC_FORMS))
    p.add_argument("image", help="image file (any format PIL reads)")
    p.add_argument("positive", help="the (positive) text")
    p.add_argument("negative", nargs="?", default=None, help="a negative text: adds the negative, Anchor and DiRe maps")
    p.add_argument("--out", required=True, help="output directory (PNG overlays + maps.npz)")
    p.add_argument("--blocks", default="all", help="ViT blocks to accumulate: all | last | an integer start block")
    p.add_argument(
        "--anchor", default=None, help="anchor text (default: vlctl.methods.trees.anchor_text(positive, negative))"
    )
    p.add_argument("--device", default="cpu", help="torch device for the encoder (default: cpu)")


def explain(args: argparse.Namespace) -> dict:
    from vlctl.encoders import create
    from vlctl.methods.relevancy import _parse_blocks, load_image
    from vlctl.methods.relevancy import explain as run

    blocks = _parse_blocks(args.blocks)
    image = load_image(args.image)
    encoder = create(args.encoder, device=args.device)
    return run(encoder, image, args.positive, args.negative, args.out, blocks=blocks, anchor=args.anchor)


def tree_args(p: argparse.ArgumentParser) -> None:
    from vlctl.methods.trees import TreeConfig

    p.add_argument("caption", help="an English caption, quoted")
    add_config_args(p, TreeConfig)


def tree(args: argparse.Namespace) -> dict:
    from vlctl.methods.trees import TreeConfig, TreeGenerator

    cfg = config_from_args(TreeConfig, args)
    gen = TreeGenerator(seed=cfg.seed, wordnet_dir=cfg.wordnet_dir, cache_path=cfg.cache, max_words=cfg.max_words)
    levels = gen.tree(args.caption, details=True)
    result = {
        "caption": args.caption,
        "seed": cfg.seed,
        "levels": [{k: lv[k] for k in ("positive", "negatives", "negative_pos")} for lv in levels],
    }
    if args.json:
        return result
    for k, lv in enumerate(levels, 1):
        print(f"L{k}  {lv['positive']}")
        for neg, (word, repl, pos, stage) in zip(lv["negatives"], lv["replaced"]):
            print(f"      - {neg}    [{pos}: {word} -> {repl}, {stage}]")
        for word, pos in lv["missed"]:
            print(f"      (no negative for {word!r}, {pos})")
    return {"levels": len(levels), "negatives": sum(len(lv["negatives"]) for lv in levels)}

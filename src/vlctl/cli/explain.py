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

    p.add_argument("captions", nargs="*", metavar="CAPTION", help="English captions, each quoted")
    p.add_argument("--file", default=None, help="a UTF-8 text file with one caption per line (blank lines skipped)")
    add_config_args(p, TreeConfig)


def _read_captions(args: argparse.Namespace) -> list[str]:
    from pathlib import Path

    from vlctl.io import VlctlError

    captions = list(args.captions)
    if args.file is not None:
        path = Path(args.file)
        try:
            captions += [ln.strip() for ln in path.read_text("utf-8").splitlines() if ln.strip()]
        except OSError as e:
            raise VlctlError(f"{path}: cannot read the captions file ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise VlctlError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not captions:
        raise VlctlError("tree: give one or more captions, or --file FILE with one caption per line")
    return captions


def tree(args: argparse.Namespace) -> dict:
    from vlctl.methods.trees import TreeConfig, TreeGenerator

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

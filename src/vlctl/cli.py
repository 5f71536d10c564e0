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
    reports = {}
    for name in names:
        out = Path(args.out) / name if args.name == "all" else Path(args.out)
        reports[name] = str(run_recipe(name, out, quick=args.quick, force=args.force))
        print(f"[vlctl] {name}: report at {reports[name]}", file=sys.stderr)
    return {"reports": reports}


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

    from vlctl.recipes import RECIPES

    p = add(sub, "reproduce", "run a paper reproduction recipe stage by stage, with caching", _cmd_reproduce)
    p.add_argument("name", choices=sorted(RECIPES) + ["all"], help="recipe name, or 'all'")
    p.add_argument("--quick", action="store_true", help="the small CPU version (minutes)")
    p.add_argument("--out", required=True, help="output directory: results.json, report.md/html, figures/, arrays/")
    p.add_argument("--force", action="store_true", help="recompute every stage instead of reusing cached ones")
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

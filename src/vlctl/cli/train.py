"""`vlctl train clip`: TinyCLIP from scratch (works under torchrun)."""

from __future__ import annotations

import argparse

from vlctl.cli.output import add_output_args
from vlctl.config import add_config_args, config_from_args


def train_clip_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path
    from vlctl.train.config import ClipTrainConfig, LoopConfig

    p.add_argument("--data", required=True, type=in_path("dataset directory", "dir"),
                   help="dataset directory (MAD format)")
    p.add_argument("--out", required=True, type=out_path("dir"), help="run directory (checkpoint/, model/, log.jsonl)")
    add_output_args(p)
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint (config must match)")
    add_config_args(p, ClipTrainConfig)
    add_config_args(p, LoopConfig)


def train_clip(args: argparse.Namespace) -> dict:
    from vlctl.train.clip import train_clip as run
    from vlctl.train.config import ClipTrainConfig, LoopConfig
    from vlctl.train.distributed import destroy_distributed

    result = run(args.data, args.out, cfg=config_from_args(ClipTrainConfig, args),
                 loop=config_from_args(LoopConfig, args), resume=args.resume)
    # Only on success: after a failure on one rank a barrier here would wait for the others.
    destroy_distributed()
    return {"out": str(args.out), "steps": result.steps, "seconds": result.seconds}

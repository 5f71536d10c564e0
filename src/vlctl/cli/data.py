"""`vlctl data mad | shapes | scenes`: the generated sets."""

from __future__ import annotations

import argparse

from vlctl.config import add_config_args, config_from_args


def _out_arg(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import out_path
    from vlctl.cli.output import add_output_args

    p.add_argument("--out", required=True, type=out_path("dir"), help="output directory (written atomically)")
    add_output_args(p)


def data_mad_args(p: argparse.ArgumentParser) -> None:
    from vlctl.data.mad_config import MadConfig

    _out_arg(p)
    add_config_args(p, MadConfig)


def data_mad(args: argparse.Namespace) -> dict:
    from vlctl.data.mad import generate_mad
    from vlctl.data.mad_config import MadConfig

    return {"out": str(generate_mad(config_from_args(MadConfig, args), args.out))}


def data_shapes_args(p: argparse.ArgumentParser) -> None:
    from vlctl.data.shapes import ShapesConfig

    _out_arg(p)
    add_config_args(p, ShapesConfig)


def data_shapes(args: argparse.Namespace) -> dict:
    from vlctl.data.shapes import ShapesConfig, generate_shapes

    return {"out": str(generate_shapes(config_from_args(ShapesConfig, args), args.out))}


def data_scenes_args(p: argparse.ArgumentParser) -> None:
    from vlctl.data.scenes import ScenesConfig

    _out_arg(p)
    add_config_args(p, ScenesConfig)


def data_scenes(args: argparse.Namespace) -> dict:
    from vlctl.data.scenes import ScenesConfig, generate_scenes

    cfg = config_from_args(ScenesConfig, args)
    return {"out": str(generate_scenes(cfg, args.out)), "split": cfg.split, "n": cfg.n}

"""`vlctl eval retrieval` (zero-shot retrieval benchmarks) and `vlctl reproduce` (the recipes)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import typing
from pathlib import Path

from vlctl.config import add_config_args, config_from_args


def eval_retrieval_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path, text_arg
    from vlctl.encoders.factory import SPEC_FORMS
    from vlctl.eval.retrieval import DATASETS, RetrievalConfig

    p.add_argument("--encoder", required=True, type=text_arg("spec"), help="encoder spec: " + " | ".join(SPEC_FORMS))
    p.add_argument("--dataset", required=True, choices=DATASETS,
                   help="coco / flickr / karpathy: a Karpathy split file or [{image, caption: [...]}]; rococo: "
                   "RoCOCO's [{image, caption: [originals..., 5 altered]}]")
    p.add_argument("--root", required=True, type=in_path("image root", "dir"),
                   help="image root the annotation paths are relative to")
    p.add_argument("--annotations", required=True, type=in_path("annotation JSON", "file"),
                   help="the annotation JSON (e.g. dataset_coco.json)")
    p.add_argument("--split", default="test", type=text_arg("split"),
                   help="Karpathy split (default: test; ignored for list files)")
    p.add_argument("--out", default=None, type=out_path("file"), help="write the results JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_args(p, RetrievalConfig)


def eval_retrieval(args: argparse.Namespace) -> dict:
    from vlctl.encoders.factory import create
    from vlctl.eval.retrieval import RetrievalConfig, evaluate_retrieval
    from vlctl.io import atomic_write_json

    cfg = config_from_args(RetrievalConfig, args)
    encoder = create(args.encoder, device=cfg.device, precision=cfg.precision, batch_size=cfg.batch_size)
    result = evaluate_retrieval(encoder, args.dataset, args.annotations, args.root, args.split, cfg,
                                progress=not args.no_progress)
    result["encoder"] = args.encoder
    if args.out:
        atomic_write_json(args.out, result)
        result["out"] = str(args.out)
    return result


def _recipe_epilog() -> str:
    from vlctl.recipes import DEMO, RECIPES
    from vlctl.recipes.real_data import LAYOUTS, REAL_RECIPES, flag

    lines = ["recipes and the datasets they need:"]
    for name in RECIPES:
        if name in REAL_RECIPES:
            cls, layouts, what = REAL_RECIPES[name]
            flags = " ".join(flag(f.name) for f in dataclasses.fields(cls))
            lines += [f"  {name}: {what}", f"      --encoder SPEC {flags}"]
            lines += [f"      {layout}: {LAYOUTS[layout]}" for layout in layouts]
        else:
            demo = " (part of 'all')" if name in DEMO else ""
            lines.append(f"  {name}: synthetic demo{demo}; generates its data and trains its own TinyCLIP, no datasets")
    return "\n".join(lines)


def _dataset_fields() -> dict[str, tuple[dataclasses.Field, list[str]]]:
    """Every dataset field of the real recipes once: name -> (field, the recipes that read it)."""
    from vlctl.recipes.real_data import REAL_RECIPES

    out: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for name, (cls, _, _) in REAL_RECIPES.items():
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, (f, []))[1].append(name)
    return out


def reproduce_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import in_path, out_path, text_arg
    from vlctl.encoders.factory import SPEC_FORMS
    from vlctl.recipes import RECIPES
    from vlctl.recipes.real_common import EncoderRun

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _recipe_epilog()
    p.add_argument("name", choices=list(RECIPES) + ["all"],
                   help="recipe name, or 'all' (the four synthetic demo recipes)")
    p.add_argument("--quick", action="store_true",
                   help="the small CPU presets; their models start from the shipped trained checkpoints, so "
                   "`reproduce all --quick` (make demo) takes minutes")
    p.add_argument("--from-scratch", action="store_true",
                   help="train every model too, instead of starting from the shipped checkpoints (make reproduce)")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="output directory: results.json, report.md/html, figures/, arrays/")
    p.add_argument("--force", action="store_true", help="recompute every stage instead of reusing cached ones")
    p.add_argument("--plan", action="store_true",
                   help="print the stages, their expected time (this CPU, one GPU), peak memory and disk, and which "
                   "are cached, from the dataset sizes in the annotation files; run nothing (real recipes)")
    p.add_argument("--stages", default=None, type=out_path("dir"), help="stage cache directory (default OUT/stages); point recipes at the "
                   "same one to share stages, e.g. tevi-mad reuses mad-clip's trained CLIP")
    p.add_argument("--recipe-config", default=None, metavar="JSON", type=in_path("recipe config JSON", "file"),
                   help="JSON file of the recipe's config fields, applied over its preset (full by default, "
                   "--quick: the small one); e.g. {\"sae_epochs\": 5}, or {\"seeds\": [1]} to run one seed's "
                   "stages into a shared --stages cache beside another process")
    real = p.add_argument_group("real recipes (tevi-coco, controlembed-*, 3vl-coco)")
    real.add_argument("--encoder", default=None, type=text_arg("spec"),
                      help="encoder spec, required by the real recipes: " + " | ".join(SPEC_FORMS))
    add_config_args(real, EncoderRun)
    for field_name, (f, users) in _dataset_fields().items():
        many = typing.get_origin(typing.get_type_hints(_owner(field_name))[field_name]) is tuple
        # Plain text here: a missing root is the recipe's error, which names the layout it expects.
        real.add_argument("--" + field_name.replace("_", "-"), dest=field_name, default=None, nargs="+" if many else None,
                          metavar="PATH", type=text_arg("path"), help=f"{f.metadata['help']} ({', '.join(users)})")


def _owner(field_name: str) -> type:
    from vlctl.recipes.real_data import REAL_RECIPES

    return next(cls for cls, _, _ in REAL_RECIPES.values() if field_name in {f.name for f in dataclasses.fields(cls)})


def _real_options(name: str, args: argparse.Namespace) -> dict:
    """encoder=, data=, cfg=, encoder_run= of real recipe `name` from the flags; other recipes' dataset
    flags are refused, naming the recipes that read them."""

    from vlctl.fsops import VlctlError
    from vlctl.recipes.real_common import EncoderRun
    from vlctl.recipes.real_data import REAL_RECIPES, flag

    cls = REAL_RECIPES[name][0]
    mine = {f.name for f in dataclasses.fields(cls)}
    for field_name, (_, users) in _dataset_fields().items():
        if field_name not in mine and getattr(args, field_name, None) is not None:
            raise VlctlError(f"{flag(field_name)} is a dataset of {', '.join(users)}, not of {name}; {name} reads "
                             + " ".join(flag(f) for f in sorted(mine)))
    data = cls(**{f: (tuple(getattr(args, f)) if isinstance(getattr(args, f), list) else getattr(args, f))
                  for f in mine if getattr(args, f, None) is not None})
    return {"encoder": args.encoder, "data": data, "cfg": recipe_config(name, args),
            "encoder_run": config_from_args(EncoderRun, args)}


def recipe_config(name: str, args: argparse.Namespace):
    """Recipe `name`'s preset (--quick or full) with the fields of --recipe-config over it."""
    import importlib

    from vlctl.config import load_config
    from vlctl.recipes import RECIPES

    cfg = importlib.import_module(RECIPES[name].split(":")[0]).load_preset(args.quick)
    if args.recipe_config:
        over = load_config(type(cfg), args.recipe_config)
        cfg = dataclasses.replace(cfg, **{k: getattr(over, k) for k in read_json_fields(args.recipe_config)})
    return cfg


def read_json_fields(path: str) -> list[str]:
    from vlctl.io import read_json

    return list(read_json(path, "recipe config JSON"))


def reproduce(args: argparse.Namespace) -> dict:
    import time

    from vlctl.fsops import VlctlError
    from vlctl.progress import heartbeat
    from vlctl.progress import say as _say
    from vlctl.recipes import DEMO, run_recipe
    from vlctl.recipes.real_data import REAL_RECIPES

    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 alone speaks

    def say(line: str) -> None:
        if main_rank:
            _say(line)

    names = list(DEMO) if args.name == "all" else [args.name]
    real = args.name in REAL_RECIPES
    if not real and args.encoder:
        raise VlctlError(f"--encoder applies to the real recipes ({', '.join(REAL_RECIPES)}); "
                         f"{args.name} generates its data and trains its own TinyCLIP")
    if args.name == "all" and args.recipe_config:
        raise VlctlError("--recipe-config: name one recipe, not 'all' (each recipe has its own config fields)")
    options = _real_options(args.name, args) if real else (
        {"cfg": recipe_config(args.name, args)} if args.recipe_config else {})
    if args.plan:
        from vlctl.recipes.plan import plan

        if not real:
            raise VlctlError(f"--plan applies to the real recipes ({', '.join(REAL_RECIPES)}); {args.name} is a "
                             "synthetic one")
        rows = plan(args.name, options["cfg"], options["data"], Path(args.stages or Path(args.out) / "stages"),
                    echo=not args.json)
        return rows if args.json else {}  # the plan is printed: nothing else to say
    # `all` shares one stage cache, so later recipes reuse earlier ones' stages (tevi-mad: the CLIP).
    stages = args.stages or (Path(args.out) / "stages" if args.name == "all" else None)
    scratch = args.from_scratch or args.force
    say(f"reproduce {args.name}{' --quick' if args.quick else ''}: {len(names)} recipe(s) ({', '.join(names)}) "
        f"into {args.out}; " + ("training every model" if scratch or real else
                                 "models from the shipped checkpoints where one matches (--from-scratch retrains)")
        + "; each stage prints when it starts and ends, Ctrl-C keeps the finished ones")
    t0 = time.perf_counter()
    reports = {}
    for name in names:
        out = Path(args.out) / name if args.name == "all" else Path(args.out)
        with heartbeat(name) if main_rank else contextlib.nullcontext():  # between stages too: the report
            reports[name] = str(run_recipe(name, out, quick=args.quick, force=args.force, stages=stages,
                                           from_scratch=args.from_scratch, **options))
        say(f"{name}: report at {reports[name]}")
    seconds = time.perf_counter() - t0
    say(f"done in {seconds / 60:.1f} min; reports:")
    for name, path in reports.items() if main_rank else ():
        print(f"  {name}: {path}", file=sys.stderr)
    return {"reports": reports, "seconds": round(seconds, 1)}

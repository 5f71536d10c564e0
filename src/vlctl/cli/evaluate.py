"""`vlctl eval retrieval` (zero-shot retrieval benchmarks) and `vlctl reproduce` (the recipes)."""

from __future__ import annotations

import argparse
import sys
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
    from vlctl.encoders import create
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


def reproduce_args(p: argparse.ArgumentParser) -> None:
    from vlctl.cli.args import out_path
    from vlctl.recipes import RECIPES

    p.add_argument("name", choices=sorted(RECIPES) + ["all"], help="recipe name, or 'all'")
    p.add_argument("--quick", action="store_true",
                   help="the small CPU presets; their models start from the shipped trained checkpoints, so "
                   "`reproduce all --quick` (make demo) takes minutes")
    p.add_argument("--from-scratch", action="store_true",
                   help="train every model too, instead of starting from the shipped checkpoints (make reproduce)")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="output directory: results.json, report.md/html, figures/, arrays/")
    p.add_argument("--force", action="store_true", help="recompute every stage instead of reusing cached ones")
    p.add_argument("--stages", default=None, type=out_path("dir"), help="stage cache directory (default OUT/stages); point recipes at the "
                   "same one to share stages, e.g. tevi-mad reuses mad-clip's trained CLIP")


def reproduce(args: argparse.Namespace) -> dict:
    import time

    from vlctl.progress import heartbeat, say
    from vlctl.recipes import RECIPES, run_recipe

    names = sorted(RECIPES) if args.name == "all" else [args.name]
    # `all` shares one stage cache, so later recipes reuse earlier ones' stages (tevi-mad: the CLIP).
    stages = args.stages or (Path(args.out) / "stages" if args.name == "all" else None)
    scratch = args.from_scratch or args.force
    say(f"reproduce {args.name}{' --quick' if args.quick else ''}: {len(names)} recipe(s) ({', '.join(names)}) "
        f"into {args.out}; " + ("training every model" if scratch else
                                 "models from the shipped checkpoints where one matches (--from-scratch retrains)")
        + "; each stage prints when it starts and ends, Ctrl-C keeps the finished ones")
    t0 = time.perf_counter()
    reports = {}
    for name in names:
        out = Path(args.out) / name if args.name == "all" else Path(args.out)
        with heartbeat(name):  # between stages too: evaluation and the report
            reports[name] = str(run_recipe(name, out, quick=args.quick, force=args.force, stages=stages,
                                           from_scratch=args.from_scratch))
        say(f"{name}: report at {reports[name]}")
    seconds = time.perf_counter() - t0
    say(f"done in {seconds / 60:.1f} min; reports:")
    for name, path in reports.items():
        print(f"  {name}: {path}", file=sys.stderr)
    return {"reports": reports, "seconds": round(seconds, 1)}

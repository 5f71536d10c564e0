"""`vlctl audit`: the 3VL compositional audit of an encoder on a user's image-caption pairs."""

from __future__ import annotations

import argparse

from vlctl.config import add_config_args, config_from_args


def audit_args(p: argparse.ArgumentParser) -> None:
    from vlctl.audit import AuditConfig
    from vlctl.cli.args import blocks_arg, device_arg, in_path, out_path, strict_arg, text_arg
    from vlctl.encoders.factory import SPEC_FORMS

    p.add_argument("--encoder", required=True, type=text_arg("spec"), help="encoder spec: " + " | ".join(SPEC_FORMS))
    p.add_argument("--pairs", required=True, type=in_path("pairs", "any"),
                   help="image-caption pairs: a CSV/TSV/JSONL of image path + caption, a folder with --annotations, "
                   "a COCO Karpathy JSON, a generated set (vlctl data scenes) or a store (vlctl embed)")
    p.add_argument("--images", default=None, type=in_path("image root", "dir"),
                   help="for a COCO Karpathy JSON or a CSV/TSV/JSONL table: the folder its image paths are relative "
                   "to (default: the file's own folder)")
    p.add_argument("--annotations", default=None, type=in_path("annotation file", "file"),
                   help="for a folder of images: a CSV / TSV / JSONL of image path (relative to the folder) and caption")
    p.add_argument("--out", required=True, type=out_path("dir"),
                   help="output directory: report.md, report.html, summary.json, items.jsonl, arrays.npz, worst/")
    p.add_argument("--device", default="cpu", type=device_arg, help="torch device for the encoder (default: cpu)")
    p.add_argument("--blocks", default="all", type=blocks_arg,
                   help="ViT blocks the worst items' maps accumulate: all | last | an integer start block")
    strict_arg(p)
    add_config_args(p, AuditConfig)


def audit(args: argparse.Namespace) -> dict:
    from vlctl.audit import AuditConfig, drop_unreadable, load_pairs, run_audit
    from vlctl.cli.explain import _parse_blocks
    from vlctl.encoders.factory import create

    cfg = config_from_args(AuditConfig, args)
    pairs, failures = drop_unreadable(load_pairs(args.pairs, args.images, args.annotations), strict=args.strict)
    encoder = create(args.encoder, device=args.device)
    return run_audit(encoder, pairs, args.out, cfg, blocks=_parse_blocks(args.blocks), failures=failures)

"""`vlctl verify PATH`: the full integrity check of a store, a generated set or a training checkpoint.

Opening any of them checks sizes, counts and fast hashes (sampled blocks of large files); this
reads every byte and compares each file's sha256 with the one recorded when it was written.

    vlctl verify store/
    vlctl verify data/mad-train/
    vlctl verify runs/clip/            # its checkpoint/ (or the checkpoint directory itself)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlctl.cli.args import in_path
from vlctl.fsops import VlctlError
from vlctl.io import read_json


def verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=in_path("store, generated set or checkpoint", "dir"),
                   help="a store (manifest.json), a generated set (meta.json), a checkpoint (state.json) or a run "
                   "directory holding checkpoint/")


def verify(args: argparse.Namespace) -> dict:
    path = Path(args.path)
    if (path / "manifest.json").is_file():
        from vlctl.embeddings.store import open_store

        kind, result = "store", open_store(path).verify()
    elif (path / "meta.json").is_file():
        kind, result = "generated set", _verify_set(path)
    elif (path / "state.json").is_file() or (path / "checkpoint" / "state.json").is_file():
        from vlctl.train.loop import verify_checkpoint

        kind = "checkpoint"
        result = verify_checkpoint(path if (path / "state.json").is_file() else path / "checkpoint")
    else:
        raise VlctlError(f"{path}: not a vlctl store, generated set or checkpoint (no manifest.json, meta.json or "
                         "state.json in it)")
    return {"path": str(path), "kind": kind, **result, "ok": True}


def _verify_set(path: Path) -> dict:
    meta = read_json(path / "meta.json", "generated set meta.json")
    fmt = meta.get("format", "vlctl-mad") if isinstance(meta, dict) else None
    if fmt == "vlctl-scenes":
        from vlctl.data.scenes import load_scenes as load
    elif fmt == "vlctl-shapes":
        from vlctl.data.shapes import load_shapes as load
    else:
        from vlctl.data.mad import load_mad as load
    load(path, verify=True)
    files = [path / "images.npy", path / "labels.jsonl"]
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}

"""What a command says when Ctrl-C stops it: only what is true of what it leaves behind.

Outputs are written whole or not at all (`vlctl.io` atomic files and directories), so an
interrupted command leaves its --out as it was, except where it keeps work on purpose: `reproduce`
keeps its finished stages, `train clip` and `fit tree` their last checkpoint (continued with
--resume), and `embed` and `index` the batches they committed (every --commit-every new images;
once at the end with --strict and into a new ivfpq store, whose quantisers train on the first
add's rows): the message says how many rows the run kept, and the same command adds the rest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# Where a resumable command keeps its checkpoint, under its --out.
_CHECKPOINTS = {"train": "checkpoint", "fit": "run/checkpoint"}


def out_state(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(--out or None, the rows of the store there for embed/index else 0 if it exists, None if not):
    taken before the command runs, to compare with after an interrupt."""
    out = getattr(args, "out", None)
    if out is None or not Path(out).exists():
        return out, None
    if args.command in ("embed", "index"):
        return out, _rows(out)
    return out, 0


def _rows(store: str) -> int:
    from vlctl.embeddings.store import open_store

    try:
        return len(open_store(store))
    except Exception:  # noqa: BLE001 -- not (yet) a store: it holds no rows
        return 0


def interrupted_message(args: argparse.Namespace, before: tuple[str | None, int | None]) -> str:
    """The one line printed after Ctrl-C (module docstring)."""
    out, had = before
    if args.command == "reproduce":
        return "vlctl: interrupted; the finished stages are kept: the same command continues from them"
    if hasattr(args, "resume") and out is not None:
        group = "train" if args.command == "train" else "fit"
        ckpt = Path(out) / _CHECKPOINTS[group]
        if (ckpt / "state.json").is_file():
            return f"vlctl: interrupted; the last checkpoint ({ckpt}) is kept: the same command with --resume continues"
        return "vlctl: interrupted before the first checkpoint was written; nothing is kept: the same command starts afresh"
    if getattr(args, "backend", None) and args.command == "index":  # each insert is kept: the rerun adds the rest
        return f"vlctl: interrupted; the rows inserted so far stay in {args.backend}: the same command adds the rest"
    if args.command in ("embed", "index") and out is not None:
        if had is None and not Path(out).exists():
            return f"vlctl: interrupted; nothing was written ({out} was not created): the same command starts afresh"
        now = _rows(out)
        kept = now - (had or 0)
        if kept > 0:
            return (f"vlctl: interrupted; {out} keeps the {kept} rows this run committed ({now} in all): the same "
                    "command adds the rest")
        return (f"vlctl: interrupted; {out} keeps the {now} rows it had, this run committed none (it commits every "
                "--commit-every new images): the same command embeds them again")
    if out is not None and had is None and not Path(out).exists():
        return f"vlctl: interrupted; nothing was written ({out} was not created)"
    return "vlctl: interrupted"

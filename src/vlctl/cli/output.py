"""--overwrite and --no-wait: the flags of every command that writes an output directory.

They set the process's output policy (`vlctl.io.set_output_policy`), which every writer reads:
`--overwrite` lets `--out` name an existing directory that holds no vlctl output of the same kind
(only vlctl's own entries in it are then replaced, everything else is kept); `--no-wait` makes a
writer fail at once, instead of waiting, when another vlctl process holds the output's lock.
"""

from __future__ import annotations

import argparse
from typing import Any

from vlctl.fsops import set_output_policy


class _PolicyFlag(argparse.Action):
    """A store_true flag that also sets the output policy when given."""

    def __init__(self, option_strings: list[str], dest: str, policy: dict, **kw: Any):
        super().__init__(option_strings, dest, nargs=0, default=False, **kw)
        self.policy = policy

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True)
        set_output_policy(**self.policy)


def add_output_args(p: argparse.ArgumentParser) -> None:
    """Add --overwrite and --no-wait to a command's parser."""
    # The parser is built afresh for every command line: start from the defaults, the flags given
    # set the rest while parsing (so an earlier in-process call's flags do not carry over).
    set_output_policy(overwrite=False, wait=True)
    p.add_argument("--overwrite", action=_PolicyFlag, policy={"overwrite": True},
                   help="write into an existing --out that holds no vlctl output of this kind, replacing only "
                   "vlctl's own entries in it (everything else is kept)")
    p.add_argument("--no-wait", action=_PolicyFlag, policy={"wait": False},
                   help="fail at once when another vlctl process is writing the same output (default: wait)")

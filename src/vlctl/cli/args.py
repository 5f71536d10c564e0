"""argparse `type=` functions of the flags that no config declares: each refuses a bad value while
parsing, so the command line says '--thumb must be in [8, 1024], got 100000' (one line, exit 2)
before any work starts. The flags generated from configs get theirs from `vlctl.config.flag_type`."""

from __future__ import annotations

import argparse
import os
import re

from vlctl.config import MAX_SEED, flag_type, shorten

MAX_K = 1_000_000  # results / candidates / clusters asked for


def int_arg(ge: int | None = None, le: int | None = None, **more):
    """An integer flag in [ge, le]."""
    return flag_type(int, {k: v for k, v in {"ge": ge, "le": le, **more}.items() if v is not None}, "int")


SEED = int_arg(0, MAX_SEED)


def text_arg(what: str = "text"):
    """A non-empty UTF-8 string."""
    return flag_type(str, {}, what)


class PathArg(str):
    """A path flag's value as parsed: a str that remembers what the file system must hold there.
    Parsing checks only the spelling (so a documented command line parses without its files);
    `check_paths` checks the file system after parsing, before the command starts."""

    way: str  # "in" (must exist) or "out" (written)
    kind: str  # in: file | dir | any | source;  out: dir | file | dir-or-json
    what: str

    def __new__(cls, text: str, way: str, kind: str, what: str):
        self = super().__new__(cls, text)
        self.way, self.kind, self.what = way, kind, what
        return self


def _path_type(way: str, kind: str, what: str):
    def parse(text: str) -> PathArg:
        if not text:
            raise argparse.ArgumentTypeError(f"must not be empty (the {what})")
        raw = os.fsencode(text)
        if len(raw) >= 4096 or any(len(part) > 255 for part in raw.split(b"/")):
            raise argparse.ArgumentTypeError(f"{shorten(text)}: path too long (at most 255 bytes a name, 4095 in all)")
        return PathArg(text, way, kind, what)

    parse.__name__ = "path"
    parse.vlctl_path = (way, kind)  # read by the CLI fuzz test
    return parse


def in_path(what: str, kind: str = "any"):
    """An input path that must exist after parsing: kind 'file', 'dir' or 'any'."""
    return _path_type("in", kind, what)


# `embed` / `index` SOURCE: an existing path, or a WebDataset brace pattern (shards-{000..009}.tar)
source_arg = _path_type("in", "source", "source (a folder, an annotation file, .tar shards or a set)")


def out_path(kind: str = "dir"):
    """An output path: kind 'dir' (must not be an existing file), 'file' (must not be an existing
    directory) or 'dir-or-json' (a .json path is a file, any other a directory); no file on the way."""
    return _path_type("out", kind, "output " + {"dir-or-json": "directory or .json file"}.get(kind, kind).replace(
        "dir", "directory"))


def _path_error(p: PathArg) -> str | None:
    """What the file system says against `p`, or None."""
    text = shorten(str(p))
    if p.way == "in":
        if p.kind == "source" and "{" in p:
            return None
        if not os.path.exists(p):
            return f"{text}: {p.what.split(' (')[0]} not found"
        if p.kind == "file" and os.path.isdir(p):
            return f"{text}: is a directory, expected the {p.what} (a file)"
        if p.kind == "dir" and not os.path.isdir(p):
            return f"{text}: is a file, expected the {p.what} (a directory)"
        return None
    want = ("file" if p.lower().endswith(".json") else "dir") if p.kind == "dir-or-json" else p.kind
    if want == "dir" and os.path.exists(p) and not os.path.isdir(p):
        return f"{text}: is a file, expected an output directory"
    if want == "file" and (os.path.isdir(p) or p.endswith(os.sep)):
        return f"{text}: is a directory, expected an output file"
    parent = os.path.dirname(os.path.abspath(p))
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{text}: {shorten(parent)} is a file, not a directory"
    return None


def check_paths(args: argparse.Namespace) -> None:
    """Every path flag of the parsed `args` against the file system (missing inputs, a file where a
    directory goes and the reverse): a VlctlError naming the flag, before the command starts."""
    from vlctl.fsops import VlctlError

    flags = getattr(args, "_vlctl_flags", None) or {}
    for dest, value in vars(args).items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, PathArg):
                why = _path_error(v)
                if why:
                    raise VlctlError(f"{flags.get(dest, dest)}: {why}")


_DEVICE = re.compile(r"cpu|mps|cuda(:(\d+))?")


def device_arg(text: str) -> str:
    """A torch device this machine has: cpu, cuda, cuda:N or mps."""
    m = _DEVICE.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"must be a torch device: cpu, cuda, cuda:N or mps, got {shorten(repr(text))}")
    if text == "cpu":
        return text
    import torch

    if text == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise argparse.ArgumentTypeError("mps: this machine has no MPS device")
        return text
    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no CUDA device (use --device cpu)")
    if m.group(2) is not None and int(m.group(2)) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return text


device_arg.vlctl_device = True


def blocks_arg(text: str) -> str:
    """`--blocks`: all | last | a start block (an integer >= 0); returned as given."""
    if text in ("all", "last") or re.fullmatch(r"-?\d{1,4}", text):
        return text
    raise argparse.ArgumentTypeError(f"must be 'all', 'last' or an integer start block, got {shorten(repr(text))}")


TEMPLATE = flag_type(str, {"check": "template"}, "template")


def strict_arg(p: argparse.ArgumentParser) -> None:
    """`--strict`: the one switch of the skip-and-list policy (`vlctl.cli.listing`)."""
    p.add_argument("--strict", action="store_true",
                   help="stop at the first unreadable image (exit 2) instead of skipping it; by default an "
                   "unreadable image is skipped and listed, with its reason, at the end (and in --json)")

"""Frozen dataclass configs and the CLI generated from them.

Each config field is declared with `opt(default, "help text")`; the help text is the field's
documentation and becomes its `--flag` help. `add_config_args` turns a dataclass into argparse
flags and `config_from_args` builds the dataclass back, so a config is defined once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from vlctl.io import VlctlError, read_json

T = TypeVar("T")


def opt(default: Any, help: str) -> Any:
    """A config field with its documentation. Mutable defaults (lists, dicts) are copied."""
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def config_to_dict(cfg: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def config_from_dict(cls: type[T], data: dict, source: str = "config") -> T:
    """Build `cls` from a dict, refusing unknown fields (typos must not pass silently)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise VlctlError(f"{source}: unknown field(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in data.items():
        if isinstance(v, list) and typing.get_origin(hints[k]) is tuple:
            v = tuple(v)
        kwargs[k] = v
    return cls(**kwargs)


def load_config(cls: type[T], path: str | Path) -> T:
    return config_from_dict(cls, read_json(path, f"{cls.__name__} JSON"), source=str(path))


def _flag_type(tp: Any):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _flag_type(args[0])
    if origin in (tuple, list):
        return typing.get_args(tp)[0] if typing.get_args(tp) else str, "+"
    return tp, None


def add_config_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "", exclude: tuple[str, ...] = ()) -> None:
    """Add one `--flag` per field of dataclass `cls` (underscores become dashes), except the
    fields in `exclude` (those the command sets itself, e.g. a dimension read from the data)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        tp, nargs = _flag_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        flag = "--" + prefix + f.name.replace("_", "-")
        help_ = f.metadata.get("help", "") + f" (default: {default})"
        if tp is bool:
            parser.add_argument(flag, dest=prefix + f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            parser.add_argument(flag, dest=prefix + f.name, type=tp, nargs=nargs, default=None, help=help_)


def config_from_args(cls: type[T], args: argparse.Namespace, base: T | None = None, prefix: str = "") -> T:
    """Fields given on the command line override `base` (or the defaults)."""
    base = base if base is not None else cls()
    changes = {}
    for f in dataclasses.fields(cls):
        v = getattr(args, prefix + f.name, None)
        if v is not None:
            changes[f.name] = tuple(v) if isinstance(v, list) else v
    return dataclasses.replace(base, **changes)


def config_to_flags(cfg: Any) -> list[str]:
    """The command-line flags that `config_from_args` turns back into `cfg` (for subprocesses)."""
    flags: list[str] = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if v is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            flags.append(flag if v else "--no-" + f.name.replace("_", "-"))
        elif isinstance(v, (tuple, list)):
            flags += [flag, *map(str, v)]
        else:
            flags += [flag, str(v)]
    return flags

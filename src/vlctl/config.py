"""Frozen dataclass configs and the CLI generated from them.

Each config field is declared with `opt(default, "help text", <range>)`; the help text is the
field's documentation and becomes its `--flag` help. The range is declared beside it: `gt=`,
`ge=`, `lt=`, `le=` (bounds; resource fields have an upper one), `choices=`, `check=` (a named
format: "device", "template"), `length=`/`min_len=` (tuples); floats must be finite and strings
non-empty unless `finite=False` / `nonempty=False`. `add_config_args` turns a dataclass into
argparse flags that refuse a value out of range at parse time, naming the flag, and
`config_from_args` builds the dataclass back; `config_from_dict` and the estimators check the same
ranges (`check_values`, `validate_config`), naming the field. So a config is defined once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import re
import string
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from vlctl.fsops import VlctlError
from vlctl.io import read_json

T = TypeVar("T")

MAX_SEED = 2**32 - 1  # numpy's seeds are 32-bit


def opt(default: Any, help: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
        le: float | None = None, choices: tuple | None = None, check: str | None = None, length: int | None = None,
        min_len: int | None = None, finite: bool = True, nonempty: bool = True, added: bool = False) -> Any:
    """A config field with its documentation and its range (module docstring). Bounds, choices and
    checks apply to each value of a tuple field. Mutable defaults (lists, dicts) are copied.
    `added`: a field added after configs were saved and hashed into cache keys; `config_to_dict`
    leaves it out while it holds its default, so those keys (and shipped checkpoints) stay valid."""
    if check is not None and check not in CHECKS:
        raise ValueError(f"opt: unknown check {check!r}; known: {sorted(CHECKS)}")
    given = {"gt": gt, "ge": ge, "lt": lt, "le": le, "choices": tuple(choices) if choices is not None else None,
             "check": check, "length": length, "min_len": min_len}
    meta = {"help": help, **{k: v for k, v in given.items() if v is not None}}
    if not finite:
        meta["finite"] = False
    if not nonempty:
        meta["nonempty"] = False
    if added:
        meta["added"] = True
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# --- the named checks --------------------------------------------------------------------------

_DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")


def _check_device(value: str) -> str | None:
    return None if _DEVICE.fullmatch(value) else "must be a torch device: cpu, cuda, cuda:N or mps"


def template_error(value: str) -> str | None:
    """Why `value` is no prompt template (one '{}' where the phrase goes, no other {field}), or None."""
    try:
        parts = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(value) if name is not None]
    except ValueError:
        parts = []
    if parts == [("", "", None)]:
        return None
    return "must contain '{}' exactly once (where the phrase goes) and no other {...} field"


CHECKS = {"device": (_check_device, "a torch device: cpu, cuda, cuda:N or mps"),
          "template": (template_error, "a template with one '{}'")}


# --- values ------------------------------------------------------------------------------------


def shorten(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters, saying how long it was (user values echoed in errors)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _show(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return shorten(repr(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe(meta: typing.Mapping) -> str:
    """The range of a field as its help shows it, e.g. 'in (0, 1]', '>= 1, <= 1024', 'one of a | b'."""
    parts = []
    if "choices" in meta:
        parts.append("one of " + " | ".join(map(str, meta["choices"])))
    lo = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    hi = ("]", meta["le"]) if "le" in meta else (")", meta["lt"]) if "lt" in meta else None
    if lo and hi:
        parts.append(f"in {lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}")
    elif lo:
        parts.append(f"{'>=' if lo[0] == '[' else '>'} {_num(lo[1])}")
    elif hi:
        parts.append(f"{'<=' if hi[0] == ']' else '<'} {_num(hi[1])}")
    if "check" in meta:
        parts.append(CHECKS[meta["check"]][1])
    return ", ".join(parts)


_BOUNDS = (("gt", ">", lambda v, b: v > b), ("ge", ">=", lambda v, b: v >= b), ("lt", "<", lambda v, b: v < b),
           ("le", "<=", lambda v, b: v <= b))


def _violation(meta: typing.Mapping, value: Any) -> str | None:
    """What is wrong with one (type-checked) value, as 'must be ...', or None. A bound names the one
    that is crossed and then, after a tab, the whole range: 'must be >= 2\t(in [2, 4096])'."""
    if isinstance(value, float) and meta.get("finite", True) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, str):
        if not value and meta.get("nonempty", True):
            return "must not be empty"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must be UTF-8 text"
    if "choices" in meta and value not in meta["choices"]:
        return "must be one of " + ", ".join(map(str, meta["choices"]))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds = {k: meta[k] for k, _, _ in _BOUNDS if k in meta}
        for key, sym, ok in _BOUNDS:
            if key in meta and not ok(value, meta[key]):
                note = f"\t({describe(bounds)})" if len(bounds) > 1 else ""
                return f"must be {sym} {_num(meta[key])}{note}"
    if "check" in meta and isinstance(value, str):
        return CHECKS[meta["check"]][0](value)
    return None


def _type_info(hint: Any) -> tuple[Any, bool, int | None]:
    """(element type, None allowed, tuple length: None = no tuple, -1 = any, n = exactly n)."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        optional, hint = len(rest) < len(args), rest[0]
    if typing.get_origin(hint) in (tuple, list):
        args = typing.get_args(hint)
        if not args:
            return str, optional, -1
        if len(args) == 2 and args[1] is Ellipsis or typing.get_origin(hint) is list:
            return args[0], optional, -1
        return args[0], optional, len(args)
    return hint, optional, None


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _typed(base: Any, value: Any) -> tuple[Any, bool]:
    """(value as `base` wants it, whether it is of that type): numpy scalars become Python ones."""
    if base is bool:
        return value, isinstance(value, bool)
    if base is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return (int(value) if ok else value), ok
    if base is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        return (value if isinstance(value, (int, float)) or not ok else float(value)), ok
    if base is str:
        return value, isinstance(value, str)
    return value, True


def _fail(label: str, phrase: str, value: Any) -> VlctlError:
    # A flag reads as a sentence ("--lr must be > 0"), a field as a field ("LoopConfig.lr: must be > 0").
    sep = " " if label.startswith("-") else ": "
    return VlctlError(f"{label}{sep}{_with_value(phrase, value)}")


def _with_value(phrase: str, value: Any) -> str:
    """'must be >= 2, got 1 (in [2, 4096])' from _violation's phrase and the value."""
    phrase, _, note = phrase.partition("\t")
    return f"{phrase}, got {_show(value)}" + (f" {note}" if note else "")


def check_value(label: str, hint: Any, meta: typing.Mapping, value: Any) -> Any:
    """`value` checked against a field's type `hint` and range `meta` (opt's metadata): returned
    (a list as a tuple, numpy scalars as Python ones), or a VlctlError naming `label`."""
    base, optional, length = _type_info(hint)
    if value is None:
        if optional:
            return None
        raise _fail(label, "must be given (not None)", value)
    if length is not None:
        if not isinstance(value, (list, tuple)):
            raise _fail(label, "must be a list of values", value)
        if length >= 0 and len(value) != length:
            raise _fail(label, f"must have exactly {length} values", value)
        if len(value) < meta.get("min_len", 0):
            raise _fail(label, f"must have at least {meta['min_len']} value(s)", value)
        if "length" in meta and len(value) != meta["length"]:
            raise _fail(label, f"must have exactly {meta['length']} values", value)
        items = []
        for item in value:
            item, ok = _typed(base, item)
            phrase = (None if ok else f"must hold {_TYPE_WORDS.get(base, base)} values") or _violation(meta, item)
            if phrase:
                raise _fail(label, phrase, value)
            items.append(item)
        return tuple(items)
    value, ok = _typed(base, value)
    phrase = (None if ok else f"must be {_TYPE_WORDS.get(base, base)}") or _violation(meta, value)
    if phrase:
        raise _fail(label, phrase, value)
    return value


def check_values(cls: type, values: typing.Mapping[str, Any], label: str | None = None) -> dict:
    """`values` for fields of dataclass `cls`, each checked (`check_value`); the error names
    `label.field` (label: the class name)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    prefix = label or cls.__name__
    return {k: check_value(f"{prefix}.{k}", hints[k], fields[k].metadata, v) if k in fields else v
            for k, v in values.items()}


def validate_config(cfg: T, label: str | None = None) -> T:
    """`cfg` if every field is of its type and in its declared range, else a VlctlError naming the field."""
    check_values(type(cfg), {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, label)
    return cfg


# --- dicts and files ---------------------------------------------------------------------------


def _added_at_default(cfg: Any, f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("added")) and getattr(cfg, f.name) == f.default


def config_to_dict(cfg: Any) -> dict:
    """The config as plain JSON values; fields declared `added` are left out at their default."""
    out = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    for f in dataclasses.fields(cfg):
        if _added_at_default(cfg, f):
            del out[f.name]
    return out


def config_fields(cfg: Any, names: tuple[str, ...]) -> dict:
    """{name: value} of the fields `names` for a cache key, leaving out `added` fields at their
    default as `config_to_dict` does (keys made before such a field stay valid)."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    return {n: getattr(cfg, n) for n in names if not _added_at_default(cfg, fields[n])}


def config_from_dict(cls: type[T], data: dict, source: str = "config") -> T:
    """Build `cls` from a dict, refusing unknown fields (typos must not pass silently) and values of
    the wrong type or out of their range."""
    if not isinstance(data, dict):
        raise VlctlError(f"{source}: expected a JSON object of {cls.__name__} fields, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise VlctlError(f"{source}: unknown field(s) {unknown} for {cls.__name__}; known: {sorted(names)}")
    return cls(**check_values(cls, data, f"{source}: {cls.__name__}"))


def load_config(cls: type[T], path: str | Path) -> T:
    return config_from_dict(cls, read_json(path, f"{cls.__name__} JSON"), source=str(path))


# --- the command line --------------------------------------------------------------------------


def flag_type(base: Any, meta: typing.Mapping | None = None, name: str | None = None):
    """An argparse `type=` for values of `base` (int, float, str) in the range `meta` (opt's keywords):
    a bad value is refused while parsing, as '--flag must be ..., got X'."""
    meta = dict(meta or {})

    def parse(text: str):
        value: Any = text
        if base is int:
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be an integer, got {_show(text)}") from None
        elif base is float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be a number, got {_show(text)}") from None
        phrase = _violation(meta, value)
        if phrase:  # a flag may say its range in its own words (vlctl_phrase)
            raise argparse.ArgumentTypeError(_with_value(getattr(parse, "vlctl_phrase", None) or phrase, value))
        return value

    parse.__name__ = name or getattr(base, "__name__", "value")
    parse.vlctl_range = (base, meta)  # what the CLI fuzz test reads to make values out of range
    return parse


def add_config_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "", exclude: tuple[str, ...] = (),
                    defaults: dict[str, Any] | None = None) -> None:
    """Add one `--flag` per field of dataclass `cls` (underscores become dashes), except the
    fields in `exclude` (those the command sets itself, e.g. a dimension read from the data).
    `defaults`: the command's own default of a field where it differs from the dataclass's (the
    command applies it; the help says it). Each
    flag refuses a value out of the field's range while parsing; `check_config_args` then builds
    the configs once, so cross-field checks fail before the command does any work."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        base, _, length = _type_info(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        default = (defaults or {}).get(f.name, default)
        flag = "--" + prefix + f.name.replace("_", "-")
        rng = describe(f.metadata)
        help_ = f.metadata.get("help", "") + f" (default: {default}" + (f"; {rng}" if rng else "") + ")"
        if base is bool and length is None:
            parser.add_argument(flag, dest=prefix + f.name, action=argparse.BooleanOptionalAction, default=None,
                                help=help_)
            continue
        nargs = None if length is None else "+" if length < 0 else length
        if "length" in f.metadata:
            nargs = f.metadata["length"]
        metavar = "{" + ",".join(map(str, f.metadata["choices"])) + "}" if "choices" in f.metadata else None
        parser.add_argument(flag, dest=prefix + f.name, type=flag_type(base, f.metadata), nargs=nargs, default=None,
                            metavar=metavar, help=help_)
    configs = list(parser.get_default("_vlctl_configs") or [])
    parser.set_defaults(_vlctl_configs=[*configs, (cls, prefix)])


def config_from_args(cls: type[T], args: argparse.Namespace, base: T | None = None, prefix: str = "") -> T:
    """Fields given on the command line override `base` (or the defaults); each is checked against
    its range, the error naming its flag."""
    base = base if base is not None else cls()
    hints = typing.get_type_hints(cls)
    changes, flags = {}, {}
    for f in dataclasses.fields(cls):
        flags[f.name] = "--" + (prefix + f.name).replace("_", "-")
        v = getattr(args, prefix + f.name, None)
        if v is not None:
            changes[f.name] = check_value(flags[f.name], hints[f.name], f.metadata,
                                          tuple(v) if isinstance(v, list) else v)
    try:
        return dataclasses.replace(base, **changes)
    except VlctlError as e:  # a check across fields (__post_init__), in the config's terms
        flags = {k: v for k, v in flags.items() if hasattr(args, prefix + k)}  # the fields that are flags
        raise VlctlError(in_flag_terms(str(e), cls.__name__, flags)) from None


def in_flag_terms(message: str, owner: str, flags: dict[str, str]) -> str:
    """A config's error `message` in the terms of the command line: "k=100 must be in [1,
    d_latent=10]" -> "--k 100 must be in [1, --d-latent 10]", "TreeTuneConfig.alpha: ..." ->
    "--alpha: ...". `flags`: {field: flag} of the fields that are flags; `owner`: the config's name."""
    if not flags:
        return message
    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    message = re.sub(rf"\b(?:{re.escape(owner)}\.)?({names})=", lambda m: flags[m.group(1)] + " ", message)
    return re.sub(rf"(?:\b{re.escape(owner)}\.|^)({names})\b", lambda m: flags[m.group(1)], message)


def check_config_args(args: argparse.Namespace) -> None:
    """Build every config a command's flags make (`add_config_args`), so that a value out of range,
    alone or with another field, is refused before the command starts."""
    for cls, prefix in getattr(args, "_vlctl_configs", None) or ():
        config_from_args(cls, args, prefix=prefix)


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

"""The skip-and-list policy's output: what a command skipped, listed with the reasons at its end.

A command that reads many images never stops at an unreadable one (unless `--strict`): its result
holds "failures" ([path, reason] of every file skipped) and "notes" ([path, note] of files used
with a remark, e.g. the first of several frames). `--json` prints them with the result; otherwise
they are listed after it, on stderr, so stdout stays the command's own output.
"""

from __future__ import annotations

import sys

SHOWN = 50  # lines of each list shown without --json; --json lists all


def print_listed(result: dict) -> None:
    """The result's "failures" and "notes" as lines on stderr (module docstring); nothing if none."""
    for key, head in (("failures", "skipped {n} unreadable file{s} (--strict stops at the first instead)"),
                      ("notes", "{n} file{s} read with a note")):
        rows = result.get(key) or []
        if not rows:
            continue
        print(f"vlctl: {head.format(n=len(rows), s='' if len(rows) == 1 else 's')}:", file=sys.stderr)
        for path, text in rows[:SHOWN]:
            print(f"  {text if text.startswith(str(path)) else f'{path}: {text}'}", file=sys.stderr)
        if len(rows) > SHOWN:
            print(f"  ... and {len(rows) - SHOWN} more (--json lists all)", file=sys.stderr)


def plain(value) -> str:
    """A result's value as the text output shows it (--json keeps every digit): floats to 4
    significant digits, a dict as `key value, ...`, a list of plain values comma-separated. A
    `score tevi` result printed Python dicts with 15-digit floats."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)) and not any(isinstance(v, (dict, list, tuple)) for v in value):
        return ", ".join(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return "; ".join(plain(v) for v in value)
    return str(value)


def without_lists(result: dict) -> dict:
    """The result less the lists `print_listed` shows (their counts stay)."""
    return {k: v for k, v in result.items() if k not in ("failures", "notes")}

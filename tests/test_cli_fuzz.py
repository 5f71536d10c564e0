"""CLI fuzz: every option of every command, read from the parser (and through it from the config
dataclasses' declared ranges), given values it must refuse: below and above its range, zero and
negative where those are out of it, NaN and infinities, huge numbers, a wrong type, bytes that are
not UTF-8, an empty string, a missing path, a file where a directory is expected and the reverse.

Every probe must end with exit code 2, one line on stderr that names the option, no traceback --
and before the command starts any work: the commands' handlers are replaced by a sentinel, so a
probe that reaches one is an invalid value accepted. A control checks that each command's base
command line (valid values everywhere) does reach its handler, so each probe fails because of its
one bad value. In-process and with one parser, so the whole run takes seconds; the slow variant
adds more values, the `--flag=value` spelling and real processes given raw bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import vlctl.cli
from vlctl.cli import COMMANDS, main
from vlctl.cli.args import blocks_arg

NOT_UTF8 = "\udcff"  # the byte 0xff, as Python hands it on in sys.argv (surrogateescape)
MAX_LINE = 2500  # an error line is cut at 2000 characters, plus the prefix and the --help hint


class _Reached(Exception):
    pass


def _sentinel(args):
    raise _Reached(args)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Paths the probes use, the parser (built once, every handler a sentinel), and the commands."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "d").mkdir()
    (root / "dj.json").mkdir()  # a directory with a file's name
    (root / "f.txt").write_text("red\n", encoding="utf-8")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "img.png")
    paths = {k: str(root / v) for k, v in {"D": "d", "DJ": "dj.json", "F": "f.txt", "IMG": "img.png",
                                            "OUT": "out", "OUTF": "out.npz", "MISSING": "missing/x"}.items()}
    parser = vlctl.cli.build_parser()
    commands = {}

    def walk(p, words):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            p.set_defaults(handler=_sentinel)
            commands[" ".join(words)] = p
            return
        for name, sp in subs[0].choices.items():
            walk(sp, [*words, name])

    walk(parser, [])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vlctl.cli, "build_parser", lambda *a, **kw: parser)  # main builds one command: here all, built once
        yield paths, commands


def base_argv(paths: dict) -> dict[str, list[str]]:
    """A valid command line per command (what a probe changes one value of)."""
    D, F, IMG, OUT, OUTF = (paths[k] for k in ("D", "F", "IMG", "OUT", "OUTF"))
    return {
        "data mad": ["--out", OUT], "data shapes": ["--out", OUT], "data scenes": ["--out", OUT],
        "train clip": ["--data", D, "--out", OUT],
        "embed": [D, "--encoder", "tiny:x", "--out", OUT], "index": [D, "--encoder", "tiny:x", "--out", OUT],
        "search": [D, "--text", "a red car"],
        "fit sae": ["--store", D, "--out", OUT], "fit tevi": ["--store", D, "--sae", D, "--out", OUT],
        "fit controlembed": ["--store", D, "--out", OUT],
        "fit tree": ["--encoder", D, "--data", D, "--out", OUT],
        "score tevi": ["--store", D, "--tevi", D, "--out", OUTF],
        "cluster": [D, "--controlembed", D, "--attribute", "color"],
        "inspect sae": ["--store", D, "--sae", D, "--out", OUT, "--vocabulary", F],
        "explain": ["--encoder", "tiny:x", IMG, "red", "blue", "--out", OUT],
        "tree": ["a red car"],
        "eval retrieval": ["--encoder", "tiny:x", "--dataset", "coco", "--root", D, "--annotations", F],
        "reproduce": ["mad-clip", "--out", OUT],
        "verify": [D],
        "store convert": [D, OUT],
        "serve": [D, "--controlembed", D],
        "audit": ["--encoder", "tiny:x", "--pairs", F, "--out", OUT],
    }


POSITIONALS = {  # command -> {dest: index of its value in the base command line}
    "embed": {"source": 0}, "index": {"source": 0}, "search": {"store": 0}, "cluster": {"store": 0},
    "explain": {"image": 2, "positive": 3, "negative": 4}, "tree": {"captions": 0}, "reproduce": {"name": 0},
    "verify": {"path": 0}, "serve": {"store": 0}, "store convert": {"source": 0, "out": 1},
}


def _inside(base, meta):
    """A value inside a numeric range (for the other values of a multi-value flag)."""
    lo = meta.get("ge", meta.get("gt"))
    hi = meta.get("le", meta.get("lt"))
    if lo is None and hi is None:
        return 1
    if lo is None or hi is None:
        return (lo + 1) if hi is None else (hi - 1)
    return (lo + hi) // 2 if base is int else (lo + hi) / 2


def _numeric_bad(base, meta, extended: bool) -> list[str]:
    out = ["abc", "", "1e400" if base is float else str(10**30)]
    if base is int:
        out.append("1.5")
    else:
        out += ["nan", "inf", "-inf"]
    for k, v in meta.items():
        if k == "ge":
            out.append(str(v - 1))
        elif k == "gt":
            out.append(str(v))
        elif k == "le":
            out.append(str(v + 1 if base is int else v * 2 + 1))
        elif k == "lt":
            out.append(str(v))
    for v in (0, -1):
        if not _in_range(v, meta):
            out.append(str(v))
    if extended and base is float:
        for k, v in meta.items():
            if k == "ge":
                out.append(repr(math.nextafter(float(v), -math.inf)))
            elif k == "le":
                out.append(repr(math.nextafter(float(v), math.inf)))
        out += ["NaN", "+nan", "-NAN", "Infinity"]
    return list(dict.fromkeys(out))


def _in_range(v, meta) -> bool:
    return all(("gt" not in meta or v > meta["gt"], "ge" not in meta or v >= meta["ge"],
                "lt" not in meta or v < meta["lt"], "le" not in meta or v <= meta["le"]))


def bad_values(action: argparse.Action, paths: dict, extended: bool = False) -> list[list[str]] | None:
    """The value lists `action` must refuse; None when the test does not know its validator."""
    t = action.type
    long = "x" * 100_000
    if hasattr(t, "vlctl_range"):
        base, meta = t.vlctl_range
        if base in (int, float):
            values = _numeric_bad(base, meta, extended)
        elif meta.get("check") == "template":
            values = ["", "no slot", "{} and {}", "{0}", "{x}", "{}{", NOT_UTF8]
        elif meta.get("check") == "device":
            values = ["foo", "cuda:x", "gpu", "", NOT_UTF8]
        elif "choices" in meta:
            values = ["bogus", "", NOT_UTF8, str(meta["choices"][0]).upper() + "x"]
        else:
            values = ["", NOT_UTF8]
        if extended:
            values.append(NOT_UTF8 + long)
        n = action.nargs
        if isinstance(n, int) and n > 1:  # the other values valid; and one value too few
            ok = str(_inside(base, meta))
            return [[*[ok] * (n - 1), v] for v in values] + [[ok] * (n - 1)]
        return [[v] for v in values]
    if hasattr(t, "vlctl_path"):
        way, kind = t.vlctl_path
        values = ["", NOT_UTF8]
        if way == "in":
            values.append(paths["MISSING"])
            values += {"dir": [paths["F"]], "file": [paths["D"]]}.get(kind, [])
        else:
            values += [paths["F"] + "/sub"]
            values += {"dir": [paths["F"]], "file": [paths["D"]], "dir-or-json": [paths["F"], paths["DJ"]]}[kind]
        if extended:
            values += [paths["MISSING"] + "/" + "y" * 5000]
        return [[v] for v in values]
    if getattr(t, "vlctl_device", False):
        return [[v] for v in ("foo", "cuda:x", "cuda:99", "gpu0", "", NOT_UTF8)]
    if t is blocks_arg:
        return [[v] for v in ("first", "1.5", "", "all blocks", NOT_UTF8)]
    if getattr(t, "__name__", "") == "_rerank_spec":
        return [[v] for v in ("x", "tevi:", "tevi:" + paths["MISSING"], "sae:" + paths["D"], "", NOT_UTF8)]
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return [[v] for v in ("bogus", "", NOT_UTF8)]
    return None


def takes_values(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))


def probe_argv(command: str, p: argparse.ArgumentParser, action, values: list[str], base: list[str],
               equals: bool = False) -> list[str]:
    argv = list(base)
    if not action.option_strings:  # a positional: its slot in the base command line
        i = POSITIONALS[command][action.dest]
        if action.nargs == "*" or i < len(argv):
            argv[i : i + 1] = values
        else:
            argv.insert(i, values[0])
        return [*command.split(), *argv]
    # the flag's (and its exclusive group's) occurrences in the base go, then the probe's
    drop = set(action.option_strings)
    for g in p._mutually_exclusive_groups:
        if action in g._group_actions:
            drop |= {s for a in g._group_actions for s in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in drop:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    flag = action.option_strings[0]
    tail = [f"{flag}={values[0]}", *values[1:]] if equals and values else [flag, *values]
    return [*command.split(), *out, *tail]


def run(argv: list[str]) -> tuple[int, str, bool]:
    """(exit code, stderr, whether the command's handler was reached)."""
    err = io.StringIO()
    reached = False
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except _Reached:
            rc, reached = 0, True
        except Exception as e:  # noqa: BLE001 -- a traceback the user would see
            rc = -1
            err.write(f"Traceback (in-process): {type(e).__name__}: {e}\n")
    return rc, err.getvalue(), reached


def check_probe(argv: list[str], action) -> str | None:
    """Why the probe's outcome is wrong, or None."""
    rc, err, reached = run(argv)
    if reached:
        return "accepted (the command's handler was reached)"
    lines = err.splitlines()
    if rc != 2 or len(lines) != 1 or "Traceback" in err or not err.startswith("vlctl: error: "):
        return f"rc={rc}, stderr={err[:500]!r}"
    names = [*action.option_strings, action.dest, str(action.metavar), "argument "]
    if not any(n in lines[0] for n in names):
        return f"the error does not name the option: {lines[0][:300]!r}"
    if len(lines[0]) > MAX_LINE:
        return f"the error line is {len(lines[0])} characters"
    return None


def fuzz(command: str, env, extended: bool = False) -> tuple[int, list[str]]:
    paths, commands = env
    p = commands[command]
    base = base_argv(paths)[command]
    probes, failures = 0, []
    for action in p._actions:
        if not takes_values(action) or action.dest in ("help", "version"):
            continue
        values_list = bad_values(action, paths, extended)
        assert values_list is not None, f"{command} {action.option_strings or action.dest}: no known validator"
        for values in values_list:
            for equals in (False, True) if extended and action.option_strings else (False,):
                argv = probe_argv(command, p, action, values, base, equals)
                probes += 1
                why = check_probe(argv, action)
                if why:
                    failures.append(f"vlctl {' '.join(map(repr, argv))[:300]}: {why}")
    return probes, failures


COMMAND_NAMES = [words for words, _, _ in COMMANDS]


def test_every_command_has_a_base_command_line(env):
    assert sorted(base_argv(env[0])) == sorted(env[1]) == sorted(COMMAND_NAMES)


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_base_command_line_reaches_the_command(env, command):
    """The control: with valid values everywhere the command starts (its handler is reached)."""
    _, err, reached = run([*command.split(), *base_argv(env[0])[command]])
    assert reached, err


_PROBES: dict[str, int] = {}  # command -> probes run (test_fuzz_covers_every_command adds them up)


@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_fuzz_every_option(env, command):
    probes, failures = fuzz(command, env)
    _PROBES[command] = probes
    assert probes > 0
    assert not failures, f"{len(failures)} of {probes} probes failed:\n" + "\n".join(failures[:40])


def test_fuzz_covers_every_command(env):
    """All together: 0 tracebacks and 0 accepted values over every option of every command (1,249
    probes when this was written), and no probe wrote anything."""
    if set(_PROBES) != set(COMMAND_NAMES):
        pytest.skip("runs after the per-command fuzz tests")
    assert sum(_PROBES.values()) >= 1200, _PROBES
    assert not os.path.exists(env[0]["OUT"]) and not os.path.exists(env[0]["OUTF"])


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMAND_NAMES)
def test_fuzz_every_option_extended(env, command):
    """More values (next float outside each bound, NaN spellings, 100,000-character values) and the
    `--flag=value` spelling."""
    probes, failures = fuzz(command, env, extended=True)
    assert not failures, f"{len(failures)} of {probes} probes failed:\n" + "\n".join(failures[:40])


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    [b"tree", b"\xff\xfe"],
    [b"train", b"clip", b"--data", b"/nonexistent", b"--out", b"/tmp/o", b"--lr", b"nan"],
    [b"data", b"mad", b"--out", b"/tmp/o\xff"],
    [b"fit", b"sae", b"--store", b"", b"--out", b"o"],
    [b"cluster", b"/", b"--controlembed", b"/", b"--attribute", b"x", b"--thumb", b"100000"],
    [b"index", b"/", b"--encoder", b"x", b"--out", b"/tmp/o", b"--device", b"foo"],
])
def test_real_process_raw_bytes(argv):
    """The same boundary in a real process, given raw bytes in argv."""
    r = subprocess.run([os.fsencode(sys.executable), b"-m", b"vlctl", *argv], capture_output=True, check=False,
                       timeout=300)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err

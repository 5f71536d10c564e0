"""Every code block of the README is executed by a test, so none can drift silently.

Blocks between `<!-- walkthrough -->`, `<!-- python-setup -->` or `<!-- python -->` markers run for
real (tests/test_walkthrough.py, tests/test_readme_python.py). Every other block is checked here
line by line: a `vlctl` command (also under torchrun) must parse with the real CLI parser, a
`make` target must exist in the Makefile, a `python -m` module must be importable, a Python block
must compile and a JSON block must load. A line of any other kind fails the test.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from vlctl.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN_ELSEWHERE = ("walkthrough", "python-setup", "python")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks() -> list[tuple[int, str, str, str | None]]:
    """(line number, language, code, marker or None) of every fenced block of the README."""
    text = README.read_text("utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").splitlines()
        marker = next((t for t in RUN_ELSEWHERE if before and before[-1] == f"<!-- {t} -->"), None)
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), marker))
    return out


def logical_lines(code: str) -> list[str]:
    """Shell lines with `\\` continuations joined and comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = []
    for line in joined.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            lines.append(shlex.join(argv))
    return lines


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text("utf-8"), re.MULTILINE))


def check_shell_line(line: str) -> None:
    argv = shlex.split(line)
    if argv[0] == "make":
        missing = set(argv[1:]) - make_targets()
        assert not missing, f"`{line}`: no Makefile target {sorted(missing)}"
        return
    if argv[0] == "torchrun":
        assert "-m" in argv and argv[argv.index("-m") + 1] == "vlctl", f"`{line}`: torchrun of what?"
        argv = ["vlctl", *argv[argv.index("-m") + 2 :]]
    if argv[0] in ("python", "python3") and argv[1] == "-m":
        assert importlib.util.find_spec(argv[2]) is not None, f"`{line}`: no module {argv[2]}"
        return
    if argv[:2] in (["git", "clone"], ["cd", argv[1] if len(argv) > 1 else ""]):
        return
    assert argv[0] == "vlctl", f"`{line}`: a README command this test cannot check"
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as e:
        raise AssertionError(f"`{line}`: the vlctl parser refuses it (exit {e.code})") from None


def test_every_readme_block_is_checked_or_run():
    found = blocks()
    assert {m for *_, m in found if m} == set(RUN_ELSEWHERE), "a block that runs elsewhere lost its marker"
    for lineno, lang, code, marker in found:
        where = f"README.md:{lineno}"
        if marker:
            continue
        if lang in ("bash", "sh", "console"):
            lines = logical_lines(code)
            assert lines, f"{where}: an empty shell block"
            for line in lines:
                try:
                    check_shell_line(line)
                except AssertionError as e:
                    raise AssertionError(f"{where}: {e}") from None
        elif lang == "python":
            compile(code, where, "exec")
        elif lang == "json":
            json.loads(code)
        else:
            assert lang in ("", "text"), f"{where}: a ```{lang} block this test does not know how to check"


@pytest.mark.parametrize("line", ["vlctl search store/ --text red -k five", "vlctl no-such-command",
                                  "rm -rf store/", "make no-such-target"])
def test_a_wrong_command_is_caught(line):
    with pytest.raises(AssertionError):
        check_shell_line(line)

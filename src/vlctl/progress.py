"""Progress for long work: a tqdm bar on a terminal, a plain line every 30 s anywhere else.

A bar redrawn with carriage returns turns a log file or a CI console into one unreadable line,
and a silent job looks hung; so when stderr is not a terminal, `progress_bar` prints
`desc: n/total (p%), elapsed, ETA` at most every `every` seconds and once at the end. `heartbeat`
covers work that has no counter of its own (a recipe stage): it prints a line every `every`
seconds unless a progress line was printed in between.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

EVERY_S = 30.0
_last_line = [0.0]  # time.monotonic() of the last progress line printed by this process
_beating: list[object] = []  # the open heartbeats, innermost last: only that one prints


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    m, s = divmod(seconds, 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


def say(line: str) -> None:
    """One progress line on stderr, `[vlctl] ...`, flushed."""
    print(f"[vlctl] {line}", file=sys.stderr, flush=True)
    _last_line[0] = time.monotonic()


def on_terminal() -> bool:
    """Whether stderr is a terminal; VLCTL_TERMINAL=1/0 says so for a child whose stderr is a pipe
    forwarded to one (a recipe's torchrun)."""
    told = os.environ.get("VLCTL_TERMINAL")
    return told == "1" if told in ("0", "1") else sys.stderr.isatty()


class LineProgress:
    """tqdm's `update`/`set_postfix`/`close` interface, printing a plain line every `every` s."""

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0,
                 disable: bool = False, every: float = EVERY_S, **_: Any):
        self.total, self.desc, self.unit, self.n = total, desc or "progress", unit, initial
        self.disable, self.every = disable, every
        self.start = self.last = time.monotonic()
        self.initial, self.postfix, self.closed = initial, "", False

    def update(self, k: int = 1) -> None:
        self.n += k
        if not self.disable and time.monotonic() - self.last >= self.every:
            self._print()

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def _print(self) -> None:
        self.last = time.monotonic()
        elapsed = self.last - self.start
        done = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
        if self.total:
            done += f" ({100 * self.n / self.total:.0f}%)"
        line = f"{self.desc}: {done}, {_duration(elapsed)}"
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        if self.total and rate > 0 and self.n < self.total:
            line += f", about {_duration((self.total - self.n) / rate)} left"
        say(line + (f" [{self.postfix}]" if self.postfix else ""))

    def close(self) -> None:
        # The final line once, and only when the work took long enough to have shown progress.
        if not self.closed and not self.disable and self.last > self.start:
            self._print()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(total: int | None = None, desc: str = "", unit: str = "it", initial: int = 0,
                 disable: bool = False, **kw: Any):
    """A tqdm bar when stderr is a terminal, else a `LineProgress`; both are context managers."""
    if on_terminal():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc or None, unit=unit, initial=initial, disable=disable,
                    dynamic_ncols=True, leave=False, **kw)
    return LineProgress(total=total, desc=desc, unit=unit, initial=initial, disable=disable)


@contextlib.contextmanager
def heartbeat(label: str, every: float = EVERY_S) -> Iterator[None]:
    """Print `label: running, <elapsed>` every `every` s while the block runs, unless another
    progress line was printed in the meantime (in a terminal a bar shows it). Nested heartbeats
    (a recipe's around its stages') print only the innermost one: one line says what is running."""
    stop = threading.Event()
    t0 = time.monotonic()
    token = object()

    def beat() -> None:
        # Wake exactly `every` s after the last line printed (by anyone), so no gap exceeds it.
        # (At least 0.2 s between wake-ups: an outer heartbeat stays overdue while an inner one runs.)
        while not stop.wait(max(0.2, max(_last_line[0], t0) + every - time.monotonic())):
            now = time.monotonic()
            if _beating and _beating[-1] is token and now - max(_last_line[0], t0) >= every - 0.01:
                say(f"{label}: running, {_duration(now - t0)}")

    _beating.append(token)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _beating.remove(token)

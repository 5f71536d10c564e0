"""Progress lines: plain lines off a terminal, one heartbeat line at a time."""

import time

from vlctl import progress


def test_nested_heartbeats_print_only_the_innermost(capsys):
    with progress.heartbeat("recipe", every=0.1):
        with progress.heartbeat("stage data", every=0.1):
            time.sleep(1.0)
        time.sleep(1.0)  # several wake-ups (at least 0.2 s apart) in each window, even on a busy machine
    lines = capsys.readouterr().err.splitlines()
    inner = [i for i, line in enumerate(lines) if line.startswith("[vlctl] stage data: running")]
    outer = [i for i, line in enumerate(lines) if line.startswith("[vlctl] recipe: running")]
    assert inner and outer, lines
    assert max(inner) < min(outer), lines  # the recipe's beat only once its stage has ended
    assert len(lines) == len(inner) + len(outer)


def test_line_progress_prints_at_most_every_interval_and_once_at_the_end(capsys, monkeypatch):
    monkeypatch.setenv("VLCTL_TERMINAL", "0")
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    with progress.progress_bar(total=10, desc="embed", unit="img") as bar:
        for _ in range(10):
            clock[0] += 4.0
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    # updates at t=4..40 s: one line when 30 s have passed (n=8), one at the end (n=10)
    assert lines == ["[vlctl] embed: 8/10 img (80%), 32 s, about 8 s left", "[vlctl] embed: 10/10 img (100%), 40 s"]

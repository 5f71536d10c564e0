"""The CLI's error boundary: a user's mistake is one line and exit code 2, never a traceback,
unless --debug / VLCTL_DEBUG=1 asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vlctl.cli import main


def test_os_error_is_one_line_naming_the_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    # --out under a regular file: the writer's mkdir fails with NotADirectoryError / FileExistsError.
    rc = main(["tree", "a red car", "--cache", str(tmp_path / "afile" / "cache.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("vlctl: error: ") and "afile" in err
    assert "Traceback" not in err


def test_debug_lets_the_traceback_through(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    argv = ["tree", "a red car", "--cache", str(tmp_path / "afile" / "cache.json")]
    with pytest.raises(OSError):
        main(["--debug", *argv])
    monkeypatch.setenv("VLCTL_DEBUG", "1")
    with pytest.raises(OSError):
        main(argv)


def test_no_traceback_in_a_real_process(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8\n")
    r = subprocess.run([sys.executable, "-m", "vlctl", "tree", "--file", str(tmp_path / "bad.txt")],
                       check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1

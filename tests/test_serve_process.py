"""Issue 43: `vlctl serve` as a process: a port in use is refused before anything loads; Ctrl-C and
SIGTERM stop the server and its worker processes without a traceback or a leaked semaphore."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from PIL import Image

from vlctl.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    (root / "photos").mkdir()
    for i in range(3):
        Image.new("RGB", (40, 30), (80 * i, 40, 200 - 60 * i)).save(root / "photos" / f"{i}.png")
    assert main(["embed", str(root / "photos"), "--encoder", "open_clip:ViT-S-32", "--out", str(root / "store"),
                 "--no-progress"]) == 0
    return root / "store"


def _serve(store, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vlctl", "serve", str(store), "--port", str(port)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)


def test_a_port_in_use_is_one_line_before_loading(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = _serve(store, port)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert err == (f"vlctl: error: --port {port}: 127.0.0.1:{port} is already in use by another process; stop it, "
                   "or pick another --port (0 for any free one)\n")  # nothing loaded, no URL printed


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_stopping_the_server_is_quiet(store, sig):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = _serve(store, port)
    deadline = time.monotonic() + 300
    while True:  # until it answers: the signal then reaches a running server and its workers
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=5)
            break
        except OSError:
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()
            time.sleep(0.3)
    os.killpg(p.pid, sig)  # as a terminal's Ctrl-C does: to the whole process group
    _, err = p.communicate(timeout=120)
    assert "Traceback" not in err and "leaked" not in err and "KeyboardInterrupt" not in err, err
    assert p.returncode in ((0,) if sig == signal.SIGINT else (0, -signal.SIGTERM)), err
    if sig == signal.SIGINT:
        assert err.rstrip().endswith("[vlctl] serve: stopped")

"""A full disk is an error, not a crash: one line naming the path and the bytes needed, exit code 2,
nothing partial left, the previous output intact.

On a real full file system: a 2 MiB tmpfs, mounted when the tests run as root and the container
allows it (skipped with the reason otherwise). Before the fix, `data mad` and an `index` add died
of SIGBUS (exit 135) in their memory-mapped writers and left the temporary output behind. The
ENOSPC path is also unit-tested everywhere through the fault hook (VLCTL_FAULT=enospc:N makes the
N-th large write fail with ENOSPC), which needs no mount.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from test_fault_injection import inputs, leftovers, mad_args, store_args, store_state  # noqa: F401
from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_bytes, open_memmap


@pytest.fixture()
def small_fs(tmp_path):
    """A 2 MiB tmpfs at tmp_path/fs (unmounted afterwards)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def fill(fs: Path, leave: int = 0) -> Path:
    """Fill `fs` up to `leave` bytes free, with one file."""
    filler = fs / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))
    return filler


def one_line_no_space(output: str, path: Path) -> None:
    errors = [line for line in output.splitlines() if line.startswith("vlctl: error:")]
    assert len(errors) == 1, output
    assert "no space left on device" in errors[0] and "bytes needed" in errors[0] and str(path) in errors[0], output


def test_data_mad_on_a_full_disk_is_an_error(inputs, small_fs):  # noqa: F811
    """2000 images of 28 x 28 x 3 need 4.7 MB: refused before rendering, the fs left empty."""
    status, output = inputs["driver"].run([*mad_args(small_fs / "mad")[:-4], "--n", 2000, "--out", small_fs / "mad"])
    assert status == 2, f"exit {status} (135 = SIGBUS): {output}"
    one_line_no_space(output, small_fs)
    assert os.listdir(small_fs) == []


def test_index_add_on_a_full_disk_keeps_the_store(inputs, small_fs, tmp_path):  # noqa: F811
    drv = inputs["driver"]
    gal = small_fs / "gal"
    assert drv.run(store_args("index", inputs["a"], inputs["model"], gal))[0] == 0
    before = store_state(gal)
    filler = fill(small_fs)
    status, output = drv.run(store_args("index", inputs["b"], inputs["model"], gal))
    assert status == 2, f"exit {status} (135 = SIGBUS): {output}"
    one_line_no_space(output, gal)
    assert store_state(gal) == before and leftovers(small_fs) == []
    filler.unlink()
    assert drv.run(store_args("index", inputs["b"], inputs["model"], gal))[0] == 0  # room again: it adds
    assert store_state(gal)[0] == 6


@pytest.mark.parametrize("n", [1, 2, 3])
def test_data_mad_enospc_at_each_write(inputs, tmp_path, n):  # noqa: F811
    """Through the fault hook: images.npy's allocation, labels.jsonl, meta.json; the previous set stays."""
    drv = inputs["driver"]
    out = tmp_path / "mad"
    assert drv.run(mad_args(out, seed=0))[0] == 0
    old = (out / "images.npy").read_bytes()
    status, output = drv.run(mad_args(out, seed=1), env={"VLCTL_FAULT": f"enospc:{n}"})
    assert status == 2, output
    one_line_no_space(output, tmp_path)
    assert (out / "images.npy").read_bytes() == old and leftovers(tmp_path) == []


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_index_enospc_at_each_write(inputs, tmp_path, n):  # noqa: F811
    """The shard's allocation, its metadata, its FAISS index part (hnsw), the manifest: the store stays as it was."""
    drv = inputs["driver"]
    gal = tmp_path / "gal"
    assert drv.run([*store_args("index", inputs["a"], inputs["model"], gal), "--index-kind", "hnsw"])[0] == 0
    before = store_state(gal)
    status, output = drv.run(store_args("index", inputs["b"], inputs["model"], gal), env={"VLCTL_FAULT": f"enospc:{n}"})
    assert status == 2, output
    one_line_no_space(output, gal)
    assert store_state(gal) == before and leftovers(tmp_path) == []


def test_enospc_in_the_helpers(tmp_path, monkeypatch):
    monkeypatch.setenv("VLCTL_FAULT", "enospc:1")
    import vlctl.fsops

    monkeypatch.setattr(vlctl.fsops, "_calls", {})
    with pytest.raises(VlctlError, match=r"a\.bin: no space left on device \(5 bytes needed, \d+ bytes free\)"):
        atomic_write_bytes(tmp_path / "a.bin", b"hello")
    monkeypatch.setattr(vlctl.fsops, "_calls", {})
    with pytest.raises(VlctlError, match=r"m\.npy: no space left on device \(\d+ bytes needed"):
        open_memmap(tmp_path / "m.npy", np.float32, (10, 4))
    assert os.listdir(tmp_path) == []  # nothing partial

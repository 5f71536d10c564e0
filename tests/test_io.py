"""vlctl.io: written files and directories get the mode the umask gives, like a plain open()."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from vlctl.io import atomic_dir, atomic_save_npz, atomic_write_json, atomic_write_text


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_outputs_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        files = [atomic_write_text(tmp_path / "a.txt", "x"), atomic_write_json(tmp_path / "b.json", {"k": 1}),
                 atomic_save_npz(tmp_path / "c.npz", x=np.zeros(2))]
        with atomic_dir(tmp_path / "d") as d:
            (d / "inside.txt").write_text("y")
    finally:
        os.umask(old)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o777 & ~umask
    assert os.umask(old) == old  # the umask itself is left as it was


def test_gc_paused_pauses_the_collector_and_restores_it():
    import gc

    from vlctl.io import gc_paused

    seen = []

    @gc_paused
    def load(fail: bool):
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("bad file")
        return 7

    assert gc.isenabled() and load(False) == 7 and gc.isenabled()
    with pytest.raises(ValueError):
        load(True)
    assert gc.isenabled() and seen == [False, False]
    gc.disable()  # paused by its caller: left paused
    try:
        load(False)
        assert not gc.isenabled()
    finally:
        gc.enable()

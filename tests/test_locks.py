"""Writers take a lock: a second writer waits (saying so) or fails at once under --no-wait, two or
three `vlctl index` runs into one store at once lose no row, and readers never see a half state.

The reproduction of issue 18: index folder A; then index B and C into the same --out at once.
Before the lock each run deleted the files its own stale manifest did not name -- the other run's
shards -- and `vlctl search` then failed with "emb-00001.npy: embedding shard named in
manifest.json is missing". TRIALS of it must keep every row.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from test_fault_injection import inputs, leftovers, mad_args, mad_state, store_args, write_photos  # noqa: F401
from vlctl.embeddings.store import open_store
from vlctl.fsops import LockBusyError, lock_file, locked, set_output_policy

TRIALS = 10


def _child(code: str, cwd: Path) -> subprocess.Popen:
    """A Python child that imports only the lock module (fast: no numpy, no torch)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_lock_is_reentrant_and_leaves_no_file(tmp_path):
    target = tmp_path / "out"
    with locked(target):
        with locked(target):  # the same process again: no deadlock
            assert lock_file(target).is_file()
        assert lock_file(target).is_file()
    assert list(tmp_path.iterdir()) == []  # the holder deletes its lock file as it lets go


def test_a_second_writer_fails_at_once_with_no_wait_and_waits_without(tmp_path):
    target = tmp_path / "out"
    child_code = f"""
        import sys
        from vlctl.fsops import LockBusyError, locked, set_output_policy
        set_output_policy(wait={{wait}})
        try:
            with locked({str(target)!r}):
                print("got it")
        except LockBusyError as e:
            print(e, file=sys.stderr)
            sys.exit(2)
    """
    with locked(target):
        busy = _child(child_code.format(wait=False), tmp_path)
        _, err = busy.communicate(timeout=60)
        assert busy.returncode == 2
        assert f"{target}: another vlctl process (pid " in err and "--no-wait" in err, err
        waiting = _child(child_code.format(wait=True), tmp_path)
        time.sleep(1.0)
        assert waiting.poll() is None  # still waiting
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and out.strip() == "got it"
    assert "waiting for it to finish" in err, err
    assert list(tmp_path.iterdir()) == []


def test_no_wait_in_this_process(tmp_path):
    """A lock held by another process, seen from here: LockBusyError under set_output_policy(wait=False)."""
    target = tmp_path / "s"
    holder = _child(f"""
        import time
        from vlctl.fsops import locked
        with locked({str(target)!r}):
            print("held", flush=True)
            time.sleep(30)
    """, tmp_path)
    try:
        assert holder.stdout.readline().strip() == "held"
        set_output_policy(wait=False)
        with pytest.raises(LockBusyError, match=r"another vlctl process \(pid \d+\) is writing it"), locked(target):
            pass
    finally:
        set_output_policy(wait=True)
        holder.kill()
        holder.wait()


def test_cli_no_wait_fails_clearly_while_another_writer_holds_the_store(inputs, tmp_path):  # noqa: F811
    drv = inputs["driver"]
    gal = tmp_path / "gal"
    holder = _child(f"""
        import time
        from vlctl.fsops import locked
        with locked({str(gal)!r}):
            print("held", flush=True)
            time.sleep(30)
    """, tmp_path)
    try:
        assert holder.stdout.readline().strip() == "held"
        status, output = drv.run([*store_args("index", inputs["a"], inputs["model"], gal), "--no-wait"])
    finally:
        holder.kill()
        holder.wait()
    assert status == 2 and "another vlctl process (pid" in output and "--no-wait" in output, output
    assert not gal.exists()


def _reader(gal: Path, stop: Path) -> subprocess.Popen:
    """Opens and searches the store in a loop until `stop` exists; prints its error count."""
    return _child(f"""
        import os, numpy as np
        from vlctl.embeddings.store import open_store
        from vlctl.io import VlctlError
        errors, reads = [], 0
        open_store({str(gal)!r}).metadata()  # the imports (pyarrow) done before the writers start
        print("ready", flush=True)
        while not os.path.exists({str(stop)!r}):
            try:
                s = open_store({str(gal)!r})
                s.search(np.ones(s.dim, np.float32), k=3)
                s.metadata()
                reads += 1
            except VlctlError as e:
                errors.append(str(e))
        print(reads, len(errors), errors[:3])
    """, gal.parent)


def test_concurrent_index_runs_lose_no_row(inputs, tmp_path):  # noqa: F811
    """TRIALS times: a gallery of A; B and C indexed into it at once; a reader throughout."""
    drv = inputs["driver"]
    b, c = write_photos(tmp_path / "b", 6, 11), write_photos(tmp_path / "c", 6, 12)
    template = tmp_path / "template"
    assert drv.run(store_args("index", inputs["a"], inputs["model"], template / "gal"))[0] == 0
    kept = waited = 0
    for trial in range(TRIALS):
        d = tmp_path / f"trial-{trial}"
        shutil.copytree(template, d)
        stop = d / "stop"
        reader = _reader(d / "gal", stop)
        assert reader.stdout.readline().strip() == "ready"
        results = drv.run_many(*(store_args("index", src, inputs["model"], d / "gal") for src in (b, c)))
        stop.touch()
        said, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, f"the reader failed: {err}"
        reads, errors, first = said.split(" ", 2)
        assert int(reads) > 0
        assert [s for s, _ in results] == [0, 0], results
        waited += any("waiting for it to finish" in out for _, out in results)  # the runs overlapped
        assert errors == "0", f"the reader saw a half state: {first}"
        store = open_store(d / "gal")
        store.verify()
        paths = sorted(m["path"] for m in store.metadata())
        want = sorted(str(p.resolve()) for folder in (inputs["a"], b, c) for p in folder.glob("*.png"))
        kept += paths == want and len(store) == 15
        status, out = drv.run(["search", d / "gal", "--text", "red", "--json"])
        assert status == 0, out
        assert leftovers(d) == []
    assert kept == TRIALS, f"{kept} of {TRIALS} trials kept every row ({waited} overlapped)"
    print(f"{kept} of {TRIALS} trials kept every row; in {waited} the second run waited for the first")


def test_three_writers_and_a_rerun_add_nothing_twice(inputs, tmp_path):  # noqa: F811
    drv = inputs["driver"]
    folders = [write_photos(tmp_path / name, 2, 20 + i) for i, name in enumerate("bcd")]
    gal = tmp_path / "gal"
    results = drv.run_many(*(store_args("index", f, inputs["model"], gal) for f in [*folders, folders[0]]))
    assert [s for s, _ in results] == [0, 0, 0, 0], results
    store = open_store(gal)
    assert len(store) == 6 and len({m["path"] for m in store.metadata()}) == 6  # folder b indexed twice, added once
    store.verify()


def test_two_generators_into_one_out(inputs, tmp_path):  # noqa: F811
    """Two `data mad` at once into one --out: both succeed, one after the other; the set is whole."""
    drv = inputs["driver"]
    results = drv.run_many(mad_args(tmp_path / "out", seed=0), mad_args(tmp_path / "out", seed=1))
    assert [s for s, _ in results] == [0, 0], results
    mad_state(tmp_path / "out")
    assert leftovers(tmp_path) == []


def test_store_add_rereads_the_manifest_under_the_lock(tmp_path):
    """Two Store objects opened at the same generation: the second add goes after the first's rows."""
    from vlctl.embeddings.store import create_store

    create_store(tmp_path / "g", "enc", 4)
    one, two = open_store(tmp_path / "g"), open_store(tmp_path / "g")
    x = np.eye(4, dtype=np.float32)
    one.add(x[:2], [{"i": 0}, {"i": 1}])
    after = two.add(x[2:], [{"i": 2}, {"i": 3}])  # `two` is stale: it re-reads, nothing is lost
    assert len(after) == 4 and [m["i"] for m in open_store(tmp_path / "g").metadata()] == [0, 1, 2, 3]
    open_store(tmp_path / "g").verify()

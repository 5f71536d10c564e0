"""Issue 43: what the CLI says when its reader goes away or Ctrl-C stops it: no traceback, and only
what is true of what was kept."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vlctl.cli import main
from vlctl.embeddings.store import create_store


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(200, 8)).astype(np.float32)
    create_store(tmp_path / "store", "enc@0", 8).add(emb, [{"name": f"a long file name {i:04d}.jpg"} for i in range(200)])
    np.save(tmp_path / "q.npy", emb[0])
    return tmp_path


@pytest.mark.parametrize("json_flag", [["--json"], []])
def test_output_into_a_closed_pipe_is_no_traceback(store, json_flag):
    """`vlctl search ... --json | head -c 10` gave a BrokenPipeError traceback and exit 1. The
    reader here closes the pipe before the command writes, so the write always fails."""
    p = subprocess.Popen([sys.executable, "-m", "vlctl", "search", str(store / "store"), "--embedding",
                          str(store / "q.npy"), "-k", "200", *json_flag],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0 and err == ""


def test_search_json_is_whole_when_read(store, capsys):
    assert main(["search", str(store / "store"), "--embedding", str(store / "q.npy"), "-k", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == 0


def _interrupt(monkeypatch, target: str):
    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, stop)


def test_ctrl_c_in_embed_says_nothing_was_added(store, tmp_path, monkeypatch, capsys):
    """It said "finished stages and checkpoints are kept: the same command continues", but no
    store existed and the rerun started from zero."""
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        Image.new("RGB", (20, 20), (i * 80, 0, 0)).save(photos / f"{i}.png")
    _interrupt(monkeypatch, "vlctl.embeddings.build.embed_image_files")
    argv = ["embed", str(photos), "--encoder", "open_clip:ViT-S-32?seed=0", "--out", str(tmp_path / "new")]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == f"vlctl: interrupted; nothing was written ({tmp_path / 'new'} was not created): the same command " \
                  "starts afresh\n" and not (tmp_path / "new").exists()


def test_ctrl_c_in_embed_keeps_the_committed_batches(tmp_path, monkeypatch, capsys):
    """Issue 43: Ctrl-C during `embed` kept nothing, and the rerun started from zero. It commits
    every --commit-every new images: here the second batch is interrupted, the first one's 2 rows
    are kept and said, and the same command embeds the rest only."""
    from PIL import Image

    from vlctl.embeddings import build

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        Image.new("RGB", (20, 20), (i * 80, 0, 0)).save(photos / f"{i}.png")
    real, calls = build.embed_image_files, []

    def second_batch_interrupted(*a, **k):
        calls.append(len(a[1]))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(build, "embed_image_files", second_batch_interrupted)
    out = tmp_path / "new"
    argv = ["embed", str(photos), "--encoder", "open_clip:vlctl-tiny-vit?seed=0", "--out", str(out), "--no-progress",
            "--commit-every", "2"]
    assert main(argv) == 130 and calls == [2, 1]
    assert capsys.readouterr().err == (f"vlctl: interrupted; {out} keeps the 2 rows this run committed (2 in all): "
                                       "the same command adds the rest\n")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["added"], report["already_present"], report["count"]) == (1, 2, 3) and calls == [2, 1, 1]
    assert main(argv) == 0  # nothing new: no batch to embed
    assert calls == [2, 1, 1]


def test_ctrl_c_in_a_fit_says_nothing_was_written(store, tmp_path, monkeypatch, capsys):
    _interrupt(monkeypatch, "vlctl.methods.sae.model.SparseAutoencoder.fit")
    out = tmp_path / "sae"
    assert main(["fit", "sae", "--store", str(store / "store"), "--out", str(out), "--d-latent", "16", "--k", "2"]) == 130
    assert capsys.readouterr().err == f"vlctl: interrupted; nothing was written ({out} was not created)\n"
    assert not out.exists()


def test_text_output_is_plain_values():
    """Issue 43: `score tevi` printed Python dicts with 15-digit floats."""
    from vlctl.cli.listing import plain

    assert plain({"i2t@1": 6.666666666666667, "t2i@10": 36.666666666666664}) == "i2t@1 6.667, t2i@10 36.67"
    assert plain([30, 30]) == "30, 30" and plain(0.1 + 0.2) == "0.3" and plain(True) == "True"
    assert plain([{"a": 1.0}, {"b": 2}]) == "a 1; b 2" and plain("x") == "x"

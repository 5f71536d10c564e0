"""Issue 45: an embedding stage of a real recipe killed (SIGKILL) in the middle resumes after its last
saved chunk and ends with the embeddings of an uninterrupted run; the rest of the recipe runs on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import upstream_layouts as layouts
from vlctl.cli import main

ENC = "open_clip:vlctl-tiny-vit"
SRC = Path(__file__).resolve().parents[1] / "src"


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlctl", *argv], check=False, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SRC), **env})


@pytest.mark.slow  # three recipe processes (torch + open_clip each)
def test_killed_embedding_stage_resumes_after_its_last_chunk(tmp_path):
    root, labels = layouts.stanford40(tmp_path)  # 18 fit images: 5 chunks of 4
    cfg = tmp_path / "ce.json"
    cfg.write_text(json.dumps({"hyper_steps": 4, "hidden": 16, "images_per_subclass": 2, "n_queries": 8}))
    argv = ["reproduce", "controlembed-stanford40", "--encoder", ENC, "--stanford40-root", str(root),
            "--stanford40-labels", str(labels), "--recipe-config", str(cfg), "--embed-chunk", "4"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    # The kill point: right after the embed-fit stage saved its second chunk's state.
    log = tmp_path / "fault.log"
    assert _run([*argv, "--out", str(tmp_path / "count")], VLCTL_FAULT_LOG=str(log)).returncode == 0
    calls = [ln.split(" ", 2) for ln in log.read_text().splitlines()]
    n = [c[1] for c in calls if c[0] == "replace" and "embed-fit" in c[2] and c[2].endswith("checkpoint/state.json")][1]
    out = tmp_path / "killed"
    killed = _run([*argv, "--out", str(out)], VLCTL_FAULT=f"replace:{n}:after")
    assert killed.returncode == -9, killed.stderr
    [partial] = (out / "stages").glob("embed-fit-*.partial")
    assert json.loads((partial / "checkpoint" / "state.json").read_text())["chunks"] == 2
    again = _run([*argv, "--out", str(out)])
    assert again.returncode == 0, again.stderr
    assert "stage embed-fit: resuming from its checkpoint" in again.stderr
    assert "2 of 5 chunks embedded before the kill" in again.stderr
    [a] = (tmp_path / "whole" / "stages").glob("embed-fit-*/embeddings.npz")
    [b] = (out / "stages").glob("embed-fit-*/embeddings.npz")
    with np.load(a) as x, np.load(b) as y:
        assert x.files == y.files and all(np.array_equal(x[k], y[k]) for k in x.files)
        assert x["image_emb"].shape[0] == 18
    assert not (b.parent / "checkpoint").exists()


@pytest.mark.needs_wordnet
def test_killed_trees_stage_resumes_after_its_last_chunk(tmp_path, monkeypatch):
    """3vl-coco's caption-parsing stage (hours for COCO's 566k captions) saves its trees chunk by
    chunk: killed in its third chunk, it goes on from there and writes the trees.json of an
    uninterrupted run."""
    from vlctl.captions.trees import TreeGenerator
    from vlctl.recipes.threevl import coco

    cfg = coco.load_preset(True)
    captions = ["a dog on a red couch", "two cats sleep on a bed", "a man rides a horse", "a dog on a red couch",
                "a blue car next to a tree", "a woman holds a small umbrella", "three birds on a wire",
                "a child eats a green apple"]
    monkeypatch.setattr(coco, "TREE_CHUNK", 3)  # 7 unique captions: 3 chunks
    coco._trees(cfg, captions, tmp_path / "whole")
    whole = json.loads((tmp_path / "whole" / "trees.json").read_text())

    real, calls = TreeGenerator.random_negatives, []

    def killed_in_the_third_chunk(self, part, seed=None, errors="raise"):
        calls.extend(part)
        if len(calls) == 7:
            raise KeyboardInterrupt  # the third chunk's negatives: chunks 1 and 2 saved, not 3
        return real(self, part, seed, errors)

    monkeypatch.setattr(TreeGenerator, "random_negatives", killed_in_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        coco._trees(cfg, captions, tmp_path / "killed")
    assert json.loads((tmp_path / "killed" / "checkpoint" / "state.json").read_text()) == {
        "chunks": 2, "of": 3, "n_unique": 7}
    calls.clear()
    coco._trees(cfg, captions, tmp_path / "killed", resume=True)
    assert len(calls) == 1  # only the third chunk's caption was parsed again
    again = json.loads((tmp_path / "killed" / "trees.json").read_text())
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in whole.items() if k != "seconds"}
    assert not (tmp_path / "killed" / "checkpoint").exists()
    assert len(again["trees"]) == 8 and any(again["negatives"]) and all(again["trees"])

"""The README's own-folder walkthrough, run command by command as the README shows it: a folder
of real photos of mixed sizes with one corrupt file, a caption CSV and a label CSV, through every
method with a random-weight OpenCLIP, from the command line only."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from vlctl.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def walkthrough_commands() -> list[list[str]]:
    text = README.read_text("utf-8")
    block = re.search(r"<!-- walkthrough -->\n```bash\n(.*?)```\n<!-- /walkthrough -->", text, re.DOTALL)
    assert block, "README.md: the walkthrough block (<!-- walkthrough --> ... <!-- /walkthrough -->) is missing"
    commands = [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]
    assert all(c[0] == "vlctl" for c in commands)
    return [c[1:] for c in commands]


def test_walkthrough_covers_every_method():
    names = [" ".join(c[:2]) if c[0] in ("fit", "score") else c[0] for c in walkthrough_commands()]
    for needed in ("embed", "fit sae", "fit tevi", "score tevi", "fit controlembed", "search", "cluster", "explain"):
        assert needed in names, f"the README walkthrough lacks `vlctl {needed}`"
    assert any("--attribute" in c for c in walkthrough_commands() if c[0] == "search")
    assert any("--rerank" in c for c in walkthrough_commands() if c[:2] == ["score", "tevi"])


def test_readme_walkthrough_runs_on_a_folder_of_photos(tmp_path, monkeypatch, capsys):
    from walkthrough import PER_SUBJECT, SUBJECTS, make_photo_folder

    make_photo_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    results = {}
    for argv in walkthrough_commands():
        rc = main([*argv, "--json"])
        out, err = capsys.readouterr()
        assert rc == 0, f"vlctl {shlex.join(argv)} failed:\n{err}"
        results[" ".join(argv[:2])] = json.loads(out) if out.strip() else {}
    n = len(SUBJECTS) * PER_SUBJECT

    embedded = next(v for k, v in results.items() if k.startswith("embed"))
    assert embedded["added"] == n and embedded["failed"] == 1 and embedded["captions"] == n
    assert "broken.jpg" in embedded["failures"][0][0]

    from vlctl.embeddings.store import open_store

    store = open_store("store")
    assert len(store) == n and store.text_emb.shape == (n, store.dim)
    assert store.encoder_id.startswith("open_clip-ViT-S-32/random-seed0@")
    assert Path(store.encoder_spec.partition(":")[2].partition("?")[0]) == Path("ViT-S-32")
    sizes = {m["relpath"]: m for m in store.metadata()}
    assert "chelsea_01.jpg" in sizes and all(m["captions"] for m in sizes.values())

    scores = np.load("scores.npz")
    assert scores["scores"].shape == (n, n) and scores["base_scores"].shape == (n, n)
    # The reranked top 10 of every caption are CLIP's top 10, in TEVI's order; the rest keep CLIP's.
    base_top = np.sort(np.argsort(-scores["base_scores"], axis=0, kind="stable")[:10], axis=0)
    new_top = np.sort(np.argsort(-scores["scores"], axis=0, kind="stable")[:10], axis=0)
    assert np.array_equal(base_top, new_top)

    fitted = results["fit controlembed"]
    assert sorted(fitted["categories"]) == ["orientation", "subject"] and fitted["images"] == n

    hits = next(v for k, v in results.items() if k.startswith("search") and "attribute" in v.get("query", {}))["hits"]
    assert len(hits) == 5 and all(Path(h["path"]).is_file() for h in hits)
    clusters = json.loads(Path("clusters/clusters.json").read_text())
    assert clusters["k"] == len(SUBJECTS) and len(clusters["cluster_of_image"]) == n
    assert sorted(p.name for p in Path("clusters").glob("cluster_*.png")) == [f"cluster_{i:02d}.png" for i in range(4)]
    assert {Path(f).name for f in results["explain --encoder"]["files"]} >= {"hilacam_positive.png", "dire.png"}


@pytest.mark.parametrize("k", [1, 3, 40, 100])
def test_score_tevi_rerank_every_depth(tmp_path, capsys, k):
    """`score tevi --rerank K` for K below, at and above the number of images (it used to crash
    whenever K was smaller): the top min(K, n) of each caption are CLIP's, reordered."""
    from vlctl.embeddings.store import create_store
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    rng = np.random.default_rng(0)
    n, d = 40, 16
    img = rng.normal(size=(n, d)).astype(np.float32)
    txt = (img + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
    store = create_store(tmp_path / "store", "enc@0", d).add(
        img, [{} for _ in range(n)], texts=txt, text_metadata=[{"text": f"t{i}", "image": i} for i in range(n)])
    sae = SparseAutoencoder(d_latent=32, k=4, epochs=2).fit(store)
    TEVI(epochs=2).fit(store, sae=sae).save(tmp_path / "tevi")
    rc = main(["score", "tevi", "--store", str(tmp_path / "store"), "--tevi", str(tmp_path / "tevi"),
               "--rerank", str(k), "--out", str(tmp_path / "s.npz"), "--json"])
    assert rc == 0, capsys.readouterr().err
    s = np.load(tmp_path / "s.npz")
    depth = min(k, n)
    base_order = np.argsort(-s["base_scores"], axis=0, kind="stable")
    new_order = np.argsort(-s["scores"], axis=0, kind="stable")
    assert np.array_equal(np.sort(base_order[:depth], 0), np.sort(new_order[:depth], 0))
    assert np.array_equal(base_order[depth:], new_order[depth:])
    assert main(["score", "tevi", "--store", str(tmp_path / "store"), "--tevi", str(tmp_path / "tevi"),
                 "--rerank", "-5", "--out", str(tmp_path / "s2.npz")]) == 2
    assert "--rerank must be >= 1" in capsys.readouterr().err

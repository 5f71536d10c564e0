"""End to end: the controlembed-shapes recipe on a tiny configuration; its numbers recompute from
arrays/controlembed.npz with vlctl.eval.metrics."""

import json

import numpy as np
import pytest

from vlctl.data.shapes import CATEGORIES
from vlctl.eval import metrics
from vlctl.methods.controlembed.estimator import kmeans_labels, normalize_rows
from vlctl.recipes import RECIPES
from vlctl.recipes.controlembed.shapes import METHODS, ControlEmbedShapesRecipe, linear_probe, load_preset, run

TINY = ControlEmbedShapesRecipe(n_train=400, n_test=200, epochs=1, batch_size=64, warmup_steps=1, hyper_steps=40,
                                images_per_subclass=4, n_queries=60, threads=1)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("controlembed-shapes")
    run(out, cfg=TINY)
    return out


def test_results_structure_and_recomputation(tiny_run):
    r = json.loads((tiny_run / "results.json").read_text())
    a = np.load(tiny_run / "arrays" / "controlembed.npz")
    g, n = a["gallery_emb"], int(a["n_queries"])
    assert g.shape == (200, 64) and np.allclose(np.linalg.norm(g, axis=1), 1, atol=1e-5) and n == 60
    ignore = np.zeros((n, len(g)), dtype=bool)
    ignore[np.arange(n), np.arange(n)] = True
    for t in CATEGORIES:
        assert set(r["query_map"][t]) == set(METHODS)
        assert set(r["cluster_acc"][t]) == set(r["zero_shot_transformed"][t]) == {"base", "ours"}
        y, w, b = a[f"label_{t}"], a[f"W_{t}"], a[f"b_{t}"]
        assert y.shape == (200,) and w.shape == (64, 64) and b.shape == (64,)
        q = g[:n]
        assert metrics.mean_average_precision((q @ w + b) @ g.T, y[:n], y, ignore=ignore) == r["query_map"][t]["ours"]
        assert metrics.mean_average_precision(q @ g.T, y[:n], y, ignore=ignore) == r["query_map"][t]["base"]
        assert metrics.zero_shot_accuracy(g @ w + b, a[f"text_{t}"], y) == r["zero_shot_transformed"][t]["ours"]
        pred = kmeans_labels(normalize_rows(g @ w + b), 10, seed=0, n_init=1)
        assert metrics.cluster_accuracy(y, pred) == r["cluster_acc"][t]["ours"]
    both = a["label_color"] * 100 + a["label_shape"]
    blend = 0.5 * (g[:n] @ a["W_color"] + a["b_color"]) + 0.5 * (g[:n] @ a["W_shape"] + a["b_shape"])
    assert metrics.mean_average_precision(blend @ g.T, both[:n], both, ignore=ignore) == r["composition"]["color+shape"]["blend"]
    assert set(r["generalisation"]) == {"heldout_subclasses", "paraphrase"}
    assert r["generalisation"]["paraphrase"]["color"]["text"] == "hue"
    assert r["timing"]["cluster_5000_s"] > 0 and set(r["linear_probe"]) == set(CATEGORIES)
    probe = np.load(tiny_run / "arrays" / "probe.npz")
    for t in ("color", "count"):
        assert linear_probe(probe["train_emb"], probe[f"train_label_{t}"], probe["test_emb"], a[f"label_{t}"]) == \
            r["linear_probe"][t]
    for f in ("query_map.png", "cluster_acc.png", "samples.png"):
        assert (tiny_run / "figures" / f).stat().st_size > 1000
    md = (tiny_run / "report.md").read_text()
    assert "| paper (Clevr-4) | 33.8 |" in md and "77.0" in md and "73.0" in md
    assert (tiny_run / "report.html").read_text().count("<table>") >= 6
    assert (tiny_run / "arrays" / "README.md").is_file()


def test_second_run_reuses_every_stage(tiny_run):
    run(tiny_run, cfg=TINY)
    r = json.loads((tiny_run / "results.json").read_text())
    assert all(r["timings"][s]["cached"] for s in ("data", "train", "embed", "fit"))


def test_registered_with_presets():
    assert RECIPES["controlembed-shapes"] == "vlctl.recipes.controlembed.shapes:run"
    quick, full = load_preset(True), load_preset(False)
    assert quick.n_train < full.n_train and quick.model == "shapes-64"


def test_cli_fit_controlembed_and_cluster(tiny_run, tmp_path, capsys):
    from vlctl.cli import main

    model_dir = next((tiny_run / "stages").glob("train-*")) / "model"
    data_dir = next((tiny_run / "stages").glob("data-*")) / "test"
    gallery = tmp_path / "store"
    assert main(["embed", str(data_dir), "--encoder", str(model_dir), "--out", str(gallery), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["fit", "controlembed", "--store", str(gallery), "--out", str(tmp_path / "m"), "--steps", "5",
                 "--images-per-subclass", "2", "--categories", "color", "shape", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["categories"] == ["color", "shape"] and fitted["images"] == 200
    assert main(["cluster", "--model", str(tmp_path / "m"), "--gallery", str(gallery), "--attribute", "shape",
                 "--out", str(tmp_path / "clusters.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["k"] <= 10 and sum(out["cluster_sizes"].values()) == 200
    assert len(json.loads((tmp_path / "clusters.json").read_text())["cluster_of_image"]) == 200
    # A gallery embedded by another encoder is refused, never silently clustered.
    meta = json.loads((gallery / "manifest.json").read_text())
    (gallery / "manifest.json").write_text(json.dumps({**meta, "encoder_id": "other@0"}))
    assert main(["cluster", "--model", str(tmp_path / "m"), "--gallery", str(gallery), "--attribute", "shape"]) == 2
    assert "come from encoder 'other@0'" in capsys.readouterr().err

"""`vlctl reproduce NAME --plan` (issue 45): the stages and their work read from the annotation files,
times / memory / disk from the scale rehearsal's rates, cached stages marked after a run, and
nothing run or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import upstream_layouts as layouts
from vlctl.cli import main
from vlctl.recipes import plan as plan_mod
from vlctl.recipes.controlembed.real import load_preset

ENC = "open_clip:vlctl-tiny-vit"


def _rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["stage", "work"]) + 1
    return {ln.split()[0]: ln.split()[1:] for ln in lines[start:]
            if not ln.strip().startswith(("total", plan_mod.OUTSIDE))}  # the stages' rows


def test_plan_lists_the_stages_and_counts_runs_nothing_then_marks_cached(tmp_path, capsys):
    tsv = layouts.shotbench(tmp_path, n_images=24)
    cfg = tmp_path / "ce.json"
    cfg.write_text(json.dumps({"hyper_steps": 20, "hidden": 32, "images_per_subclass": 2, "n_queries": 40}))
    argv = ["reproduce", "controlembed-shotbench", "--encoder", ENC, "--shotbench-tsv", str(tsv),
            "--recipe-config", str(cfg), "--out", str(tmp_path / "out")]
    capsys.readouterr()
    assert main([*argv, "--plan"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    # 24 images, eval_fraction 0.5: 12 fit + 12 eval; fit = hyper_steps x images_per_subclass; evaluate = queries x gallery
    assert list(rows) == ["data", "embed-fit", "embed-eval", "fit", "evaluate"]
    assert [rows[s][0] for s in rows] == ["24", "12", "12", "40", "144"]
    assert all(r[-1] == "no" for r in rows.values())
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--plan"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert {s for s, r in rows.items() if r[-1] == "yes"} == {"embed-fit", "embed-eval", "fit"}
    # --json: the same plan as one JSON document on stdout, the table not printed
    assert main([*argv, "--plan", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["stage"], r["work"], r["cached"]) for r in doc["stages"] if r["stage"] != plan_mod.OUTSIDE] == [
        ("data", 24, False), ("embed-fit", 12, True), ("embed-eval", 12, True), ("fit", 40, True), ("evaluate", 144, False)]
    assert doc["counts"] == {"images": 24}
    todo = [r["cpu_seconds"] for r in doc["stages"] if not r["cached"]]
    assert doc["total_cpu_seconds"] == pytest.approx(sum(todo))


def test_plan_counts_coco_and_rococo_from_the_annotations(tmp_path, capsys):
    ann = layouts.coco(tmp_path / "coco", n_train=12, n_test=6)
    rococo = layouts.rococo(tmp_path / "coco", ann)
    for p in (tmp_path / "coco").rglob("*.jpg"):
        p.unlink()  # the plan reads no image: the annotation files alone
    capsys.readouterr()
    assert main(["reproduce", "tevi-coco", "--quick", "--plan", "--encoder", ENC, "--coco-root", str(tmp_path / "coco"),
                 "--coco-annotations", str(ann), "--rococo-annotations", str(rococo), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "train: 12 images, 60 captions" in out and "coco: 6 images, 30 captions" in out
    assert "rococo: 6 images, 60 captions" in out
    rows = _rows(out)
    assert list(rows) == ["data", "embed-train", "embed-coco", "embed-rococo", "sae", "tevi", "sae-sweep", "evaluate"]
    assert rows["embed-train"][0] == "27" and rows["evaluate"][0] == "540"  # 12 + 60 / 4; 6 x 30 + 6 x 60
    # CC12M-style shards (10 + 10 + 5 pairs): counted from the first and the last shard's tar headers
    shards = layouts.webdataset(tmp_path / "cc", 25, per_shard=10)
    assert main(["reproduce", "tevi-coco", "--quick", "--plan", "--encoder", ENC, "--train-shards", shards,
                 "--coco-root", str(tmp_path / "coco"), "--coco-annotations", str(ann), "--out", str(tmp_path / "o")]) == 0
    assert "train: 25 images, 25 captions" in capsys.readouterr().out
    # without the dataset: the run's own one-line error, nothing planned
    assert main(["reproduce", "tevi-coco", "--plan", "--encoder", ENC, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--coco-annotations not given" in err[0]


def test_rates_are_fitted_through_two_runs_and_the_plan_applies_them(tmp_path):
    small = {"fit": {"work": 10, "seconds": 3.0, "peak_rss_bytes": 2e9, "written_bytes": 1e6}}
    big = {"fit": {"work": 100, "seconds": 12.0, "peak_rss_bytes": 2e9, "written_bytes": 1e7}}
    rates = plan_mod.fit_rates(small, big)
    assert rates["fit"]["seconds"] == {"fixed": pytest.approx(2.0), "per_work": pytest.approx(0.1)}
    assert rates["fit"]["peak_rss_bytes"] == {"fixed": 2e9, "per_work": 0.0}
    f = tmp_path / "rates.json"
    f.write_text(json.dumps({"controlembed-clevr4": rates}))
    cfg = load_preset(True)
    rows = plan_mod.make_plan("controlembed-clevr4", cfg, {"fit": 30, "eval": 20}, Path(tmp_path / "stages"), f)
    fit = next(r for r in rows if r["stage"] == "fit")
    assert fit["work"] == cfg.hyper_steps * cfg.images_per_subclass
    assert fit["cpu_seconds"] == pytest.approx(2.0 + 0.1 * fit["work"])
    assert fit["disk_bytes"] == pytest.approx(1e5 * fit["work"]) and fit["gpu_seconds"] is None
    assert next(r for r in rows if r["stage"] == "data")["cpu_seconds"] is None  # no rate: "not measured"
    # the same work at both sizes (fixed steps): the mean of the two times, in proportion to the work (a
    # larger run is not planned at the rehearsal's time), the larger of the two memories
    same = plan_mod.fit_rates({"fit": {**small["fit"], "work": 100, "peak_rss_bytes": 3e9}}, big)
    assert same["fit"]["seconds"] == {"fixed": 0.0, "per_work": pytest.approx(0.075)}
    assert same["fit"]["peak_rss_bytes"] == {"fixed": 3e9, "per_work": 0.0}
    # the time outside the stages (start, annotations, report): a last row, always run
    f.write_text(json.dumps({"controlembed-clevr4": {**rates, plan_mod.OUTSIDE: {"seconds": {"fixed": 6.0,
                                                                                         "per_work": 0.0}}}}))
    rows = plan_mod.make_plan("controlembed-clevr4", cfg, {"fit": 30, "eval": 20}, Path(tmp_path / "stages"), f)
    assert rows[-1]["stage"] == plan_mod.OUTSIDE and rows[-1]["cpu_seconds"] == 6.0 and not rows[-1]["cached"]
    assert "outside stages" in plan_mod.format_plan("controlembed-clevr4", "", rows)

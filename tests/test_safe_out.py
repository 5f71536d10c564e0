"""`--out` never destroys what vlctl did not write, and a swap cut by a kill is restored.

Writing into an existing directory is allowed only when it holds a vlctl artefact of the same
kind, known by its marker file (config.json of an estimator, meta.json of a generated set,
state.json of a checkpoint, manifest.json of a store); anything else is refused naming the
directory, unless --overwrite, and then only vlctl's own entries are replaced. (Issue 18: `vlctl
fit sae --cache proj/cache/KEY --out proj` used to leave proj/ holding config.json and
sae.safetensors only: the cache, the data and the user's README.txt were gone.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from vlctl.cli import main
from vlctl.embeddings.store import create_store
from vlctl.fsops import VlctlError, set_output_policy
from vlctl.io import atomic_dir, atomic_write_json, clean_dead_temps, recover_dir

SAE = ["--expansion", "2", "--k", "4", "--aux-k", "4", "--epochs", "1", "--batch-size", "16"]


@pytest.fixture(autouse=True)
def _default_policy():
    set_output_policy(overwrite=False, wait=True)
    yield
    set_output_policy(overwrite=False, wait=True)


def _cli(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _project(root: Path) -> Path:
    """A user's project: a store in cache/KEY, a data folder, a README."""
    proj = root / "proj"
    rng = np.random.default_rng(0)
    create_store(proj / "cache" / "KEY", "enc@0", 8).add(rng.standard_normal((64, 8)).astype(np.float32))
    (proj / "data").mkdir()
    (proj / "data" / "x.csv").write_text("a,b\n")
    (proj / "README.txt").write_text("my notes")
    return proj


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_fit_sae_into_a_users_directory_is_refused_then_overwrite_keeps_the_rest(tmp_path, capsys):
    proj = _project(tmp_path)
    before = _tree(proj)
    rc, _, err = _cli(["fit", "sae", "--cache", proj / "cache" / "KEY", "--out", proj, *SAE], capsys)
    assert rc == 2 and f"{proj}: exists and holds" in err and "--overwrite" in err, err
    assert _tree(proj) == before  # untouched

    rc, _, err = _cli(["fit", "sae", "--cache", proj / "cache" / "KEY", "--out", proj, *SAE, "--overwrite"], capsys)
    assert rc == 0, err
    after = _tree(proj)
    assert {k: v for k, v in after.items() if k in before} == before  # the cache, the data, the README: kept
    assert {"config.json", "sae.safetensors"} <= set(after)
    assert "kept 3 others: README.txt, cache, data" in err

    # Now proj holds a SAE: fitting one again needs no --overwrite, and still keeps the rest.
    rc, _, err = _cli(["fit", "sae", "--cache", proj / "cache" / "KEY", "--out", proj, *SAE, "--seed", "1"], capsys)
    assert rc == 0, err
    assert {k: v for k, v in _tree(proj).items() if k in before} == before


def test_an_artefact_of_another_kind_is_refused(tmp_path, capsys):
    store = tmp_path / "s"
    create_store(store, "enc@0", 8).add(np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32))
    sae = tmp_path / "sae"
    assert _cli(["fit", "sae", "--cache", store, "--out", sae, *SAE], capsys)[0] == 0
    rc, _, err = _cli(["data", "mad", "--n", "4", "--workers", "1", "--out", sae], capsys)
    assert rc == 2 and "holds a vlctl.estimator/SparseAutoencoder (config.json), not a vlctl-mad" in err, err
    assert (sae / "sae.safetensors").is_file()


def test_data_mad_replaces_its_own_output_whole(tmp_path, capsys):
    out = tmp_path / "mad"
    assert _cli(["data", "mad", "--n", "4", "--workers", "1", "--out", out], capsys)[0] == 0
    first = (out / "images.npy").read_bytes()
    assert _cli(["data", "mad", "--n", "4", "--workers", "1", "--seed", "1", "--out", out], capsys)[0] == 0
    assert (out / "images.npy").read_bytes() != first and sorted(os.listdir(tmp_path)) == ["mad"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "n.txt").write_text("x")
    rc, _, err = _cli(["data", "mad", "--n", "4", "--workers", "1", "--out", tmp_path / "notes"], capsys)
    assert rc == 2 and "notes: exists and holds 1 entries vlctl did not write (e.g. n.txt)" in err, err


def test_atomic_dir_swap_merge_and_refusal(tmp_path):
    kind = ("meta.json", "vlctl-test", None)
    target = tmp_path / "out"
    with atomic_dir(target, kind=kind) as d:
        (d / "a").write_text("1")
        atomic_write_json(d / "meta.json", {"format": "vlctl-test"})
    with atomic_dir(target, kind=kind) as d:  # same kind, nothing the new one lacks: swapped whole
        (d / "a").write_text("new")
        (d / "b").write_text("2")
        atomic_write_json(d / "meta.json", {"format": "vlctl-test"})
    assert sorted(os.listdir(target)) == ["a", "b", "meta.json"] and os.listdir(tmp_path) == ["out"]
    (target / "mine.txt").write_text("user")  # an entry the next write does not make: merged, kept
    with atomic_dir(target, kind=kind) as d:
        (d / "b").write_text("3")
        atomic_write_json(d / "meta.json", {"format": "vlctl-test"})
    assert sorted(os.listdir(target)) == ["a", "b", "meta.json", "mine.txt"]
    assert (target / "a").read_text() == "new" and (target / "b").read_text() == "3"
    with pytest.raises(VlctlError, match="not a vlctl-other"), atomic_dir(target, kind=("meta.json", "vlctl-other", None)):
        pass
    with pytest.raises(VlctlError, match="is not a directory"), atomic_dir(target / "mine.txt", kind=kind):
        pass


def test_a_killed_swap_is_restored_on_open(tmp_path, capsys):
    """Both renames' halves: the target missing, the new complete copy or only the old one beside it."""
    from vlctl.data.mad import load_mad

    out = tmp_path / "mad"
    assert _cli(["data", "mad", "--n", "4", "--workers", "1", "--out", out], capsys)[0] == 0
    os.rename(out, tmp_path / ".mad.abcd1234.old")  # killed after moving the old one aside
    (tmp_path / ".mad.efgh5678.tmp").mkdir()  # and a half-built one of a dead process
    assert len(load_mad(out)["labels"]) == 4
    err = capsys.readouterr().err
    assert "restored the previous version" in err and "from .mad.abcd1234.old" in err
    assert sorted(os.listdir(tmp_path)) == ["mad"]

    new = tmp_path / ".mad.ijkl9012.new"
    os.rename(out, new)
    (tmp_path / ".mad.mnop3456.old").mkdir()
    assert recover_dir(out) and sorted(os.listdir(tmp_path)) == ["mad"]
    assert "restored the new version" in capsys.readouterr().err


def test_dead_temps_in_a_cache_root_are_cleaned(tmp_path):
    """A killed `embed` leaves `.KEY.*.tmp`; the next run into the root removes it, whatever its key."""
    (tmp_path / ".0123456789abcdef.a1b2c3d4.tmp").mkdir()
    (tmp_path / ".0123456789abcdef.a1b2c3d4.tmp" / "computing-images.npy").write_bytes(b"x" * 100)
    (tmp_path / ".notours.tmp").write_text("user file")  # not our naming: kept
    clean_dead_temps(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [".notours.tmp"]


def test_estimator_save_refuses_a_users_config_json(tmp_path):
    """A class that writes into its directory (TreeTuner) still refuses a config.json it did not write."""
    from vlctl.artifacts import save_estimator

    class Fake:
        REPLACES_DIR, WEIGHTS_FILE, ARTIFACT_VERSION = False, None, 1
        config_, encoder_id_ = None, "enc"

        def _artifact_state(self):
            return {}, {}, None

    (tmp_path / "config.json").write_text(json.dumps({"my": "settings"}))
    import vlctl.artifacts

    orig = vlctl.artifacts.config_to_dict
    vlctl.artifacts.config_to_dict = lambda c: {}
    try:
        with pytest.raises(VlctlError, match=r"config\.json: exists and is not a saved Fake"):
            save_estimator(Fake(), tmp_path)
        assert json.loads((tmp_path / "config.json").read_text()) == {"my": "settings"}
        set_output_policy(overwrite=True)
        save_estimator(Fake(), tmp_path)
        assert json.loads((tmp_path / "config.json").read_text())["class"] == "Fake"
    finally:
        vlctl.artifacts.config_to_dict = orig

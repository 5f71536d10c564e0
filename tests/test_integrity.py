"""Integrity on open and honest determinism.

* Stores record each file's size, sha256 and fast hash (blake2b, whole file up to 1 MiB, 64 sampled
  blocks above) and check size and fast hash on every open: a shard overwritten in place, even
  with NaN at the same size, is refused before it is searched or added to. `vlctl verify` reads
  everything (it also finds what the sampled blocks miss).
* Generated sets record the fast hashes too: an images.npy edited in place no longer loads, so no
  embedding cache can serve the old images' embeddings for it.
* A first `vlctl index` that fails (a bad --index-pq-m) leaves no empty store to lock in its
  config; stores record absolute encoder paths.
* Resume refuses another thread count (float sums differ with 1 and 2 threads) and checkpoint
  weights that are not the ones its state.json hashes (another run's model.safetensors).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from vlctl.cli import main
from vlctl.embeddings.store import create_store, open_or_create_store, open_store
from vlctl.fsops import VlctlError
from vlctl.io import FAST_BLOCK, FAST_BLOCKS, FAST_FULL
from vlctl.train.config import LoopConfig
from vlctl.train.loop import train, verify_checkpoint


def _cli(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _store(path: Path, n: int = 50, dim: int = 8):
    x = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    return create_store(path, "enc@0", dim).add(x, [{"i": i} for i in range(n)])


# --- stores --------------------------------------------------------------------------------------


def test_a_shard_overwritten_with_nan_at_the_same_size_is_refused_on_open(tmp_path):
    store = _store(tmp_path / "s")
    shard = tmp_path / "s" / "img_emb" / "img_emb_00000.npy"
    arr = np.load(shard)
    arr[:] = np.nan
    with open(shard, "r+b") as f:  # in place, same size, valid header
        f.seek(shard.stat().st_size - arr.nbytes)
        f.write(arr.tobytes())
    with pytest.raises(VlctlError, match=r"img_emb_00000\.npy: sha256 differs from .*manifest\.json .*changed or corrupted"):
        open_store(tmp_path / "s")
    with pytest.raises(VlctlError, match="sha256 differs"):
        store.add(np.ones((1, 8), np.float32))  # the add re-reads the store under its lock


def test_verify_finds_what_the_sampled_hash_misses(tmp_path, capsys):
    n = FAST_FULL // (4 * 64) + 100  # a shard just over FAST_FULL: hashed by sampled blocks
    _store(tmp_path / "s", n=n, dim=64)
    rc, out, _ = _cli(["verify", tmp_path / "s", "--json"], capsys)
    assert rc == 0 and json.loads(out)["kind"] == "store" and json.loads(out)["files"] == 2  # shard, rows (flat: no index file)
    shard = tmp_path / "s" / "img_emb" / "img_emb_00000.npy"
    size = shard.stat().st_size
    step = (size - FAST_BLOCK) / (FAST_BLOCKS - 1)
    at = round(31 * step) + FAST_BLOCK + 10  # one byte between sampled blocks 31 and 32
    assert at < round(32 * step)
    with open(shard, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    open_store(tmp_path / "s")  # the cheap check does not read it (documented)
    rc, _, err = _cli(["verify", tmp_path / "s"], capsys)
    assert rc == 2 and "img_emb_00000.npy: sha256 differs" in err


def test_a_failed_first_index_leaves_no_store_and_empty_stores_fix_nothing(tmp_path, capsys):
    from test_fault_injection import TINY, write_photos
    from vlctl.embeddings.search import IndexConfig
    from vlctl.encoders import tiny_config, tiny_model
    from vlctl.encoders.tiny_pretrained import save_pretrained

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({**TINY, "vocab": list(tiny_config.MAD_VALUES)}))
    save_pretrained(tiny_model.create_model(str(cfg), seed=0), tmp_path / "model")
    photos = write_photos(tmp_path / "p", 3, 0)
    gal = tmp_path / "gal"
    base = ["index", photos, "--encoder", f"tiny:{tmp_path / 'model'}", "--out", gal, "--no-progress"]
    rc, _, err = _cli([*base, "--index-kind", "ivfpq", "--index-pq-m", "3", "--index-nlist", "1"], capsys)
    assert rc == 2 and "pq_m=3" in err, err
    assert not gal.exists()  # no empty gallery holding the bad config
    rc, _, err = _cli(base, capsys)
    assert rc == 0, err
    assert open_store(gal).config.kind == "flat"
    # and a store that is empty for another reason (a crash) adopts the next config asked for
    create_store(tmp_path / "e", "enc@0", 8, IndexConfig(kind="hnsw"))
    assert open_or_create_store(tmp_path / "e", "enc@1", 8, IndexConfig(kind="flat")).config.kind == "flat"


def test_stores_record_absolute_encoder_paths(tmp_path, monkeypatch):
    (tmp_path / "models" / "enc").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for spec, want in [("tiny:models/enc", f"tiny:{tmp_path / 'models' / 'enc'}"),
                       ("models/enc", str(tmp_path / "models" / "enc")),
                       ("hf:models/enc?seed=3", f"hf:{tmp_path / 'models' / 'enc'}?seed=3"),
                       ("open_clip:ViT-B-32/laion2b_s34b_b79k", "open_clip:ViT-B-32/laion2b_s34b_b79k"),
                       ("hf:openai/clip-vit-base-patch32", "hf:openai/clip-vit-base-patch32")]:
        store = create_store(tmp_path / f"s{abs(hash(spec))}", "enc@0", 4, encoder_spec=spec)
        assert store.encoder_spec == want, spec


# --- generated sets ------------------------------------------------------------------------------


def test_an_images_npy_edited_in_place_no_longer_loads(tmp_path, capsys):
    from vlctl.data.mad import generate_mad, load_mad
    from vlctl.data.mad_config import MadConfig

    d = generate_mad(MadConfig(n=8, workers=1), tmp_path / "mad")
    images = np.load(d / "images.npy", mmap_mode="r+")
    images[3, 10, 10, 0] ^= 0xFF  # in place: same size, same meta.json, same data id
    images.flush()
    del images
    with pytest.raises(VlctlError, match=r"images\.npy: sha256 differs from .*meta\.json"):
        load_mad(d)
    rc, _, err = _cli(["verify", d], capsys)
    assert rc == 2 and "images.npy: sha256 differs" in err


# --- training: threads and weights ---------------------------------------------------------------


CFG = LoopConfig(epochs=2, batch_size=8, lr=0.05, seed=0, checkpoint_every=2, log_every=2, progress=False)


def _fit(out: Path, cfg: LoopConfig = CFG, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    y = x.sum(1, keepdim=True)
    result = train(model, n_samples=32, make_batch=lambda idx, epoch: (x[idx], y[idx]),
                   loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), cfg=cfg, out_dir=out,
                   device="cpu", **kw)
    return model, result


@pytest.fixture()
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_resume_refuses_another_thread_count(tmp_path, _threads):
    _fit(tmp_path / "run", dataclasses.replace(CFG, threads=1), stop_after_steps=2)
    with pytest.raises(VlctlError, match=r"changed: threads \(1 -> 2\) \(threads: pass --threads"):
        _fit(tmp_path / "run", dataclasses.replace(CFG, threads=2), resume=True)
    _fit(tmp_path / "run", dataclasses.replace(CFG, threads=1, log_every=1), resume=True)  # the same count: fine


def test_resume_refuses_another_runs_weights(tmp_path, capsys):
    _fit(tmp_path / "a", stop_after_steps=2)
    _fit(tmp_path / "b", dataclasses.replace(CFG, seed=1), stop_after_steps=2)
    assert verify_checkpoint(tmp_path / "a" / "checkpoint")["files"] == 2
    os.replace(tmp_path / "b" / "checkpoint" / "model.safetensors", tmp_path / "a" / "checkpoint" / "model.safetensors")
    with pytest.raises(VlctlError, match=r"model\.safetensors: not the file .*state\.json was written with"):
        _fit(tmp_path / "a", resume=True)
    rc, _, err = _cli(["verify", tmp_path / "a"], capsys)
    assert rc == 2 and "model.safetensors: not the file" in err


def test_a_checkpoint_of_an_older_vlctl_still_resumes(tmp_path):
    """Written before threads and file hashes were recorded: resumed without those checks."""
    _fit(tmp_path / "run", stop_after_steps=2)
    state_path = tmp_path / "run" / "checkpoint" / "state.json"
    state = json.loads(state_path.read_text())
    del state["setup"]["threads"], state["files"], state["format"]
    state_path.write_text(json.dumps(state))
    _, result = _fit(tmp_path / "run", resume=True)
    assert result.steps == 8


@pytest.mark.parametrize("edit", [{"shards": 5}, {"count": "3"}, {"shards": [{"rows": "x"}]},
                                  {"texts": {"count": 0, "shards": 7}}])
def test_a_manifest_with_wrong_field_types_is_one_error(tmp_path, edit):
    """A hand-edited manifest whose shard list or count has the wrong type is refused by name."""
    import json

    from vlctl.embeddings.manifest import read_manifest
    from vlctl.embeddings.store import create_store

    path = tmp_path / "s"
    create_store(path, dim=4, encoder_id="enc@0")
    doc = json.loads((path / "manifest.json").read_text())
    doc.update(edit)
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(VlctlError, match=r"manifest\.json: corrupt store manifest, field (texts\.)?(shards|count)"):
        read_manifest(path)


def test_verify_reads_a_fitted_model_whole(tmp_path, capsys):
    """Issue 43: `verify` refused a fitted-model folder. It now reads every tensor of a TEVI and
    its SAE, and a cut file fails naming itself."""
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    rng = np.random.default_rng(0)
    img = rng.normal(size=(40, 16)).astype(np.float32)
    store = create_store(tmp_path / "store", "enc@0", 16).add(
        img, [{} for _ in range(40)], texts=img + 0.1, text_metadata=[{"text": f"t{i}", "image": i} for i in range(40)])
    sae = SparseAutoencoder(d_latent=32, k=4, epochs=1).fit(store)
    TEVI(epochs=1).fit(store, sae=sae).save(tmp_path / "tevi")
    assert main(["verify", str(tmp_path / "tevi"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["kind"] == "fitted model" and got["files"] == 2 and got["ok"] is True
    mask = tmp_path / "tevi" / "mask.safetensors"
    mask.write_bytes(mask.read_bytes()[:100])
    assert main(["verify", str(tmp_path / "tevi")]) == 2
    assert capsys.readouterr().err.startswith(f"vlctl: error: {mask}: cannot read its tensors")

"""ControlEmbed's hypernetwork fit, TEVI's mask fit and 3VL's LoRA fine-tune resume from their
checkpoints to exactly the uninterrupted fit (weights bit for bit, the final logged loss, the log's
last line), after a cut (`stop_after_steps`, as a preempted job) and after a SIGKILL inside a
checkpoint write (a child process killed by the fault hook, `vlctl.fsops`: once before the new
checkpoint is complete, so the previous one stays, once in the swap's last rename, so the new one is
restored); and they refuse a checkpoint of another config, encoder, data or SAE.

Sizes: 60 steps (the loop logs every 50), checkpoints every 25; the kills hit the save at step 50.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ddp_worker
from vlctl.fsops import VlctlError

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY, KILL_STEP = 60, 25, 50


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The loop refuses to resume under another thread count (float sums differ); the killed child
    # runs with one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the fits ------------------------------------------------------------------------------------


def ce_fit(out_dir, resume: bool = False, encoder_id: str = "toy", **cfg):
    from vlctl.methods.controlembed.estimator import ControlEmbed

    x, labels, cond, text = ddp_worker.controlembed_data()
    x = cfg.pop("x", x)
    est = ControlEmbed(**{**ddp_worker.CE_CFG, "steps": STEPS, **cfg}, out_dir=out_dir)
    return est.fit(x, labels, encoder_id=encoder_id, category_emb=cond, class_text_emb=text,
                   checkpoint_every=EVERY, resume=resume)


def tevi_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    return x, (x @ rng.normal(size=(8, 8)) + 0.5 * rng.normal(size=(64, 8))).astype(np.float32)


def sae_dir(root: Path, seed: int = 0) -> Path:
    """A tiny SAE over tevi_data's images, fitted once and saved (the child loads the same one)."""
    from vlctl.methods.sae.model import SparseAutoencoder

    path = root / f"sae-{seed}"
    if not path.is_dir():
        SparseAutoencoder(d_latent=24, k=3, aux_k=4, epochs=2, batch_size=16, init_b_pre="mean", seed=seed).fit(
            tevi_data()[0], "toy").save(path)
    return path


def tevi_fit(out_dir, resume: bool = False, sae_seed: int = 0, **cfg):
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    x, t = tevi_data()
    sae = SparseAutoencoder.load(sae_dir(Path(out_dir).parent, sae_seed))
    # 64 pairs in batches of 16: 4 steps an epoch, 15 epochs = STEPS; negative conditioning (Eq. 11). holdout 0:
    # every pair trains (a held-out share would leave fewer steps than the kill at step 50 needs).
    est = TEVI(**{"hidden": 8, "conditioning": "negative", "epochs": 15, "batch_size": 16, "lr": 1e-2, "holdout": 0,
                  **cfg},
               out_dir=out_dir)
    return est.fit(x, t, sae=sae, checkpoint_every=EVERY, resume=resume)


def tree_fit(out_dir, resume: bool = False, **cfg):
    """3VL's tree-loss LoRA fine-tune of a tiny TinyCLIP: 16 pairs in batches of 4, 15 epochs = STEPS."""
    from vlctl.encoders import tiny_config, tiny_model
    from vlctl.methods.threevl.tree_tune import TreeTuner

    vocab = ("a", "red", "blue", "circle", "square", "left", "right", "of")
    model = tiny_model.create_model(tiny_config.TinyCLIPConfig(
        name="t", image_size=16, patch_size=4, vision_width=16, vision_layers=1, vision_heads=2, text_width=16,
        text_layers=1, text_heads=2, context_length=10, vocab=vocab, embed_dim=8), seed=0)
    images = np.random.default_rng(0).integers(0, 255, (16, 16, 16, 3), dtype=np.uint8)
    caps = ["a red circle left of a blue square", "a blue square", "a red square", "a blue circle"] * 4
    trees = [[{"positive": c, "negatives": [c.replace("red", "blue") if "red" in c else c.replace("blue", "red")]}]
             for c in caps]
    est = TreeTuner(**{"mode": "tree", "epochs": 15, "batch_size": 4, "lr": 1e-2, "warmup_steps": 0, "rank": 2, **cfg})
    return est.fit(images, caps, model=model, out_dir=out_dir, trees=trees, checkpoint_every=EVERY, resume=resume)


FITS = {"controlembed": (ce_fit, lambda est: est.hypernet_, lambda est: est.final_loss_),
        "tevi": (tevi_fit, lambda est: est.mask_, None),
        "tree": (tree_fit, lambda est: est.model_, lambda est: est.final_loss_)}


def _weights(module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _last_log(run: Path) -> dict:
    line = json.loads((run / "log.jsonl").read_text().splitlines()[-1])
    return {k: v for k, v in line.items() if k != "samples_per_s"}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert torch.equal(value, b[name]), name


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted fits: {kind: (weights, final loss or None, last log line)}."""
    root = tmp_path_factory.mktemp("whole")
    out = {}
    for kind, (fit, module, loss) in FITS.items():
        est = fit(root / kind)
        out[kind] = (_weights(module(est)), loss(est) if loss else None, _last_log(root / kind))
    return out


# --- a cut ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(FITS))
def test_a_cut_fit_resumes_to_the_uninterrupted_weights(kind, whole, tmp_path, monkeypatch):
    from vlctl.train import loop

    fit, module, _ = FITS[kind]
    real = loop.train
    monkeypatch.setattr(loop, "train", functools.partial(real, stop_after_steps=37))  # preempted at step 37
    fit(tmp_path / kind)
    monkeypatch.setattr(loop, "train", real)
    assert json.loads((tmp_path / kind / "checkpoint" / "state.json").read_text())["step"] == 37
    resumed = fit(tmp_path / kind, resume=True)
    _assert_same(_weights(module(resumed)), whole[kind][0])


# --- a SIGKILL in a checkpoint write ---------------------------------------------------------------

KILLED_CHILD = """
import os, sys
from vlctl import fsops
from vlctl.train import loop
import test_fit_resume as t

real = loop._save_checkpoint
def save(ckpt_dir, model, optimizer, scheduler, step, *args, **kwargs):
    if step == t.KILL_STEP:  # SIGKILL at the n-th rename of this checkpoint's write
        os.environ[fsops.FAULT_ENV] = f"replace:{fsops._calls.get('replace', 0) + int(sys.argv[3])}"
    return real(ckpt_dir, model, optimizer, scheduler, step, *args, **kwargs)
loop._save_checkpoint = save
getattr(t, sys.argv[1])(sys.argv[2])
"""
# A checkpoint's write renames model.safetensors, optimizer.pt and state.json into a new directory,
# then swaps it in (3 renames; `vlctl.io.atomic_dir`). Killed at rename 3 (state.json, the marker,
# not yet in place): the previous checkpoint (step 25) stays. At rename 6 (the old one moved
# aside, the new one not yet in place): the next reader restores the new one (step 50).
KILLS = {3: EVERY, 6: KILL_STEP}


@pytest.mark.parametrize("kind", list(FITS))
@pytest.mark.parametrize("rename", list(KILLS))
def test_a_fit_killed_in_a_checkpoint_write_resumes_to_the_uninterrupted_fit(kind, rename, whole, tmp_path):
    from vlctl.io import recover_dir

    fit, module, loss = FITS[kind]
    run = tmp_path / kind
    if kind == "tevi":
        sae_dir(tmp_path)  # made here, so the child only fits the mask
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "VLCTL_FAULT", "VLCTL_FAULT_LOG"):
        env.pop(var, None)
    child = subprocess.run([sys.executable, "-c", KILLED_CHILD, fit.__name__,
                            str(run), str(rename)], check=False, env=env, capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == -9, child.stderr[-3000:]
    recover_dir(run / "checkpoint")
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == KILLS[rename]
    resumed = fit(run, resume=True)
    ref_weights, ref_loss, ref_log = whole[kind]
    _assert_same(_weights(module(resumed)), ref_weights)
    # Resumed at or before the last logging step (50), so the last logging window is whole again.
    assert _last_log(run) == ref_log
    if loss is not None:
        assert loss(resumed) == ref_loss


# --- refusals -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A finished checkpoint of each fit, to resume with something changed."""
    root = tmp_path_factory.mktemp("ckpt")
    for kind, (fit, _, _) in FITS.items():
        fit(root / kind)
    return root


@pytest.mark.parametrize("kind, change, field", [
    ("controlembed", {"lr": 2e-2}, "run.controlembed.lr"),
    ("controlembed", {"images_per_subclass": 2}, "run.controlembed.images_per_subclass"),
    ("controlembed", {"encoder_id": "other"}, "run.encoder_id"),
    ("controlembed", {"x": ddp_worker.controlembed_data()[0] + 0.01}, "run.data"),
    ("tevi", {"lr": 2e-2}, "run.tevi.lr"),
    ("tevi", {"conditioning": "positive"}, "run.tevi.conditioning"),
    ("tevi", {"sae_seed": 1}, "run.sae"),
    ("tree", {"lr": 2e-2}, "run.tree_tune.lr"),
    ("tree", {"level_reduction": "mean"}, "run.tree_tune.level_reduction"),
])
def test_a_checkpoint_of_another_fit_is_refused(checkpoints, kind, change, field):
    fit = FITS[kind][0]
    with pytest.raises(VlctlError, match=rf"another configuration; changed: .*{field.replace('.', '[.]')} "):
        fit(checkpoints / kind, resume=True, **change)


def test_resume_needs_out_dir_and_a_checkpoint(tmp_path):
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    x, labels, cond, _ = ddp_worker.controlembed_data()
    with pytest.raises(VlctlError, match="ControlEmbed.fit: checkpoint_every / resume need out_dir"):
        ControlEmbed(steps=2).fit(x, labels, encoder_id="t", category_emb=cond, resume=True)
    sae = SparseAutoencoder.load(sae_dir(tmp_path))
    with pytest.raises(VlctlError, match="TEVI.fit: checkpoint_every / resume need out_dir"):
        TEVI(epochs=1).fit(*tevi_data(), sae=sae, checkpoint_every=2)
    # Nothing to resume (killed before the first checkpoint was complete): it starts afresh and says
    # so, as the recipe runner does (issue 43: it stopped with "no checkpoint to resume from").
    with pytest.warns(UserWarning, match="no complete checkpoint to resume from .* starting afresh"):
        fresh = ce_fit(tmp_path / "nothing", resume=True)
    assert np.array_equal(fresh.transform(ddp_worker.controlembed_data()[0][:4], "color"),
                          ce_fit(tmp_path / "again").transform(ddp_worker.controlembed_data()[0][:4], "color"))
    with pytest.warns(UserWarning, match="starting afresh"):
        tevi_fit(tmp_path / "nothing-tevi", resume=True)


# --- the recipes' stages ----------------------------------------------------------------------------


def _killed_in(monkeypatch, out_dir: Path, at: int):
    """loop.train that, for the fit into `out_dir` (not resumed), stops after step `at` (its
    checkpoint written) and raises KeyboardInterrupt, as a run killed there."""
    from vlctl.train import loop

    real = loop.train

    def train(*args, **kw):
        if Path(kw["out_dir"]) == out_dir and not kw.get("resume"):
            real(*args, **{**kw, "stop_after_steps": at})
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(loop, "train", train)
    return real


@pytest.mark.parametrize("other_ranks", [False, True])
def test_the_controlembed_fit_stage_resumes_after_a_kill(tmp_path, monkeypatch, capsys, other_ranks):
    """The recipe's fit stage killed in its second model: rerun with resume, the first model is
    kept (not refitted), the second continues from its checkpoint; every model saved is the one
    the uninterrupted stage saves, final loss included. A checkpoint of another number of ranks
    (`other_ranks`: as if written by 2) is not resumed (the fit would refuse it): that model is
    fitted again, and the stage still finishes."""
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.recipes.controlembed import real as ce
    from vlctl.train import loop

    x, labels, _, _ = ddp_worker.controlembed_data()
    values = {c: sorted({v for v in y if v is not None}) for c, y in labels.items()}
    rng = np.random.default_rng(3)
    emb = {"image_emb": x, **{f"values_{c}": np.array(v) for c, v in values.items()},
           **{f"text_{c}": rng.normal(size=(len(v), x.shape[1])).astype(np.float32) for c, v in values.items()}}
    fit = ce.Labelled([Path(f"{i}.png") for i in range(len(x))], {c: list(y) for c, y in labels.items()}, [])
    cfg = ce.ControlEmbedRealRecipe(hidden=16, hyper_steps=60, images_per_subclass=3, align_weight=0.5)
    ce._fit(cfg, emb, fit, "toy", "cpu", tmp_path / "whole")
    work = tmp_path / "killed"
    real = _killed_in(monkeypatch, work / "run" / "translation_only", at=50)  # right after its checkpoint at 50
    with pytest.raises(KeyboardInterrupt):
        ce._fit(cfg, emb, fit, "toy", "cpu", work)
    monkeypatch.setattr(loop, "train", real)
    first = (work / "ours" / "fit_time.json").read_text()
    assert not (work / "translation_only").exists()
    if other_ranks:
        state = work / "run" / "translation_only" / "checkpoint" / "state.json"
        doc = json.loads(state.read_text())
        doc["setup"]["loop"]["batch_size"] = 2  # what 2 ranks write (not among the hashed files)
        state.write_text(json.dumps(doc))
    capsys.readouterr()
    ce._fit(cfg, emb, fit, "toy", "cpu", work, resume=True)
    again = "stage fit: translation_only: its checkpoint is of 2 ranks, this run has 1; fitting it again"
    assert (again in capsys.readouterr().err) == other_ranks
    assert (work / "ours" / "fit_time.json").read_text() == first  # kept, not refitted
    assert json.loads((work / "translation_only" / "fit_time.json").read_text())["resumed"] != other_ranks
    names = ["ours", "translation_only", "per_attribute_color", "per_attribute_shape"]
    for name in names:
        a, b = ControlEmbed.load(tmp_path / "whole" / name), ControlEmbed.load(work / name)
        _assert_same(_weights(b.hypernet_), _weights(a.hypernet_))
        assert a.final_loss_ == b.final_loss_, name
        assert not (work / "run" / name / "checkpoint").exists()  # replaced by the saved model
    assert json.loads((work / "fit.json").read_text()) == json.loads((tmp_path / "whole" / "fit.json").read_text())


def test_the_tevi_mask_stage_resumes_after_a_kill(tmp_path, monkeypatch):
    from vlctl.methods.tevi.estimator import TEVI
    from vlctl.recipes.tevi import coco as tevi_coco
    from vlctl.train import loop

    x, t = tevi_data()
    sae = sae_dir(tmp_path)
    (tmp_path / "sae-stage").mkdir()
    (tmp_path / "sae-stage" / "sae").symlink_to(sae)
    train = {"image_emb": x, "text_emb": t, "image_of_text": np.arange(len(x))}
    # 64 pairs in batches of 16, 15 epochs: 60 steps, checkpoints every 6.
    cfg = tevi_coco.TeviCocoRecipe(mask_hidden=8, mask_epochs=15, mask_batch_size=16, mask_lr=1e-2)
    tevi_coco._tevi_stage(cfg, train, tmp_path / "sae-stage", "cpu", tmp_path / "whole")
    work = tmp_path / "killed"
    real = _killed_in(monkeypatch, work / "run", at=45)
    with pytest.raises(KeyboardInterrupt):
        tevi_coco._tevi_stage(cfg, train, tmp_path / "sae-stage", "cpu", work)
    monkeypatch.setattr(loop, "train", real)
    assert json.loads((work / "run" / "checkpoint" / "state.json").read_text())["step"] == 45
    tevi_coco._tevi_stage(cfg, train, tmp_path / "sae-stage", "cpu", work, resume=True)
    assert json.loads((work / "fit.json").read_text())["resumed"]
    a, b = TEVI.load(tmp_path / "whole" / "tevi"), TEVI.load(work / "tevi")
    _assert_same(_weights(b.mask_), _weights(a.mask_))
    assert _last_log(work / "run") == _last_log(tmp_path / "whole" / "run")

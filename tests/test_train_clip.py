"""TinyCLIP from scratch: the two entry points (`vlctl.train.clip.train_clip`, from a MAD-format
directory, and `vlctl.methods.threevl.tree_tune.pretrain_clip`, from arrays) are one trainer,
`vlctl.train.clip.train_clip_arrays`.

`_reference_train_clip` and `_reference_pretrain_clip` below are the two trainers as they were
before they were merged (commit e4327b4: train/clip.py's `train_clip` and tree_tune.py's
`pretrain_clip`, verbatim but for their imports). Trained on the same tiny config and data, the
merged entry points must give the same weights, bit for bit, and the same loss log.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vlctl.config import config_to_dict
from vlctl.data.mad import generate_mad, load_mad, mad_dataset_id
from vlctl.data.mad_config import MadConfig
from vlctl.encoders import tiny_model, tiny_pretrained
from vlctl.encoders.loss import clip_loss
from vlctl.encoders.tiny_config import MAD_VALUES
from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_json
from vlctl.methods.threevl.tree_tune import _image_embedding, patch_keep, pretrain_clip, trim_padding
from vlctl.train.clip import train_clip
from vlctl.train.config import ClipTrainConfig, LoopConfig
from vlctl.train.loop import TrainResult, default_param_groups, sample_rng, train

TINY = {
    "name": "tiny-test", "image_size": 28, "stem_channels": [4], "patch_size": 2, "vision_width": 16,
    "vision_layers": 1, "vision_heads": 2, "text_tower": "transformer", "text_width": 16, "text_layers": 1,
    "text_heads": 2, "context_length": 8, "vocab": list(MAD_VALUES), "embed_dim": 8,
}


def _reference_train_clip(data_dir, out_dir, cfg: ClipTrainConfig, loop: LoopConfig, resume=False) -> TrainResult:
    data = load_mad(data_dir)
    images = data["images"]
    captions = [lab["caption"] for lab in data["labels"]]
    if not captions:
        raise VlctlError(f"{data_dir}: no captions to train on")

    model = tiny_model.create_model(cfg.model, seed=loop.seed)
    text_inputs = model.tokenize(captions) if model.config.text_tower == "transformer" else captions
    n = len(captions)
    s = cfg.shift_pixels

    def make_batch(indices: np.ndarray, epoch: int):
        batch = np.asarray(images[indices])
        if s > 0:
            batch = batch.copy()
            for row, i in enumerate(indices):
                dy, dx = sample_rng(loop.seed, epoch, i).integers(-s, s + 1, size=2)
                batch[row] = np.roll(batch[row], (int(dy), int(dx)), axis=(0, 1))
        x = tiny_model.preprocess_batch(batch)
        t = text_inputs[torch.as_tensor(indices)] if torch.is_tensor(text_inputs) else [text_inputs[i] for i in indices]
        return x, t

    def loss_fn(m, batch):
        x, t = batch
        img, txt, scale = m(x, t)
        loss = clip_loss(img, txt, scale)
        return loss, {"temp": float(1.0 / scale.detach())}

    others = torch.nn.ModuleDict({"visual": model.visual, "text": model.text})
    groups = [{**g, "lr": loop.lr} for g in default_param_groups(others, loop.weight_decay)]
    groups.append({"params": [model.logit_scale], "lr": cfg.temperature_lr, "weight_decay": 0.0})
    run_config = {"clip": config_to_dict(cfg), "model": config_to_dict(model.config), "data": mad_dataset_id(data_dir)}
    result = train(model, n_samples=n, make_batch=make_batch, loss_fn=loss_fn, cfg=loop, out_dir=out_dir,
                   param_groups=groups, resume=resume, run_config=run_config)
    tiny_pretrained.save_pretrained(model, Path(out_dir) / "model")
    return result


def _reference_pretrain_clip(images: np.ndarray, captions: Sequence[str], model_config, out_dir, *, epochs: int,
                             batch_size: int, lr: float, temperature_lr: float = 1e-2, warmup_steps: int = 50,
                             weight_decay: float = 0.1, seed: int = 0, threads: int = 0, resume: bool = False,
                             patch_dropout: float = 0.0):
    model = tiny_model.create_model(model_config, seed=seed)
    tokens = model.tokenize(list(captions))

    def make_batch(idx: np.ndarray, epoch: int):
        return (tiny_model.preprocess_batch(np.asarray(images[idx])), trim_padding(tokens[torch.as_tensor(idx)]),
                patch_keep(idx, epoch, seed, model.config.n_patches, patch_dropout))

    def loss_fn(m, b):
        img = _image_embedding(m, b[0], b[2])
        txt, scale = m.encode_text(b[1], normalize=True), m.scale()
        return clip_loss(img, txt, scale), {"temp": float(1.0 / scale.detach())}

    others = nn.ModuleDict({"visual": model.visual, "text": model.text})
    groups = [{**g, "lr": lr} for g in default_param_groups(others, weight_decay)]
    groups.append({"params": [model.logit_scale], "lr": temperature_lr, "weight_decay": 0.0})
    loop = LoopConfig(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                      warmup_steps=warmup_steps, seed=seed, threads=threads, progress=False, log_every=20,
                      checkpoint_every=200)
    train(model, n_samples=len(captions), make_batch=make_batch, loss_fn=loss_fn, cfg=loop, out_dir=out_dir,
          param_groups=groups, resume=resume, device="cpu",
          run_config={"model": config_to_dict(model.config), "n": len(captions), "patch_dropout": patch_dropout})
    model.eval()
    tiny_pretrained.save_pretrained(model, Path(out_dir) / "model")
    return model


@pytest.fixture(scope="module")
def mad_dir(tmp_path_factory) -> Path:
    return generate_mad(MadConfig(n=48, seed=3, workers=1), tmp_path_factory.mktemp("mad") / "train")


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny-test.json"
    atomic_write_json(path, TINY)
    return path


def _same_weights(a: Path, b: Path) -> None:
    sa = tiny_pretrained.load_pretrained(a).state_dict()
    sb = tiny_pretrained.load_pretrained(b).state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), f"{k} differs"


def _setup(run: Path) -> dict:
    """What a resume checks a checkpoint against (loop config, param groups, run config)."""
    return json.loads((run / "checkpoint" / "state.json").read_text())["setup"]


def _losses(run: Path) -> list[tuple]:
    return [(r["step"], r["loss"], r["temp"], r["lr_groups"])
            for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())]


def test_train_clip_is_the_old_trainer_bit_for_bit(mad_dir, tiny_config, tmp_path):
    cfg = ClipTrainConfig(model=str(tiny_config), shift_pixels=2)
    loop = LoopConfig(epochs=2, batch_size=16, lr=2e-3, warmup_steps=2, seed=1, log_every=1, progress=False, threads=1)
    old = _reference_train_clip(mad_dir, tmp_path / "old", cfg, loop)
    new = train_clip(mad_dir, tmp_path / "new", cfg, loop)
    assert new.steps == old.steps == 6 and new.final_loss == old.final_loss
    _same_weights(tmp_path / "old" / "model", tmp_path / "new" / "model")
    assert _losses(tmp_path / "new") == _losses(tmp_path / "old")
    # the run config is recorded as before, so checkpoints written before the merge still resume
    assert _setup(tmp_path / "new") == _setup(tmp_path / "old")


@pytest.mark.parametrize("patch_dropout", [0.0, 0.7])
def test_pretrain_clip_is_the_old_trainer_bit_for_bit(mad_dir, tiny_config, tmp_path, patch_dropout):
    data = load_mad(mad_dir)
    captions = [lab["caption"] for lab in data["labels"]]
    kw = {"epochs": 2, "batch_size": 16, "lr": 2e-3, "warmup_steps": 2, "seed": 2, "threads": 1,
          "patch_dropout": patch_dropout}
    old = _reference_pretrain_clip(data["images"], captions, str(tiny_config), tmp_path / "old", **kw)
    new = pretrain_clip(data["images"], captions, str(tiny_config), tmp_path / "new", **kw)
    assert not new.training and not old.training
    for k, v in old.state_dict().items():
        assert torch.equal(v, new.state_dict()[k]), f"{k} differs"
    _same_weights(tmp_path / "old" / "model", tmp_path / "new" / "model")
    assert _losses(tmp_path / "new") == _losses(tmp_path / "old")
    assert _setup(tmp_path / "new") == _setup(tmp_path / "old")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_training_child_dies_with_its_parent(tmp_path):
    """run_child's child (torchrun, for launch_clip_training) gets SIGTERM when the recipe process
    is killed (SIGKILL included), so no training keeps running behind a dead `vlctl reproduce`."""
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    stmt = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import os\n"
        "from vlctl.train.clip import run_child\n"
        f"run_child('timeit', ['-n', '1', {stmt!r}], dict(os.environ), 'sleeping')\n")])
    for _ in range(200):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    for _ in range(100):  # the orphan is re-parented and, signalled, exits (a zombie counts as gone)
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its killed parent")


def test_a_failed_training_child_is_one_error(tmp_path):
    """A child that fails raises a VlctlError naming what failed (the CLI prints it as one line)."""
    import os

    from vlctl.fsops import VlctlError
    from vlctl.train.clip import run_child

    with pytest.raises(VlctlError, match="training into x failed"):
        run_child("timeit", ["-n", "1", "raise SystemExit(3)"], dict(os.environ), "training into x")

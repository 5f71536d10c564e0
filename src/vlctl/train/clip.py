"""Train TinyCLIP from scratch on a captioned image set (MAD, shapes, ...) with the one loop.

`train_clip_arrays` is the trainer (arrays in, weights trained in place); `train_clip` runs it on
a MAD-format directory, `vlctl.methods.threevl.tree_tune.pretrain_clip` on arrays (3VL's base model).

Runs the same in one process or under `torchrun --nproc_per_node P` (DDP): `vlctl train clip`.
InfoNCE with a learnable temperature; the temperature gets its own learning rate because with
the weights' small lr it barely moves and learning crawls (calibrated on MAD).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.config import config_to_dict
from vlctl.encoders import tiny_model, tiny_pretrained
from vlctl.encoders.loss import clip_loss
from vlctl.fsops import VlctlError
from vlctl.train.config import ClipTrainConfig, LoopConfig
from vlctl.train.loop import TrainResult, default_param_groups, sample_rng, train


def train_clip(
    data_dir: str | Path,
    out_dir: str | Path,
    cfg: ClipTrainConfig | None = None,
    loop: LoopConfig | None = None,
    resume: bool = False,
) -> TrainResult:
    """Train a TinyCLIP on the captioned images of `data_dir` (a MAD-format directory).

    Writes `out_dir/checkpoint/` (loop checkpoints) and `out_dir/model/` (TinyCLIP
    `save_pretrained`, loadable with `vlctl.encoders.load_encoder`).
    """
    from vlctl.data.mad import load_mad, mad_dataset_id

    cfg, loop = cfg or ClipTrainConfig(), loop or LoopConfig()
    data = load_mad(data_dir)
    images = data["images"]
    captions = [lab["caption"] for lab in data["labels"]]
    if not captions:
        raise VlctlError(f"{data_dir}: no captions to train on")

    model = tiny_model.create_model(cfg.model, seed=loop.seed)
    text_inputs = model.tokenize(captions) if model.config.text_tower == "transformer" else captions
    run_config = {"clip": config_to_dict(cfg), "model": config_to_dict(model.config), "data": mad_dataset_id(data_dir)}
    result = train_clip_arrays(model, images, text_inputs, out_dir, loop, temperature_lr=cfg.temperature_lr,
                               shift_pixels=cfg.shift_pixels, resume=resume, run_config=run_config)
    from vlctl.train.distributed import is_main

    if is_main():
        tiny_pretrained.save_pretrained(model, Path(out_dir) / "model")
    return result


def train_clip_arrays(
    model: torch.nn.Module,
    images: np.ndarray,
    texts: torch.Tensor | Sequence[str],
    out_dir: str | Path,
    loop: LoopConfig,
    *,
    temperature_lr: float,
    shift_pixels: int = 0,
    text_batch: Callable[[torch.Tensor], torch.Tensor] | None = None,
    patch_keep: Callable[[np.ndarray, int], torch.Tensor | None] | None = None,
    resume: bool = False,
    run_config: dict | None = None,
    device: str | None = None,
) -> TrainResult:
    """Train the TinyCLIP `model` in place, contrastively (CLIP InfoNCE with its learnable
    temperature), on `images` (N, S, S, 3) uint8 and their `texts` with the one loop
    (`vlctl.train.loop.train`); the two from-scratch trainers (`train_clip`,
    `vlctl.methods.threevl.tree_tune.pretrain_clip`) are this function.

    texts: token rows (N, C) (the word-level text tower) or N strings (MiniLM).
    temperature_lr: the learnable temperature's own learning rate (its own param group, no weight
        decay); the towers get `loop.lr` and the loop's default groups.
    shift_pixels: random translation by up to this many pixels (np.roll), drawn from
        sample_rng(loop.seed, epoch, index): identical under any rank split and after a resume.
    text_batch: applied to each batch's token rows (e.g. tree_tune.trim_padding).
    patch_keep: (indices, epoch) -> (n, m) patch indices each image keeps, or None for all (FLIP
        patch dropout, tree_tune.patch_keep); one process only (the kept patches go through
        `model.visual.forward_keep`, outside DDP's forward).
    run_config, resume, device: as `train` takes them.
    """
    from torch.nn.parallel import DistributedDataParallel

    s = shift_pixels

    def make_batch(indices: np.ndarray, epoch: int):
        batch = np.asarray(images[indices])
        if s > 0:
            batch = batch.copy()
            for row, i in enumerate(indices):
                dy, dx = sample_rng(loop.seed, epoch, i).integers(-s, s + 1, size=2)
                # On a black background a roll is a translation, except that a stroke within
                # `s` px of the border wraps to the other side (rare on MAD: digits fill a
                # centred 20 px box; only some 'small' ones are pasted near an edge).
                batch[row] = np.roll(batch[row], (int(dy), int(dx)), axis=(0, 1))
        x = tiny_model.preprocess_batch(batch)
        t = texts[torch.as_tensor(indices)] if torch.is_tensor(texts) else [texts[i] for i in indices]
        if text_batch is not None:
            t = text_batch(t)
        return x, t, patch_keep(indices, epoch) if patch_keep is not None else None

    def loss_fn(m, batch):
        x, t, keep = batch
        if keep is None:
            img, txt, scale = m(x, t)
        else:
            if isinstance(m, DistributedDataParallel):
                raise VlctlError("train_clip_arrays: patch dropout (patch_keep) runs in one process only, not DDP")
            img = F.normalize(m.visual.forward_keep(x, keep), dim=-1)
            txt, scale = m.encode_text(t, normalize=True), m.scale()
        loss = clip_loss(img, txt, scale)
        return loss, {"temp": float(1.0 / scale.detach())}

    # The temperature gets its own group and lr; everything else keeps the loop's default groups.
    others = torch.nn.ModuleDict({"visual": model.visual, "text": model.text})
    groups = [{**g, "lr": loop.lr} for g in default_param_groups(others, loop.weight_decay)]
    groups.append({"params": [model.logit_scale], "lr": temperature_lr, "weight_decay": 0.0})
    return train(model, n_samples=len(texts), make_batch=make_batch, loss_fn=loss_fn, cfg=loop, out_dir=out_dir,
                 param_groups=groups, resume=resume, run_config=run_config, device=device)


def launch_clip_training(
    data_dir: str | Path, out_dir: str | Path, cfg: ClipTrainConfig, loop: LoopConfig, procs: int, resume: bool = False
) -> None:
    """Train a TinyCLIP in `procs` CPU processes (torchrun DDP, one thread each, when > 1; in this
    process otherwise), or with one rank per GPU when CUDA is available. On CPU, two single-thread
    data-parallel ranks beat one two-thread process (measured)."""
    import os

    from vlctl.config import config_to_flags

    procs = torch.cuda.device_count() if torch.cuda.is_available() else procs
    if procs <= 1:
        train_clip(data_dir, out_dir, cfg, loop, resume=resume)
        return
    loop = dataclasses.replace(loop, threads=1)
    args = ["--standalone", f"--nproc_per_node={procs}", "-m", "vlctl", "train", "clip", "--data", str(data_dir),
            "--out", str(out_dir), *config_to_flags(cfg), *config_to_flags(loop)] + (["--resume"] if resume else [])
    run_child("torch.distributed.run", args, env={**os.environ, "OMP_NUM_THREADS": "1"},
              what=f"training into {out_dir}")


# Run in the child before the module: ask the kernel for SIGTERM when the parent dies, however it
# dies (Linux's PR_SET_PDEATHSIG; torchrun stops its ranks on SIGTERM), and exit at once if the
# parent already died before that. Done after exec, not in a preexec_fn, which is unsafe in a
# process with threads (the runner's heartbeat).
_CHILD_PRELUDE = """
import ctypes, os, runpy, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))
except (OSError, AttributeError):
    pass
if os.getppid() != int(os.environ["VLCTL_PARENT_PID"]):
    sys.exit(143)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_child(module: str, args: list[str], env: dict[str, str], what: str) -> None:
    """Run `python -m module args` (torchrun) to completion as a child that dies with this process.

    The child gets its own process group, so Ctrl-C reaches only this process, which then stops
    the whole group with SIGTERM and re-raises: one clean "interrupted" line. The child's output
    is forwarded through this process, and dropped once it is being stopped, because torchrun
    answers SIGTERM with a traceback. (It is told whether our stderr is a terminal, so it still
    draws a progress bar there.) A failed child has already printed its one-line error; this
    raises a VlctlError naming what failed.
    """
    import os
    import signal
    import subprocess
    import sys
    import threading

    cmd = [sys.executable, "-c", _CHILD_PRELUDE, module, *args]
    env = {**env, "VLCTL_PARENT_PID": str(os.getpid()), "VLCTL_TERMINAL": "1" if sys.stderr.isatty() else "0"}
    child = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopping = threading.Event()

    def forward() -> None:
        fd = child.stdout.fileno()
        while chunk := os.read(fd, 1 << 16):
            if not stopping.is_set():
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()

    forwarder = threading.Thread(target=forward, daemon=True)
    forwarder.start()
    try:
        rc = child.wait()
    except BaseException:
        stopping.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        raise
    finally:
        forwarder.join(timeout=5)
        child.stdout.close()
    if rc != 0:
        raise VlctlError(f"{what} failed (exit code {rc}; the error is printed above)")

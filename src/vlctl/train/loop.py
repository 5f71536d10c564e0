"""The one training loop every vlctl trainer uses (TinyCLIP, sparse autoencoders, mask MLPs, ...).

A caller supplies a model, `make_batch(indices, epoch)` and `loss_fn(model, batch)`; the loop
does the rest the way OpenCLIP's training does: AdamW with warmup + cosine schedule, optional
gradient clipping, DDP over torchrun ranks, a tqdm bar, `log.jsonl`, and an atomic checkpoint
that a run can resume from bit-exactly.

Data order. Epoch e visits `np.random.default_rng([seed, e]).permutation(n_samples)` in
consecutive global batches of `batch_size`; under DDP rank r takes the r-th contiguous shard of
each global batch. The order depends only on (seed, epoch), never on the number of ranks or on
where a run was resumed.

The `make_batch` contract. `make_batch(indices, epoch)` must be a pure function of its arguments
(and the dataset): any randomness, e.g. augmentation, must come from a generator seeded by
(seed, epoch, index) for each sample -- `sample_rng(seed, epoch, index)` -- never from global RNGs.
Then sample i of epoch e looks the same whether one process or many build the batch, and whether
the run was interrupted and resumed.

The `loss_fn` contract. `loss_fn(model, batch)` returns a scalar loss tensor, or
`(loss, {name: float})` with extra metrics to log (averaged over each logging window and over
ranks; the names step, epoch, loss, lr, lr_groups, samples_per_s are taken by the loop's own
fields in log.jsonl). `model` is the DistributedDataParallel wrapper under DDP: call it
(`model(...)`) rather than its methods, since DDP only synchronises gradients of work done
through `forward`. A loss that is a mean over the local samples matches
single-process training as is (equal shards: the mean of local means is the global mean). A
contrastive loss over the whole global batch gathers features with `all_gather_with_grad`
(see distributed.py for why the gradients then come out right).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import io
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from vlctl.config import config_to_dict
from vlctl.fsops import VlctlError, locked
from vlctl.io import (
    atomic_dir,
    atomic_save_safetensors,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
    recover_dir,
    sha256_file,
    sha256_json,
)
from vlctl.progress import progress_bar
from vlctl.train.config import LoopConfig
from vlctl.train.distributed import all_gather_object, all_reduce_mean, barrier, init_distributed, is_main

# Fields that change only speed or logging, never the trained weights: a run may be resumed with
# other values for them. Every other field must match the checkpoint. (`threads` is free as a
# field, but the thread count it leads to is checked: see `train`.)
_RESUME_FREE = frozenset({"checkpoint_every", "log_every", "progress", "threads"})
CHECKPOINT_FORMAT = "vlctl.checkpoint/1"
_CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt")  # their sha256 are in state.json, checked on resume


@dataclasses.dataclass(frozen=True)
class TrainResult:
    steps: int  # optimizer steps done in total (including those before a resume)
    final_loss: float  # mean loss of the last logging window, averaged over ranks
    seconds: float  # wall time of this call
    samples_per_s: float  # global samples per second in this call
    out_dir: Path


def seed_everything(seed: int) -> None:
    """Seed python, numpy's global RNG and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator `make_batch` should draw sample `index`'s augmentation from in `epoch`."""
    return np.random.default_rng([seed, epoch, int(index)])


def epoch_order(n_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch `epoch` visits the dataset."""
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def steps_per_epoch(n_samples: int, cfg: LoopConfig, world_size: int = 1) -> int:
    """Optimizer steps in one epoch; VlctlError if the batches cannot be split over the ranks."""
    if cfg.batch_size < 1 or cfg.batch_size % world_size:
        raise VlctlError(f"the batch size {cfg.batch_size} must be a positive multiple of the world size {world_size}")
    full, rest = divmod(n_samples, cfg.batch_size)
    steps = full if cfg.drop_last or rest == 0 else full + 1
    # The messages say the fields in words, for the Python API and the command line alike.
    if steps == 0:
        raise VlctlError(f"{n_samples} samples make no full batch of {cfg.batch_size}, and the last incomplete batch "
                         "is dropped (drop last): lower the batch size, or keep the last batch")
    if steps > full and rest % world_size:
        # Unequal shards would make "mean of local means" differ from the global mean.
        raise VlctlError(f"the last batch ({rest} samples) cannot be split evenly over {world_size} ranks; drop it "
                         "(drop last) or choose another batch size")
    return steps


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Factor on each group's peak lr at `step` (0-based): linear warmup, then cosine down to
    `min_lr_ratio`, reached at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def default_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and conv kernels (>= 2-d) only: decaying biases, norm gains or a
    temperature pulls them towards 0, which is not a useful prior for them."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _one_writer(fn: Callable) -> Callable:
    """Hold the lock of the run directory (`out_dir`) for the whole of `fn`, on rank 0, the one
    that writes: a second run into the same directory waits, or fails under --no-wait."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rank0 = os.environ.get("RANK", "0") == "0"  # before init_distributed, so not is_main()
        with locked(kwargs["out_dir"]) if rank0 else contextlib.nullcontext():
            return fn(*args, **kwargs)

    return wrapper


@_one_writer
def train(
    model: torch.nn.Module,
    *,
    n_samples: int,
    make_batch: Callable[[np.ndarray, int], Any],
    loss_fn: Callable[[torch.nn.Module, Any], Any],
    cfg: LoopConfig,
    out_dir: str | Path,
    param_groups: list[dict] | None = None,
    resume: bool = False,
    run_config: dict | None = None,
    device: str | None = None,
    stop_after_steps: int | None = None,
) -> TrainResult:
    """Train `model` in place and leave `out_dir/checkpoint/` holding the final state.

    param_groups: AdamW groups {"params", "lr", "weight_decay"}; omitted keys default to `cfg`.
        Default: `default_param_groups`. Every trainable parameter must be in a group.
    resume: continue from `out_dir/checkpoint/`, refusing one written with another loop config,
        param groups, run_config, model or intra-op thread count (float sums are not the same
        with 1 and 2 threads, so such a resume would not repeat the uninterrupted run), or whose
        weight files are not the ones its state.json hashes. Without `resume`, an existing
        checkpoint is refused rather than overwritten.
    run_config: the caller's model/data config (JSON-able); recorded and checked on resume.
    device: "cpu", "cuda" or None (CUDA when available). The model and batches are moved there.
    stop_after_steps: stop (with a checkpoint) once this many steps are done in total, as a
        preempted job would; the lr schedule still spans all `cfg.epochs`.
    """
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / "checkpoint"
    log_path = out_dir / "log.jsonl"
    dist = init_distributed(device)
    per_epoch = steps_per_epoch(n_samples, cfg, dist.world_size)
    total_steps = cfg.epochs * per_epoch
    end_step = total_steps if stop_after_steps is None else min(total_steps, stop_after_steps)
    if cfg.log_every < 1:
        raise VlctlError(f"log_every must be >= 1, got {cfg.log_every}")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    # Ranks differ in seed so they draw different dropout masks; one process uses `seed` itself.
    seed_everything(cfg.seed + dist.rank)

    model.to(dist.device)
    model.train()
    groups = param_groups if param_groups is not None else default_param_groups(model, cfg.weight_decay)
    optimizer = torch.optim.AdamW(
        _checked_groups(model, groups), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    setup = {
        "loop": config_to_dict(cfg),
        # Hyperparameters only: the optimizer state itself refuses regrouped parameters on load.
        "param_groups": [{"lr": g["lr"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups],
        "run": json.loads(json.dumps(run_config or {})),  # tuples -> lists, as they come back from JSON
        "threads": torch.get_num_threads(),  # the results depend on it (summation order)
    }
    schedule = functools.partial(
        lr_multiplier, warmup_steps=cfg.warmup_steps, total_steps=total_steps, min_lr_ratio=cfg.min_lr_ratio
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    step, last_loss = 0, None
    window = _Window(dist.device)
    recover_dir(ckpt_dir)  # a checkpoint swap killed between its two renames
    if resume and not (ckpt_dir / "state.json").is_file():
        # One rule with the recipe runner's: a run killed before its first checkpoint was complete
        # left nothing to resume, so resuming it starts afresh, and says so.

        warnings.warn(f"{ckpt_dir}: no complete checkpoint to resume from (the run stopped before its first "
                      "one was written); starting afresh", stacklevel=2)
        resume = False
    if resume:
        step, last_loss = _load_checkpoint(
            ckpt_dir, model, optimizer, scheduler, setup, dist.rank, dist.world_size, dist.device, window
        )
    elif (ckpt_dir / "state.json").exists():
        raise VlctlError(f"{ckpt_dir}: a checkpoint already exists; resume it or train into a new out_dir")
    if is_main():
        _truncate_log(log_path, step)  # drop lines from after the checkpoint (or all, when fresh)

    net = model
    if dist.world_size > 1:
        # A 1x1 convolution's weight (C, C', 1, 1) gets its gradient with strides (C', 1, C', C')
        # where DDP's bucket has (C', 1, 1, 1): the same bytes in the same order (strides of size-1
        # dimensions are arbitrary), yet the reducer warns at every step. Nothing to act on.
        warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
        net = DistributedDataParallel(model, device_ids=[dist.local_rank] if dist.device.type == "cuda" else None)

    bar = progress_bar(total=total_steps, initial=step, desc="train", unit="step",
                       disable=not (cfg.progress and is_main()))
    samples_done, t_start = 0, time.perf_counter()
    order = None
    while step < end_step:
        epoch, i = divmod(step, per_epoch)
        if order is None or i == 0:
            order = epoch_order(n_samples, cfg.seed, epoch)
        global_idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
        local_idx = np.split(global_idx, dist.world_size)[dist.rank]
        batch = _to_device(make_batch(local_idx, epoch), dist.device)

        out = loss_fn(net, batch)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        lrs = [g["lr"] for g in optimizer.param_groups]  # what this step used, before the schedule moves on
        optimizer.step()
        scheduler.step()
        step += 1
        samples_done += len(global_idx)
        window.add(loss, metrics, len(global_idx))
        bar.update(1)

        if step % cfg.log_every == 0 or step == end_step:
            last_loss, record = window.flush()
            if not math.isfinite(last_loss):
                raise VlctlError(f"loss became {last_loss} at step {step}; lower lr or enable grad_clip")
            record = {**record, "step": step, "epoch": epoch, "loss": last_loss, "lr": lrs[0], "lr_groups": lrs}
            if is_main():
                _append_log(log_path, record)
                bar.set_postfix(loss=f"{last_loss:.4f}", samples_per_s=f"{record['samples_per_s']:.0f}")
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == end_step:
            _save_checkpoint(ckpt_dir, model, optimizer, scheduler, step, per_epoch, setup, last_loss, dist.device,
                             window)
    bar.close()

    seconds = time.perf_counter() - t_start
    return TrainResult(
        steps=step,
        final_loss=math.nan if last_loss is None else last_loss,
        seconds=seconds,
        samples_per_s=samples_done / seconds if seconds > 0 else 0.0,
        out_dir=out_dir,
    )


def _checked_groups(model: torch.nn.Module, groups: list[dict]) -> list[dict]:
    """Materialise the groups' params and refuse groups that leave a trainable parameter out
    (it would silently never train)."""
    groups = [{**g, "params": list(g["params"])} for g in groups]
    grouped = {id(p) for g in groups for p in g["params"]}
    left_out = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in grouped]
    if left_out:
        raise VlctlError(
            f"param_groups leave trainable parameters out: {left_out} (set requires_grad=False to freeze them)"
        )
    return groups


class _Window:
    """Loss and metrics summed over the steps since the last log line.

    The loss stays on the device until the log step, so training does not wait for the GPU at
    every step just to read a number.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._reset()

    def _reset(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.metrics: dict[str, float] = {}
        self.steps = 0
        self.samples = 0
        self.t0 = time.perf_counter()

    def state(self) -> dict:
        """The open window's sums, for a checkpoint taken between two log lines (JSON: floats are exact)."""
        return {"loss_sum": float(self.loss_sum), "metrics": dict(self.metrics), "steps": self.steps,
                "samples": self.samples}

    def restore(self, state: dict) -> None:
        self.loss_sum.fill_(float(state["loss_sum"]))
        self.metrics = {str(k): float(v) for k, v in state["metrics"].items()}
        self.steps, self.samples = int(state["steps"]), int(state["samples"])

    def add(self, loss: torch.Tensor, metrics: dict[str, float], samples: int) -> None:
        self.loss_sum += loss.detach().to(torch.float64)
        for k, v in metrics.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + float(v)
        self.steps += 1
        self.samples += samples

    def flush(self) -> tuple[float, dict]:
        """(mean loss, {metric: mean, samples_per_s}) over the window, averaged over ranks."""
        names = sorted(self.metrics)
        means = torch.stack(
            [self.loss_sum] + [torch.tensor(self.metrics[k], dtype=torch.float64, device=self.device) for k in names]
        )
        means = all_reduce_mean(means / self.steps).tolist()
        record = dict(zip(names, means[1:]))
        record["samples_per_s"] = self.samples / max(time.perf_counter() - self.t0, 1e-9)
        self._reset()
        return means[0], record


def _to_device(batch: Any, device: torch.device) -> Any:
    """Move the tensors in a (nested) tuple/list/dict batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _append_log(path: Path, record: dict) -> None:
    # One short append per line: a crash can cut at most the last line, and resume drops it.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def _truncate_log(path: Path, step: int) -> None:
    """Keep only log lines up to `step`, so a resumed run's log reads like an uninterrupted one."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text("utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a crash
    atomic_write_text(path, "".join(keep))


# --- checkpoints -------------------------------------------------------------------------------


def _compared_setup(setup: dict) -> dict:
    """The part of the setup that determines the trained weights (what resume must match)."""
    loop = {k: v for k, v in setup["loop"].items() if k not in _RESUME_FREE}
    threads = {"threads": setup["threads"]} if "threads" in setup else {}  # absent: written before it was
    return {"loop": loop, "param_groups": setup["param_groups"], "run": setup["run"], **threads}


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k2: v2 for k, v in obj.items() for k2, v2 in _flatten(v, f"{prefix}.{k}" if prefix else str(k)).items()}
    if isinstance(obj, list):
        return {k2: v2 for i, v in enumerate(obj) for k2, v2 in _flatten(v, f"{prefix}[{i}]").items()}
    return {prefix: obj}


def _rng_state(device: torch.device) -> dict:
    """This process's RNG states as JSON (torch's as base64 bytes)."""
    np_state = np.random.get_state()
    state = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state(device).numpy().tobytes()).decode()
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(
            torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8), device
        )


def _save_checkpoint(ckpt_dir, model, optimizer, scheduler, step, per_epoch, setup, loss, device, window) -> None:
    """Replace `ckpt_dir` atomically (rank 0 writes; every rank hands in its RNG state and its open
    logging window, so a resumed run logs the losses the uninterrupted one did)."""
    rng = all_gather_object(_rng_state(device))
    windows = all_gather_object(window.state())
    if is_main():
        epoch, step_in_epoch = divmod(step, per_epoch)
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "loss": loss,
            "rng": rng,  # one entry per rank
            "window": windows,  # one entry per rank
            "setup": setup,
            "setup_sha256": sha256_json(_compared_setup(setup)),
            "versions": {"torch": torch.__version__, "numpy": np.__version__},
        }
        buf = io.BytesIO()
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buf)
        with atomic_dir(ckpt_dir, kind=("state.json", CHECKPOINT_FORMAT, None), legacy=_old_checkpoint) as tmp:
            # Copies: safetensors refuses tensors that share memory (tied weights).
            weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            atomic_save_safetensors(tmp / "model.safetensors", weights, metadata={"step": str(step)})
            atomic_write_bytes(tmp / "optimizer.pt", buf.getvalue())
            state["files"] = {name: sha256_file(tmp / name) for name in _CHECKPOINT_FILES}
            atomic_write_json(tmp / "state.json", state)  # last: the marker
    barrier()  # nobody runs ahead (or returns) before the checkpoint is on disk


def _old_checkpoint(path: Path) -> bool:
    """A checkpoint of a vlctl before CHECKPOINT_FORMAT: state.json with a step and a setup."""
    try:
        state = read_json(path / "state.json")
    except VlctlError:
        return False
    return isinstance(state, dict) and "format" not in state and {"step", "setup"} <= set(state)


def _load_checkpoint(
    ckpt_dir, model, optimizer, scheduler, setup, rank, world_size, device, window
) -> tuple[int, float | None]:
    """Restore everything from `ckpt_dir` (`window`: this rank's open logging window, when the
    checkpoint has it); returns (step, last logged loss)."""
    state_path = ckpt_dir / "state.json"
    if not state_path.is_file():
        raise VlctlError(f"{state_path}: no checkpoint to resume from; train without resume first")
    state = read_json(state_path, "checkpoint state")
    try:
        if "threads" not in state["setup"]:  # written before the thread count was recorded
            setup = {k: v for k, v in setup.items() if k != "threads"}
        old, new = _flatten(_compared_setup(state["setup"])), _flatten(_compared_setup(setup))
        step, loss, rng = int(state["step"]), state["loss"], state["rng"]
    except (KeyError, TypeError, ValueError) as e:
        raise VlctlError(f"{state_path}: corrupt checkpoint state ({e!r})") from None
    changed = [
        f"{k} ({old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r})"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]
    if changed:
        hint = " (threads: pass --threads with the checkpoint's count)" if old.get("threads") != new.get("threads") \
            else ""
        raise VlctlError(
            f"{state_path}: the checkpoint was trained with another configuration; changed: {', '.join(changed)}"
            f"{hint}. Resume with the original configuration or train into a new out_dir."
        )
    _check_files(ckpt_dir, state)

    _load_weights(ckpt_dir / "model.safetensors", model)
    opt_path = ckpt_dir / "optimizer.pt"
    try:
        saved = torch.load(opt_path, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise VlctlError(f"{opt_path}: cannot restore optimizer state ({e})") from None

    if len(rng) == world_size:
        _set_rng_state(rng[rank], device)
    else:
        warnings.warn(
            f"{state_path}: saved by {len(rng)} ranks, resumed on {world_size}; RNG states not restored, "
            "so random layers (dropout) will not repeat the uninterrupted run exactly"
        )
    windows = state.get("window")  # absent in checkpoints written before it was kept
    if isinstance(windows, list) and len(windows) == world_size:
        try:
            window.restore(windows[rank])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise VlctlError(f"{state_path}: corrupt checkpoint state (window: {e!r})") from None
    return step, loss


def _check_files(ckpt_dir: Path, state: dict) -> int:
    """Refuse a checkpoint whose weight files are not those its state.json hashes (another run's
    model.safetensors copied in, a corrupted file); returns the bytes checked."""
    size = 0
    for name, digest in (state.get("files") or {}).items():
        file = ckpt_dir / name
        if not file.is_file() or sha256_file(file) != digest:
            raise VlctlError(f"{file}: not the file {ckpt_dir / 'state.json'} was written with (missing, or its "
                             "sha256 differs: replaced or corrupted); resume from an intact checkpoint")
        size += file.stat().st_size
    return size


def verify_checkpoint(ckpt_dir: str | Path) -> dict:
    """The full check of a checkpoint directory (`vlctl verify`): {"files", "bytes"}."""
    ckpt_dir = Path(ckpt_dir)
    recover_dir(ckpt_dir)
    state = read_json(ckpt_dir / "state.json", "checkpoint state")
    if not isinstance(state, dict) or not state.get("files"):
        raise VlctlError(f"{ckpt_dir / 'state.json'}: records no file hashes (written by an older vlctl); nothing "
                         "to verify against")
    return {"files": len(state["files"]), "bytes": _check_files(ckpt_dir, state)}


def _load_weights(path: Path, model: torch.nn.Module) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        saved = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise VlctlError(f"{path}: cannot read checkpoint weights ({e})") from None
    expected = model.state_dict()
    problems = []
    if missing := sorted(expected.keys() - saved.keys()):
        problems.append(f"missing {missing}")
    if unexpected := sorted(saved.keys() - expected.keys()):
        problems.append(f"unexpected {unexpected}")
    for k in sorted(expected.keys() & saved.keys()):
        a, b = saved[k], expected[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: checkpoint {a.dtype}{list(a.shape)} vs model {b.dtype}{list(b.shape)}")
    if problems:
        raise VlctlError(f"{path}: weights do not match the model: {'; '.join(problems)}")
    model.load_state_dict(saved)

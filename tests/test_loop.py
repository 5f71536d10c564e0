"""The training loop in one process: schedule, param groups, logging, checkpoints, exact resume."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vlctl.fsops import VlctlError
from vlctl.train.config import LoopConfig
from vlctl.train.loop import default_param_groups, lr_multiplier, sample_rng, seed_everything, steps_per_epoch, train

N, DIM = 50, 6
X = torch.randn(N, DIM, generator=torch.Generator().manual_seed(0))
Y = X @ torch.linspace(-1, 1, DIM) + 0.5

# 50 samples / batch 8 with drop_last = 6 steps per epoch, 18 in all.
CFG = LoopConfig(
    epochs=3,
    batch_size=8,
    lr=0.02,
    warmup_steps=3,
    min_lr_ratio=0.1,
    grad_clip=1.0,
    seed=7,
    checkpoint_every=4,
    log_every=2,
    progress=False,
)


def make_batch(indices, epoch):
    noise = np.stack([sample_rng(CFG.seed, epoch, i).normal(size=DIM) for i in indices])
    return X[indices] + 0.01 * torch.from_numpy(noise).float(), Y[indices]


def mse(model, batch):
    x, y = batch
    pred = model(x).squeeze(-1)
    return torch.nn.functional.mse_loss(pred, y), {"abs_err": (pred - y).abs().mean().item()}


def make_model(hidden=16):
    seed_everything(0)
    # Dropout makes the result depend on the torch RNG, so exact resume must restore it.
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(hidden, 1)
    )


def fit(out_dir, model=None, cfg=CFG, loss_fn=mse, **kw):
    model = model if model is not None else make_model()
    result = train(
        model,
        n_samples=N,
        make_batch=make_batch,
        loss_fn=loss_fn,
        cfg=cfg,
        out_dir=out_dir,
        device="cpu",
        run_config={"hidden": 16},
        **kw,
    )
    return model, result


def crashing_at(n: int):
    """The mse loss, interrupted (KeyboardInterrupt) in its n-th call: a crash inside step n."""
    calls = 0

    def loss_fn(model, batch):
        nonlocal calls
        calls += 1
        if calls == n:
            raise KeyboardInterrupt
        return mse(model, batch)

    return loss_fn


def read_log(out_dir):
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def test_lr_multiplier_warmup_cosine_floor():
    f = lambda s: lr_multiplier(s, warmup_steps=4, total_steps=24, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    assert f(14) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the cosine
    assert f(24) == pytest.approx(0.1)
    after = [f(s) for s in range(4, 30)]
    assert all(a >= b for a, b in itertools.pairwise(after)) and min(after) == pytest.approx(0.1)


def test_per_group_lr_follows_the_schedule(tmp_path):
    model = make_model()
    weights = [p for n, p in model.named_parameters() if n != "3.bias"]
    temperature = model[3].bias  # stands in for CLIP's logit scale: its own lr
    groups = [
        {"params": weights, "lr": 2e-3, "weight_decay": 0.1},
        {"params": [temperature], "lr": 1e-2, "weight_decay": 0.0},
    ]
    fit(tmp_path, model, dataclasses.replace(CFG, log_every=1), param_groups=groups)
    log = read_log(tmp_path)
    assert [r["step"] for r in log] == list(range(1, 19))
    for r in log:
        m = lr_multiplier(r["step"] - 1, warmup_steps=3, total_steps=18, min_lr_ratio=0.1)
        assert r["lr_groups"] == pytest.approx([2e-3 * m, 1e-2 * m])
        assert r["lr"] == r["lr_groups"][0]


def test_default_param_groups_decay_only_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model.register_parameter("scale", torch.nn.Parameter(torch.ones(())))
    decay, no_decay = default_param_groups(model, 0.3)
    assert decay["weight_decay"] == 0.3 and no_decay["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [(4, 4)]
    assert {id(p) for p in no_decay["params"]} == {
        id(model[0].bias),
        id(model[1].weight),
        id(model[1].bias),
        id(model.scale),
    }


def test_param_groups_must_cover_trainable_params(tmp_path):
    model = make_model()
    with pytest.raises(VlctlError, match=r"3\.bias"):
        fit(tmp_path, model, param_groups=[{"params": [p for n, p in model.named_parameters() if n != "3.bias"]}])


def test_loss_decreases_and_log_written(tmp_path):
    _, result = fit(tmp_path, cfg=dataclasses.replace(CFG, epochs=6, progress=True))
    log = read_log(tmp_path)
    assert result.steps == 36 and result.final_loss == log[-1]["loss"]
    assert log[-1]["loss"] < 0.2 * log[0]["loss"]
    assert {"step", "epoch", "loss", "lr", "samples_per_s", "abs_err"} <= log[0].keys()
    assert [r["step"] for r in log] == list(range(2, 37, 2))
    assert result.samples_per_s > 0 and result.out_dir == tmp_path


def test_checkpoint_files(tmp_path):
    model, _ = fit(tmp_path)
    ckpt = tmp_path / "checkpoint"
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.safetensors", "optimizer.pt", "state.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "log.jsonl"]  # no temporary leftovers
    weights = load_file(str(ckpt / "model.safetensors"))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert opt["scheduler"]["last_epoch"] == 18 and len(opt["optimizer"]["state"]) == 4
    state = json.loads((ckpt / "state.json").read_text())
    assert (state["step"], state["epoch"], state["step_in_epoch"]) == (18, 3, 0)
    assert state["setup"]["loop"]["lr"] == CFG.lr and state["setup"]["run"] == {"hidden": 16}
    assert len(state["setup_sha256"]) == 64 and len(state["rng"]) == 1


def test_resume_reaches_identical_weights(tmp_path):
    full, _ = fit(tmp_path / "full")

    # Preempted after step 7 (mid-epoch 1) with a checkpoint there, then resumed.
    _, part = fit(tmp_path / "stopped", stop_after_steps=7)
    assert part.steps == 7
    state = json.loads((tmp_path / "stopped" / "checkpoint" / "state.json").read_text())
    assert (state["step"], state["epoch"], state["step_in_epoch"]) == (7, 1, 1)
    resumed, result = fit(tmp_path / "stopped", resume=True)
    assert result.steps == 18

    # Crashed in step 11: the last checkpoint is from step 8, so steps 9-10 are redone.
    with pytest.raises(KeyboardInterrupt):
        fit(tmp_path / "crashed", loss_fn=crashing_at(11))
    assert json.loads((tmp_path / "crashed" / "checkpoint" / "state.json").read_text())["step"] == 8
    recovered, _ = fit(tmp_path / "crashed", resume=True)

    for model in (resumed, recovered):
        for (name, a), b in zip(full.state_dict().items(), model.state_dict().values()):
            assert torch.equal(a, b), name
    # Lines logged after the last checkpoint are dropped on resume, so the crashed run's log reads
    # as if never interrupted; the stopped run logged its stop at step 7 as well.
    full_log = [(r["step"], r["loss"]) for r in read_log(tmp_path / "full")]
    assert [(r["step"], r["loss"]) for r in read_log(tmp_path / "crashed")] == full_log
    assert [r["step"] for r in read_log(tmp_path / "stopped")] == sorted([s for s, _ in full_log] + [7])


def test_resume_between_log_lines_logs_the_uninterrupted_losses(tmp_path):
    # A checkpoint at step 3 falls inside the log window of steps 3-4: the window's sums travel with
    # it, so the resumed run's step-4 line is the mean of steps 3 and 4, as in the uninterrupted run.
    cfg = dataclasses.replace(CFG, checkpoint_every=3, log_every=2)
    full, _ = fit(tmp_path / "full", cfg=cfg)
    with pytest.raises(KeyboardInterrupt):
        fit(tmp_path / "crashed", cfg=cfg, loss_fn=crashing_at(5))
    state = json.loads((tmp_path / "crashed" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and state["window"][0]["steps"] == 1
    resumed, result = fit(tmp_path / "crashed", cfg=cfg, resume=True)
    assert [(r["step"], r["loss"], r["abs_err"]) for r in read_log(tmp_path / "crashed")] == \
        [(r["step"], r["loss"], r["abs_err"]) for r in read_log(tmp_path / "full")]
    assert result.final_loss == read_log(tmp_path / "full")[-1]["loss"]
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values()))


def test_resume_with_changed_config_refused(tmp_path):
    fit(tmp_path, stop_after_steps=2)
    with pytest.raises(VlctlError, match=r"state\.json.*loop\.lr \(0\.02 -> 0\.03\)"):
        fit(tmp_path, cfg=dataclasses.replace(CFG, lr=0.03), resume=True)
    model = make_model()
    with pytest.raises(VlctlError, match=r"state\.json.*run\.hidden"):
        train(
            model,
            n_samples=N,
            make_batch=make_batch,
            loss_fn=mse,
            cfg=CFG,
            out_dir=tmp_path,
            device="cpu",
            run_config={"hidden": 32},
            resume=True,
        )
    # Fields that only affect logging may change.
    _, result = fit(tmp_path, cfg=dataclasses.replace(CFG, log_every=5, checkpoint_every=0), resume=True)
    assert result.steps == 18


def test_resume_with_mismatched_model_refused(tmp_path):
    fit(tmp_path, stop_after_steps=2)
    with pytest.raises(VlctlError, match=r"model\.safetensors.*0\.weight"):
        fit(tmp_path, model=make_model(hidden=8), resume=True)


def test_resume_without_checkpoint_starts_afresh_and_says_so(tmp_path):
    """A run killed before its first checkpoint was complete left nothing to resume: resuming it
    trains from step 0, as a fresh run does, with a warning (the recipe runner's rule; issue 43)."""
    with pytest.warns(UserWarning, match="no complete checkpoint to resume from .* starting afresh"):
        model, resumed = fit(tmp_path / "a", resume=True)
    fresh_model, fresh = fit(tmp_path / "b")
    assert resumed.steps == fresh.steps
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(p, q)


def test_fresh_run_does_not_overwrite_checkpoint(tmp_path):
    fit(tmp_path, stop_after_steps=1)
    with pytest.raises(VlctlError, match="already exists"):
        fit(tmp_path)


def test_diverging_loss_stops_training(tmp_path):
    with pytest.raises(VlctlError, match="loss became nan at step 2"):
        fit(tmp_path, loss_fn=lambda model, batch: model(batch[0]).sum() * math.nan)
    assert not (tmp_path / "checkpoint").exists()


def test_batches_must_split_evenly_over_ranks():
    assert steps_per_epoch(50, CFG) == 6
    assert steps_per_epoch(50, dataclasses.replace(CFG, drop_last=False)) == 7
    # Issue 43: the messages said drop_last=True and batch_size; they say the fields in words.
    with pytest.raises(VlctlError, match="^the batch size 8 must be a positive multiple of the world size 3$"):
        steps_per_epoch(48, CFG, world_size=3)
    with pytest.raises(VlctlError, match=r"^the last batch \(2 samples\) cannot be split evenly over 4 ranks; drop it "
                       r"\(drop last\) or choose another batch size$"):  # 50 = 6*8 + 2 ... 2 samples over 4 ranks
        steps_per_epoch(50, dataclasses.replace(CFG, drop_last=False), world_size=4)
    with pytest.raises(VlctlError, match=r"^5 samples make no full batch of 8, and the last incomplete batch is dropped "
                       r"\(drop last\): lower the batch size, or keep the last batch$"):
        steps_per_epoch(5, CFG)

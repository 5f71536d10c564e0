"""ControlEmbed's hypernetwork fit under torchrun (2 CPU processes, gloo) equals the one-process fit.

Every rank builds the step's whole episode and takes its share of the anchors
(`vlctl.methods.controlembed.fit`); DDP averages the ranks' gradients. Checked at three levels:
one episode's loss, logged terms and gradient (the decomposition itself, exact up to rounding and
sensitive to a wrong world-size factor, which AdamW's scale invariance could hide in a fit); each
parameterisation's fitted weights and final loss (episodes of 9 anchors, split 5 / 4, so the
shards are unequal; a category with more subclasses than an episode takes; unlabelled images);
and a DDP fit cut short and resumed on 2 ranks, bit for bit the uninterrupted DDP fit. The workers
are `tests/ddp_worker.py controlembed`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ddp_worker
from vlctl.fsops import VlctlError

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    out = tmp_path_factory.mktemp("ce-ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "ddp_worker.py"), str(out), "controlembed"]
    proc = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, torch.load(out / "controlembed.pt")


def test_one_episode_sharded_loss_and_gradient_equal_the_whole_episode(ddp):
    _, saved = ddp
    loss, stats, gw, gb = saved["grad"]
    ref_loss, ref_stats, ref_gw, ref_gb = ddp_worker.controlembed_episode_grad(sharded=False)
    assert loss == pytest.approx(ref_loss, rel=1e-6, abs=0)
    assert stats == pytest.approx(ref_stats, rel=1e-6, abs=0) and min(ref_stats.values()) > 0.1
    assert ref_gw.abs().max() > 1e-2 and ref_gb.abs().max() > 1e-2
    torch.testing.assert_close(gw, ref_gw, atol=1e-6, rtol=0)
    torch.testing.assert_close(gb, ref_gb, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", list(ddp_worker.CE_KINDS))
def test_ddp_fit_equals_the_one_process_fit(ddp, kind, tmp_path):
    from vlctl.methods.controlembed.estimator import AffineHyperNet

    _, saved = ddp
    got, got_loss = saved[kind]
    one = ddp_worker.controlembed_fit(kind, tmp_path / "one")
    ref = one.hypernet_.state_dict()
    init = AffineHyperNet(one.config_, seed=one.config_.seed).state_dict()
    assert ref.keys() == got.keys()
    for name in ref:
        # Training moved every weight far beyond the tolerance: a wrong gradient cannot pass.
        assert (ref[name] - init[name]).abs().max() > 1e-3, name
        torch.testing.assert_close(got[name], ref[name], atol=2e-6, rtol=0, msg=lambda m, n=name: f"{kind}/{n}: {m}")
    assert got_loss == pytest.approx(one.final_loss_, rel=1e-5, abs=0)


def test_a_ddp_fit_resumed_after_a_cut_equals_the_uninterrupted_ddp_fit(ddp):
    out, saved = ddp
    whole, _ = saved["full"]
    resumed, _ = saved["resumed"]
    for name in whole:
        assert torch.equal(resumed[name], whole[name]), name
    # Not the final loss: the loop's last logging window (steps 1-10 uninterrupted) holds only the
    # resumed steps 7-10; tests/test_fit_resume.py checks it for resumes outside that window.
    import json

    state = json.loads((out / "cut" / "checkpoint" / "state.json").read_text())
    assert state["step"] == ddp_worker.CE_CFG["steps"] and len(state["rng"]) == 2


def test_a_checkpoint_of_two_ranks_is_refused_in_one_process(ddp):
    out, _ = ddp
    with pytest.raises(VlctlError, match=r"checkpointed by 2 process\(es\), this one runs 1; .*--nproc_per_node 2"):
        ddp_worker.controlembed_fit("full", out / "cut", resume=True)

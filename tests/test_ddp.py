"""DDP over 2 CPU processes (torchrun, gloo) reaches the same weights as one process.

Covers both gradient paths: a contrastive loss on features gathered with all_gather_with_grad
(all_gather's backward sums over ranks, DDP divides by the world size) and a plain local-mean MSE.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ddp_worker

ROOT = Path(__file__).resolve().parents[1]


def test_ddp_matches_single_process(tmp_path):
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]),
    )
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(ROOT / "tests" / "ddp_worker.py"),
        str(tmp_path / "ddp"),
    ]
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    for kind in ddp_worker.KINDS:
        init, single = ddp_worker.run(kind, tmp_path / "single" / kind)
        assert single.steps == 20
        ref = load_file(str(tmp_path / "single" / kind / "checkpoint" / "model.safetensors"))
        got = load_file(str(tmp_path / "ddp" / kind / "checkpoint" / "model.safetensors"))
        assert ref.keys() == got.keys()
        for name in ref:
            # Training moved the weights far more than the tolerance, so a wrong gradient factor
            # (e.g. gathered grads not summed, or summed and not averaged) cannot pass.
            assert (ref[name] - init[name]).abs().max() > 1e-3, (kind, name)
            torch.testing.assert_close(
                got[name], ref[name], atol=1e-5, rtol=0, msg=lambda m, where=f"{kind}/{name}": f"{where}: {m}"
            )


def test_a_cuda_index_names_that_gpu(monkeypatch):
    """`rank_device` gives each torchrun rank "cuda:LOCAL_RANK"; a config may name "cuda:N": the
    loop's device then is that GPU (it used to refuse every "cuda:N")."""
    import torch

    from vlctl.fsops import VlctlError
    from vlctl.train.distributed import _pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _pick_device("cuda:1", 0) == torch.device("cuda", 1)
    assert _pick_device("cuda", 3) == torch.device("cuda", 3)
    with pytest.raises(VlctlError, match="'cpu', 'cuda', 'cuda:N' or None"):
        _pick_device("cuda:x", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(VlctlError, match="device 'cuda:1' requested but no CUDA device is available"):
        _pick_device("cuda:1", 0)

"""The real recipes under torchrun (2 CPU processes, gloo): the embedding stage shards the images
over the ranks and equals the one-process run; the training stages run DDP through the project's
loop (ControlEmbed's fit too, equal to the one-process fit); only rank 0 writes stages, results and the report and prints the stage lines; a rerun
reuses every stage; a run whose rank 1 dies mid fine-tuning leaves no finished stage behind and,
restarted with the same command, resumes from the last checkpoint. Plus the sharding arithmetic.

Fixtures: those of tests/test_recipes_real.py (a Clevr-4 folder from `vlctl data shapes`, COCO
Karpathy json from the real captions, the compositional benchmark files), with its random-weight
tiny OpenCLIP (`open_clip:vlctl-tiny-vit`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import upstream_layouts as layouts
from vlctl.cli import main
from vlctl.fsops import VlctlError
from vlctl.train.distributed import shard_rows, unshard

ROOT = Path(__file__).resolve().parents[1]


def test_shard_rows_cover_every_row_once_and_unshard_restores_the_order():
    for n in range(12):
        for world in range(1, 5):
            shards = [shard_rows(n, r, world) for r in range(world)]
            assert sorted(i for s in shards for i in s) == list(range(n))  # disjoint and complete
            assert all(len(s) in (n // world, n // world + 1) for s in shards)  # balanced to one row
            assert shards == [shard_rows(n, r, world) for r in range(world)]  # deterministic
            x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
            assert np.array_equal(unshard([x[s] for s in shards], n), x)
    assert shard_rows(10, 1, 4) == [1, 5, 9]
    with pytest.raises(VlctlError, match="rank 2 is not in a world of 2"):
        shard_rows(5, 2, 2)
    with pytest.raises(VlctlError, match="rank 1 returned 1 rows for a shard of 2"):
        unshard([np.zeros((3, 2)), np.zeros((1, 2))], 5)


def test_a_one_process_recipe_refuses_torchrun(tmp_path, monkeypatch):
    from vlctl.recipes.runner import Runner

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(VlctlError, match="runs in one process .* run it without torchrun"):
        Runner(tmp_path / "out")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _torchrun(args: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    entry = [script] if script else ["-m", "vlctl"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *entry, *args]
    return subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=600)


def _emb(stage_dir: Path, name: str) -> dict:
    [d] = [p for p in stage_dir.glob(f"{name}-*") if len(p.name) == len(name) + 13]
    with np.load(d / "embeddings.npz") as z:
        return {"dir": d.name, **{k: z[k] for k in z.files}}


@pytest.mark.slow
def test_controlembed_under_torchrun_equals_one_process_and_reuses(tmp_path):
    from test_recipes_real import CE_CFG, ENC, _config

    flags = ["--clevr4-root", str(layouts.clevr4(tmp_path / "data")), *_config(tmp_path, "ce", CE_CFG)]
    two, one = tmp_path / "two", tmp_path / "one"
    argv = ["reproduce", "controlembed-clevr4", "--encoder", ENC, *flags]
    proc = _torchrun([*argv, "--out", str(two)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Rank 0 alone prints the stage lines, the estimate and the progress.
    assert proc.stderr.count("stage embed-fit: started (2 ranks)") == 1, proc.stderr[-4000:]
    assert proc.stderr.count("over 2 ranks, about") == 2 and proc.stderr.count("stage fit: done in") == 1
    # Every rank fits (each episode's anchors split over the ranks, DDP); rank 0 prints.
    assert proc.stderr.count("stage fit: started (2 ranks)") == 1 and proc.stderr.count("stage fit: 60 steps") == 1
    r2 = json.loads((two / "results.json").read_text())
    assert not any(v["cached"] for k, v in r2["timings"].items() if isinstance(v, dict) and k != "evaluate")
    assert not list((two / "stages").glob("*.partial")) and not list((two / "stages").rglob(".shard-rank*"))
    assert (two / "report.md").is_file() and set(r2["query_map"]) == set(r2["categories"])

    assert main([*argv, "--out", str(one)]) == 0
    for name in ("embed-fit", "embed-eval"):
        a, b = _emb(one / "stages", name), _emb(two / "stages", name)
        assert a["dir"] == b["dir"]  # the same key whatever the number of processes
        assert a.keys() == b.keys()
        for k in a:
            if k != "dir":
                # Rows in the one-process order; equal up to the rounding of another batch split.
                np.testing.assert_allclose(b[k], a[k], atol=1e-6, rtol=0) if b[k].dtype.kind == "f" \
                    else np.testing.assert_array_equal(b[k], a[k])
    # The fit stage: the same key, and the models of the one-process fit up to float rounding.
    import torch

    from vlctl.methods.controlembed.estimator import ControlEmbed

    [fit_two] = (two / "stages").glob("fit-*")
    [fit_one] = (one / "stages").glob("fit-*")
    assert fit_two.name == fit_one.name and (fit_two / "fit.json").is_file()
    for name in [p.name for p in fit_one.iterdir() if (p / "fit_time.json").is_file()]:
        a, b = ControlEmbed.load(fit_one / name).hypernet_, ControlEmbed.load(fit_two / name).hypernet_
        for k, v in a.state_dict().items():
            torch.testing.assert_close(b.state_dict()[k], v, atol=1e-5, rtol=0, msg=lambda m, w=f"{name}/{k}": f"{w}: {m}")

    proc = _torchrun([*argv, "--out", str(two)])  # a rerun under torchrun reuses every stage
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((two / "results.json").read_text())
    assert all(v["cached"] for k, v in r["timings"].items() if isinstance(v, dict) and k not in ("data", "evaluate"))
    assert "started" not in proc.stderr


# Run by torchrun in place of `-m vlctl`: rank 1 dies after the ControlEmbed fit of "ours" has
# written its checkpoint at step 10 (os._exit: no cleanup, as a kill); rank 0 waits for it at a
# barrier until torchrun stops it.
_DYING_RANK_CE = """
import os, sys
from pathlib import Path
import torch.distributed as dist
from vlctl.train import loop
real = loop.train
def dying(*a, **kw):
    if Path(kw["out_dir"]).name == "ours" and not kw.get("resume"):
        real(*a, **{**kw, "stop_after_steps": 10})
        if os.environ["RANK"] == "1":
            os._exit(9)
        dist.barrier()  # never passed: rank 1 is gone
    return real(*a, **kw)
loop.train = dying
from vlctl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_controlembed_fit_under_torchrun_survives_a_dying_rank_and_resumes(tmp_path):
    import torch

    from test_recipes_real import CE_CFG, ENC, _config
    from vlctl.methods.controlembed.estimator import ControlEmbed

    flags = ["--clevr4-root", str(layouts.clevr4(tmp_path / "data")), *_config(tmp_path, "ce", CE_CFG)]
    argv = ["reproduce", "controlembed-clevr4", "--encoder", ENC, *flags]
    two, one = tmp_path / "two", tmp_path / "one"
    script = tmp_path / "dying_rank.py"
    script.write_text(_DYING_RANK_CE)
    proc = _torchrun([*argv, "--out", str(two)], script=str(script))
    assert proc.returncode != 0 and "exitcode  : 9 " in proc.stderr, proc.stderr[-3000:]  # rank 1's death
    [partial] = (two / "stages").glob("fit-*.partial")
    assert (partial / "run" / "ours" / "checkpoint" / "state.json").is_file() and not (partial / "ours").exists()

    proc = _torchrun([*argv, "--out", str(two)])  # the same command, restarted
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("stage fit: resuming from its checkpoint (2 ranks)") == 1, proc.stderr[-3000:]
    [fit_two] = (two / "stages").glob("fit-*")
    assert fit_two.suffix != ".partial" and json.loads((fit_two / "ours" / "fit_time.json").read_text())["resumed"]
    # The resumed DDP fit is the uninterrupted one-process fit, up to float rounding.
    assert main([*argv, "--out", str(one)]) == 0
    [fit_one] = (one / "stages").glob("fit-*")
    assert fit_one.name == fit_two.name
    for name in [p.name for p in fit_one.iterdir() if (p / "fit_time.json").is_file()]:
        a, b = ControlEmbed.load(fit_one / name).hypernet_, ControlEmbed.load(fit_two / name).hypernet_
        for k, v in a.state_dict().items():
            torch.testing.assert_close(b.state_dict()[k], v, atol=1e-5, rtol=0, msg=lambda m, w=f"{name}/{k}": f"{w}: {m}")


# Run by torchrun in place of `-m vlctl`: rank 1 dies after the tree fine-tuning's first
# checkpoint (os._exit: no cleanup, as a kill), rank 0 goes on and waits for it in the stage's
# final report, until torchrun stops it.
_DYING_RANK = """
import os, sys
from pathlib import Path
from vlctl.train import loop
real = loop.train
def dying(*a, **kw):
    if Path(kw["out_dir"]).name == "run" and kw["run_config"]["mode"] == "tree" and not kw.get("resume"):
        res = real(*a, **{**kw, "stop_after_steps": 1})
        if os.environ["RANK"] == "1":
            os._exit(9)
        return res
    return real(*a, **kw)
loop.train = dying
from vlctl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_3vl_under_torchrun_survives_a_dying_rank_and_resumes(tmp_path):
    from test_recipes_real import ENC, THREE_VL_CFG, _config

    ann = layouts.coco(tmp_path / "coco")
    out = tmp_path / "out"
    argv = ["reproduce", "3vl-coco", "--encoder", ENC, "--coco-root", str(tmp_path / "coco"),
            "--coco-annotations", str(ann), *layouts.compositional(tmp_path / "comp"), "--out", str(out),
            *_config(tmp_path, "3vl", {**THREE_VL_CFG, "checkpoint_every": 1})]
    script = tmp_path / "dying_rank.py"
    script.write_text(_DYING_RANK)
    proc = _torchrun(argv, script=str(script))
    assert proc.returncode != 0 and "exitcode  : 9 " in proc.stderr, proc.stderr[-3000:]  # rank 1's death
    stages = out / "stages"
    # The stage the rank died in is not finished; the ones before it are.
    assert not list(stages.glob("finetune-tree-*/done.json"))
    [partial] = stages.glob("finetune-tree-*.partial")
    assert (partial / "run" / "checkpoint" / "state.json").is_file()
    assert list(stages.glob("finetune-contrastive-*/done.json")) and not (out / "results.json").exists()

    proc = _torchrun(argv)  # the same command, restarted
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("stage finetune-tree: resuming from its checkpoint (2 ranks)") == 1, proc.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    assert r["timings"]["finetune-contrastive"]["cached"] and r["timings"]["trees"]["cached"]
    assert not r["timings"]["finetune-tree"]["cached"]
    assert r["fine_tuning"]["tree"]["steps"] == 2 and not list(stages.glob("*.partial"))
    assert set(r["checklist"]) == {"attribute", "relation", "object", "average"}


@pytest.mark.slow
def test_tevi_coco_under_torchrun_trains_sae_and_mask_ddp(tmp_path):
    from test_recipes_real import ENC, TEVI_CFG, _config

    ann = layouts.coco(tmp_path / "coco")
    out = tmp_path / "out"
    proc = _torchrun(["reproduce", "tevi-coco", "--encoder", ENC, "--coco-root", str(tmp_path / "coco"),
                      "--coco-annotations", str(ann), "--out", str(out), *_config(tmp_path, "tevi", TEVI_CFG)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    for stage in ("embed-train", "embed-coco", "sae", "tevi", "sae-sweep"):
        assert proc.stderr.count(f"stage {stage}: started (2 ranks)") == 1, (stage, proc.stderr[-3000:])
    r = json.loads((out / "results.json").read_text())
    assert set(r["retrieval"]) == {"base", "tevi", "tevi_rerank"} and len(r["sae_sweep"]) == 2
    assert r["n_train_pairs"] == 60 and not list((out / "stages").glob("*.partial"))
    # The mask trained DDP through the project's loop: its checkpoint holds both ranks' RNG states.
    [state] = (out / "stages").glob("tevi-*/run/checkpoint/state.json")
    assert len(json.loads(state.read_text())["rng"]) == 2


SAE_FIT = '''
import os, sys
import numpy as np
import torch
from vlctl.methods.sae.model import SparseAutoencoder, TopKSAEConfig

x = np.load(sys.argv[1])
cfg = TopKSAEConfig(d_latent=256, k=2, aux_k=8, epochs=4, batch_size=32, dead_after=64, init_b_pre="mean")
sae = SparseAutoencoder(cfg).fit(x, encoder_id="t")
if os.environ.get("RANK", "0") == "0":
    torch.save({k: v.clone() for k, v in sae.model_.state_dict().items()}, sys.argv[2])
'''


@pytest.mark.slow
def test_sae_fit_under_torchrun_equals_the_one_process_fit(tmp_path):
    """Under DDP the SAE's loss is normalised by the global batch's variance and its dead-latent
    counts see every rank's firings, so 2 ranks train the same weights as 1 process (AuxK active:
    with dead_after 64, latents die within the 4 epochs)."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(128, 12)) @ rng.normal(size=(12, 12))).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "fit.py"
    script.write_text(SAE_FIT)
    one = subprocess.run([sys.executable, str(script), str(tmp_path / "x.npy"), str(tmp_path / "one.pt")],
                         check=False, env=_env(), capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun([str(tmp_path / "x.npy"), str(tmp_path / "two.pt")], script=str(script))
    assert two.returncode == 0, two.stderr[-3000:]
    import torch

    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert int((a["samples_since_fired"] > 64).sum()) > 0  # AuxK had dead latents to work on
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)

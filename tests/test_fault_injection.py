"""Fault injection: `vlctl data mad`, `embed`, `index` and `train clip`, killed with SIGKILL right
before and right after every rename and fsync they make (`vlctl.fsops`: VLCTL_FAULT=OP:N[:after]).

After every kill the output is its old state or its new one, complete (a reader restores a swap
cut between its two renames), and a rerun -- `--resume` for training -- finishes exactly as the
uninterrupted run did, leaving no temporary entry or lock file behind. The kill points of each
command are counted from a run with VLCTL_FAULT_LOG, so a new rename is covered without editing
the test (KILL_POINTS records the count, as a check that the sweep ran at all).

The commands run in children forked from one warm driver process (`Driver`: imports, MAD glyphs
and a first training step done once), so a trial costs a fork, not a Python start. The full
sweep of `train clip` (48 kill points) is marked slow; by default it runs every third one.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
TINY = {"name": "tiny-test", "image_size": 28, "stem_channels": [4], "patch_size": 2, "vision_width": 16,
        "vision_layers": 1, "vision_heads": 2, "text_tower": "transformer", "text_width": 16, "text_layers": 1,
        "text_heads": 2, "context_length": 8, "embed_dim": 8}
# As measured: (replaces + fsyncs) x 2. A store add (issue 44): shard, metadata, the fsync of each
# directory they went into and of the store's, the manifest; `index` (flat) writes no index file.
# "embed batches": three such commits into an hnsw store, each with its index part, then their merge.
KILL_POINTS = {"data mad": 16, "embed": 18, "index": 18, "train clip": 48, "embed batches": 88}


# --- the driver: one warm process that forks a child per command -----------------------------


def serve() -> None:
    """The driver's loop (run as `python -c "import test_fault_injection as t; t.serve()"`): one
    JSON request per line on stdin, {"cmds": [{"argv", "env", "out"}, ...]}, run concurrently in
    forked children; one JSON answer per line, [{"status", "output"}, ...] (status: the exit
    code, -9 for SIGKILL)."""
    import torch

    import vlctl.fsops
    from vlctl.cli import main

    # One thread: an OpenMP pool started here would hang the forked children (libgomp is not
    # fork-safe), and the commands are tiny.
    torch.set_num_threads(1)

    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the warm-up prints must not reach the channel
    for line in sys.stdin:
        request = json.loads(line)
        if "warm" in request:  # commands run here, in the driver, so their caches are inherited
            for argv in request["warm"]:
                main(argv)
            vlctl.fsops._calls.clear()  # the children count their own renames from 1
            channel.write("[]\n")
            channel.flush()
            continue
        pids = []
        for cmd in request["cmds"]:
            pid = os.fork()
            if pid == 0:  # the child: the command's environment, output to its own file
                try:
                    os.environ.update(cmd["env"])
                    fd = os.open(cmd["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    code = main(cmd["argv"])
                    sys.stdout.flush()
                    sys.stderr.flush()
                except BaseException:  # noqa: BLE001 (the child reports anything, then exits)
                    import traceback

                    traceback.print_exc()
                    code = 99
                finally:
                    os._exit(code)
            pids.append(pid)
        answers = []
        for pid, cmd in zip(pids, request["cmds"]):
            _, status = os.waitpid(pid, 0)
            answers.append({"status": os.waitstatus_to_exitcode(status), "output": Path(cmd["out"]).read_text()})
        channel.write(json.dumps(answers) + "\n")
        channel.flush()


class Driver:
    """The test side of `serve`."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.n = 0
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        env.pop("VLCTL_FAULT", None)
        self.proc = subprocess.Popen([sys.executable, "-c", "import test_fault_injection as t; t.serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def _ask(self, request: dict) -> list[dict]:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the driver died"
        return json.loads(line)

    def warm(self, *argvs: list[str]) -> None:
        self._ask({"warm": [list(map(str, a)) for a in argvs]})

    def run_many(self, *argvs: list, env: dict | None = None) -> list[tuple[int, str]]:
        cmds = []
        for argv in argvs:
            self.n += 1
            cmds.append({"argv": list(map(str, argv)), "env": {k: str(v) for k, v in (env or {}).items()},
                         "out": str(self.workdir / f"out-{self.n}.txt")})
        return [(a["status"], a["output"]) for a in self._ask({"cmds": cmds})]

    def run(self, argv: list, env: dict | None = None) -> tuple[int, str]:
        return self.run_many(argv, env=env)[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


# --- the inputs ----------------------------------------------------------------------------------


def write_photos(folder: Path, n: int, seed: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (20 + i % 3, 22, 3), dtype=np.uint8)).save(folder / f"{folder.name}{i}.png")
    return folder


def tiny_model(root: Path) -> tuple[Path, Path]:
    """(a TinyCLIP config JSON, a saved TinyCLIP of it) of 8-d embeddings."""
    from vlctl.encoders.tiny_config import MAD_VALUES
    from vlctl.encoders.tiny_model import create_model
    from vlctl.encoders.tiny_pretrained import save_pretrained

    cfg = root / "tiny.json"
    cfg.write_text(json.dumps({**TINY, "vocab": list(MAD_VALUES)}))
    save_pretrained(create_model(str(cfg), seed=0), root / "model")
    return cfg, root / "model"


def mad_args(out: Path, seed: int = 0) -> list:
    return ["data", "mad", "--n", 16, "--workers", 1, "--seed", seed, "--out", out]


def store_args(cmd: str, source: Path, model: Path, out: Path) -> list:
    return [cmd, source, "--encoder", f"tiny:{model}", "--out", out, "--no-progress"]


def train_args(data: Path, cfg: Path, out: Path, resume: bool = False) -> list:
    return ["train", "clip", "--data", data, "--out", out, "--model", cfg, "--epochs", 1, "--batch-size", 8,
            "--checkpoint-every", 1, "--threads", 1, "--log-every", 1, "--no-progress"] + (["--resume"] if resume else [])


# --- the states compared -------------------------------------------------------------------------

_TEMP = re.compile(r"^\..*\.([a-z0-9_]{8}\.(tmp|new|old)|tmp|lock)$|\.vlctl-partial\.json$")


def leftovers(d: Path) -> list[str]:
    """Temporary entries and lock files anywhere under `d` (none may survive a finished run)."""
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if _TEMP.match(p.name))


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def mad_state(out: Path) -> tuple:
    from vlctl.data.mad import load_mad

    load_mad(out, verify=True)  # restores a swap a kill cut in two; refuses anything incomplete
    return sha(out / "images.npy"), sha(out / "labels.jsonl")


def store_state(out: Path) -> tuple:
    from vlctl.embeddings.store import open_store

    store = open_store(out)
    store.verify()
    emb = store.embeddings()
    searched = store.search(emb, k=len(store)).ids.tolist() if len(store) else []
    return len(store), sha256_array(emb), json.dumps(store.metadata(), sort_keys=True), searched


def sha256_array(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def run_state(out: Path) -> tuple:
    """(checkpoint step or None, its weights' sha256 or None, the final model's or None): every one
    complete when present (verify_checkpoint reads all of it)."""
    from vlctl.io import recover_dir
    from vlctl.train.loop import verify_checkpoint

    ckpt = out / "checkpoint"
    step = weights = model = None
    recover_dir(ckpt)
    if ckpt.exists():
        verify_checkpoint(ckpt)
        step = json.loads((ckpt / "state.json").read_text())["step"]
        weights = sha(ckpt / "model.safetensors")
    recover_dir(out / "model")
    if (out / "model").exists():
        from vlctl.encoders import tiny_pretrained

        tiny_pretrained.load_pretrained(out / "model")
        model = sha(out / "model" / "model.safetensors")
    return step, weights, model


def losses(run: Path) -> list:
    return [(r["step"], r["loss"]) for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())]


# --- the sweep -----------------------------------------------------------------------------------


def kill_points(log: Path) -> list[str]:
    """The VLCTL_FAULT values that kill a command before and after each of its renames and fsyncs."""
    ops = [line.split()[:2] for line in log.read_text().splitlines()]
    return [f"{op}:{n}:{when}" for op, n in ops if op in ("replace", "fsync") for when in ("before", "after")]


def sweep(drv: Driver, tmp: Path, prepare, argv_of, state_of, rerun_of=None, every: int = 1, between=None) -> int:
    """Kill `argv_of(dir)` at each kill point on a fresh `prepare(dir)`; returns the number of
    kill points. `state_of(dir)` must give the old or the new state after each kill (or one that
    `between(state)` accepts: a complete intermediate checkpoint), and the new one after
    `rerun_of(dir)` (default: the same command again)."""
    ref = tmp / "ref"
    prepare(ref)
    old = state_of(ref)
    log = tmp / "ops.log"
    status, output = drv.run(argv_of(ref), env={"VLCTL_FAULT_LOG": log})
    assert status == 0, output
    new = state_of(ref)
    assert new != old
    points = kill_points(log)
    for i, point in enumerate(points):
        if i % every:
            continue
        d = tmp / f"kill-{i}"
        prepare(d)
        status, output = drv.run(argv_of(d), env={"VLCTL_FAULT": point})
        assert status == -9, f"{point}: not killed (status {status}): {output}"
        state = state_of(d)
        assert state in (old, new) or (between is not None and between(state)), f"{point}: neither old nor new: {state}"
        status, output = drv.run((rerun_of or argv_of)(d))
        assert status == 0, f"{point}: the rerun failed: {output}"
        assert state_of(d) == new, f"{point}: the rerun did not finish as the uninterrupted run"
        assert leftovers(d) == [], f"{point}: left {leftovers(d)}"
        shutil.rmtree(d)
    return len(points)


_SHARED: dict = {}


@pytest.fixture(scope="session")
def inputs(tmp_path_factory):
    """The tiny inputs and one warm driver, shared by the fault-injection, lock and full-disk tests.

    Made once per session however many modules import this fixture (pytest makes an imported
    fixture once per module; the module-level cache makes that once in all), and the driver is
    closed when the session ends.
    """
    if not _SHARED:
        root = tmp_path_factory.mktemp("inputs")
        cfg, model = tiny_model(root)
        photos_a, photos_b = write_photos(root / "a", 3, 0), write_photos(root / "b", 3, 1)
        drv = Driver(root)
        atexit.register(drv.close)
        # Warm: the glyphs, a first store, a first training step (each ~5 s cold) happen once.
        drv.warm(mad_args(root / "mad"), store_args("index", photos_a, model, root / "warm-store"),
                 train_args(root / "mad", cfg, root / "warm-run"))
        _SHARED.update(root=root, cfg=cfg, model=model, a=photos_a, b=photos_b, mad=root / "mad", driver=drv)
    return _SHARED


def test_data_mad_survives_a_kill_at_every_point(inputs, tmp_path):
    def prepare(d: Path) -> None:
        shutil.copytree(inputs["mad"], d / "out")  # an existing set, seed 0; the command writes seed 1

    n = sweep(inputs["driver"], tmp_path, prepare, lambda d: mad_args(d / "out", seed=1),
              lambda d: mad_state(d / "out"))
    assert n == KILL_POINTS["data mad"]


@pytest.mark.parametrize("cmd", ["embed", "index"])
def test_store_add_survives_a_kill_at_every_point(inputs, tmp_path, cmd):
    drv = inputs["driver"]
    template = tmp_path / "template"
    status, output = drv.run(store_args(cmd, inputs["a"], inputs["model"], template / "s"))
    assert status == 0, output

    def prepare(d: Path) -> None:
        shutil.copytree(template, d)  # a store of folder a; the command adds folder b

    n = sweep(drv, tmp_path, prepare, lambda d: store_args(cmd, inputs["b"], inputs["model"], d / "s"),
              lambda d: store_state(d / "s"))
    assert n == KILL_POINTS[cmd]


def test_embed_in_batches_into_an_indexed_store_survives_a_kill_at_every_point(inputs, tmp_path):
    """`embed --commit-every 1` into an hnsw store: three commits, then the merge of their index
    parts into one. A kill between commits leaves the committed rows (a complete store); the rerun
    adds the rest."""
    drv = inputs["driver"]
    template = tmp_path / "template"
    status, output = drv.run([*store_args("embed", inputs["a"], inputs["model"], template / "s"), "--index-kind", "hnsw"])
    assert status == 0, output
    argv = lambda d: [*store_args("embed", inputs["b"], inputs["model"], d / "s"), "--commit-every", 1]
    n = sweep(drv, tmp_path, lambda d: shutil.copytree(template, d), argv, lambda d: store_state(d / "s"),
              between=lambda state: 3 < state[0] < 6)
    assert n == KILL_POINTS["embed batches"]


def _train_sweep(inputs, tmp_path, every: int) -> None:
    drv = inputs["driver"]
    args = lambda d, resume=False: train_args(inputs["mad"], inputs["cfg"], d / "run", resume)
    rerun = lambda d: args(d, resume=(d / "run" / "checkpoint").exists())
    # Between the old state (nothing) and the new (final checkpoint and model): a complete
    # checkpoint of some step and no model yet; resuming from it must still end identically.
    no_model = lambda state: state[0] is not None and state[2] is None
    n = sweep(drv, tmp_path, lambda d: d.mkdir(parents=True), args, lambda d: run_state(d / "run"), rerun, every,
              between=no_model)
    assert n == KILL_POINTS["train clip"]
    # the resumed runs' logs read like the uninterrupted one's
    fresh = tmp_path / "again"
    assert drv.run(args(fresh))[0] == 0 and losses(fresh / "run") == losses(tmp_path / "ref" / "run")


def test_train_clip_survives_kills_and_resumes_identically(inputs, tmp_path):
    _train_sweep(inputs, tmp_path, every=3)


@pytest.mark.slow
def test_train_clip_survives_a_kill_at_every_point(inputs, tmp_path):
    _train_sweep(inputs, tmp_path, every=1)


def test_a_killed_resume_still_resumes(inputs, tmp_path):
    """A run killed mid-checkpoint, resumed, killed again in its own first swap, resumed again."""
    drv = inputs["driver"]
    run = tmp_path / "run"
    args = lambda resume: train_args(inputs["mad"], inputs["cfg"], run, resume)
    assert drv.run(args(False), env={"VLCTL_FAULT": "replace:7:after"})[0] == -9  # inside the 2nd checkpoint
    assert (run / "checkpoint" / "state.json").is_file() or any(run.glob(".checkpoint.*"))
    assert drv.run(args(True), env={"VLCTL_FAULT": "replace:1:after"})[0] == -9
    status, output = drv.run(args(True))
    assert status == 0, output
    ref = tmp_path / "ref"
    assert drv.run(train_args(inputs["mad"], inputs["cfg"], ref))[0] == 0
    assert run_state(run) == run_state(ref) and leftovers(tmp_path) == []

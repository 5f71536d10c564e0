"""Run a recipe stage by stage, reusing each stage whose inputs have not changed.

A stage's output lives in `STAGES/<name>-<key>/` (default STAGES = `OUT/stages`; recipes that
share stages, e.g. tevi-mad reusing mad-clip's CLIP, find each other's through a shared STAGES), where the key hashes everything the stage
depends on (its config and the keys of the stages it reads). A finished stage holds `done.json`;
re-running the recipe finds it and skips the work. Stages are built in `<dir>.partial/` and
renamed when they finish, so an interrupted stage is never mistaken for a finished one; a
resumable stage (training) picks its `.partial/` directory up again.

Shipped checkpoints. The `--quick` presets' training stages (and the MAD train split's
embeddings and label values, which would otherwise need 30,000 images rendered) are committed
under `checkpoints/<name>-<key>/` (their files listed with their hashes in
`checkpoints/manifest.json`; `vlctl.recipes.shipped` says which), so `make demo` runs every
method, evaluation and report on trained models in minutes. A stage that is not finished in STAGES but is shipped with the same directory
name (so the same key) is copied from there, after its files are checked against the manifest.
`from_scratch=True` (`vlctl reproduce --from-scratch`, also implied by `--force`) never reads them.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_json, read_json
from vlctl.progress import heartbeat
from vlctl.progress import say as _say
from vlctl.recipes.shipped import SHIPPED, copy_shipped, shipped_manifest, stage_dir_name

# How long a rank waits at a collective for the others (rank 0 may evaluate alone for hours).
DIST_TIMEOUT_S = 24 * 3600.0


def has_checkpoint(partial: Path) -> bool:
    """Whether a stage's `.partial/` holds a training checkpoint to resume: a `state.json` (the marker a
    checkpoint writes last) under a `checkpoint*` folder, at any depth (`run/checkpoint/`, a swap's `.new`)."""
    return partial.is_dir() and any(any(q.startswith("checkpoint") for q in p.relative_to(partial).parts[:-1])
                                    for p in partial.rglob("state.json"))


def _proc_field(path: str, pattern: str) -> int | None:
    try:
        with open(path) as f:
            m = re.search(pattern, f.read())
    except OSError:  # not Linux, or /proc not mounted
        return None
    return int(m.group(1)) if m else None


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for (DataLoader
    workers, the DDP processes a training stage starts)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def measured(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Fill `record` with what the block cost: wall `seconds`, `cpu_seconds`, `peak_rss_bytes` (this
    process's high-water mark, reset at the start where Linux allows it: /proc/self/clear_refs; else
    the process's peak so far) and `written_bytes` (to disk by this process, /proc/self/io). The
    scale rehearsal reads these per stage (benchmarks/rehearsal/)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    w0, c0, t0 = _proc_field("/proc/self/io", r"write_bytes:\s+(\d+)"), _cpu_seconds(), time.perf_counter()
    try:
        yield record
    finally:
        w1 = _proc_field("/proc/self/io", r"write_bytes:\s+(\d+)")
        hwm = _proc_field("/proc/self/status", r"VmHWM:\s+(\d+) kB")
        record.update(seconds=time.perf_counter() - t0, cpu_seconds=round(_cpu_seconds() - c0, 3),
                      peak_rss_bytes=1024 * (hwm if hwm is not None else
                                             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
                      written_bytes=None if w0 is None or w1 is None else w1 - w0)


class Runner:
    """Stages of one recipe run. Each stage says on stderr when it starts and ends, how long it
    took, and whether it was reused from an earlier run or resumed from its checkpoint.

    Under torchrun (WORLD_SIZE > 1; `torchrun --nproc_per_node N -m vlctl reproduce NAME ...`)
    every rank runs the recipe. The runner joins the process group (gloo on CPU, nccl on CUDA)
    and keeps the ranks in step: rank 0 alone decides whether a stage is reused, shipped or
    resumed, prepares its directory and tells the others; a `distributed=True` stage's function
    runs on every rank (the embedding stages shard the images, the training stages run DDP
    through `vlctl.train.loop`), any other stage's only on rank 0 while the others wait. Rank 0
    alone writes (the stage functions write only where `is_main`), marks the stage done and
    renames it, and only after every rank has reported its part finished: a rank that dies
    mid-stage never joins that report, torchrun stops the rest, and the stage stays `.partial`.
    After the last stage the recipe calls `leave()`: the ranks other than 0 stop there, and rank
    0 evaluates, reports and prints as one process.
    """

    def __init__(self, out: str | Path, force: bool = False, stages: str | Path | None = None,
                 verbose: bool = True, from_scratch: bool = False, shipped: Path = SHIPPED,
                 device: str | None = None, torchrun: bool = False):
        """`torchrun`: the recipe is written for several ranks (the real recipes); any other
        refuses to run under torchrun (the synthetic ones launch their own DDP training)."""
        from vlctl.train.distributed import init_distributed

        self.out = Path(out)
        self.stages = Path(stages) if stages is not None else self.out / "stages"
        self.force = force
        self.shipped = None if (from_scratch or force) else Path(shipped)
        self.timings: dict[str, dict[str, Any]] = {}
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = 0
        if self.world_size > 1 and not torchrun:
            raise VlctlError(f"{self.out}: this recipe runs in one process (its training starts its own DDP "
                             "processes); run it without torchrun")
        if self.world_size > 1:
            info = init_distributed("cuda" if (device or "cpu").startswith("cuda") else "cpu",
                                    timeout_s=DIST_TIMEOUT_S)
            self.rank = info.rank
        self.is_main = self.rank == 0
        self.verbose = verbose and self.is_main

    def _gather(self, obj: Any) -> list:
        from vlctl.train.distributed import all_gather_object

        return all_gather_object(obj) if self.world_size > 1 else [obj]

    def stage(self, name: str, key: dict, fn: Callable[..., Any], resumable: bool = False,
              distributed: bool = False) -> Path:
        """Run `fn(workdir)` (or `fn(workdir, resume)` when resumable) unless a finished stage
        with the same key exists; return the stage directory. `distributed`: under torchrun,
        `fn` runs on every rank (it shards its work or trains DDP); otherwise on rank 0 only."""
        final = self.stages / stage_dir_name(name, key)
        names = self._gather(final.name)
        if len(set(names)) > 1:  # ranks given different commands, or nondeterministic keys
            raise VlctlError(f"stage {name}: the ranks disagree on its key ({', '.join(sorted(set(names)))}); "
                             "every torchrun rank must run the same command on the same files")
        partial = final.with_name(final.name + ".partial")
        plan = None
        if self.is_main:
            try:
                plan = self._prepare(name, key, final, partial, resumable)
            except VlctlError as e:  # every rank raises it: none waits for rank 0 forever
                plan = {"error": str(e)}
        plan = self._gather(plan)[0]
        if "error" in plan:
            raise VlctlError(plan["error"])
        if plan["kind"] in ("done", "shipped"):
            self.timings[name] = plan["timing"]
            return final
        resume = plan["kind"] == "resume"
        runs_here = self.is_main or distributed
        cost: dict[str, Any] = {}
        with measured(cost):
            if runs_here:
                with heartbeat(f"stage {name}") if self.verbose else contextlib.nullcontext():
                    fn(partial, resume) if resumable else fn(partial)
        seconds = cost["seconds"]
        # Every rank's part is finished (a rank that died never gets here: the stage stays partial).
        self._gather(True)
        if self.is_main:
            if self.verbose:
                _say(f"stage {name}: done in {seconds:.1f} s")
            atomic_write_json(partial / "done.json", {"stage": name, "key": key, "seconds": seconds})
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
        self._gather(True)  # the others read the stage only once it is renamed
        self.timings[name] = {**cost, "cached": False, **({"resumed": True} if resume else {})}
        return final

    @contextlib.contextmanager
    def measure(self, name: str) -> Iterator[None]:
        """Work done outside a cached stage (a recipe's evaluation): timed and measured like a stage
        into `timings[name]`, with the same heartbeat, so it is never silent for more than 30 s."""
        cost: dict[str, Any] = {}
        with measured(cost), heartbeat(name) if self.verbose else contextlib.nullcontext():
            yield
        self.timings[name] = {**cost, "cached": False}

    def _prepare(self, name: str, key: dict, final: Path, partial: Path, resumable: bool) -> dict:
        """Rank 0: reuse, copy the shipped stage, or make the stage's `.partial/` (kept to resume)."""
        if self.force:
            shutil.rmtree(final, ignore_errors=True)
            shutil.rmtree(partial, ignore_errors=True)
        if (final / "done.json").is_file():
            done = read_json(final / "done.json", "stage marker")
            if self.verbose:
                _say(f"stage {name}: reused {final} (computed in {done['seconds']:.0f} s)")
            return {"kind": "done", "timing": {"seconds": done["seconds"], "cached": True}}
        entry = shipped_manifest(self.shipped).get(final.name) if self.shipped is not None else None
        if entry is not None:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            copy_shipped(self.shipped / final.name, entry, key, partial)
            os.replace(partial, final)
            if self.verbose:
                _say(f"stage {name}: shipped with vlctl (computed in {entry['seconds']:.0f} s; "
                     "--from-scratch recomputes it)")
            return {"kind": "shipped", "timing": {"seconds": entry["seconds"], "cached": True, "shipped": True}}
        # resume only what left a checkpoint: a stage killed before its first one starts afresh (the trainers
        # refuse to resume from nothing)
        resume = resumable and has_checkpoint(partial)
        if not resume:
            shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
        if self.verbose:
            _say(f"stage {name}: {'resuming from its checkpoint' if resume else 'started'}"
                 + (f" ({self.world_size} ranks)" if self.world_size > 1 else ""))
        return {"kind": "resume" if resume else "fresh"}

    def leave(self) -> bool:
        """After the last stage: leave the process group; True on the rank that goes on (rank 0,
        or the only process) to evaluate, write the report and print, False on the others."""
        from vlctl.train.distributed import destroy_distributed

        if self.world_size > 1:
            destroy_distributed()
            # From here rank 0 runs alone: a later training loop must not wait for the others.
            os.environ.update(WORLD_SIZE="1", RANK="0")
            self.world_size = 1
        return self.is_main


def find_stage(stages: str | Path, name: str) -> Path:
    """The one finished `name` stage in a stage directory (`STAGES/<name>-<12 hex>/` with
    `done.json`), for scripts that reuse a recipe's stages without knowing its keys. Refuses zero
    or several (another config's stage beside it): say which one with an explicit path instead."""
    stages = Path(stages)
    found = [p for p in sorted(stages.glob(f"{name}-*"))
             if len(p.name) == len(name) + 13 and (p / "done.json").is_file()]  # not "<name>-train-..."
    if len(found) != 1:
        raise VlctlError(f"{stages}: expected one finished {name!r} stage, found {[p.name for p in found]}")
    return found[0]

"""Run a recipe stage by stage, reusing each stage whose inputs have not changed.

A stage's output lives in `STAGES/<name>-<key>/` (default STAGES = `OUT/stages`; recipes that
share stages, e.g. tevi-mad reusing mad-clip's CLIP, find each other's through a shared STAGES), where the key hashes everything the stage
depends on (its config and the keys of the stages it reads). A finished stage holds `done.json`;
re-running the recipe finds it and skips the work. Stages are built in `<dir>.partial/` and
renamed when they finish, so an interrupted stage is never mistaken for a finished one; a
resumable stage (training) picks its `.partial/` directory up again.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlctl.io import VlctlError, atomic_write_json, read_json, sha256_json


def _say(line: str) -> None:
    print(f"[vlctl] {line}", file=sys.stderr, flush=True)


class Runner:
    """Stages of one recipe run. Each stage says on stderr when it starts and ends, how long it
    took, and whether it was reused from an earlier run or resumed from its checkpoint."""

    def __init__(self, out: str | Path, force: bool = False, stages: str | Path | None = None,
                 verbose: bool = True):
        self.out = Path(out)
        self.stages = Path(stages) if stages is not None else self.out / "stages"
        self.force = force
        self.verbose = verbose
        self.timings: dict[str, dict[str, Any]] = {}

    def stage(self, name: str, key: dict, fn: Callable[..., Any], resumable: bool = False) -> Path:
        """Run `fn(workdir)` (or `fn(workdir, resume)` when resumable) unless a finished stage
        with the same key exists; return the stage directory."""
        digest = sha256_json({"stage": name, **key})[:12]
        final = self.stages / f"{name}-{digest}"
        partial = final.with_name(final.name + ".partial")
        if self.force:
            shutil.rmtree(final, ignore_errors=True)
            shutil.rmtree(partial, ignore_errors=True)
        if (final / "done.json").is_file():
            done = read_json(final / "done.json", "stage marker")
            self.timings[name] = {"seconds": done["seconds"], "cached": True}
            if self.verbose:
                _say(f"stage {name}: reused {final} (computed in {done['seconds']:.0f} s)")
            return final
        resume = resumable and partial.is_dir()
        if not resume:
            shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
        if self.verbose:
            _say(f"stage {name}: {'resuming from its checkpoint' if resume else 'started'}")
        t0 = time.perf_counter()
        fn(partial, resume) if resumable else fn(partial)
        seconds = time.perf_counter() - t0
        if self.verbose:
            _say(f"stage {name}: done in {seconds:.1f} s")
        atomic_write_json(partial / "done.json", {"stage": name, "key": key, "seconds": seconds})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        self.timings[name] = {"seconds": seconds, "cached": False}
        return final


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

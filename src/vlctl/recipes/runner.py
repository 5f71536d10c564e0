"""Run a recipe stage by stage, reusing each stage whose inputs have not changed.

A stage's output lives in `STAGES/<name>-<key>/` (default STAGES = `OUT/stages`; recipes that
share stages, e.g. tevi-mad reusing mad-clip's CLIP, find each other's through a shared STAGES), where the key hashes everything the stage
depends on (its config and the keys of the stages it reads). A finished stage holds `done.json`;
re-running the recipe finds it and skips the work. Stages are built in `<dir>.partial/` and
renamed when they finish, so an interrupted stage is never mistaken for a finished one; a
resumable stage (training) picks its `.partial/` directory up again.

Shipped checkpoints. The `--quick` presets' training stages (and the MAD train split's
embeddings and label values, which would otherwise need 30,000 images rendered) are committed
under `recipes/checkpoints/<name>-<key>/` (their files listed with their hashes in
`checkpoints/manifest.json`; `vlctl.recipes.shipped` says which), so `make demo` runs every
method, evaluation and report on trained models in minutes. A stage that is not finished in STAGES but is shipped with the same directory
name (so the same key) is copied from there, after its files are checked against the manifest.
`from_scratch=True` (`vlctl reproduce --from-scratch`, also implied by `--force`) never reads them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlctl.io import VlctlError, atomic_write_json, read_json
from vlctl.progress import heartbeat
from vlctl.progress import say as _say
from vlctl.recipes.shipped import SHIPPED, copy_shipped, shipped_manifest, stage_dir_name


class Runner:
    """Stages of one recipe run. Each stage says on stderr when it starts and ends, how long it
    took, and whether it was reused from an earlier run or resumed from its checkpoint."""

    def __init__(self, out: str | Path, force: bool = False, stages: str | Path | None = None,
                 verbose: bool = True, from_scratch: bool = False, shipped: Path = SHIPPED):
        self.out = Path(out)
        self.stages = Path(stages) if stages is not None else self.out / "stages"
        self.force = force
        self.verbose = verbose
        self.shipped = None if (from_scratch or force) else Path(shipped)
        self.timings: dict[str, dict[str, Any]] = {}

    def stage(self, name: str, key: dict, fn: Callable[..., Any], resumable: bool = False) -> Path:
        """Run `fn(workdir)` (or `fn(workdir, resume)` when resumable) unless a finished stage
        with the same key exists; return the stage directory."""
        final = self.stages / stage_dir_name(name, key)
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
        entry = shipped_manifest(self.shipped).get(final.name) if self.shipped is not None else None
        if entry is not None:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            copy_shipped(self.shipped / final.name, entry, key, partial)
            os.replace(partial, final)
            self.timings[name] = {"seconds": entry["seconds"], "cached": True, "shipped": True}
            if self.verbose:
                _say(f"stage {name}: shipped with vlctl (computed in {entry['seconds']:.0f} s; "
                     "--from-scratch recomputes it)")
            return final
        resume = resumable and partial.is_dir()
        if not resume:
            shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
        if self.verbose:
            _say(f"stage {name}: {'resuming from its checkpoint' if resume else 'started'}")
        t0 = time.perf_counter()
        with heartbeat(f"stage {name}") if self.verbose else contextlib.nullcontext():
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

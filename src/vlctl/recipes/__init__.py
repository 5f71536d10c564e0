"""Paper reproductions, each a recipe run stage by stage (data -> train -> embed -> fit ->
evaluate -> report) with cached stages. `vlctl reproduce NAME [--quick] --out DIR`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vlctl.io import VlctlError

# name -> module:function(out, quick, force, stages, from_scratch) -> Path of report.md
RECIPES: dict[str, str] = {
    "mad-clip": "vlctl.recipes.mad_clip:run",
    "controlembed-shapes": "vlctl.recipes.controlembed_shapes:run",
    "tevi-mad": "vlctl.recipes.tevi_mad:run",
    "3vl-scenes": "vlctl.recipes.three_vl_scenes:run",
}


def _load(name: str) -> Callable[..., Path]:
    import importlib

    if name not in RECIPES:
        raise VlctlError(f"unknown recipe {name!r}; known: {sorted(RECIPES)}")
    module, fn = RECIPES[name].split(":")
    return getattr(importlib.import_module(module), fn)


def run_recipe(
    name: str, out: str | Path, quick: bool = False, force: bool = False, stages: str | Path | None = None,
    from_scratch: bool = False,
) -> Path:
    """Run recipe `name` into `out`. `stages`: where stage outputs are cached (default OUT/stages);
    recipes given the same `stages` reuse each other's identical stages (same key).
    `from_scratch`: train every model instead of starting from the shipped checkpoints."""
    return _load(name)(Path(out), quick=quick, force=force, stages=stages, from_scratch=from_scratch)

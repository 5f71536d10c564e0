"""Paper reproductions, each a recipe run stage by stage (data -> train -> embed -> fit ->
evaluate -> report) with cached stages. `vlctl reproduce NAME [--quick] --out DIR`.

Two kinds: the synthetic demo recipes (generated data, TinyCLIP trained here; `reproduce all`
runs exactly these, `DEMO`) and the real recipes, which take an encoder spec and the datasets in
their upstream layouts (`vlctl reproduce tevi-coco --encoder open_clip:... --coco-root ...`;
their dataset flags come from `vlctl.recipes.real_data.REAL_RECIPES`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlctl.fsops import VlctlError

# name -> module:function(out, quick, force, stages, from_scratch, **options) -> Path of report.md
RECIPES: dict[str, str] = {
    "mad-clip": "vlctl.recipes.tevi.mad_clip:run",
    "controlembed-shapes": "vlctl.recipes.controlembed.shapes:run",
    "tevi-mad": "vlctl.recipes.tevi.mad:run",
    "3vl-scenes": "vlctl.recipes.threevl.scenes:run",
    "tevi-coco": "vlctl.recipes.tevi.coco:run",
    "controlembed-clevr4": "vlctl.recipes.controlembed.real:run_clevr4",
    "controlembed-stanford40": "vlctl.recipes.controlembed.real:run_stanford40",
    "controlembed-shotbench": "vlctl.recipes.controlembed.real:run_shotbench",
    "3vl-coco": "vlctl.recipes.threevl.coco:run",
    "3vl-lit": "vlctl.recipes.threevl.lit:run",
}
# What `vlctl reproduce all` runs: the synthetic demo recipes only, in this order (tevi-mad
# reuses mad-clip's CLIP). Every other recipe is run by name.
DEMO: tuple[str, ...] = ("mad-clip", "controlembed-shapes", "tevi-mad", "3vl-scenes")


def _load(name: str) -> Callable[..., Path]:
    import importlib

    if name not in RECIPES:
        raise VlctlError(f"unknown recipe {name!r}; known: {sorted(RECIPES)}")
    module, fn = RECIPES[name].split(":")
    return getattr(importlib.import_module(module), fn)


def run_recipe(
    name: str, out: str | Path, quick: bool = False, force: bool = False, stages: str | Path | None = None,
    from_scratch: bool = False, **options: Any,
) -> Path:
    """Run recipe `name` into `out`. `stages`: where stage outputs are cached (default OUT/stages);
    recipes given the same `stages` reuse each other's identical stages (same key).
    `from_scratch`: train every model instead of starting from the shipped checkpoints.
    `options`: a real recipe's encoder=, data=, cfg=, encoder_run= (see its `run`)."""
    return _load(name)(Path(out), quick=quick, force=force, stages=stages, from_scratch=from_scratch, **options)

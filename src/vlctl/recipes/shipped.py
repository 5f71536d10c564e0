"""The trained checkpoints shipped in the repository, so `make demo` starts from trained models.

Each is the finished train stage of a `--quick` preset, as the recipe itself wrote it (`done.json`
with the stage key, `model/` with the TinyCLIP weights and its encoder id, `log.jsonl`), stored
under `checkpoints/<stage>-<key digest>/`. `checkpoints/manifest.json` lists, per stage
directory, the recipe, the stage, how long it trained and the sha256 of every file; the runner
copies a stage from here only when its key and every hash match.

Refresh them after a change to a preset or an architecture (the test suite says when):
`vlctl reproduce all --quick --from-scratch --out runs/fresh` and then
`python -m vlctl.recipes.shipped runs/fresh/stages`.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

from vlctl.io import VlctlError, atomic_write_json, read_json, sha256_file, sha256_json

SHIPPED = Path(__file__).with_name("checkpoints")
# recipe -> (module, its training stage): the stages worth shipping (minutes of training each).
TRAINED = {
    "mad-clip": ("vlctl.recipes.mad_clip", "train"),
    "controlembed-shapes": ("vlctl.recipes.controlembed_shapes", "train"),
    "3vl-scenes": ("vlctl.recipes.three_vl_scenes", "base"),
}
SHIPPED_FILES = ("done.json", "log.jsonl", "model/config.json", "model/model.safetensors")


def stage_dir_name(name: str, key: dict) -> str:
    """`<name>-<first 12 hex of the hash of the stage name and key>`."""
    return f"{name}-{sha256_json({'stage': name, **key})[:12]}"


def expected_stages() -> dict[str, tuple[str, str, dict]]:
    """Stage directory name -> (recipe, stage, key) of each `--quick` preset's training stage."""
    out = {}
    for recipe, (module, stage) in TRAINED.items():
        mod = importlib.import_module(module)  # by name: the recipes import the runner, which imports this
        key = mod.stage_keys(mod.load_preset(True))[stage]
        out[stage_dir_name(stage, key)] = (recipe, stage, key)
    return out


def shipped_manifest(shipped: Path = SHIPPED) -> dict[str, dict]:
    """Stage directory name -> {recipe, stage, seconds, files: {path: sha256}}; {} if none shipped."""
    path = Path(shipped) / "manifest.json"
    return read_json(path, "shipped checkpoint manifest")["stages"] if path.is_file() else {}


def copy_shipped(src: Path, entry: dict, key: dict, dst: Path) -> None:
    """Copy a shipped stage into `dst`, refusing it unless its key and every file's hash match."""
    if read_json(src / "done.json", "shipped stage marker").get("key") != key:
        raise VlctlError(f"{src / 'done.json'}: the shipped stage's key is not the key its directory name says")
    for rel, digest in entry["files"].items():
        if not (src / rel).is_file() or sha256_file(src / rel) != digest:
            raise VlctlError(f"{src / rel}: shipped checkpoint file missing or modified (its sha256 is not the one "
                             "in checkpoints/manifest.json); rerun with --from-scratch")
    for rel in entry["files"]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)


def ship(stages: Path, shipped: Path = SHIPPED) -> dict[str, dict]:
    """Copy the `--quick` presets' finished training stages from a stage cache into `shipped`
    and rewrite its manifest. Refuses when one of them is missing from `stages`."""
    stages, shipped = Path(stages), Path(shipped)
    manifest = {}
    for name, (recipe, stage, key) in expected_stages().items():
        src = stages / name
        if not (src / "done.json").is_file():
            raise VlctlError(f"{src}: no finished {recipe} {stage} stage of the --quick preset here")
        dst = shipped / name
        shutil.rmtree(dst, ignore_errors=True)
        for rel in SHIPPED_FILES:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dst / rel)
        done = read_json(src / "done.json", "stage marker")
        manifest[name] = {"recipe": recipe, "stage": stage, "seconds": round(done["seconds"], 1),
                          "encoder_id": read_json(src / "model/config.json", "model config")["id"],
                          "files": {rel: sha256_file(dst / rel) for rel in SHIPPED_FILES}}
    for old in shipped.iterdir() if shipped.is_dir() else []:
        if old.is_dir() and old.name not in manifest:
            shutil.rmtree(old)  # a stale checkpoint of an earlier preset
    atomic_write_json(shipped / "manifest.json", {"format": "vlctl.shipped/1", "stages": manifest})
    return manifest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m vlctl.recipes.shipped STAGES_DIR")
    for name, entry in ship(Path(sys.argv[1])).items():
        print(f"{name}: {entry['recipe']} {entry['stage']}, {entry['encoder_id']}")

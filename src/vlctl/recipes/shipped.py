"""The trained checkpoints shipped in the repository, so `make demo` starts from trained models.

Each is a finished training stage of a `--quick` preset (the CLIPs; 3VL's base and its three
LoRA fine-tunes), as the recipe itself wrote it (`done.json` with the stage key, `model/` with the
TinyCLIP weights and its encoder id, the training log; not the resume state), stored under
`checkpoints/<stage>-<key digest>/`. `checkpoints/manifest.json` lists, per stage
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
# recipe -> its module, whose `shipped_stage_keys(cfg, stages)` names the stages worth shipping
# (minutes of training each) and their keys, reading any upstream stage they are keyed by in `stages`.
TRAINED = {
    "mad-clip": "vlctl.recipes.mad_clip",
    "controlembed-shapes": "vlctl.recipes.controlembed_shapes",
    "3vl-scenes": "vlctl.recipes.three_vl_scenes",
    "tevi-mad": "vlctl.recipes.tevi_mad",
}
MAX_FILE_BYTES = 8 * 1024 * 1024  # tevi-mad's train embeddings: 30,000 x 32 x 2 float32


def stage_dir_name(name: str, key: dict) -> str:
    """`<name>-<first 12 hex of the hash of the stage name and key>`."""
    return f"{name}-{sha256_json({'stage': name, **key})[:12]}"


def expected_stages(stages: Path | None = None, **upstream: str) -> dict[str, tuple[str, str, dict]]:
    """Stage directory name -> (recipe, stage, key) of each stage the `--quick` presets ship. Keys
    that depend on an earlier stage's output (3VL's fine-tunes: `trees`, the trees' digest) are
    given in `upstream` or read from that stage in `stages`."""
    out = {}
    for recipe, module in TRAINED.items():
        mod = importlib.import_module(module)  # by name: the recipes import the runner, which imports this
        for stage, key in mod.shipped_stage_keys(mod.load_preset(True), stages, **upstream).items():
            out[stage_dir_name(stage, key)] = (recipe, stage, key)
    return out


def shipped_files(stage_dir: Path) -> list[str]:
    """The files of a finished stage that are shipped: all but a training run's resume state
    (`checkpoint/` folders: optimizer moments, only needed to continue an interrupted run) and an
    embedding stage's `cache/` (the same arrays as its embeddings.npz, in the store's layout)."""
    return sorted(p.relative_to(stage_dir).as_posix() for p in stage_dir.rglob("*")
                  if p.is_file() and not {"checkpoint", "cache"} & set(p.relative_to(stage_dir).parts[:-1]))


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


def _encoder_id(stage_dir: Path) -> str | None:
    """The id of the encoder a stage trained (model/config.json) or embedded with (encoder.json)."""
    if (stage_dir / "model/config.json").is_file():
        return read_json(stage_dir / "model/config.json", "model config")["id"]
    if (stage_dir / "encoder.json").is_file():
        return read_json(stage_dir / "encoder.json", "encoder record")["encoder_id"]
    return None


def ship(stages: Path, shipped: Path = SHIPPED) -> dict[str, dict]:
    """Copy the `--quick` presets' finished trained stages from a stage cache into `shipped`
    and rewrite its manifest. Refuses when one of them is missing from `stages` or a file is
    over MAX_FILE_BYTES."""
    stages, shipped = Path(stages), Path(shipped)
    manifest = {}
    for name, (recipe, stage, _key) in expected_stages(stages).items():
        src = stages / name
        if not (src / "done.json").is_file():
            raise VlctlError(f"{src}: no finished {recipe} {stage} stage of the --quick preset here")
        files = shipped_files(src)
        big = [rel for rel in files if (src / rel).stat().st_size > MAX_FILE_BYTES]
        if big:
            raise VlctlError(f"{src / big[0]}: over {MAX_FILE_BYTES >> 20} MB, too large to ship in the repository")
        dst = shipped / name
        shutil.rmtree(dst, ignore_errors=True)
        for rel in files:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dst / rel)
        done = read_json(src / "done.json", "stage marker")
        manifest[name] = {"recipe": recipe, "stage": stage, "seconds": round(done["seconds"], 1),
                          "encoder_id": _encoder_id(src),
                          "files": {rel: sha256_file(dst / rel) for rel in files}}
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

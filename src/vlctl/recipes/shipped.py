"""The trained checkpoints shipped in the repository, so `make demo` starts from trained models.

Each is a finished training stage of a `--quick` preset (the CLIPs; 3vl-scenes' base and its three
LoRA fine-tunes; 3vl-lit's three seeds of both), or of a full preset named in FULL_PRESETS (the paper-size MAD CLIP, 80-110 min of
training on 2 cores, which tevi-mad's 5-seed protocol starts from), as the recipe itself wrote it (`done.json` with the stage key, `model/` with the
TinyCLIP weights and its encoder id, the training log; not the resume state), stored under
`checkpoints/<stage>-<key digest>/` at the repository's top level. `checkpoints/manifest.json` lists, per stage
directory, the recipe, the stage, how long it trained and the sha256 of every file; the runner
copies a stage from here only when its key and every hash match.

Refresh them after a change to a preset or an architecture (the test suite says when):
`vlctl reproduce all --quick --from-scratch --out runs/fresh` (and `vlctl reproduce mad-clip --from-scratch
--out runs/full` for the full CLIP) and then `python -m vlctl.recipes.shipped runs/fresh/stages runs/full/stages`
(each stage is taken from the first folder that has it finished; the shipped folder itself may be one).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path

from vlctl.fsops import VlctlError
from vlctl.io import atomic_write_json, read_json, sha256_file, sha256_json

# One setting says where they are: $VLCTL_CHECKPOINTS, else the repository's top-level checkpoints/
# beside src/ (a source checkout or an editable install). They live outside the package so that a
# wheel of vlctl does not carry 35 MB of weights; with no such folder every recipe trains its models.
CHECKPOINTS_ENV = "VLCTL_CHECKPOINTS"
SHIPPED = Path(os.environ.get(CHECKPOINTS_ENV) or Path(__file__).resolve().parents[3] / "checkpoints")
# recipe -> its module, whose `shipped_stage_keys(cfg, stages)` names the stages worth shipping
# (minutes of training each) and their keys, reading any upstream stage they are keyed by in `stages`.
TRAINED = {
    "mad-clip": "vlctl.recipes.tevi.mad_clip",
    "controlembed-shapes": "vlctl.recipes.controlembed.shapes",
    "3vl-scenes": "vlctl.recipes.threevl.scenes",
    "tevi-mad": "vlctl.recipes.tevi.mad",
    "3vl-lit": "vlctl.recipes.threevl.lit",
}
# recipe -> the full (not --quick) preset's stages shipped too. Only the MAD CLIP: tevi-mad's full train embeddings
# (60,000 x 18 x 2 float32, 8.6 MB) are recomputed from it in about 5 minutes, its training takes 80-110.
FULL_PRESETS = {"mad-clip": ("train",)}
MAX_FILE_BYTES = 10 * 1024 * 1024  # the full MAD CLIP: 2.42M float32 parameters, 9.7 MB


def stage_dir_name(name: str, key: dict) -> str:
    """`<name>-<first 12 hex of the hash of the stage name and key>`."""
    return f"{name}-{sha256_json({'stage': name, **key})[:12]}"


def expected_stages(stages: Path | None = None, **upstream: str) -> dict[str, tuple[str, str, dict]]:
    """Stage directory name -> (recipe, stage, key) of each stage shipped: the `--quick` presets',
    and FULL_PRESETS' of the full presets. Keys that depend on an earlier stage's output (3VL's
    fine-tunes: `trees`, the trees' digest) are given in `upstream` or read from that stage in `stages`."""
    out = {}
    for recipe, module in TRAINED.items():
        mod = importlib.import_module(module)  # by name: the recipes import the runner, which imports this
        for stage, key in mod.shipped_stage_keys(mod.load_preset(True), stages, **upstream).items():
            out[stage_dir_name(stage, key)] = (recipe, stage, key)
        full = mod.shipped_stage_keys(mod.load_preset(False), stages, **upstream) if recipe in FULL_PRESETS else {}
        for stage in FULL_PRESETS.get(recipe, ()):
            out[stage_dir_name(stage, full[stage])] = (recipe, stage, full[stage])
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
    # compared as hashed, like the directory name: a key's tuples are lists once written as JSON
    if sha256_json(read_json(src / "done.json", "shipped stage marker").get("key")) != sha256_json(key):
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


def shipped_trees_digest(shipped: Path = SHIPPED) -> str | None:
    """The trees digest the shipped 3VL fine-tunes were trained on (their keys' `trees`), None if none is shipped."""
    digests = {read_json(Path(shipped) / name / "done.json", "shipped stage marker")["key"]["trees"]
               for name, entry in shipped_manifest(shipped).items()
               if entry["recipe"] == "3vl-scenes" and entry["stage"].startswith("finetune_")}
    if len(digests) > 1:
        raise VlctlError(f"{shipped}: the shipped fine-tunes were trained on different trees {sorted(digests)}")
    return digests.pop() if digests else None


def ship(stages: Path | list[Path], shipped: Path = SHIPPED, **upstream: str) -> dict[str, dict]:
    """Copy the shipped presets' finished trained stages (`expected_stages`) from stage caches into
    `shipped` and rewrite its manifest; each stage from the first folder of `stages` that has it
    finished (`shipped` itself may be one: its stages are then kept as they are). Refuses when one
    is missing from all of them or a file is over MAX_FILE_BYTES. `upstream`: as in `expected_stages`."""
    folders = [Path(p) for p in ([stages] if isinstance(stages, (str, Path)) else stages)]
    shipped = Path(shipped)
    manifest = {}
    for name, (recipe, stage, _key) in expected_stages(folders[0], **upstream).items():
        src = next((f / name for f in folders if (f / name / "done.json").is_file()), None)
        if src is None:
            raise VlctlError(f"{folders[0] / name}: no finished {recipe} {stage} stage in "
                             f"{', '.join(map(str, folders))}")
        files = shipped_files(src)
        big = [rel for rel in files if (src / rel).stat().st_size > MAX_FILE_BYTES]
        if big:
            raise VlctlError(f"{src / big[0]}: over {MAX_FILE_BYTES >> 20} MB, too large to ship in the repository")
        dst = shipped / name
        if src.resolve() != dst.resolve():
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
    if len(sys.argv) < 2:
        sys.exit("usage: python -m vlctl.recipes.shipped STAGES_DIR [STAGES_DIR ...]")
    folders = [Path(a) for a in sys.argv[1:]]
    # 3VL's fine-tunes are keyed by their trees' digest: from a trees stage of the first folder, else (re-shipping
    # the shipped folder's own stages) the digest the shipped fine-tunes were trained on
    has_trees = any(folders[0].glob("trees-*/done.json"))
    digest = None if has_trees else shipped_trees_digest()
    upstream = {} if digest is None else {"trees": digest}
    for name, entry in ship(folders, **upstream).items():
        print(f"{name}: {entry['recipe']} {entry['stage']}, {entry['encoder_id']}")

"""Saved estimators: one directory format for every method (`vlctl.methods.base.Estimator`).

    DIR/
      config.json        {"format": "vlctl.estimator", "class": "SparseAutoencoder", "version": 1,
                          "config": {the resolved Config}, "encoder_id": "...", "state": {...}}
      <WEIGHTS_FILE>     safetensors of the fitted tensors (sae.safetensors, mask.safetensors, ...)
      ...                what the estimator adds (TEVI: its SAE in sae/; TreeTuner: adapters/, model/)

The directory is built under a temporary name and renamed into place (`vlctl.io.atomic_dir`), and
config.json is written last; it is the marker that lets a later save replace the directory: an
existing `DIR` that holds no saved estimator of the same class is refused unless --overwrite, and
then only the estimator's own entries are replaced. A class with REPLACES_DIR False (TreeTuner,
whose directory also holds its training run and the caller's files) writes its files and
subdirectories into `DIR` one by one, each atomically, removing config.json first and writing it
last, under the directory's lock. `load_estimator` refuses, with a VlctlError naming the file: a
directory of another class, a format version this vlctl does not read, an encoder id other than
the caller's (the embedding space the estimator was fitted in), a config with unknown fields, and
weights whose names, shapes or dtypes do not match the config. A directory written before this
format (no "format" key) is read through the class's `_legacy_document` when it knows the old
layout, else refused with a message saying how to refit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vlctl.config import config_from_dict, config_to_dict
from vlctl.fsops import VlctlError, locked, output_policy
from vlctl.io import atomic_dir, atomic_save_safetensors, atomic_write_json, read_json, recover_dir

FORMAT = "vlctl.estimator"
CONFIG_FILE = "config.json"

# How to refit each class, for the messages that refuse an unreadable directory.
REFIT = {
    "SparseAutoencoder": "vlctl fit sae",
    "TEVI": "vlctl fit tevi",
    "ControlEmbed": "vlctl fit controlembed",
    "TreeTuner": "vlctl fit tree",
}


def save_estimator(est: Any, path: str | Path) -> Path:
    """Write `est` (fitted) to directory `path`, atomically; returns the path."""
    cls = type(est)
    tensors, state, write_extra = est._artifact_state()
    doc = {
        "format": FORMAT,
        "class": cls.__name__,
        "version": cls.ARTIFACT_VERSION,
        "config": config_to_dict(est.config_),
        "encoder_id": est.encoder_id_,
        "state": state,
    }

    def write(d: Path) -> None:
        if cls.WEIGHTS_FILE is not None:
            atomic_save_safetensors(d / cls.WEIGHTS_FILE, tensors)
        if write_extra is not None:
            write_extra(d)
        atomic_write_json(d / CONFIG_FILE, doc)  # last

    path = Path(path)
    if cls.REPLACES_DIR:
        with atomic_dir(path, kind=(CONFIG_FILE, FORMAT, cls.__name__)) as tmp:
            write(tmp)
    else:  # each file or subdirectory atomically, other entries of `path` kept; config.json goes first and last
        with locked(path):
            cfg = path / CONFIG_FILE
            try:
                old = read_json(cfg) if cfg.is_file() else None
            except VlctlError:
                old = None
            ours = isinstance(old, dict) and old.get("format") == FORMAT and old.get("class") == cls.__name__
            if cfg.exists() and not ours and not output_policy().overwrite:
                raise VlctlError(f"{cfg}: exists and is not a saved {cls.__name__}; refusing to replace it (choose "
                                 "another output directory, or pass --overwrite)")
            path.mkdir(parents=True, exist_ok=True)
            cfg.unlink(missing_ok=True)
            write(path)
    return path


def read_document(cls: type, path: str | Path, encoder_id: str | None = None) -> tuple[dict, Path]:
    """config.json of a saved `cls` (or its legacy equivalent) -> (document, the file it came from),
    checked for format, class, version and encoder id."""
    path = Path(path)
    if not path.exists():
        recover_dir(path)  # a save killed between its two renames
    cfg_path = path / CONFIG_FILE
    name = cls.__name__
    refit = REFIT.get(name, "fit it again")
    doc = read_json(cfg_path, f"{name} config") if cfg_path.is_file() else None
    if doc is None or (isinstance(doc, dict) and "format" not in doc):
        legacy = cls._legacy_document(path)
        if legacy is None:
            if doc is None:
                read_json(cfg_path, f"{name} config")  # raises: not found
            raise VlctlError(f"{cfg_path}: written by an older vlctl in a layout this one does not read; refit with "
                             f"`{refit}`")
        doc, cfg_path = legacy
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise VlctlError(f"{cfg_path}: not a saved vlctl estimator (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("class") != name:
        other = doc.get("class")

        def made(cls: str) -> str:
            return f" (made by `{REFIT[cls]}`)" if cls in REFIT else ""

        raise VlctlError(f"{cfg_path}: holds a saved {other}{made(other)}, not a {name}{made(name)}")
    if doc.get("version") != cls.ARTIFACT_VERSION:
        raise VlctlError(f"{cfg_path}: {name} format version {doc.get('version')!r}, this vlctl reads version "
                         f"{cls.ARTIFACT_VERSION}; refit with `{refit}` (or use the vlctl that wrote it)")
    try:
        saved_id, _ = doc["encoder_id"], doc["config"]
    except KeyError as e:
        raise VlctlError(f"{cfg_path}: corrupt {name} config (missing {e})") from None
    if encoder_id is not None and encoder_id != saved_id:
        raise VlctlError(f"{cfg_path}: {name} was fitted on embeddings of encoder {saved_id!r}, not {encoder_id!r}; "
                         "its maps are meaningless in another encoder's space")
    return doc, cfg_path


def load_estimator(cls: type, path: str | Path, encoder_id: str | None = None, **kwargs: Any):
    """Load a saved `cls` from directory `path` (see the module docstring for what is refused)."""
    path = Path(path)
    doc, cfg_path = read_document(cls, path, encoder_id)
    try:
        config = config_from_dict(cls.Config, dict(doc["config"]), source=str(cfg_path))
    except (TypeError, ValueError) as e:
        raise VlctlError(f"{cfg_path}: corrupt {cls.__name__} config ({e})") from None
    tensors = read_weights(path / cls.WEIGHTS_FILE) if cls.WEIGHTS_FILE is not None else {}
    state = doc.get("state") or {}
    return cls._from_artifact(config, doc["encoder_id"], tensors, state, path, cfg_path=cfg_path, **kwargs)


def not_this_class(cls: type, cfg_path: Path) -> VlctlError:
    """The error for an older directory that is of another kind than `cls`."""
    return VlctlError(f"{cfg_path}: not a saved {cls.__name__} (an older vlctl's file of another kind); refit with "
                      f"`{REFIT.get(cls.__name__, 'fit it again')}`")


def read_weights(w_path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file -> {name: tensor}; VlctlError naming the file when missing or corrupt."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(w_path))
    except (OSError, SafetensorError) as e:
        raise VlctlError(f"{w_path}: cannot read weights ({e})") from None


def load_checked_state(module: nn.Module, state: dict, w_path: Path, cfg_path: Path) -> None:
    """Load `state` into `module` only if names, shapes and dtypes all match; else name both files."""
    expected = module.state_dict()
    bad = sorted(set(expected) ^ set(state)) + [
        f"{k} {list(state[k].shape)} vs {list(expected[k].shape)}"
        for k in sorted(set(expected) & set(state))
        if state[k].shape != expected[k].shape or state[k].dtype != expected[k].dtype
    ]
    if bad:
        raise VlctlError(f"{w_path}: weights do not match {cfg_path}: {bad}")
    module.load_state_dict(state)


def legacy_document(cls: type, cfg_path: Path, config: dict, encoder_id: str, state: dict) -> tuple[dict, Path]:
    """A current document for an older directory whose metadata the class has translated."""
    if not isinstance(config, dict):
        raise VlctlError(f"{cfg_path}: corrupt {cls.__name__} config (no config object)")
    return {"format": FORMAT, "class": cls.__name__, "version": cls.ARTIFACT_VERSION, "config": config,
            "encoder_id": encoder_id, "state": state}, cfg_path

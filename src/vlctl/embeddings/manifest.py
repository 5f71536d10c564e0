"""A store's manifest.json: what a new one holds, and reading one back checked.

See `vlctl.embeddings.store` for the layout it describes.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from vlctl.config import config_to_dict
from vlctl.embeddings.foreign import OLD_FORMATS, foreign_manifest, is_foreign, old_store_message
from vlctl.embeddings.search import IndexConfig
from vlctl.embeddings.table import MANIFEST
from vlctl.fsops import VlctlError
from vlctl.io import read_json, recover_dir

FORMAT = "vlctl.store/2"
REQUIRED = ("format", "encoder_id", "dim", "count", "generation", "shards", "index")
OLD_CACHE = "meta.json"  # the per-key embedding cache of vlctl 0.1 (image_emb.npy, text_emb.npy)
SPEC_KINDS = ("open_clip", "hf", "tiny")  # vlctl.encoders.factory.KINDS


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def absolute_spec(spec: str | None) -> str | None:
    """An encoder spec with its local path made absolute ("tiny:models/enc" -> "tiny:/home/u/models/enc"),
    so the store still finds its encoder when read from another directory. Specs naming no
    existing local path (a hub name, an OpenCLIP architecture) are kept as they are."""
    if not spec:
        return spec

    def absolute(p: str) -> str:
        path = Path(p).expanduser()
        return str(path.resolve()) if p and path.exists() else p

    kind, sep, rest = spec.partition(":")
    if not sep or kind not in SPEC_KINDS:
        return absolute(spec)  # a bare TinyCLIP directory
    body, q, query = rest.partition("?")
    if kind == "open_clip":
        model, slash, tag = body.partition("/")
        body = model + slash + absolute(tag) if slash else body
    else:
        body = absolute(body)
    return f"{kind}:{body}{q}{query}"


def new_manifest(encoder_id: str, dim: int, config: IndexConfig, encoder_spec: str | None, info: dict | None) -> dict:
    return {
        "format": FORMAT,
        "encoder_id": encoder_id,
        "encoder_spec": absolute_spec(encoder_spec),
        "dim": dim,
        "dtype": config.dtype,
        "count": 0,
        "generation": 0,
        "shards": [],
        "texts": {"count": 0, "shards": []},
        "index": {"config": config_to_dict(config), "trained": None, "parts": []},
        "info": dict(info or {}),
        "created": now(),
        "updated": now(),
    }


def read_manifest(path: Path, old: bool = False) -> dict:
    """The checked manifest of the store at `path` (see `open_store` for what is checked), or the
    one describing a clip-retrieval folder (`vlctl.embeddings.foreign`). A store directory that a
    killed swap left beside its name (`vlctl.io.recover_dir`) is put back first. A store of an
    older vlctl is refused with its converting command, unless `old` (the converter reads it)."""
    if not path.is_dir():
        recover_dir(path)
    if not path.is_dir():
        raise VlctlError(f"{path}: store directory not found")
    if is_foreign(path):
        return foreign_manifest(path)
    if not (path / MANIFEST).is_file():
        if (path / OLD_CACHE).is_file() and (path / "image_emb.npy").exists() | (path / "text_emb.npy").exists():
            raise VlctlError(
                f"{path}: an embedding cache of vlctl 0.1, not a store; convert it with "
                f"`python -m vlctl.embeddings.cache convert {path} NEW_STORE` (or embed the data again with `vlctl embed`)"
            )
        raise VlctlError(
            f"{path / MANIFEST}: store manifest not found (not a vlctl store nor a clip-retrieval folder "
            "with img_emb/, or its manifest was deleted; rebuild it with `vlctl embed` or `vlctl index`)"
        )
    manifest = read_json(path / MANIFEST, "store manifest")
    if not isinstance(manifest, dict) or any(k not in manifest for k in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(manifest, dict) or k not in manifest]
        raise VlctlError(f"{path / MANIFEST}: corrupt store manifest, missing field(s) {missing}")
    if manifest["format"] in OLD_FORMATS and not old:
        raise VlctlError(old_store_message(path, manifest["format"]))
    if manifest["format"] != FORMAT and manifest["format"] not in OLD_FORMATS:
        raise VlctlError(f"{path / MANIFEST}: format {manifest['format']!r}, this vlctl reads {FORMAT!r}")
    _check_shard_list(path / MANIFEST, manifest, "")
    texts = manifest.get("texts", {"count": 0, "shards": []})
    _check_shard_list(path / MANIFEST, texts, "texts.")
    if sum(s["rows"] for s in manifest["shards"]) != manifest["count"]:
        raise VlctlError(f"{path / MANIFEST}: shard rows do not add up to count={manifest['count']}")
    if sum(s["rows"] for s in texts["shards"]) != texts["count"]:
        raise VlctlError(f"{path / MANIFEST}: text shard rows do not add up to texts.count={texts['count']}")
    return manifest


def _check_shard_list(where: Path, part: object, prefix: str) -> None:
    """`count` an integer and `shards` a list of {"rows": integer, ...}, or one line naming the field."""
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(part, dict) or not is_int(part.get("count")):
        raise VlctlError(f"{where}: corrupt store manifest, field {prefix}count must be a non-negative integer")
    shards = part.get("shards")
    if not isinstance(shards, list) or not all(isinstance(x, dict) and is_int(x.get("rows")) for x in shards):
        raise VlctlError(f"{where}: corrupt store manifest, field {prefix}shards must be a list of "
                         '{"rows": integer, ...} entries')


def is_empty(manifest: dict) -> bool:
    """Nothing was ever added: no image row, no text row."""
    return manifest["count"] == 0 and not manifest.get("texts", {}).get("count") and manifest["generation"] == 0

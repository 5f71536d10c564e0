"""Building a store from a source: `embed_source` for any `ImageSource`, `index_images` for files,
`convert_store` for the stores of an older vlctl and clip-retrieval folders.

Adding is incremental: images the store already holds (by path, or by id for in-memory images)
are skipped, so re-running `vlctl embed` on a folder that grew embeds only the new files. Files
are committed `ExtractConfig.commit_every` new images at a time (`--commit-every`), so an
interrupted run keeps its finished batches and the same command embeds only the rest; except with
`strict` (which adds nothing when an image fails) and into an empty ivfpq store, whose quantisers
train on the first add's rows and so get the whole run at once. A finished run merges the index
parts of its commits into one (`Store.merge_index_parts`): a part per run, not per batch.

A run holds the store's lock (`vlctl.io.locked`) from opening it to its last commit: a second run into
the same store waits for the first (saying so), then reads the store as the first left it and adds
only what is still missing, so concurrent runs lose no row and add none twice. A first add that
fails (a bad index config, an interrupt) leaves no empty store behind to fix its config.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlctl.config import config_from_dict
from vlctl.embeddings.extract import embed_image_array, embed_image_files, embed_text_list
from vlctl.embeddings.extract_config import ExtractConfig
from vlctl.embeddings.foreign import OLD_FORMATS, is_foreign, old_tables
from vlctl.embeddings.manifest import read_manifest
from vlctl.embeddings.search import IndexConfig
from vlctl.embeddings.store import Store, create_store, discard_if_empty, open_or_create_store
from vlctl.embeddings.table import MANIFEST
from vlctl.fsops import VlctlError, fsync, locked, replace


@contextlib.contextmanager
def writing(out: str | os.PathLike, wait: bool | None = None) -> Iterator[None]:
    """Hold the lock of the store at `out` for the block (`wait`: as `vlctl.io.locked`); if the
    block created the store and fails, remove it again (nothing was added: it would only fix the
    failed run's encoder and config)."""
    with locked(out, wait=wait):
        created = not (Path(out) / MANIFEST).is_file()
        try:
            yield
        except BaseException:
            if created:
                discard_if_empty(out)
            raise


def embed_source(
    encoder: Any,
    source: Any,
    out: str | os.PathLike,
    index_config: IndexConfig | None = None,
    extract: ExtractConfig | None = None,
    encoder_spec: str | None = None,
    progress: bool = True,
    strict: bool = False,
) -> tuple[Store | None, dict]:
    """Embed an `vlctl.data.source.ImageSource` (images and their captions) into the store at `out`.

    Files and WebDataset samples go through `index_images` (incremental, torchrun-aware; `strict`
    as there; the source's own skipped files, `ImageSource.skipped`, join its failures). A
    generated set is embedded whole from its memory-mapped array, its labels becoming the rows'
    fields; a store already holding that set (same data id) is left as it is.
    """
    if source.array is None:
        if strict and source.skipped:
            raise VlctlError(f"{source.skipped[0][1]} (--strict stops at an unreadable image; nothing was added)")
        store, report = index_images(encoder, source.files, out, source.fields, index_config, extract, encoder_spec,
                                     progress, ids=source.ids, captions=source.captions, strict=strict)
        if source.skipped:
            report["failures"] = sorted(report["failures"] + [list(f) for f in source.skipped])
            report["failed"] = len(report["failures"])
        return store, report
    with writing(out):
        return _embed_array(encoder, source, out, index_config, extract or ExtractConfig(), encoder_spec, progress)


def _embed_array(encoder, source, out, index_config, extract, encoder_spec, progress) -> tuple[Store, dict]:
    info = {"data_id": source.data_id, "source": str(Path(source.name).resolve())}
    store = open_or_create_store(out, encoder.id, int(encoder.embed_dim), index_config, encoder_spec, info=info)
    report = {"added": 0, "already_present": 0, "failed": 0, "failures": [], "notes": [], "captions": 0}
    if len(store) or len(store.texts_table):
        if store.info.get("data_id") != source.data_id:
            raise VlctlError(f"{store.path}: the store holds other data ({store.info.get('data_id')!r}), not the "
                             f"generated set {source.name} ({source.data_id!r}); embed it into another --out")
        return store, {**report, "already_present": len(source), "count": len(store)}
    start = time.perf_counter()
    n, dim = len(source), int(encoder.embed_dim)
    image_emb = np.empty((n, dim), np.float32)
    embed_image_array(encoder, source.array, n, image_emb, extract.batch_size, progress)
    text_meta = [{"text": c, "image": i} for i, caps in enumerate(source.captions) for c in caps]
    text_emb = None
    if text_meta:
        text_emb = np.empty((len(text_meta), dim), np.float32)
        embed_text_list(encoder, [t["text"] for t in text_meta], text_emb, extract.batch_size, progress)
    meta = [{"row": i, **f, **({"captions": c} if c else {})} for i, (f, c) in enumerate(zip(source.fields, source.captions))]
    store = store.add(image_emb, meta, encoder_id=encoder.id, texts=text_emb, text_metadata=text_meta or None,
                      normalized=True)
    seconds = time.perf_counter() - start
    return store, {**report, "added": n, "captions": len(text_meta), "count": len(store), "seconds": round(seconds, 3),
                   "images_per_second": round(n / seconds, 2) if seconds > 0 else None, "world_size": 1}


def index_images(
    encoder: Any,
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    metadata: Sequence[dict] | None = None,
    index_config: IndexConfig | None = None,
    extract: ExtractConfig | None = None,
    encoder_spec: str | None = None,
    progress: bool = True,
    *,
    ids: Sequence[str] | None = None,
    captions: Sequence[Sequence[str]] | None = None,
    strict: bool = False,
) -> tuple[Store | None, dict]:
    """Embed images into the store at `out` (created if absent; otherwise only new images are added).

    Each row's metadata is {"path": the absolute path (or ids[i]), **metadata[i]}; with `captions`
    (a list per image), each caption of an added image becomes a text row {"text", "image": row}.
    `paths` may also hold in-memory encoded images (io.BytesIO, WebDataset samples); then `ids`
    names each one. Returns the store and a report: {"added", "already_present", "failed"
    (count), "failures" ([path, reason]), "notes" ([path, note]: the first of several frames
    used), "captions", "count", "seconds", "images_per_second"}. An unreadable image is skipped
    and listed in "failures"; with `strict`, it is an error instead and nothing is added.
    `extract.commit_every` new images go into each commit (module docstring).

    Under torchrun (a process group initialised, e.g. by `vlctl.train.distributed.init_distributed`)
    every rank embeds every world_size-th new image; rank 0 alone writes the gallery, with the
    rows in the same order a single process would give. Other ranks return (None, their report).

    Raises:
        VlctlError: an existing gallery of another encoder or index config, an encoder that does
        not produce `embed_dim` columns.
    """
    from vlctl.train.distributed import is_distributed

    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if is_distributed() else (0, 1)
    if ids is None:
        paths = [str(Path(p).resolve()) for p in paths]
        ids = paths
    for name, rows_ in (("metadata", metadata), ("ids", ids), ("captions", captions)):
        if rows_ is not None and len(rows_) != len(paths):
            raise VlctlError(f"index_images: {len(paths)} images but {len(rows_)} {name} rows")

    # Rank 0 alone writes. Under torchrun it waits for the lock even with --no-wait: failing alone,
    # before its verdict (below), would leave the other ranks waiting for it forever.
    with writing(out, wait=True if world > 1 else None) if rank == 0 else contextlib.nullcontext():
        return _index(encoder, paths, ids, out, metadata, index_config, extract, encoder_spec, progress, captions,
                      rank, world, strict)


def _index(encoder, paths, ids, out, metadata, index_config, extract, encoder_spec, progress, captions, rank, world,
           strict):
    from vlctl.train.distributed import all_gather_object

    # Rank 0 opens the gallery; its verdict (or error) reaches every rank, so none waits forever
    # in a collective after another has failed.
    gallery, state = None, None
    if rank == 0:
        try:
            gallery = open_or_create_store(
                out, encoder.id, int(encoder.embed_dim), index_config, encoder_spec=encoder_spec
            )
            present = {m.get("path") for m in gallery.metadata()} if len(gallery) else set()
            todo = [i for i, p in enumerate(ids) if p not in present]
            whole = strict or (gallery.config.kind == "ivfpq" and not len(gallery))  # one commit (docstring)
            state = {"todo": todo, "batch": max(len(todo), 1) if whole else (extract or ExtractConfig()).commit_every}
            first_part = len(gallery.manifest["index"].get("parts", []))  # this run's parts merge at its end
        except VlctlError as e:
            state = {"error": str(e)}
    state = all_gather_object(state)[0]
    if "error" in state:
        raise VlctlError(state["error"])
    todo: list[int] = state["todo"]

    added, failures, notes, seconds, n_captions = 0, [], [], 0.0, 0
    for start in range(0, len(todo), state["batch"]):
        part = _embed_part(encoder, paths, todo[start:start + state["batch"]], extract, progress, out, rank, world)
        if rank != 0:
            added, failures = added + len(part["rows"]), failures + part["failures"]
            continue
        failures, notes, seconds = failures + part["failures"], notes + part["notes"], seconds + part["seconds"]
        if strict and failures:
            _, reason = failures[0]
            raise VlctlError(f"{reason} (--strict stops at an unreadable image: {len(failures)} of {len(todo)} "
                             "were; nothing was added)")
        gallery, n = _commit(gallery, encoder, part["rows"], part["embeddings"], ids, metadata, captions, extract,
                             progress)
        added, n_captions = added + len(part["rows"]), n_captions + n
    if rank != 0:
        return None, {"rank": rank, "embedded": added, "failed": len(failures)}
    gallery = gallery.merge_index_parts(first_part)
    report = {
        "added": added,
        "already_present": len(paths) - len(todo),
        "failed": len(failures),
        "failures": [list(f) for f in failures],
        "notes": [list(f) for f in notes],
        "captions": n_captions,
        "count": len(gallery),
        "seconds": round(seconds, 3),
        "images_per_second": round(added / seconds, 2) if seconds > 0 else None,
        "world_size": world,
    }
    return gallery, report


def _embed_part(encoder, paths, todo, extract, progress, out, rank, world) -> dict:
    """Embed the images `todo` (indices into `paths`), each rank every world_size-th: on rank 0
    {"rows", "embeddings", "failures", "notes", "seconds"} of them all, in the single-process order;
    on the other ranks its own rows and failures."""
    from vlctl.train.distributed import all_gather_object

    mine = todo[rank::world]
    result = embed_image_files(encoder, [paths[i] for i in mine], extract, progress=progress and rank == 0)
    rows = [mine[r] for r in result.ok]
    embeddings, failures, notes, seconds = result.embeddings, result.failures, result.notes, result.seconds
    if world > 1:
        # Embeddings travel through files: pickling gigabytes through gloo would double memory.
        part = Path(out).parent / f".{Path(out).name}.rank{rank}.npy"
        part.parent.mkdir(parents=True, exist_ok=True)
        tmp = part.with_name(part.name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, embeddings)
            fsync(f)
        replace(tmp, part)
        parts = all_gather_object({"rows": rows, "failures": failures, "notes": notes, "file": str(part),
                                   "seconds": seconds})
        if rank != 0:
            return {"rows": rows, "failures": failures}
        rows = [r for p in parts for r in p["rows"]]
        position = {str(p): i for i, p in enumerate(paths)}
        failures = sorted((f for p in parts for f in p["failures"]), key=lambda f: position[f[0]])
        notes = sorted((f for p in parts for f in p["notes"]), key=lambda f: position[f[0]])
        embeddings = np.concatenate([np.load(p["file"]) for p in parts]) if rows else embeddings
        for p in parts:
            Path(p["file"]).unlink(missing_ok=True)
        order = np.argsort(rows, kind="stable")  # the single-process row order
        rows, embeddings = [rows[i] for i in order], embeddings[order]
        seconds = max(p["seconds"] for p in parts)
    return {"rows": rows, "embeddings": embeddings, "failures": failures, "notes": notes, "seconds": seconds}


def _commit(gallery, encoder, rows, embeddings, ids, metadata, captions, extract, progress) -> tuple[Store, int]:
    """Add the images `rows` (indices into `ids`) and their captions to `gallery` in one commit;
    returns the store after it and the number of captions added."""
    if not rows:
        return gallery, 0
    meta = [{"path": ids[i], **(metadata[i] if metadata is not None else {})} for i in rows]
    text_emb, text_meta = None, None
    if captions is not None:
        text_meta = [{"text": c, "image": len(gallery) + r} for r, i in enumerate(rows) for c in captions[i]]
        if text_meta:
            text_emb = np.empty((len(text_meta), int(encoder.embed_dim)), np.float32)
            embed_text_list(encoder, [t["text"] for t in text_meta], text_emb, (extract or ExtractConfig()).batch_size,
                            progress)
        for r, i in enumerate(rows):
            if captions[i]:
                meta[r]["captions"] = list(captions[i])
    gallery = gallery.add(embeddings, meta, encoder_id=encoder.id, texts=text_emb, text_metadata=text_meta or None)
    return gallery, len(text_meta or ())



def convert_store(src: str | os.PathLike, out: str | os.PathLike, config: IndexConfig | None = None) -> Store:
    """A new store at `out` holding the rows of `src`, which is read and never changed: a store of
    an older vlctl (emb-*.npy + meta-*.jsonl) or a clip-retrieval folder (its captions, if it has
    text_emb/, become text rows of their images). One add per source shard, so memory holds one
    shard; `config` (default: the old store's index config, or "none" for a folder) indexes it."""
    src = Path(src)
    with writing(out):
        if is_foreign(src):
            folder = Store(src)
            cfg = config or IndexConfig(kind="none", dtype=folder.config.dtype)
            store = create_store(out, folder.encoder_id, folder.dim, cfg, folder.encoder_spec, info=folder.info)
            table = folder.images_table
            for s, arr in enumerate(table._arrays):
                ids = np.arange(table._offsets[s], table._offsets[s + 1])
                meta = table.metadata(ids)
                texts, text_meta = None, None
                if len(folder.texts_table):
                    texts = folder.texts_table._arrays[s]
                    text_meta = [{"text": m.get("caption") or "", "image": int(i)} for m, i in zip(meta, ids)]
                store = store.add(arr, meta, texts=texts, text_metadata=text_meta)  # unit norm here, not fp16-rounded
            return store.merge_index_parts(0)
        manifest = read_manifest(src, old=True)
        if manifest["format"] not in OLD_FORMATS:
            raise VlctlError(f"{src}: already a store of this vlctl ({manifest['format']}); nothing to convert")
        cfg = config or config_from_dict(IndexConfig, manifest["index"]["config"], source=str(src / MANIFEST))
        store = create_store(out, manifest["encoder_id"], int(manifest["dim"]), cfg, manifest.get("encoder_spec"),
                             info=manifest.get("info"))
        for what, emb, meta in old_tables(src, manifest):
            if what == "image":
                store = store.add(emb, meta, normalized=True)
            else:
                store = store.add(None, texts=emb, text_metadata=meta, normalized=True)
        return store.merge_index_parts(0)

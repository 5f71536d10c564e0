"""What the real-data recipes share: the encoder they run, the embedding stage, its cache check
and the one-line estimate printed before each heavy stage.

Stage keys. Every embedding stage is keyed by the encoder spec (canonical: absolute paths, seed),
a hash of the data (the annotation files' sha256, the image root, the image list) and the
extraction settings that change the numbers (precision). The stage records the encoder's `id`
(architecture + a hash of its weights); a rerun whose encoder has another id under the same key
(a checkpoint file retrained in place) is refused, naming both ids, never silently reused.

Under torchrun the embedding stage is sharded: rank r embeds images (and texts) r, r + N, ...
(`vlctl.train.distributed.shard_rows`), writes its rows to a file in the stage's `.partial/`
directory, and rank 0 puts them back in the single-process order and writes the stage; the
result equals the one-process run (to float rounding of the batched forward pass, <= 1e-6).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.config import opt
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_json, read_json, sha256_file, sha256_json
from vlctl.progress import say

# A caption costs about a quarter of an image to embed (a text tower of a ViT-B CLIP; measured on CPU).
TEXT_COST = 0.25
RANDOM_WEIGHTS_NOTE = (
    "The encoder has RANDOM weights: every number in this report is meaningless as a result; the run checks "
    "the mechanics (stages, caches, keys, report) only."
)


@dataclasses.dataclass(frozen=True)
class EncoderRun:
    """How a real recipe runs its encoder (the same for every stage)."""

    device: str = opt("cpu", "torch device of the encoder and of every training stage", check="device")
    precision: str = opt("fp32", "'fp32', or 'bf16' / 'fp16' autocast (GPU) for embedding and training",
                         choices=("fp32", "bf16", "fp16"))
    batch_size: int = opt(256, "images / captions per forward pass when embedding", ge=1, le=65536)
    workers: int = opt(0, "DataLoader processes decoding images (0 = in the main process)", ge=0, le=256)
    embed_chunk: int = opt(50_000, "images per saved chunk of an embedding stage: a killed stage resumes after "
                           "its last saved chunk", ge=1, le=10**9)


def is_random(encoder_id: str) -> bool:
    return "/random-seed" in encoder_id


def rank_device(device: str) -> str:
    """`device` for this process: under torchrun, "cuda" means this rank's GPU (LOCAL_RANK)."""
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def is_main_rank() -> bool:
    """Rank 0 under torchrun (or the only process): the one that writes and prints."""
    from vlctl.train.distributed import is_main

    return is_main()


def say_main(line: str) -> None:
    if is_main_rank():
        say(line)


def load_encoder(spec: str, run: EncoderRun):
    from vlctl.encoders.factory import create

    return create(spec, device=rank_device(run.device), precision=run.precision, batch_size=run.batch_size)


class LazyEncoder:
    """The encoder, built on first use: a rerun whose stages are all cached only builds it to
    check the cached stages' encoder id (cheap next to embedding)."""

    def __init__(self, spec: str, run: EncoderRun):
        self.spec, self.run, self._enc = spec, run, None

    def get(self):
        if self._enc is None:
            t0 = time.perf_counter()
            self._enc = load_encoder(self.spec, self.run)
            say_main(f"encoder {self._enc.id} loaded in {time.perf_counter() - t0:.1f} s")
        return self._enc

    @property
    def canonical_spec(self) -> str:
        return getattr(self.get(), "spec", None) or self.spec


def data_hash(files: Sequence[Path | None], images: Sequence[str], root: Path | None) -> str:
    """sha256 over the annotation files' contents, the image root and the image list (16 hex)."""
    parts = [sha256_file(f) if f is not None and Path(f).is_file() else None for f in files]
    return sha256_json([parts, str(Path(root).resolve()) if root else None, list(images)])[:16]


def check_stage_encoder(stage: Path, encoder_id: str) -> None:
    """Refuse a cached stage computed by another encoder (both ids named)."""
    rec = read_json(stage / "encoder.json", "stage encoder record")
    if rec.get("encoder_id") != encoder_id:
        raise VlctlError(
            f"{stage}: cached stage was computed with encoder {rec.get('encoder_id')!r}, but the encoder now is "
            f"{encoder_id!r} (same spec, other weights); refusing to mix them: rerun with --force, or another --stages")


def _peak_bytes(device: Any) -> int | None:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    return None


def _model_bytes(encoder: Any) -> int:
    model = getattr(encoder, "model", encoder)
    try:
        return int(sum(p.numel() * p.element_size() for p in model.parameters()))
    except AttributeError:
        return 0


def estimate_line(what: str, n: int, rate: float, bytes_resident: int, unit: str = "images") -> None:
    """The one line printed before a heavy stage: work, estimated time and memory."""
    eta = n / rate if rate > 0 else float("inf")
    say_main(f"{what}: {n} {unit}, about {eta:.0f} s at {rate:.1f} {unit}/s (measured), "
        f"about {bytes_resident / 2**30:.2f} GiB")


def embed_files_and_texts(encoder: Any, paths: Sequence[Path], texts: Sequence[str], run: EncoderRun,
                          what: str, probe: int = 16, rank: int = 0, world_size: int = 1
                          ) -> tuple[np.ndarray, np.ndarray, list]:
    """(image embeddings, text embeddings, failures) of this rank's shard (`shard_rows`; all rows
    in one process): float32, unit norm; failures are (path, reason) of images that did not decode.

    The first `probe` images are embedded first and timed; the estimate line for the whole stage
    is printed from that rate (times the ranks), then the rest is embedded (the probe's rows are
    kept, not redone).
    """
    from vlctl.embeddings.extract import embed_image_files, embed_text_list
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.train.distributed import shard_rows

    extract = ExtractConfig(batch_size=min(run.batch_size, 4096), workers=run.workers)
    n_all, m_all = len(paths), len(texts)
    paths = [Path(paths[i]) for i in shard_rows(n_all, rank, world_size)]
    texts = [texts[i] for i in shard_rows(m_all, rank, world_size)]
    d = int(encoder.embed_dim)
    parts, failures = [], []
    k = min(probe, len(paths))
    t0 = time.perf_counter()
    if k:
        res = embed_image_files(encoder, paths[:k], extract, progress=False, precision=run.precision)
        parts.append(res.embeddings)
        failures += res.failures
    rate = k / max(time.perf_counter() - t0, 1e-9) * world_size
    peak = _peak_bytes(rank_device(run.device)) or _model_bytes(encoder)
    if rank == 0:
        ranks = f" over {world_size} ranks" if world_size > 1 else ""
        say(f"{what}: {n_all} images + {m_all} texts{ranks}, about "
            f"{(n_all - k * world_size + m_all * TEXT_COST) / max(rate, 1e-9):.0f} s more at {rate:.1f} images/s (measured "
            f"on the first {k}), about {(peak + (n_all + m_all) * d * 4) / 2**30:.2f} GiB")
    if len(paths) > k:
        res = embed_image_files(encoder, paths[k:], extract, progress=rank == 0, precision=run.precision)
        parts.append(res.embeddings)
        failures += res.failures
    img = np.concatenate(parts) if parts else np.zeros((0, d), np.float32)
    txt = np.zeros((len(texts), d), np.float32)
    if texts:
        embed_text_list(encoder, list(texts), txt, extract.batch_size, progress=rank == 0, precision=run.precision)
    return img, txt, [(str(p), r) for p, r in failures]


def _raise_failures(what: str, failures: list) -> None:
    if failures:
        shown = "; ".join(f"{p}: {r}" for p, r in failures[:5])
        raise VlctlError(f"{what}: {len(failures)} image(s) could not be read: {shown}")


def embed_sharded(encoder: Any, paths: Sequence[Path], texts: Sequence[str], run: EncoderRun, what: str,
                  work: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Every rank embeds its shard; rank 0 returns (image_emb, text_emb) of all rows in the
    single-process order, the other ranks None. The shards travel through files in `work` (the
    stage's `.partial/`, the same path on every rank): pickling gigabytes through gloo would
    double the memory. Any rank's unreadable image fails the stage on every rank."""
    from vlctl.train.distributed import all_gather_object, rank_and_world, unshard

    rank, world = rank_and_world()
    img, txt, failures = embed_files_and_texts(encoder, paths, texts, run, what, rank=rank, world_size=world)
    if world == 1:
        _raise_failures(what, failures)
        return img, txt
    part = work / f".shard-rank{rank}.npz"
    if not failures:
        atomic_save_npz(part, image_emb=img, text_emb=txt)
    every = [f for fs in all_gather_object(failures) for f in fs]
    _raise_failures(what, sorted(every))
    if rank != 0:
        return None
    shards = [dict(np.load(work / f".shard-rank{r}.npz")) for r in range(world)]
    d = int(encoder.embed_dim)
    img = unshard([s["image_emb"] for s in shards], len(paths)).astype(np.float32).reshape(len(paths), d)
    txt = unshard([s["text_emb"] for s in shards], len(texts)).astype(np.float32).reshape(len(texts), d)
    for r in range(world):
        (work / f".shard-rank{r}.npz").unlink()
    return img, txt


def embed_stage(runner: Any, name: str, lazy: LazyEncoder, key: dict, paths: Sequence[Path], texts: Sequence[str],
                run: EncoderRun, extra: dict[str, np.ndarray] | Callable[[], dict] | None = None) -> Path:
    """A cached stage holding embeddings.npz (image_emb, text_emb, **extra) and encoder.json.
    `extra`: more arrays, or a function returning them (called only when the stage is computed).

    The rows are embedded `run.embed_chunk` images (and the same share of the texts) at a time, each
    chunk saved under the stage's `.partial/checkpoint/` with a state.json naming the chunks done and
    the encoder id: a stage killed after hours of a CC12M-size embedding resumes at its first chunk
    not saved (of the same encoder), instead of starting over."""

    def compute(work: Path, resume: bool) -> None:
        from vlctl.train.distributed import barrier

        enc = lazy.get()
        ck = work / "checkpoint"
        n_chunks = max(1, -(-len(paths) // run.embed_chunk))
        per_text = -(-len(texts) // n_chunks)
        state = read_json(ck / "state.json", "embedding checkpoint") if resume else {}
        done = state.get("chunks", 0) if state.get("encoder_id") == enc.id and state.get("of") == n_chunks else 0
        if done:
            say_main(f"stage {name}: {done} of {n_chunks} chunks embedded before the kill; going on from there")
        for c in range(done, n_chunks):
            what = f"stage {name}" + (f" (chunk {c + 1}/{n_chunks})" if n_chunks > 1 else "")
            got = embed_sharded(enc, paths[c * run.embed_chunk:(c + 1) * run.embed_chunk],
                                texts[c * per_text:(c + 1) * per_text], run, what, work)
            if got is not None:  # rank 0 holds the chunk; the others' parts are in it
                atomic_save_npz(ck / f"chunk-{c:05d}.npz", image_emb=got[0], text_emb=got[1])
                atomic_write_json(ck / "state.json", {"chunks": c + 1, "of": n_chunks, "encoder_id": enc.id})
            barrier()
        if not is_main_rank():
            return
        parts = [dict(np.load(ck / f"chunk-{c:05d}.npz")) for c in range(n_chunks)]
        more = extra() if callable(extra) else (extra or {})
        atomic_save_npz(work / "embeddings.npz", image_emb=np.concatenate([p["image_emb"] for p in parts]),
                        text_emb=np.concatenate([p["text_emb"] for p in parts]), **more)
        atomic_write_json(work / "encoder.json", {"encoder_id": enc.id, "spec": lazy.canonical_spec})
        shutil.rmtree(ck)  # embeddings.npz replaces the chunks

    stage = runner.stage(name, {"encoder": lazy.canonical_spec, "precision": run.precision, **key}, compute,
                         resumable=True, distributed=True)
    check_stage_encoder(stage, lazy.get().id)
    return stage


def load_embeddings(stage: Path) -> dict[str, np.ndarray]:
    with np.load(stage / "embeddings.npz") as z:
        return {k: z[k] for k in z.files}


def report_header(rep: Any, encoder_id: str, spec: str, machine_note: str = "") -> None:
    """The lines every real report starts with: the encoder, and the random-weights warning."""
    rep.text(f"Encoder `{spec}` (id `{encoder_id}`). {machine_note}".strip())
    if is_random(encoder_id):
        rep.heading("Random weights")
        rep.text(RANDOM_WEIGHTS_NOTE)


def threads_for_cpu(run: EncoderRun) -> None:
    """On CPU, use the threads the machine gives (OMP_NUM_THREADS, else torch's default)."""
    import torch

    if run.device == "cpu" and os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))

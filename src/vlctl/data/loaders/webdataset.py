"""WebDataset tar shards (img2dataset's output), streamed."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from vlctl.data.loaders.common import (
    _SHOW,
    IMAGE_EXTENSIONS,
)
from vlctl.fsops import VlctlError
from vlctl.io import gc_paused


@dataclasses.dataclass(frozen=True)
class WebDatasetSample:
    """One sample of a WebDataset shard: the files sharing a key, e.g. 000000042.{jpg,txt,json}.

    image: the encoded image bytes (decode with `vlctl.embeddings.extract.read_image(io.BytesIO(...))`),
    None if the sample has no image file; image_ext: "jpg" / "png" / "webp" ...; caption: the
    .txt file (UTF-8), None if absent; meta: the parsed .json file ({} if absent).
    """

    key: str
    shard: str
    image: bytes | None
    image_ext: str | None
    caption: str | None
    meta: dict


def expand_shards(spec: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Shard paths from a list, a glob ("data/*.tar") or WebDataset braces ("data/{00000..00031}.tar")."""
    import glob
    import re

    if isinstance(spec, (list, tuple)):
        return [Path(p) for p in spec]
    s = str(spec)
    m = re.search(r"\{(\d+)\.\.(\d+)\}", s)
    if m:
        lo, hi, width = int(m.group(1)), int(m.group(2)), len(m.group(1))
        return [p for i in range(lo, hi + 1) for p in expand_shards(s[: m.start()] + f"{i:0{width}d}" + s[m.end() :])]
    if any(c in s for c in "*?["):
        found = sorted(glob.glob(s))
        if not found:
            raise VlctlError(f"{s}: no WebDataset shards match this pattern")
        return [Path(p) for p in found]
    return [Path(s)]


def _existing_shards(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """The shard paths, all missing ones named before any is read."""
    paths = expand_shards(shards)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(missing[:_SHOW]) + (f", ... ({len(missing) - _SHOW} more)" if len(missing) > _SHOW else "")
        raise VlctlError(f"{len(missing)} of {len(paths)} WebDataset shards not found: {shown}")
    return paths


def iter_webdataset(shards: str | os.PathLike | Sequence[str | os.PathLike]) -> Iterator[WebDatasetSample]:
    """Stream the samples of WebDataset tar shards in order, one shard open at a time.

    WebDataset's convention: a sample is the run of consecutive tar members whose basenames share
    the part before the first "."; the rest is the extension ("jpg", "txt", "json"). Images are
    the first member with an image extension. Nothing is extracted to disk.

    Raises:
        VlctlError: a missing shard (all missing ones are named before any is read), a corrupt
        tar or .json member (naming the shard and member).
    """
    import tarfile

    paths = _existing_shards(shards)
    for shard in paths:
        current: str | None = None
        files: dict[str, bytes] = {}
        try:
            with tarfile.open(shard, mode="r|*") as tar:  # streaming: members in file order
                for member in tar:
                    if not member.isfile():
                        continue
                    base = member.name.rsplit("/", 1)
                    prefix = base[0] + "/" if len(base) == 2 else ""
                    stem, _, ext = base[-1].partition(".")
                    key = prefix + stem
                    if key != current:
                        if current is not None:
                            yield _wds_sample(current, shard, files)
                        current, files = key, {}
                    f = tar.extractfile(member)
                    files[ext.lower()] = f.read() if f is not None else b""
            if current is not None:
                yield _wds_sample(current, shard, files)
        except tarfile.TarError as e:
            raise VlctlError(f"{shard}: corrupt WebDataset shard after sample {current!r} ({e})") from None


def _wds_sample(key: str, shard: Path, files: dict[str, bytes]) -> WebDatasetSample:
    ext = next((e for e in files if "." + e in IMAGE_EXTENSIONS), None)
    meta: dict = {}
    if "json" in files:
        try:
            meta = json.loads(files["json"].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise VlctlError(f"{shard}: member {key}.json is not valid JSON ({e})") from None
    caption = files["txt"].decode("utf-8", errors="replace").strip() if "txt" in files else None
    return WebDatasetSample(key, str(shard), files.get(ext) if ext else None, ext, caption, meta)




@gc_paused
def unpack_webdataset(shards: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike,
                      progress: bool = True) -> tuple[list[Path], list[str], list[Path]]:
    """The image-and-caption samples of WebDataset shards as files: (image paths, captions, the
    per-shard manifests), for stages that read image files. Samples without an image or a caption
    (img2dataset's failed downloads) are left out.

    Each shard unpacks into OUT/<16 hex of its path, size and mtime>/, finished by a `pairs.json`
    manifest written last: a rerun reads the manifests of finished shards without opening their
    tars (a killed unpack resumes at the first shard without one), and shards that changed, or
    another shard set, never reuse another's images. The images are renamed into place unsynced,
    and synced once per shard before its manifest, so a million small files do not cost a million
    fsyncs.
    """
    import hashlib

    from vlctl.io import atomic_write_json, read_json
    from vlctl.progress import progress_bar

    paths, caps, manifests = [], [], []
    shard_paths = _existing_shards(shards)
    with progress_bar(total=len(shard_paths), desc="unpacking WebDataset shards", unit="shards",
                      disable=not progress) as bar:
        for shard in shard_paths:
            st = shard.stat()
            tag = hashlib.sha256(repr((str(shard.resolve()), st.st_size, st.st_mtime_ns)).encode())
            d = Path(out) / tag.hexdigest()[:16]
            manifest = d / "pairs.json"
            if not manifest.is_file():
                d.mkdir(parents=True, exist_ok=True)
                pairs = []
                for s in iter_webdataset([shard]):
                    if s.image is None or not s.caption:
                        continue
                    name = f"{len(pairs):09d}.{s.image_ext or 'jpg'}"
                    tmp = d / f".{name}.tmp"
                    tmp.write_bytes(s.image)
                    os.replace(tmp, d / name)
                    pairs.append([name, s.caption])
                os.sync()  # the images on disk before the manifest that vouches for them
                atomic_write_json(manifest, {"shard": str(shard), "pairs": pairs})
            for name, caption in read_json(manifest, "unpacked shard manifest")["pairs"]:
                paths.append(d / name)
                caps.append(caption)
            manifests.append(manifest)
            bar.update(1)
    return paths, caps, manifests

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

    paths = expand_shards(shards)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(missing[:_SHOW]) + (f", ... ({len(missing) - _SHOW} more)" if len(missing) > _SHOW else "")
        raise VlctlError(f"{len(missing)} of {len(paths)} WebDataset shards not found: {shown}")
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



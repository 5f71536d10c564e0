"""Any image collection a user points vlctl at, read the same way: `open_source(SOURCE)`.

    photos/                          a folder of image files (recursive), captions and attribute
                                     columns from `annotations` (CSV / TSV / JSONL) if given
    captions.csv | .tsv | .jsonl     a table of image path + caption (paths relative to the table)
    shards-{000..009}.tar | a.tar    WebDataset shards (key.jpg + key.txt + key.json)
    data/mad-train/                  a generated set (vlctl data mad | shapes | scenes)

Every form gives the same `ImageSource`: the images (files, encoded bytes, or an array), the
captions of each image and its fields (attributes, ids), so `vlctl embed` writes one store
whatever the source.
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path
from typing import Any

from vlctl.fsops import VlctlError
from vlctl.io import read_json

GENERATED_FORMATS = ("vlctl-mad", "vlctl-shapes", "vlctl-scenes")
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")


@dataclasses.dataclass(frozen=True)
class ImageSource:
    """Images to embed, with their captions and fields.

    Attributes:
        name: the source as the user named it.
        kind: "folder", "table", "webdataset" or "generated".
        files: (n,) image files (absolute paths) or in-memory encoded images (io.BytesIO), or
            None for a generated set.
        array: a generated set's (n, H, W, 3) uint8 read-only memmap, else None.
        ids: (n,) a stable name per image, the store's duplicate check: the absolute path, the
            WebDataset "shard#key", or the generated set's row number.
        captions: (n,) the captions of each image ([] for none).
        fields: (n,) dicts of per-image fields: attribute columns, labels of a generated set.
        data_id: a generated set's content id (vlctl.data.mad.mad_dataset_id); None otherwise.
        missing: annotated image files that were not found (and were skipped).
        skipped: (path, reason) of a folder's files that look like images but are not read
            (`vlctl.data.loaders.folder.folder_extras`): listed with the unreadable images.
    """

    name: str
    kind: str
    files: list | None
    array: Any
    ids: list[str]
    captions: list[list[str]]
    fields: list[dict]
    data_id: str | None = None
    missing: list[str] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def _generated_format(path: Path) -> str | None:
    meta_file = path / "meta.json"
    if not (path.is_dir() and meta_file.is_file() and (path / "images.npy").is_file()):
        return None
    meta = read_json(meta_file, "generated set meta.json")
    fmt = meta.get("format", "vlctl-mad") if isinstance(meta, dict) else None
    return fmt if fmt in GENERATED_FORMATS else None


def open_source(
    source: str | os.PathLike,
    annotations: str | os.PathLike | None = None,
    image_column: str | None = None,
    caption_column: str | None = None,
    on_missing: str = "error",
) -> ImageSource:
    """Read `source` (see the module docstring for the forms).

    Raises:
        VlctlError naming the file: a source that does not exist or is none of the forms, a table
        without an image column, annotated files that are missing (unless on_missing="skip").
    """
    text = str(source)
    path = Path(source)
    if "{" in text or path.suffix == ".tar":
        return _webdataset(text, annotations)
    if not path.exists():
        raise VlctlError(f"{path}: source not found (a folder of images, a CSV/TSV/JSONL of image and caption, "
                         "WebDataset .tar shards, or a generated set)")
    fmt = _generated_format(path) if path.is_dir() else None
    if fmt is not None:
        if annotations is not None:
            raise VlctlError(f"{annotations}: a generated set carries its own labels; --annotations is for folders")
        return _generated(path, fmt)
    from vlctl.data.loaders.folder import folder_extras, load_caption_table, load_image_folder

    skipped: list[tuple[str, str]] = []
    if path.is_dir():
        data = load_image_folder(path, annotations, image_column, caption_column, on_missing)
        kind = "folder"
        skipped = folder_extras(path)
    elif path.suffix.lower() in TABLE_SUFFIXES:
        if annotations is not None:
            raise VlctlError(f"{annotations}: the source {path} is itself the annotation table; drop --annotations")
        data = load_caption_table(path, None, image_column, caption_column, on_missing=on_missing)
        kind = "table"
    else:
        raise VlctlError(f"{path}: not a folder, a {'/'.join(TABLE_SUFFIXES)} table or a .tar shard")
    files = [str(p.resolve()) for p in data.image_paths()]
    fields = [{"relpath": rel, **f} for rel, f in zip(data.images, data.image_fields)]
    return ImageSource(text, kind, files, None, files, data.captions_by_image(), fields, None, list(data.missing),
                       skipped)


def _generated(path: Path, fmt: str) -> ImageSource:
    if fmt == "vlctl-scenes":
        from vlctl.data.scenes import load_scenes, scenes_dataset_id

        data, data_id = load_scenes(path), scenes_dataset_id(path)
    else:
        from vlctl.data.mad import load_mad, mad_dataset_id

        data, data_id = load_mad(path), mad_dataset_id(path)
    labels = data["labels"]
    captions = [[lab["caption"]] if isinstance(lab.get("caption"), str) else [] for lab in labels]
    fields = [{k: v for k, v in lab.items() if k != "caption"} for lab in labels]
    return ImageSource(str(path), "generated", None, data["images"], [str(i) for i in range(len(labels))],
                       captions, fields, data_id)


def _webdataset(spec: str, annotations: str | os.PathLike | None) -> ImageSource:
    from vlctl.data.loaders.webdataset import iter_webdataset

    if annotations is not None:
        raise VlctlError(f"{annotations}: WebDataset samples carry their own captions (.txt) and fields (.json)")
    files, ids, captions, fields = [], [], [], []
    for s in iter_webdataset(spec):
        if s.image is None:
            continue  # a text-only sample
        files.append(io.BytesIO(s.image))
        ids.append(f"{Path(s.shard).resolve()}#{s.key}")
        captions.append([s.caption] if s.caption else [])
        fields.append({"key": s.key, "shard": str(Path(s.shard).resolve()), **s.meta})
    if not files:
        raise VlctlError(f"{spec}: no samples with an image in the WebDataset shards")
    return ImageSource(spec, "webdataset", files, None, ids, captions, fields)

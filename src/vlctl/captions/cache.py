"""The JSONL cache of 3VL caption trees (`vlctl.captions.trees.TreeGenerator(cache_path=...)`)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from vlctl.fsops import VlctlError


class TreeCache:
    """Trees on disk as JSON lines {"key", "caption", "tree"}, one per caption and settings.

    The key hashes the generator version, seed, settings fingerprint and caption, so a line
    written under other settings is never returned. Appends write one whole line with O_APPEND
    (several processes may share the file); a truncated or corrupt line (a crash mid-write) is
    skipped with a warning.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._entries: dict[str, tuple[str, list]] = {}
        self.skipped_lines = 0
        if self.path.exists() and not self.path.is_file():
            raise VlctlError(f"{self.path}: tree cache must be a JSONL file, not a directory")
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                self._entries[row["key"]] = (row["caption"], row["tree"])
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                self.skipped_lines += 1
                last = i == len(lines) - 1
                warnings.warn(f"{self.path}: {'truncated last' if last else 'corrupt'} line {i + 1} ignored",
                              stacklevel=3)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, caption: str) -> list | None:
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] == caption else None

    def put(self, key: str, caption: str, tree: list) -> None:
        line = (json.dumps({"key": key, "caption": caption, "tree": tree}, ensure_ascii=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a truncated line: start our own
            os.write(fd, line)
        finally:
            os.close(fd)
        self._entries[key] = (caption, tree)

"""How images are decoded and embedded (`ExtractConfig`), without torch: `vlctl embed --help` and
`vlctl index --help` build their flags from it."""

from __future__ import annotations

import dataclasses

from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError
from vlctl.images import DEFAULT_MAX_PIXELS


@dataclasses.dataclass(frozen=True)
class ExtractConfig:
    """How images are decoded and embedded, and how often a store being built is committed."""

    batch_size: int = opt(64, "images per forward pass", ge=1, le=4096)
    workers: int = opt(0, "DataLoader worker processes decoding images (0 = decode in the main process)", ge=0, le=256)
    max_pixels: int = opt(
        DEFAULT_MAX_PIXELS, "refuse images with more pixels than this (decompression bombs; PIL's limit)",
        ge=1, le=2**30,
    )
    # About a minute of CPU embedding at TinyCLIP speeds; each commit costs a manifest write.
    commit_every: int = opt(4096, "commit the store every this many new images, so an interrupted run keeps the "
                            "finished ones (--strict, and a new ivfpq store, whose quantisers train on the first "
                            "add, commit once at the end)", ge=1, le=10**9, added=True)

    def __post_init__(self) -> None:
        for f in ("batch_size", "max_pixels"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise VlctlError(f"ExtractConfig.{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise VlctlError(f"ExtractConfig.workers must be >= 0, got {self.workers!r}")
        validate_config(self)  # then every field in its declared range (the opt() above)

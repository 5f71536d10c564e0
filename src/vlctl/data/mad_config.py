"""MAD's generation parameters (`MadConfig`), without scipy and scikit-image: `vlctl data mad
--help` builds its flags from them."""

from __future__ import annotations

import dataclasses
from typing import Optional

from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError

SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class MadConfig:
    """How a MAD set is generated: its size, seed and split, and the morphology of each attribute."""

    n: int = opt(10000, "number of images", ge=1, le=10**7)
    seed: int = opt(0, "random seed (>= 0); image i depends only on (seed, split, i)", ge=0, le=2**32 - 1)
    split: str = opt("train", "'train' or 'test': picks the (disjoint) pool of source glyphs", choices=SPLITS)
    image_size: int = opt(28, "output image side in pixels", ge=8, le=1024)
    # Optional[...], not `str | None`: config.add_config_args only understands typing.Union
    mnist_dir: Optional[str] = opt(None, "directory with MNIST IDX files (.gz ok); default: scikit-learn's 8x8 digits")  # noqa: UP045
    workers: int = opt(2, "worker processes (the output does not depend on it)", ge=1, le=256)
    stroke_thickness: float = opt(2.5, "stroke thickness (px at 28 px) the thick 8x8 scikit-learn glyphs are redrawn with",
                                  gt=0, le=100)
    thicken_amount: float = opt(0.7, "thickening grows the measured stroke thickness by this fraction", gt=0, le=10)
    thin_amount: float = opt(0.7, "thinning shrinks the measured stroke thickness by this fraction", gt=0, lt=1)
    swell_strength: float = opt(3.0, "swelling: power of the radial warp (1 = none)", gt=0, le=100)
    swell_radius: float = opt(7.0, "swelling: radius (px at 28 px, for a stroke 4 px thick; scales with sqrt(thickness))",
                              gt=0, le=1000)
    fracture_count: int = opt(3, "fracture: number of cuts", ge=1, le=100)
    fracture_thickness: float = opt(1.5, "fracture: width of a cut (px at 28 px)", gt=0, le=100)
    small_scale: float = opt(0.75, "'small' digits are rescaled by this factor", gt=0, lt=1)

    def __post_init__(self):
        if self.split not in SPLITS:
            raise VlctlError(f"MadConfig.split: {self.split!r} is not one of {list(SPLITS)}")
        for name in ("n", "image_size", "workers", "fracture_count"):
            if getattr(self, name) < 1:
                raise VlctlError(f"MadConfig.{name}: must be >= 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise VlctlError(f"MadConfig.seed: must be >= 0, got {self.seed}")
        if not (0 < self.thin_amount < 1 and 0 < self.small_scale < 1):
            raise VlctlError("MadConfig.thin_amount and small_scale: must lie strictly between 0 and 1")
        validate_config(self)  # then every field in its declared range (the opt() above)

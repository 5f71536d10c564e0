"""TinyCLIP architectures as data: `TinyCLIPConfig` and the registry of shipped configs.

`encoders/configs/NAME.json` are the shipped architectures (`list_configs()`), like open_clip's
model_configs; `get_config` reads one by name, a config JSON file, or a saved model directory's
config.json (the file format constants `FORMAT`, `WEIGHTS_FILE`, `CONFIG_FILE` live here because
both this registry and `tiny_pretrained` read them).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from vlctl.config import config_from_dict, load_config, opt, validate_config
from vlctl.fsops import VlctlError
from vlctl.io import read_json

VISION_POOLS = ("cls", "cls_mean")  # TinyCLIPConfig.vision_pool

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
FORMAT = "vlctl.tinyclip/1"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

# The 26 attribute values of MAD (Schrodi et al. 2025), the TEVI paper's synthetic data set.
MAD_VALUES: tuple[str, ...] = (
    *(str(d) for d in range(10)),
    "gray", "red", "green", "blue", "cyan", "magenta", "yellow",
    "thickening", "thinning", "no thickthinning",
    "swelling", "no swelling",
    "fracture", "no fracture",
    "large", "small",
)  # fmt: skip



@dataclasses.dataclass(frozen=True)
class TinyCLIPConfig:
    """Architecture of a TinyCLIP (all of it: two models with equal configs have equal shapes)."""

    name: str = opt("tinyclip", "architecture name; part of the encoder id")
    image_size: int = opt(28, "input image side S in pixels (images are S x S x 3)", ge=1, le=4096)
    patch_size: int = opt(7, "ViT patch side; image_size must be a multiple of it", ge=1, le=4096)
    stem_channels: tuple[int, ...] = opt(
        (),
        "convolutional stem before the patchify conv (a hybrid ViT, as in Dosovitskiy et al. 2021 and "
        "'early convolutions', Xiao et al. 2021): one stage per entry, conv3x3 -> GELU -> 2x2 max-pool, "
        "halving the resolution; () = a plain ViT. Tokens are patches of the stem's feature map.",
        ge=1, le=65536,
    )
    vision_width: int = opt(96, "ViT width (token dimension)", ge=1, le=65536)
    vision_layers: int = opt(4, "number of ViT transformer blocks", ge=1, le=1024)
    vision_heads: int = opt(4, "ViT attention heads; must divide vision_width", ge=1, le=1024)
    vision_pool: str = opt(
        "cls",
        "what the image embedding reads: 'cls', the class token (CLIP); 'cls_mean', the class token plus the "
        "mean of the patch tokens, each through its own projection (a per-token product of content and "
        "position, summed over the image, reaches the embedding without attention gathering it into the "
        "class token: what makes spatial relations learnable on the scenes, docs/findings.md)",
        choices=VISION_POOLS, added=True,
    )
    text_tower: str = opt(
        "transformer",
        "'transformer' (small causal transformer over word tokens) or "
        "'minilm' (frozen all-MiniLM-L6-v2 + trainable linear projection)",
        choices=("transformer", "minilm"),
    )
    text_width: int = opt(64, "text transformer width (unused for minilm)", ge=0, le=65536)
    text_layers: int = opt(2, "text transformer blocks (unused for minilm)", ge=0, le=1024)
    text_heads: int = opt(2, "text transformer heads; must divide text_width (unused for minilm)", ge=0, le=1024)
    context_length: int = opt(8, "token row length incl. <start>/<end> (MiniLM: WordPiece tokens incl. [CLS]/[SEP])",
                              ge=2, le=4096)
    vocab: tuple[str, ...] = opt(
        MAD_VALUES,
        "word tokens of the word tokenizer (multi-word allowed; <pad>/<start>/<end> are added); unused for minilm",
    )
    embed_dim: int = opt(32, "dimension of the joint embedding space", ge=1, le=65536)
    init_logit_scale: float = opt(math.log(1 / 0.07), "initial log inverse temperature (CLIP: log(1/0.07))",
                                  ge=-10, le=10)

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise VlctlError(f"TinyCLIPConfig {self.name!r}: {msg}")

        for f in (
            "image_size",
            "patch_size",
            "vision_width",
            "vision_layers",
            "vision_heads",
            "context_length",
            "embed_dim",
        ):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                bad(f"{f} must be a positive integer, got {getattr(self, f)!r}")
        if not isinstance(self.stem_channels, tuple):
            object.__setattr__(self, "stem_channels", tuple(self.stem_channels))
        if not all(isinstance(c, int) and c > 0 for c in self.stem_channels):
            bad(f"stem_channels must be positive integers, got {self.stem_channels!r}")
        if self.image_size % (self.patch_size * 2 ** len(self.stem_channels)):
            bad(
                f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size} "
                f"x the stem's downsampling {2 ** len(self.stem_channels)}"
            )
        if self.vision_width % self.vision_heads:
            bad(f"vision_heads {self.vision_heads} does not divide vision_width {self.vision_width}")
        if self.text_tower not in ("transformer", "minilm"):
            bad(f"text_tower must be 'transformer' or 'minilm', got {self.text_tower!r}")
        if self.text_tower == "transformer":
            for f in ("text_width", "text_layers", "text_heads"):
                if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                    bad(f"{f} must be a positive integer, got {getattr(self, f)!r}")
            if self.text_width % self.text_heads:
                bad(f"text_heads {self.text_heads} does not divide text_width {self.text_width}")
            if not self.vocab:
                bad("the transformer text tower needs a non-empty vocab")
        if self.context_length < 2:
            bad(f"context_length must be >= 2, got {self.context_length}")
        if not isinstance(self.vocab, tuple):
            object.__setattr__(self, "vocab", tuple(self.vocab))
        validate_config(self)  # then every field in its declared range (the opt() above)

    @property
    def n_patches(self) -> int:
        return (self.image_size // 2 ** len(self.stem_channels) // self.patch_size) ** 2


def list_configs() -> list[str]:
    """Names of the shipped architectures (encoders/configs/NAME.json)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def get_config(name_or_path: str | Path | TinyCLIPConfig) -> TinyCLIPConfig:
    """A shipped config by name, a config JSON file, or a saved model directory's config."""
    if isinstance(name_or_path, TinyCLIPConfig):
        return name_or_path
    s = str(name_or_path)
    if s in list_configs():
        return load_config(TinyCLIPConfig, CONFIG_DIR / f"{s}.json")
    p = Path(s)
    if p.is_file():
        return load_config(TinyCLIPConfig, p)
    if p.is_dir() and (p / CONFIG_FILE).is_file():
        doc = read_json(p / CONFIG_FILE, "TinyCLIP config")
        if not isinstance(doc, dict) or "config" not in doc:
            raise VlctlError(f"{p / CONFIG_FILE}: not a TinyCLIP model config (no 'config' field)")
        return config_from_dict(TinyCLIPConfig, doc["config"], source=str(p / CONFIG_FILE))
    raise VlctlError(f"unknown TinyCLIP config {s!r}: not one of {list_configs()} and not a config file")


"""ControlEmbed's hyperparameters (`ControlEmbed.Config`) and default prompt templates, without
torch: `vlctl fit controlembed --help` builds its flags from them."""

from __future__ import annotations

import dataclasses

from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError

CONTROLEMBED_DATA_FIELDS = ("embed_dim", "cond_dim")  # the Config fields fit sets from the data (no CLI flag)
PARAMETERISATIONS = ("full", "lowrank", "translation")
HEAD_MAX_WEIGHTS = 1 << 22  # head_rank None: the unfactored output layer up to this many weights
AUTO_HEAD_RANK = 8  # head_rank None: the code width beyond
DEFAULT_TEMPLATES = (  # averaged into a subclass's text embedding (prompts.prompt_ensemble)
    "a photo of {}.", "an image of {}.", "a rendering of {}.", "a picture of {}.",
)


@dataclasses.dataclass(frozen=True)
class ControlEmbedConfig:
    """ControlEmbed's hyperparameters, hypernetwork and training alike (`ControlEmbed.Config`)."""

    embed_dim: int | None = opt(None, "D: dimension of the image embedding space the maps act on; set from the data",
                                ge=1, le=65536)
    cond_dim: int | None = opt(None, "dimension of the attribute text embedding fed to the MLP; set from the "
                               "condition encoder", ge=1, le=65536)
    hidden: int = opt(256, "hidden width of the 3-layer MLP", ge=1, le=65536)
    parameterisation: str = opt("full", "W: 'full' (I + Delta), 'lowrank' (I + U V^T) or 'translation' (W = I)",
                                choices=PARAMETERISATIONS)
    rank: int = opt(32, "rank r of the 'lowrank' parameterisation (ignored otherwise)", ge=1, le=65536)
    head_rank: int | None = opt(None, "width k of the code between the MLP's hidden layer and the map's parameters "
                                "(0: no code, one hidden x parameters layer; None: 0 up to 2^22 weights, else 8)",
                                ge=0, le=65536)
    temperature: float = opt(0.1, "tau of the StableRep and alignment losses", gt=0, le=100)
    align_weight: float = opt(0.1, "omega: weight of the i2t + t2i alignment loss (0 = off)", ge=0, le=1000)
    images_per_subclass: int = opt(16, "m: images per subclass in an episode (class-balanced sampler)", ge=2, le=4096)
    min_images_per_subclass: int = opt(0, "drop a category's subclasses with fewer labelled images than this (2 or "
                                       "more: their images sit out that category's episodes, and a warning names "
                                       "them); 0: keep every subclass, and refuse one with a single image",
                                       ge=0, le=10**6, added=True)
    max_subclasses_per_batch: int = opt(32, "at most this many subclasses per episode (a random subset beyond)",
                                        ge=2, le=4096)
    steps: int = opt(2000, "training episodes (optimizer steps), one category each", ge=1, le=10**8)
    lr: float = opt(1e-3, "peak learning rate (AdamW, warmup + cosine)", gt=0, le=10)
    weight_decay: float = opt(1e-4, "AdamW weight decay of the MLP's matrices", ge=0, le=10)
    warmup_steps: int = opt(50, "linear warmup steps", ge=0, le=10**8)
    seed: int = opt(0, "seed of the initialisation and the episodes", ge=0, le=2**32 - 1)
    threads: int = opt(1, "torch threads while fitting (restored afterwards; 0 = leave as is): the episodes are "
                       "small, and on a shared CPU one thread was 7x faster than two (measured)", ge=0, le=1024)
    device: str | None = opt("cpu", "cpu or cuda (None: CUDA when available)", check="device")

    def __post_init__(self):
        # Every field in its declared range (above; an episode needs 2 images of a subclass, a positive
        # besides the image itself, and 2 subclasses); then what crosses fields.
        validate_config(self)
        if self.parameterisation == "lowrank" and self.embed_dim is not None and self.rank > self.embed_dim:
            raise VlctlError(f"rank: must be <= embed_dim ({self.embed_dim}, the embedding dimension) for the "
                             f"'lowrank' parameterisation, got {self.rank}")

    @property
    def out_dim(self) -> int:
        """Parameters of one map: the output layer's width."""
        d, r = self.embed_dim, self.rank
        if d is None:
            raise VlctlError("ControlEmbedConfig: embed_dim is not set (fit sets it from the data)")
        return {"full": d * d + d, "lowrank": 2 * d * r + d, "translation": d}[self.parameterisation]

    @property
    def code_dim(self) -> int:
        """head_rank resolved: 0 (unfactored output layer) or the code width k."""
        if self.head_rank is not None:
            return self.head_rank
        return 0 if self.hidden * self.out_dim <= HEAD_MAX_WEIGHTS else AUTO_HEAD_RANK

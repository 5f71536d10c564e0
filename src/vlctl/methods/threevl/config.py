"""The hyperparameters of 3VL's LoRA fine-tuning (`TreeTuner.Config`), without torch: `vlctl fit
tree --help` builds its flags from them."""

from __future__ import annotations

import dataclasses

from vlctl.config import opt
from vlctl.fsops import VlctlError

MODES = ("contrastive", "negclip", "tree")
REDUCTIONS = ("sum", "mean")
TOWERS = ("both", "visual", "text")  # the towers that get LoRA adapters


@dataclasses.dataclass(frozen=True)
class TreeTuneConfig:
    """The hyperparameters of LoRA fine-tuning (`TreeTuner.Config`)."""

    mode: str = opt("tree", "loss: 'contrastive', 'negclip' or 'tree' (alpha L_tree + (1 - alpha) L_contrast)",
                    choices=MODES)
    alpha: float = opt(0.5, "weight of L_tree in the 3VL loss", ge=0, le=1)
    level_reduction: str = opt("sum", "tree levels aggregated by 'sum' (paper) or 'mean' (authors' code)",
                               choices=REDUCTIONS)
    rank: int = opt(1, "LoRA rank", ge=1, le=1024)
    lora_alpha: float = opt(1.0, "LoRA alpha (the update is scaled by alpha / rank)", gt=0, le=10_000)
    towers: str = opt("both", "towers that get adapters: 'both', 'visual' or 'text'", choices=TOWERS)
    lr: float = opt(3e-3, "peak learning rate of the adapters", gt=0, le=10)
    weight_decay: float = opt(0.1, "AdamW weight decay on the adapters", ge=0, le=10)
    epochs: int = opt(5, "passes over the fine-tuning set", ge=1, le=100_000)
    batch_size: int = opt(64, "batch size", ge=1, le=4096)
    warmup_steps: int = opt(20, "linear warmup steps", ge=0, le=10**9)
    max_levels: int = opt(8, "tree levels kept per caption (the finest; 0: all, as the paper)", ge=0, le=1000)
    max_negatives: int = opt(8, "negatives kept per tree level (0: all, as the paper)", ge=0, le=1000)
    patch_dropout: float = opt(0.0, "probability that a batch's images are encoded from a random subset of their "
                               "patches (see patch_keep)", ge=0, le=1)
    seed: int = opt(0, "seed of adapters' init, data order and negative subsampling", ge=0, le=2**32 - 1)
    minilm_layers: int = opt(6, "LiT (MiniLM text tower) models: LoRA on the attention of this many last BERT layers "
                             "(the frozen layers below are cached per text)", ge=1, le=6)
    threads: int = opt(0, "torch threads (0 = leave as is)", ge=0, le=1024)
    device: str | None = opt("cpu", "cpu or cuda (None: CUDA when available); the tuned model comes back to the CPU",
                             check="device")

    def __post_init__(self):
        if self.mode not in MODES:
            raise VlctlError(f"TreeTuneConfig.mode: {self.mode!r} is not one of {list(MODES)}")
        if self.level_reduction not in REDUCTIONS:
            raise VlctlError(f"TreeTuneConfig.level_reduction: {self.level_reduction!r} is not one of {list(REDUCTIONS)}")
        if not 0 <= self.alpha <= 1:
            raise VlctlError(f"TreeTuneConfig.alpha: must be in [0, 1], got {self.alpha}")
        if not 0 <= self.patch_dropout <= 1:
            raise VlctlError(f"TreeTuneConfig.patch_dropout: must be in [0, 1], got {self.patch_dropout}")
        if self.towers not in TOWERS:
            raise VlctlError(f"TreeTuneConfig.towers: {self.towers!r} is not one of {list(TOWERS)}")

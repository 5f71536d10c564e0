"""The configs of training, without torch: the loop's (`LoopConfig`, every trainer's) and
TinyCLIP's (`ClipTrainConfig`). `vlctl train clip --help` builds its flags from them."""

from __future__ import annotations

import dataclasses

from vlctl.config import opt, validate_config


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """The training loop's hyperparameters (`vlctl.train.loop.train`)."""

    epochs: int = opt(1, "passes over the dataset", ge=1, le=100_000)
    batch_size: int = opt(256, "GLOBAL batch size: split evenly over DDP ranks", ge=1, le=65536)
    lr: float = opt(1e-3, "peak learning rate (default for param groups that set none)", gt=0, le=10)
    weight_decay: float = opt(0.1, "AdamW decoupled weight decay (default groups: >=2-d params only)", ge=0, le=10)
    betas: tuple[float, float] = opt((0.9, 0.98), "AdamW betas", ge=0, lt=1)
    eps: float = opt(1e-6, "AdamW epsilon", gt=0, le=1)
    warmup_steps: int = opt(0, "steps of linear learning-rate warmup before the cosine decay", ge=0, le=10**9)
    min_lr_ratio: float = opt(0.0, "cosine floor as a fraction of each group's peak lr", ge=0, le=1)
    grad_clip: float = opt(0.0, "clip the global gradient norm to this value (0 = off)", ge=0, le=1e6)
    seed: int = opt(0, "seed for data order and torch/numpy/python RNGs", ge=0, le=2**32 - 1)
    checkpoint_every: int = opt(0, "write a checkpoint every this many steps (0 = only at the end)", ge=0, le=10**9)
    log_every: int = opt(10, "steps between log.jsonl lines and progress-bar updates", ge=1, le=10**9)
    threads: int = opt(0, "torch.set_num_threads per process (0 = leave as is)", ge=0, le=1024)
    progress: bool = opt(True, "show a tqdm progress bar (rank 0 only)")
    drop_last: bool = opt(True, "drop the last incomplete batch of each epoch")

    def __post_init__(self) -> None:
        validate_config(self)  # every field in its declared range (the opt() above)


@dataclasses.dataclass(frozen=True)
class ClipTrainConfig:
    """What `train_clip` adds to the loop's config: the TinyCLIP, its temperature and augmentation."""

    model: str = opt("mad-quick", "TinyCLIP config name (encoders/configs/NAME.json) or path to a config JSON")
    temperature_lr: float = opt(1e-2, "learning rate of the learnable temperature (its own param group)", ge=0, le=10)
    shift_pixels: int = opt(2, "random translation augmentation, in pixels (0 = off); seeded per (epoch, index)",
                            ge=0, le=64)

    def __post_init__(self) -> None:
        validate_config(self)  # every field in its declared range (the opt() above)

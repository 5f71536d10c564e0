"""Training: one loop (loop.py) for every trainer, and the DDP helpers it runs on (distributed.py)."""

from vlctl.encoders.loss import all_gather_with_grad
from vlctl.train.distributed import (
    DistInfo,
    all_gather_object,
    all_reduce_mean,
    barrier,
    destroy_distributed,
    init_distributed,
    is_distributed,
    is_main,
)
from vlctl.train.loop import (
    LoopConfig,
    TrainResult,
    default_param_groups,
    epoch_order,
    lr_multiplier,
    sample_rng,
    seed_everything,
    steps_per_epoch,
    train,
)

__all__ = [
    "DistInfo",
    "LoopConfig",
    "TrainResult",
    "all_gather_object",
    "all_gather_with_grad",
    "all_reduce_mean",
    "barrier",
    "default_param_groups",
    "destroy_distributed",
    "epoch_order",
    "init_distributed",
    "is_distributed",
    "is_main",
    "lr_multiplier",
    "sample_rng",
    "seed_everything",
    "steps_per_epoch",
    "train",
]

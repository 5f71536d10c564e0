"""Multi-process (DDP) helpers that degrade to no-ops in a single process.

Launch with torchrun (`torchrun --nproc_per_node N -m ...`): it sets RANK, WORLD_SIZE and
LOCAL_RANK, and `init_distributed` joins the process group from them. Without those variables
everything here runs as one process and the collectives return their input, so trainers are
written once and work either way.

The autograd-aware gather of the contrastive loss, `all_gather_with_grad`, is in
`vlctl.encoders.loss` with the argument for its gradients.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

from vlctl.io import VlctlError


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank among world_size processes, its GPU index on the node
    (local_rank) and the device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def _pick_device(device: str | None, local_rank: int) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise VlctlError("device 'cuda' requested but no CUDA device is available")
        return torch.device("cuda", local_rank)
    raise VlctlError(f"device must be 'cpu', 'cuda' or None (auto), got {device!r}")


def init_distributed(device: str | None = None) -> DistInfo:
    """Join torchrun's process group (gloo on CPU, nccl on CUDA); a no-op in a single process.

    `device`: "cpu", "cuda" or None (CUDA when available). Safe to call more than once: later
    calls return the same information without re-initialising.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _pick_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            # nccl talks to "the current device"; without this every rank would use GPU 0.
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def destroy_distributed() -> None:
    """Leave the process group (call once at the end of a torchrun script).

    All ranks meet at a barrier first: a rank that tears gloo down while the other still has
    work in flight aborts that rank ("terminate called without an active exception"). Before
    that, a garbage collection: DistributedDataParallel wrappers sit in reference cycles, so
    without it a finished run's wrapper (and its reducer) may be freed only later, after the
    group is gone, which aborts the same way (seen intermittently on a loaded machine).
    """
    if is_distributed():
        import gc

        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_main() -> bool:
    """True on rank 0 (or in a single process): the one that logs and writes files."""
    return not is_distributed() or dist.get_rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over ranks (a new tensor; no gradient). Returns `x` itself in one process."""
    if not is_distributed():
        return x
    x = x.detach().clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x / dist.get_world_size()


def all_gather_object(obj):
    """List of `obj` from every rank, in rank order (`[obj]` in one process)."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out

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
import datetime
import os

import numpy as np
import torch
import torch.distributed as dist

from vlctl.fsops import VlctlError


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
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise VlctlError(f"device {device!r} requested but no CUDA device is available")
        # "cuda": this rank's GPU; "cuda:N" (what the recipes' rank_device gives each torchrun
        # rank, and a config's device may name) that GPU.
        index = local_rank if device == "cuda" else device.partition(":")[2]
        if not str(index).isdigit():
            raise VlctlError(f"device must be 'cpu', 'cuda', 'cuda:N' or None (auto), got {device!r}")
        return torch.device("cuda", int(index))
    raise VlctlError(f"device must be 'cpu', 'cuda', 'cuda:N' or None (auto), got {device!r}")


def init_distributed(device: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Join torchrun's process group (gloo on CPU, nccl on CUDA); a no-op in a single process.

    `device`: "cpu", "cuda" or None (CUDA when available). `timeout_s`: how long a collective
    waits for the other ranks (torch's default, 30 min, when None); the recipes raise it, since
    their ranks wait at a barrier while rank 0 alone runs a long evaluation stage. Safe to call
    more than once: later calls return the same information without re-initialising.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _pick_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            # nccl talks to "the current device"; without this every rank would use GPU 0.
            torch.cuda.set_device(dev)
        extra = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                **extra)
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


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process in the process group; (0, 1) without one."""
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def shard_rows(n: int, rank: int, world_size: int) -> list[int]:
    """The rows of `n` that rank `rank` of `world_size` handles: every world_size-th row from
    `rank` (DistributedSampler's order without shuffling or padding). Deterministic, disjoint
    over ranks, and together they cover range(n); `unshard` puts them back in order."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise VlctlError(f"rank {rank} is not in a world of {world_size} processes")
    return list(range(rank, n, world_size))


def unshard(parts: list, n: int):
    """Rows of the ranks' results (parts[r]: the rows of `shard_rows(n, r, len(parts))`, in that
    order) back in the single-process order, as one array of n rows."""
    world = len(parts)
    for r, p in enumerate(parts):
        if len(p) != len(shard_rows(n, r, world)):
            raise VlctlError(f"rank {r} returned {len(p)} rows for a shard of {len(shard_rows(n, r, world))}")
    if not parts or n == 0:
        return np.concatenate(parts) if parts else np.zeros((0,))
    out = np.empty((n, *np.asarray(parts[0]).shape[1:]), dtype=np.asarray(parts[0]).dtype)
    for r, p in enumerate(parts):
        out[r::world] = p
    return out


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

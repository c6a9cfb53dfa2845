"""Several ranks under torchrun, on torch.distributed; every function is a no-op for a plain `python train.py`.

What it is for: starting the process group, each rank's share of a batch (whole GRPO groups), gathering
picklable values, and summing gradients. The method's side of data parallelism (which rows a rank holds, how
the loss weights count the global batch) is in grpo.py; this file only moves values between ranks.

Data parallel is decided by the launcher (torchrun's WORLD_SIZE > 1), never by `dist.is_initialized()`: an
in-process vLLM engine creates a world-size-1 process group of its own, which a single process must neither
send its collectives through nor destroy. Only the group `init_distributed` created is destroyed.

    torchrun --standalone --nproc_per_node 2 train.py --model tiny --steps 2     # CPU: gloo; GPU: nccl
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DIST_TIMEOUT_MIN = 30  # a rank that waits this long for the others in a collective gives up with an error
_created_group = False  # whether init_distributed created the process group (only that one is destroyed)


def data_parallel() -> bool:
    """Several ranks: torchrun's WORLD_SIZE > 1 and the process group started. A group someone else made in a
    single process (vLLM's world-size-1 group) does not count."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_initialized()


def quiet_other_ranks() -> None:
    """Under torchrun, only rank 0 prints (for the life of the process); errors still come from every rank."""
    if int(os.environ.get("RANK", "0")) != 0:
        sys.stdout = open(os.devnull, "w")


def init_distributed(device: str = "auto") -> str | None:
    """Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set): the process group and this rank's device, as --device
    asks: `cpu` is gloo on the CPU (also on a GPU machine); `auto` and `cuda` are nccl with each rank on GPU
    LOCAL_RANK where torch sees a GPU (a `cuda:N` index is replaced by the local rank), else gloo on the CPU. A plain
    `python train.py` has no process group: None."""
    global _created_group
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None
    local = int(os.environ["LOCAL_RANK"])
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=DIST_TIMEOUT_MIN))
    _created_group = True
    quiet_other_ranks()
    return f"cuda:{local}" if cuda else "cpu"


def close_distributed() -> None:
    """Destroy the process group init_distributed created; any other (vLLM's) is its owner's to destroy."""
    global _created_group
    if _created_group and dist.is_initialized():
        dist.destroy_process_group()
    _created_group = False


def world() -> tuple[int, int]:
    """(rank, world size) under torchrun; (0, 1) for a plain `python train.py` (no process group)."""
    return (dist.get_rank(), dist.get_world_size()) if data_parallel() else (0, 1)


def share(items: list) -> list:
    """This rank's contiguous share of a batch (all of it without torchrun); ranks in order give the batch back,
    so a task's n samples stay on one rank and group advantages need no communication."""
    rank, size = world()
    k, extra = divmod(len(items), size)
    start = rank * k + min(rank, extra)
    return items[start:start + k + (rank < extra)]


def gather(value) -> list:
    """Every rank's `value` (any picklable object), in rank order; [value] without a process group."""
    if not data_parallel():
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_reduce_sum(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over ranks, in place (every rank then holds the same sums)."""
    if data_parallel():
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)


def barrier() -> None:
    if data_parallel():
        dist.barrier()

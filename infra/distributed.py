"""Several ranks under torchrun, on torch.distributed; every function is a no-op for a plain `python train.py`.

What it is for: starting the process group, each rank's share of a batch (whole GRPO groups), gathering
picklable values, and summing gradients. The method's side of data parallelism (which rows a rank holds, how
the loss weights count the global batch) is in grpo.py; this file only moves values between ranks.

    torchrun --standalone --nproc_per_node 2 train.py --model tiny --steps 2     # CPU: gloo; GPU: nccl
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

DIST_TIMEOUT_MIN = 30  # a rank that waits this long for the others in a collective gives up with an error


def quiet_other_ranks() -> None:
    """Under torchrun, only rank 0 prints (for the life of the process); errors still come from every rank."""
    if int(os.environ.get("RANK", "0")) != 0:
        sys.stdout = open(os.devnull, "w")


def init_distributed(device: str = "auto") -> str | None:
    """Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set): the process group and this rank's device, as --device
    asks: `cpu` is gloo on the CPU (also on a GPU machine); `auto` and `cuda` are nccl with each rank on GPU
    LOCAL_RANK where torch sees a GPU (a `cuda:N` index is replaced by the local rank), else gloo on the CPU. A plain
    `python train.py` has no process group: None."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None
    local = int(os.environ["LOCAL_RANK"])
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=DIST_TIMEOUT_MIN))
    quiet_other_ranks()
    return f"cuda:{local}" if cuda else "cpu"


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> tuple[int, int]:
    """(rank, world size) under torchrun; (0, 1) for a plain `python train.py` (no process group)."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def share(items: list) -> list:
    """This rank's contiguous share of a batch (all of it without torchrun); ranks in order give the batch back,
    so a task's n samples stay on one rank and group advantages need no communication."""
    rank, size = world()
    k, extra = divmod(len(items), size)
    start = rank * k + min(rank, extra)
    return items[start:start + k + (rank < extra)]


def gather(value) -> list:
    """Every rank's `value` (any picklable object), in rank order; [value] without a process group."""
    if not dist.is_initialized():
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_reduce_sum(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over ranks, in place (every rank then holds the same sums)."""
    if dist.is_initialized():
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()

"""Several ranks under torchrun, on torch.distributed, and the one device each process claims.

What it is for: starting the process group, each rank's share of a batch (whole GRPO groups),
gathering picklable values, and the update's torchrun steps (grpo.update_policy): `every_rank_rows`
gives every rank the rows of the global batch (the others' without tokens) to cut into mini-batches,
`mark_mine` marks the rows a rank trains, and `sum_gradients` adds the ranks' gradients, so that
every rank steps with the gradient one process would have. Which rows and weights those are is
grpo.py's (`mini_batches`); this file only moves values between ranks.

Every function but `claim_device` is a no-op for a plain `python train.py`. Data parallel is decided
by the launcher (torchrun's WORLD_SIZE > 1), never by `dist.is_initialized()`: an in-process vLLM
engine creates a world-size-1 process group of its own, which a single process must neither send its
collectives through nor destroy. Only the group `init_distributed` created is destroyed.

    torchrun --standalone --nproc_per_node 2 train.py --model tiny --steps 2   # gloo; GPU: nccl
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from infra import models

# a rank that waits this long for the others in a collective gives up with an error
DIST_TIMEOUT_MIN = 30
# whether init_distributed created the process group (only that one is destroyed)
_created_group = False


def data_parallel() -> bool:
    """Several ranks: torchrun's WORLD_SIZE > 1 and the process group started. A group someone else
    made in a single process (vLLM's world-size-1 group) does not count."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_initialized()


def quiet_other_ranks() -> None:
    """Under torchrun, only rank 0 prints (for the life of the process); errors still come from
    every rank."""
    if int(os.environ.get("RANK", "0")) != 0:
        sys.stdout = open(os.devnull, "w")


def init_distributed(device: str = "auto") -> str | None:
    """Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set): the process group and this rank's device,
    as --device asks: `cpu` is gloo on the CPU (also on a GPU machine); `auto` and `cuda` are nccl
    with each rank on GPU LOCAL_RANK where torch sees a GPU (a `cuda:N` index is replaced by the
    local rank), else gloo on the CPU. A plain `python train.py` has no process group: None."""
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


def claim_device(device: str) -> str:
    """One device per process, made the current device before any model or engine is built: `auto`
    resolved, and for CUDA torch.cuda.set_device, so that memory counters and anything that names
    bare `cuda` (a generate() cache, a checkpoint's tensors) are on it, with fp32 matmuls as TF32.
    Under torchrun `device` is init_distributed's rank device; vLLM's own worker takes
    cuda:{LOCAL_RANK} there, the same GPU (vllm_engine.engine_problem)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(int(device.partition(":")[2] or 0))
    models.use_tensor_cores(device)  # CUDA: fp32 matmuls as TF32
    return device


def close_distributed() -> None:
    """Destroy the process group init_distributed created; any other (vLLM's) is its owner's to
    destroy."""
    global _created_group
    if _created_group and dist.is_initialized():
        dist.destroy_process_group()
    _created_group = False


def world() -> tuple[int, int]:
    """(rank, world size) under torchrun; (0, 1) for a plain `python train.py` (no process
    group)."""
    return (dist.get_rank(), dist.get_world_size()) if data_parallel() else (0, 1)


def share(items: list) -> list:
    """This rank's contiguous share of a batch (all of it without torchrun); ranks in order give the
    batch back, so a task's n samples stay on one rank and group advantages need no
    communication."""
    rank, size = world()
    k, extra = divmod(len(items), size)
    start = rank * k + min(rank, extra)
    return items[start:start + k + (rank < extra)]


def gather(value) -> list:
    """Every rank's `value` (any picklable object), in rank order; [value] without a process
    group."""
    if not data_parallel():
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def every_rank_rows(rows: list, stand_in: Callable) -> list:
    """Every rank's rows in rank order, this rank's as they are and the others' as `stand_in(row)`
    (what the mini-batches' weights need, without tokens): the order one process would have them
    in, since ranks hold contiguous shares of the tasks (`share`). Cut into mini-batches, they give
    every rank the same mini-batches and weights (`mark_mine` then marks this rank's rows)."""
    rank, _ = world()
    parts = gather([stand_in(r) for r in rows])
    return [r for k, part in enumerate(parts) for r in (rows if k == rank else part)]


def mark_mine(mini_batches: list, rows: list) -> list:
    """Each mini-batch (a dataclass with `rows` and `mine`) with `mine` the indices of its rows
    that are this rank's own `rows`: those it trains."""
    own = {id(r) for r in rows}
    return [replace(mb, mine=[i for i, r in enumerate(mb.rows) if id(r) in own])
            for mb in mini_batches]


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Under torchrun: each parameter's gradient summed over ranks (the loss weights count the
    global mini-batch, so the sum is the gradient one process would have), in one flat fp32 tensor;
    nothing for one process. Every parameter must have a gradient (grpo.zero_missing_grads)."""
    if not data_parallel():
        return
    flat = torch.cat([p.grad.flatten() for p in params]).float()
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def all_reduce_sum(tensors: list[torch.Tensor]) -> None:
    """Sum each tensor over ranks, in place (every rank then holds the same sums)."""
    if data_parallel():
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)


def barrier() -> None:
    if data_parallel():
        dist.barrier()

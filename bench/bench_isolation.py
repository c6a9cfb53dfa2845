"""What isolation costs: one Voting training step under IP (an adapter per role type) against SP (one shared).

Both trainers come from train.py's `build_trainer` with the same flags but
`--policy`, and run train.py's `train_step` on the same task batches,
alternating step by step so machine noise hits both alike. IP routes the
generators and the aggregator to different adapters (its generate calls still
hold one adapter per stage) and gives the generator adapter one optimizer step
per instance (3 per training step, the later two needing old log-probs), where
SP takes one step over all calls. We print the median step time of each after
`--warmup` steps and the ratio IP / SP.

By default every completion is forced to `--new-tokens` tokens (`min_new_tokens`),
so both sides generate exactly the same number of tokens; `--free-length` lets
them stop at EOS.

    python bench/bench_isolation.py                    # tiny random model (a minute)
    python bench/bench_isolation.py --model smollm2    # SmolLM2-135M (several minutes on 2 cores)
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
import train  # noqa: E402
from tasks import math_splits  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny | smollm2")
    p.add_argument("--tasks", type=int, default=4, help="tasks per step")
    p.add_argument("--n", type=int, default=4, help="episodes per task (group size)")
    p.add_argument("--new-tokens", type=int, default=32, help="max completion tokens per call")
    p.add_argument("--free-length", action="store_true", help="let completions stop at EOS (default: forced length)")
    p.add_argument("--steps", type=int, default=4, help="measured steps per policy")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per policy first")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    tasks, _ = math_splits(170, 64, difficulty=0, seed=0)
    total = args.warmup + args.steps
    batches = [tasks[i * args.tasks:(i + 1) * args.tasks] for i in range(total)]
    trainers, times = {}, {"sp": [], "ip": []}
    for policy in ("sp", "ip"):
        flags = ["--model", args.model, "--workflow", "voting", "--policy", policy, "--tasks-per-step",
                 str(args.tasks), "--n", str(args.n), "--max-new-tokens", str(args.new_tokens), "--val-every", "0"]
        run_args = train.settings_from_flags(train.flags.parse_args(train.build_parser(), flags, train.ROLES))
        train.checkpoints.seed_everything(0)
        trainers[policy] = (run_args, train.build_trainer(run_args, "cpu"))
        if not args.free_length:
            trainers[policy][1].model.generation_config.min_new_tokens = args.new_tokens
    steps = {}
    for batch in batches:
        for policy, (run_args, trainer) in trainers.items():
            t = time.perf_counter()
            steps[policy] = train.train_step(batch, run_args, trainer)
            times[policy].append(time.perf_counter() - t)
    sp, ip = (statistics.median(times[k][args.warmup:]) for k in ("sp", "ip"))
    print(f"model {args.model}: Voting, {args.tasks} tasks x {args.n} episodes (3 generators + aggregator), "
          f"{args.new_tokens} new tokens ({'free' if args.free_length else 'forced'} length), "
          f"{args.steps} steps after {args.warmup} warm-up")
    print(f"optimizer steps per training step: SP generator {steps['sp']['generator/opt_steps']:.0f}, "
          f"IP generator {steps['ip']['generator/opt_steps']:.0f} + "
          f"aggregator {steps['ip']['aggregator/opt_steps']:.0f}")
    print(f"Voting step  SP {sp:7.2f} s   IP {ip:7.2f} s   ratio IP/SP {ip / sp:.3f}")


if __name__ == "__main__":
    main()

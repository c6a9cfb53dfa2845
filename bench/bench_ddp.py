"""What data parallelism costs: a training step under torchrun with 2 ranks against 1, on the same global batch.

Runs `torchrun --standalone --nproc_per_node N train.py ...` for N = 1 and 2 with the same flags (the same tasks per
step, group size, model and seed), each for --steps steps, and reads the step times from the runs' metrics.jsonl
(rollout + update, median of the steps after the first). One rank gets all --threads CPU threads, two ranks half
each, so both use the same cores. On a 2-core CPU no speed-up is expected: the ratio shows the overhead of the
process group (gradient all-reduce, gathered sample lengths and metric counts, checkpoint barriers) and of two
half-size rollouts. On several GPUs each rank has its own device and the ratio is what scaling buys.

    python bench/bench_ddp.py                     # tiny model, a minute
    python bench/bench_ddp.py --model smollm2     # SmolLM2-135M, several minutes on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def step_times(ranks: int, flags: list[str], threads: int) -> list[float]:
    run_dir = tempfile.mkdtemp(prefix=f"bench-ddp-{ranks}-")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
               "train.py", *flags, "--run-dir", os.path.join(run_dir, "run")]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, threads // ranks))}
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    with open(os.path.join(run_dir, "run", "metrics.jsonl")) as f:
        return [m["time_rollout"] + m["time_update"] for m in map(json.loads, f) if m["step"] > 0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--workflow", default="voting")
    p.add_argument("--policy", default="ip")
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=2, help="CPU threads in all, split between the ranks")
    args = p.parse_args()
    flags = ["--model", args.model, "--workflow", args.workflow, "--policy", args.policy, "--tasks-per-step",
             str(args.tasks_per_step), "--group-size", str(args.group_size), "--max-new-tokens", str(args.new_tokens),
             "--steps", str(args.steps), "--val-every", "0", "--save-every", "0", "--device", "cpu"]
    times = {ranks: step_times(ranks, flags, args.threads) for ranks in (1, 2)}
    one, two = (statistics.median(times[r][1:]) for r in (1, 2))
    print(f"{args.model} {args.workflow}-{args.policy.upper()}, {args.tasks_per_step} tasks x {args.group_size}, "
          f"{args.new_tokens} new tokens: 1 rank {one:.2f} s per step, 2 ranks {two:.2f} s; "
          f"ratio 2 / 1 = {two / one:.2f}")
    print("step times, 1 rank: " + ", ".join(f"{t:.2f}" for t in times[1]) + "; 2 ranks: "
          + ", ".join(f"{t:.2f}" for t in times[2]))


if __name__ == "__main__":
    main()

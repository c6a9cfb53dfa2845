"""The toy-world study: every finding's runs on the toy model, over several seeds, resumable, then evaluation and
figures with a band over seeds.

What it is for: one command that trains the grid of docs/findings.md (single agent; Voting SP, SP with equal
role weights, IP, IP with merged instance steps, IP with I6, IP with I1; Eval-Opt SP and IP; Orch-Workers SP and
IP) on `--model toy`, runs eval.py's four modes on the final checkpoints, and draws the curves. Each run is an ordinary
`python train.py` / `python eval.py` command in its own folder under --out: a finished run is skipped, a stopped
one resumed, so the study can be stopped and started again. What it is not: the method (it only calls train.py
and eval.py), nor part of the test suite.

    python -m infra.study --dry-run                 # the grid and the commands, nothing run
    python -m infra.study --out runs/study --figures docs/findings   # everything (77 minutes on 2 cores)
    python -m infra.study --only voting-sp,voting-ip --seeds 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from infra.runfolder import read_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--model", "toy", "--tasks-per-step", "4", "--group-size", "4", "--lr", "1e-3", "--max-new-tokens", "24",
         "--n-val", "64", "--val-n", "2", "--val-every", "10", "--save-every", "50", "--difficulty", "0",
         "--micro-batch-size", "16"]
GRID = {  # name -> the flags that make it (on top of TRAIN); the names are the figures' labels
    "single": ["--workflow", "single"],
    "voting-sp": ["--workflow", "voting", "--policy", "sp"],
    "voting-sp-equal": ["--workflow", "voting", "--policy", "sp", "--role-weights", "equal"],
    "voting-ip": ["--workflow", "voting", "--policy", "ip"],
    "voting-ip-merged": ["--workflow", "voting", "--policy", "ip", "--merge-instance-steps"],
    "voting-ip-i6": ["--workflow", "voting", "--policy", "ip", "--coherence", "generator=0.3"],
    "voting-ip-i1": ["--workflow", "voting", "--policy", "ip", "--kl-coef", "generator=0.1,aggregator=0.1"],
    "evalopt-sp": ["--workflow", "evalopt", "--policy", "sp"],
    "evalopt-ip": ["--workflow", "evalopt", "--policy", "ip"],
    "orchworkers-sp": ["--workflow", "orchworkers", "--policy", "sp"],
    "orchworkers-ip": ["--workflow", "orchworkers", "--policy", "ip"],
}
MODES = ("base", "trained", "sa-transfer", "sa-generator-transfer")


def run_dir(out: str, name: str, seed: int) -> str:
    return os.path.join(out, f"{name}-s{seed}")


def train_command(out: str, name: str, seed: int, steps: int) -> list[str]:
    """A new run, or the resumption of a stopped one (its folder holds a run already)."""
    folder = run_dir(out, name, seed)
    if os.path.exists(os.path.join(folder, "args.json")):
        return [sys.executable, "train.py", "--resume", folder, "--steps", str(steps)]
    return [sys.executable, "train.py", *TRAIN, *GRID[name], "--seed", str(seed), "--steps", str(steps),
            "--run-dir", folder]


def eval_commands(out: str, name: str, seed: int, samples: int, names: list[str]) -> list[list[str]]:
    """eval.py on a multi-agent run's final checkpoint (the single-agent run of its seed is the SA adapter); a
    mode already in the run's eval.jsonl is not run again. `trained` runs for every configuration; base and the
    two transfer modes load no adapter of the run, so they run once per workflow and seed, on the workflow's
    first configuration in the grid (voting-sp, evalopt-sp, orchworkers-sp)."""
    folder, sa = run_dir(out, name, seed), run_dir(out, "single", seed)
    workflow_first = next(n for n in names if GRID[n][1] == GRID[name][1]) == name
    done = {r["mode"] for r in read_results(os.path.join(folder, "eval.jsonl"))}
    return [[sys.executable, "eval.py", "--run-dir", folder, "--mode", mode, "--samples", str(samples),
             *(["--sa-run", sa] if mode.startswith("sa") else [])]
            for mode in MODES if mode not in done and (mode == "trained" or workflow_first)]


TRAINING_KEYS = ("loss_share", "grad_norm_share", "entropy", "coherence_scale", "kl_base", "opt_steps")


def summary(out: str, names: list[str], seeds: int) -> dict:
    """The numbers docs/findings.md quotes, per configuration, one value per seed: every validation metric at step
    0 and at the last step, validation accuracy's peak and its step, the role metrics of TRAINING_KEYS averaged
    over the first and the last 10 steps, and eval.py's accuracy per mode."""
    from infra.plots import eval_accuracy
    table = {}
    for name in names:
        runs = [read_results(os.path.join(run_dir(out, name, seed), "metrics.jsonl"), ("step",), warn=False)
                for seed in range(seeds)]
        runs = [r for r in runs if r]
        if not runs:
            continue
        val = [[m for m in r if "val/success" in m] for r in runs]
        row = {key: [v[0][key] for v in val] for key in val[0][0] if key.startswith("val/")}
        row.update({f"{key}@end": [v[-1].get(key) for v in val] for key in val[0][-1] if key.startswith("val/")})
        row["val/success@peak"] = [max(m["val/success"] for m in v) for v in val]
        row["peak_step"] = [max(v, key=lambda m: m["val/success"])["step"] for v in val]
        for key in sorted({k for m in runs[0] for k in m if k.split("/")[-1] in TRAINING_KEYS and "val/" not in k}):
            for part, rows in (("first10", lambda r: r[1:11]), ("last10", lambda r: r[-10:])):
                row[f"{key}@{part}"] = [_mean([m.get(key) for m in rows(r)]) for r in runs]
        row.update({f"eval/{mode}": eval_accuracy(out, name, seeds, mode) for mode in MODES})
        table[name] = row
    return table


def _mean(values: list) -> float | None:
    """The mean of the values that are not None (a step where a metric had nothing to measure)."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def finished(out: str, name: str, seed: int, steps: int) -> bool:
    metrics = read_results(os.path.join(run_dir(out, name, seed), "metrics.jsonl"), ("step",))
    return any(m["step"] == steps for m in metrics)


def run(command: list[str], log: str, dry_run: bool) -> None:
    print(" ".join(command[1:]), flush=True)
    if dry_run:
        return
    start = time.time()
    with open(log, "a") as f:
        done = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[1:3])}... failed (exit {done.returncode}); see {log}")
    print(f"  {time.time() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/study", help="folder of the study's runs, logs and figures")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 of every configuration")
    p.add_argument("--steps", type=int, default=150, help="training steps of every run")
    p.add_argument("--samples", type=int, default=2, help="eval.py samples per validation task")
    p.add_argument("--only", default=None, help="comma-separated grid names (default: all; single always runs)")
    p.add_argument("--figures", default=None, help="folder for the figures (default: --out; docs/findings.md's "
                   "are in docs/findings)")
    p.add_argument("--dry-run", action="store_true", help="print the grid's commands, run nothing")
    args = p.parse_args(argv)
    names = list(GRID) if not args.only else ["single", *[n for n in args.only.split(",") if n != "single"]]
    unknown = [n for n in names if n not in GRID]
    if unknown:
        p.error(f"--only: unknown names {unknown}; the grid: {', '.join(GRID)}")
    args.out = os.path.abspath(args.out)  # the commands run from the repository root
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
    log, start = os.path.join(args.out, "study.log"), time.time()
    for seed in range(args.seeds):  # seed by seed, so that a stopped study has whole seeds to show
        for name in names:
            if not finished(args.out, name, seed, args.steps):
                run(train_command(args.out, name, seed, args.steps), log, args.dry_run)
        for name in names[1:]:
            for command in eval_commands(args.out, name, seed, args.samples, names):
                run(command, log, args.dry_run)
    if not args.dry_run:
        from infra.plots import plot_study
        os.makedirs(args.figures or args.out, exist_ok=True)
        figures = plot_study(args.out, args.seeds, args.figures or args.out)
        with open(os.path.join(args.out, "study.json"), "w") as f:
            json.dump({"names": names, "seeds": args.seeds, "steps": args.steps, "minutes": (time.time() - start)
                       / 60, "figures": figures, "summary": summary(args.out, names, args.seeds)}, f, indent=1)
        print(f"study: {(time.time() - start) / 60:.1f} minutes; figures and study.json in {args.out}")


if __name__ == "__main__":
    main()

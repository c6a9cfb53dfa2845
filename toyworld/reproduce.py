"""A committed run again: any run of the study's compact results trained anew by this checkout,
all of its steps or its first N, and compared with the committed record value by value, to the
digits the results keep.

What it is for: checking that the code that ships makes the numbers the pages quote. A run's name
says its command (toyworld/study.py's train_command: the configuration, the seed, the run seed;
the rate and steps from the results' study.json), which runs here as the study ran it, on one
thread, into OUT/RUN. Then each validation and training value the results keep (findings.RESULTS,
4 decimals) is compared step by step, and the first that differs is printed. A toy run is
bit-for-bit only with the same kernels: an AVX512 CPU and one thread, as the study's
(docs/findings/history.md, "Reproducing a run"). What it is not: the run's evaluations, which are
not run again.

    python -m toyworld.reproduce voting-ip-s0                       # about 100 s on one thread
    python -m toyworld.reproduce evalopt-sp-s3-run1003 --steps 20   # its first 20 steps
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from toyworld import declared
from toyworld.findings import kept_metrics
from toyworld.jobs import ROOT
from toyworld.results import records
from toyworld.study import train_command


def parse_run(run: str) -> tuple[str, int, int | None]:
    """(configuration, seed, run seed or None) of a run's name: voting-ip-s3-run1003 ->
    ("voting-ip", 3, 1003); ValueError for a name that is not a study run's."""
    found = re.fullmatch(r"(.+)-s(\d+)(?:-run(\d+))?", run)
    if not found or found[1] not in {**declared.GRID, **declared.SWEEP}:
        raise ValueError(f"{run!r} is not a study run's name (CONFIGURATION-sSEED or "
                         f"CONFIGURATION-sSEED-runRUNSEED; configurations: "
                         f"{', '.join([*declared.SWEEP, *declared.GRID])})")
    return found[1], int(found[2]), int(found[3]) if found[3] else None


def differences(committed: list[dict], fresh: list[dict], steps: int) -> tuple[int, list[str]]:
    """(the values compared, a line for each that differs), over the committed records of steps up
    to `steps`, in order (each record's values but its step); a value the fresh run lacks
    differs."""
    by_step = {r["step"]: r for r in fresh}
    compared, differ = 0, []
    for record in (r for r in committed if r["step"] <= steps):
        mine = by_step.get(record["step"], {})
        for key, value in ((k, v) for k, v in record.items() if k != "step"):
            compared += 1
            if mine.get(key) != value:
                differ.append(f"step {record['step']}: {key} {mine.get(key)}, committed {value}")
    return compared, differ


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run's name: voting-ip-s0, evalopt-sp-s3-run1003")
    p.add_argument("--steps", type=int, default=None, help="its first N steps (default: all)")
    p.add_argument("--results", default="docs/findings/results",
                   help="the compact results and study.json that hold the run")
    p.add_argument("--out", default="runs/reproduce", help="the new run goes into OUT/RUN")
    args = p.parse_args(argv)
    try:
        parse_run(args.run)
    except ValueError as e:
        p.error(str(e))
    committed = records(args.results, args.run, "metrics.jsonl")
    if not committed:
        p.error(f"{args.results} holds no run {args.run}")
    with open(os.path.join(args.results, "study.json")) as f:
        study = json.load(f)
    steps = args.steps or study["steps"]
    out = os.path.abspath(args.out)
    folder = os.path.join(out, args.run)
    if os.path.exists(folder):
        p.error(f"{folder} exists; remove it or give another --out")
    compared, differ = train_again(args.run, committed, out, steps, study["lr"])
    print(f"{args.run}: {compared - len(differ):,} of {compared:,} values agree (steps 0-{steps})")
    if differ:
        print(f"first differs at {differ[0]}")
        sys.exit(1)


def train_again(run: str, committed: list[dict], out: str, steps: int, lr: str,
                root: str = ROOT) -> tuple[int, list[str]]:
    """The committed run `run` (its records `committed`) trained again by the checkout `root` into
    OUT/RUN, as the study ran it on one thread, and `differences` against its records; exits with
    a line when the run fails."""
    name, seed, run_seed = parse_run(run)
    command = train_command(out, name, seed, steps, lr, run_seed)
    command[1] = os.path.join(root, command[1])
    print(" ".join(command[1:]), flush=True)
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the study's: one thread a run
    folder = os.path.join(out, run)
    with open(folder + ".log", "w") as log:
        status = subprocess.run(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    if status.returncode:
        sys.exit(f"error: the run failed (exit {status.returncode}); see {folder}.log")
    return differences(committed, kept_metrics(folder), steps)


if __name__ == "__main__":
    main()

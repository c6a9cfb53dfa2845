"""An ablation's size and its committed baseline (toyworld/ablate.py): which configuration of the
study an arm's flags are, that configuration's committed runs and their spread, the runs a seed
that detect a threshold at that spread within a budget, the minutes they take, and whether the
committed runs can stand in for the baseline's (a reproduction agrees value for value).

What it is for: what toyworld/ablate.py prints before it runs and what it reuses. Its numbers come
from the committed study (docs/findings/results/) and infra/detection.py. What it is not: the
comparison itself (infra/paired.py) or the runs (toyworld/ablate.py).
"""
from __future__ import annotations

import json
import math
import os
import time

from infra import detection, paired
from toyworld import declared
from toyworld.findings import series
from toyworld.jobs import ROOT, code_commit, run_name
from toyworld.reproduce import train_again
from toyworld.results import records
from toyworld.study import flags_of

RESULTS = os.path.join(ROOT, "docs", "findings", "results")  # the committed study
BUDGET_MINUTES = 60  # the default size: an hour of the 2-core machine (two runs at a time)
# A run's minutes at the study's 150 steps, on one thread, two runs side by side on the 2-core
# machine, by workflow, measured 2026-12-06/07: single and voting the medians of the recipes' runs
# (10 and 75: docs/ablations.md), evalopt and orchworkers the means of an SP and an IP run side by
# side (2.17 and 2.13; 3.60 and 2.44, SP's last minute alone)
MINUTES_A_RUN = {"single": 0.55, "voting": 1.7, "evalopt": 2.15, "orchworkers": 3.0}
QUANTITY = "end"  # what the default size is chosen for


def full_flags(args, flags: list[str]) -> list[str]:
    """An arm's flags as train.py gets them after the study's regime: its workflow and policy,
    the study's rate, then its own (which win)."""
    return ["--workflow", args.workflow, "--policy", args.policy, "--lr", args.lr, *flags]


def committed_name(args, flags: list[str]) -> str | None:
    """The study's configuration whose runs an arm's are: the same settings, as train.py's parser
    reads both (the last of a repeated flag wins); None when none is."""
    import train
    parser = train.build_parser()
    mine = vars(parser.parse_args([*declared.TRAIN, *full_flags(args, flags)]))
    return next((name for name in declared.GRID
                 if vars(parser.parse_args([*declared.TRAIN, *flags_of(name, args.lr)])) == mine),
                None)


def committed_arm(name: str, seeds: list[int]) -> paired.Arm:
    """A committed configuration's runs on `seeds` (the study's and the replication's): seed ->
    run k (k = 0, 1, ...; run seed seed + k x RUN_SEED_STEP) -> its validation curve."""
    arm = {}
    for seed in seeds:
        runs = {}
        for k in range(declared.runs_a_seed(name)):
            suffix = f"-run{seed + k * declared.RUN_SEED_STEP}" if k else ""
            curve = [v for _, v in series(RESULTS, name, seed, "val/success", suffix)]
            if curve:
                runs[str(k)] = curve
        if runs:
            arm[seed] = runs
    return arm


def aa_model(arm: paired.Arm, quantity: str = QUANTITY) -> detection.RunModel:
    """Two arms of this configuration, as infra/detection.py draws their difference: a run's
    difference spreads sqrt 2 times one run's SD within its seed (the runs that collapse apart),
    no spread of the seeds' own (a change may add one), and each arm's runs collapse at the
    configuration's rate, by the jumps its collapses showed."""
    values, jumps, fell, total = [], [], 0, 0
    for runs in arm.values():
        clean = [paired.curve_values(c)[quantity] for c in runs.values() if not paired.collapsed(c)]
        values += [[x - paired.mean_of(clean) for x in clean]] if len(clean) > 1 else []
        jumps += [paired.curve_values(c)[quantity] - paired.mean_of(clean)
                  for c in runs.values() if paired.collapsed(c) and clean]
        fell, total = fell + sum(map(paired.collapsed, runs.values())), total + len(runs)
    pooled = sum(x * x for v in values for x in v) / max(1, sum(len(v) - 1 for v in values))
    return detection.RunModel(0.0, math.sqrt(2 * pooled), fell / max(total, 1), tuple(jumps))


def default_runs(args, model: detection.RunModel | None, reusable: int) -> tuple[int, str]:
    """The runs a seed: --quick's 1, the user's --runs, or the fewest (2 or more) whose seeds
    detect the threshold POWER of the time at the committed spread (`model`), within
    BUDGET_MINUTES on --jobs (`reusable`: the baseline's committed runs a seed); with why."""
    if args.quick:
        return 1, "quick: a first look, one run a seed"
    if args.runs:
        return args.runs, "as asked"
    affordable = [r for r in range(2, detection.MOST_RUNS + 1)
                  if minutes(args, r, reusable) <= BUDGET_MINUTES] or [2]
    if model is None:
        return min(3, affordable[-1]), "the study's 3: no committed runs of this configuration"
    needed = next((r for r in affordable if detection.smallest_in(
        detection.seed_noise(model, len(args.seeds), r)) <= args.threshold), None)
    if needed:
        return needed, f"the fewest that detect {args.threshold:g} at the committed spread"
    return affordable[-1], (f"the most that {BUDGET_MINUTES} minutes on {args.jobs} jobs allow; "
                            f"{args.threshold:g} needs more")


def minutes(args, runs: int, reusable: int) -> float:
    """The ablation's estimated minutes on this machine: the runs it trains (the baseline's past
    those it reuses, and one reproduction) at MINUTES_A_RUN, --jobs at a time."""
    one = MINUTES_A_RUN[args.workflow] * args.steps / declared.STEPS
    to_train = len(args.seeds) * (runs + max(0, runs - reusable)) + (1 if reusable else 0)
    return to_train * one / args.jobs


def reusable_runs(args) -> tuple[str | None, int]:
    """The committed configuration the baseline arm is and its runs a seed, when its runs can
    stand in for the baseline's (the study's steps, seeds the results hold); else (None, 0)."""
    name = committed_name(args, args.baseline_flags)
    held = all(records(RESULTS, run_name(name, s), "metrics.jsonl") for s in args.seeds) \
        if name else False
    if not name or args.steps != declared.STEPS or not held:
        return None, 0
    return name, declared.runs_a_seed(name)


def reproduced(args, folder: str, name: str) -> tuple[bool, str]:
    """Whether the baseline's checkout trains the committed run of `name` on the first seed again
    value for value (toyworld/reproduce.py); with the line that says so."""
    run = run_name(name, args.seeds[0])
    committed = records(RESULTS, run, "metrics.jsonl")
    out = os.path.join(folder, "reproduction")
    if os.path.exists(os.path.join(out, run, "args.json")):  # a stopped reproduction: again
        os.rename(os.path.join(out, run), os.path.join(out, f"{run}-stopped-{time.time():.0f}"))
    root = args.baseline_checkout or ROOT
    compared, differ = train_again(run, committed, out, args.steps, args.lr, root)
    said = (f"a reproduction of {run} by {code_commit(root)} agrees on "
            f"{compared - len(differ):,} of {compared:,} values")
    return not differ, said + (f"; first differs at {differ[0]}" if differ else "")


def committed_seeds() -> list[int]:
    with open(os.path.join(RESULTS, "study.json")) as f:
        study = json.load(f)
    return study["seeds"] + study.get("replication", {}).get("seeds", [])

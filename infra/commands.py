"""eval.py's command line: the flags of evaluating a run and their checks, and the commands besides
it (plot, table, report, compare and calibrate), their flags and what each runs.

What it is for: eval.py makes its parser from these (`add_evaluate_flags`, `add_commands`), checks
its flags here (`check_evaluate_flags`) and hands a parsed command to `run`, so that eval.py holds
the evaluation alone. What it is not: the evaluation (eval.py: the five modes, pass@k, per-role
statistics) or the figures, tables and pages themselves (plots.py, results.py, report.py;
compare's statistics, infra/paired.py; calibrate is the toy world's, toyworld/toy_hooks.py).

    python eval.py --run-dir runs/voting-ip --mode base --samples 4  # evaluate a run (eval.py)
    python eval.py plot runs/voting-ip runs/voting-sp [--out runs/plots]  # PNG curves
    python eval.py table runs/voting-ip runs/voting-sp               # their eval.jsonl, one table
    python eval.py report runs/voting-sp runs/voting-ip --out runs/voting.html  # curves, samples
    python eval.py compare --a runs/clip-s* --b runs/base-s* --threshold 0.05  # paired by seed
    python eval.py calibrate --seed 0                                # the toy model at base
"""
from __future__ import annotations

import importlib.util
import os
import re
from typing import Callable

import torch

from infra import paired, vllm_engine
from infra.flags import number
from infra.plots import plot_runs
from infra.report import write_report
from infra.results import results_command
from infra.runfolder import (
    WriteError,
    check_writable,
    read_results,
    read_run_args,
    usage_error,
    writing,
)
from toyworld import toy_hooks


def add_evaluate_flags(p, modes: tuple[str, ...]) -> None:
    """eval.py's own flags, those of evaluating a run (`modes`: eval.MODES)."""
    g = p.add_argument_group("evaluate")
    g.add_argument("--run-dir", "--run", dest="run", default=None,
                   help="run folder written by train.py; under torchrun write --run-dir "
                   "(torchrun takes --run for its own --run-path)")
    g.add_argument("--mode", default="trained", choices=modes,
                   help="base: adapters off; trained: the run's adapters as in training; "
                   "sa-transfer: --sa-run's adapter for every role; sa-generator-transfer: for the "
                   "generators and workers only; swapped: an IP run's adapters with two roles' "
                   "exchanged (--swap), beside trained")
    g.add_argument("--sa-run", default=None,
                   help="SA modes: a single-agent run folder (same model and task)")
    g.add_argument("--swap", default=None, metavar="ROLE,ROLE",
                   help="swapped: the two role types whose adapters change places (default: "
                   "the workflow's last two)")
    g.add_argument("--step", type=int, default=None,
                   help="checkpoint step (SA modes: of --sa-run); default: latest")
    g.add_argument("--every-checkpoint", action="store_true",
                   help="evaluate every saved checkpoint")
    g.add_argument("--data", default=None,
                   help="evaluate on this file instead of the run's validation split, in the "
                   "run's task format (math: AIME 2025; code: DeepCoder's primeintellect test "
                   "split)")
    g.add_argument("--split", default="val", choices=["val", "test"],
                   help="synthetic math: the run's validation problems, or as many others drawn "
                   "after its training ones (disjoint from both)")
    count = number(int, 1)
    g.add_argument("--samples", "--n", dest="samples", type=count, default=1,
                   help="samples per task: accuracy is their mean, pass@k for k = 1, 2, 4... <= "
                   "n; under torchrun write --samples")
    g.add_argument("--temperature", type=number(float, 0), default=None,
                   help="default: the run's sampling temperature")
    g.add_argument("--max-new-tokens", type=count, default=None,
                   help="default: a paper cell's evaluation length (math 8192, code 5120), else "
                   "the run's")
    g.add_argument("--max-prompt-tokens", type=count, default=None,
                   help="default: a paper cell's evaluation limit, else the run's")
    g.add_argument("--seed", type=int, default=0,
                   help="sampling seed, the same for every checkpoint")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"],
                   help="auto: vllm on CUDA when it imports, else hf (transformers generate)")
    g.add_argument("--vllm-gpu-memory", type=number(float, 0, 1, low_open=True), default=0.85,
                   help="vllm: fraction of GPU memory it takes (the model and its adapters stay on "
                   "the CPU)")
    g.add_argument("--dump", action="store_true",
                   help="one JSON file per episode under RUN/trajectories/")
    g.add_argument("--out", default=None,
                   help="JSONL to append results to (default: RUN/eval.jsonl)")


def check_evaluate_flags(args, run_keys: tuple[str, ...], sa_modes: tuple[str, ...]) -> None:
    """One line for each bad value of evaluating a run, before any model loads (`run_keys`: what
    eval.py reads of a run's args.json; `sa_modes`: the modes that read --sa-run)."""
    if not args.run:
        usage_error("--run-dir RUN is needed (or a command: plot, table, report, calibrate, "
                    "compare; see --help)")
    run_args = read_run_args(args.run, keys=run_keys)  # not a run folder: one line
    if args.out:
        check_writable(args.out, "--out", folder=False)
    if args.mode in sa_modes and args.sa_run:
        read_run_args(args.sa_run, f"--sa-run {args.sa_run}", run_keys)
    known = re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device)
    if not known or (args.device.startswith("cuda") and not torch.cuda.is_available()):
        usage_error(f"--device {args.device}: expected auto, cpu, or cuda with a visible CUDA "
                    "device")
    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    if args.engine == "auto":
        args.engine = "vllm" if cuda and importlib.util.find_spec("vllm") else "hf"
    if problem := vllm_engine.engine_problem(args.engine, args.device):  # not installed; cuda:N
        usage_error(problem)
    if args.split == "test" and (args.data or run_args["task"] != "math"):
        usage_error("--split test: synthetic math runs only, without --data")
    if args.swap and args.mode != "swapped":
        usage_error("--swap is for --mode swapped")
    if args.every_checkpoint and args.mode == "base":
        usage_error("--every-checkpoint needs a mode with checkpoints (base has none)")


def add_commands(commands) -> None:
    """The commands' parsers, under eval.py's `add_subparsers` action `commands`."""
    plot = commands.add_parser("plot", help="PNG curves of runs: validation accuracy, per-role "
                               "training metrics")
    plot.add_argument("runs", nargs="+", help="run folders written by train.py")
    plot.add_argument("--out", default=None,
                      help="folder for the PNGs (default: plots/ beside the first run)")
    calibrate = commands.add_parser("calibrate", help="the toy model of --seed at base against its "
                                    "targets (toyworld/calibration.py; also python -m toyworld.toy "
                                    "--calibrate)")
    calibrate.add_argument("--seed", type=int, default=0, help="the toy model's seed")
    calibrate.add_argument("--build-only", action="store_true",
                           help="build the seed's toy model (once, into the cache) and stop")
    calibrate.add_argument("--build-into", default=None,
                           help="build the seed's toy model afresh into this new folder (never "
                           "copied from docs/findings/models/) and stop")
    calibrate.add_argument("--episodes", type=number(int, 1), default=None,
                           help="episodes per problem of every measurement (default: "
                           "calibration.EPISODES, >= 500 calls of each habit)")
    calibrate.add_argument("--out", default=None, help="also write the record as JSON here")
    calibrate.add_argument("--temperature", type=number(float, 0), default=None,
                           help="sampling temperature (default: the study's, "
                           "calibration.TEMPERATURE)")
    report = commands.add_parser("report", help="one HTML file: per-role curves, warnings, "
                                 "sampled episodes")
    report.add_argument("runs", nargs="+", help="run folders written by train.py")
    report.add_argument("--out", required=True, help="the HTML file to write")
    table = commands.add_parser("table", help="the runs' eval.jsonl records as one markdown table")
    table.add_argument("results", nargs="+",
                       help="run folders (reads RUN/eval.jsonl) or results JSONL files")
    compare = commands.add_parser("compare", help="two sets of runs paired by seed: each "
                                  "quantity's difference, its t-interval, spreads, power, verdict")
    compare.add_argument("--a", nargs="+", required=True, help="run folders of arm A (the change)")
    compare.add_argument("--b", nargs="+", required=True,
                         help="run folders of arm B (the baseline)")
    compare.add_argument("--threshold", type=number(float, 0, low_open=True), required=True,
                         help="the difference that counts (A higher by it: shown)")
    compare.add_argument("--key", default="success",
                         help="the validation metric compared (val/KEY; default: success)")


def run(args, roles: dict[str, list[str]], play: Callable, toy_engine: Callable):
    """What the parsed command gives back (and prints); `roles` are the workflows' roles (plot),
    `play` and `toy_engine` the toy world's rollout and engine (calibrate)."""
    if args.command == "table":
        return results_command(args.results)
    if args.command == "compare":
        return compare_command(args.a, args.b, args.threshold, args.key)
    if args.command == "calibrate":
        return toy_hooks.calibrate_command(args, play, toy_engine)
    if args.command == "report":
        written = write_report(args.runs, args.out)
        warnings = sum(map(len, written["warnings"]))
        print(f"wrote {args.out} ({written['bytes'] / 1e6:.2f} MB; {warnings} warnings)")
        return written
    return plot_command(args.runs, args.out, roles)


def plot_command(runs: list[str], out: str | None, roles: dict[str, list[str]]) -> dict:
    """`eval.py plot`: the runs' curves as PNGs in `out` (default: plots/ beside the first run)."""
    out = out or os.path.join(os.path.dirname(os.path.normpath(runs[0])), "plots")
    check_writable(out, "--out", folder=True)
    try:
        with writing(f"the plots in {out}", out):
            figures = plot_runs(runs, out, roles)
    except WriteError as error:
        usage_error(f"{error}")
    print("\n".join(f"wrote {path}" for _, path in figures.values()))
    return figures


def compare_command(a: list[str], b: list[str], threshold: float, key: str) -> dict:
    """`eval.py compare`: two sets of run folders, each run's seed and run seed from its
    args.json, paired by seed (within a seed, runs in the order of their run seeds), compared as
    infra/paired.py compares arms; printed, and returned."""
    arms = [arm_of(folders, key, flag) for folders, flag in ((a, "--a"), (b, "--b"))]
    if len(set(arms[0]) & set(arms[1])) < 2:
        usage_error(f"--a and --b share {len(set(arms[0]) & set(arms[1]))} seed(s) "
                    f"(A: {sorted(arms[0])}, B: {sorted(arms[1])}); a paired interval needs 2")
    result = paired.compare_arms(arms[0], arms[1], threshold)
    print("\n".join(paired.describe(result)))
    return result


def arm_of(folders: list[str], key: str, flag: str) -> paired.Arm:
    """Run folders as an arm: seed -> "0", "1", ... (its runs by run seed) -> validation curve of
    val/`key` (RUN.log files beside them skipped); a folder that is not a run, or a run with fewer
    than 3 validation points, is one line."""
    by_seed: dict[int, list[tuple[int, list[float]]]] = {}
    # a run's log lies beside its folder (RUN.log): a glob such as runs/abl/clip-s* names both
    for folder in [f for f in folders if not (f.endswith(".log") and os.path.isfile(f))]:
        run_args = read_run_args(folder, f"{flag} {folder}", ("seed",))
        curve = [m[f"val/{key}"] for m in read_results(os.path.join(folder, "metrics.jsonl"))
                 if m.get(f"val/{key}") is not None]
        if len(curve) < paired.WINDOW:
            usage_error(f"{flag} {folder}: {len(curve)} validation points of val/{key} (a peak "
                        f"and an end need {paired.WINDOW})")
        run_seed = run_args.get("run_seed")
        seed = run_args["seed"]
        by_seed.setdefault(seed, []).append((seed if run_seed is None else run_seed, curve))
    return {seed: {str(i): curve for i, (_, curve) in enumerate(sorted(runs, key=lambda r: r[0]))}
            for seed, runs in by_seed.items()}

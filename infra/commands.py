"""eval.py's commands besides evaluating a run: plot, table, report and calibrate, their flags and
what each runs.

What it is for: eval.py adds these commands to its command line (`add_commands`) and hands a parsed
one to `run`, so that eval.py holds the evaluation alone. What it is not: the evaluation (eval.py:
the five modes, pass@k, per-role statistics) or the figures, tables and pages themselves (plots.py,
results.py, report.py; calibrate is the toy world's, toyworld/toy_hooks.py).

    python eval.py plot runs/voting-ip runs/voting-sp [--out runs/plots]  # PNG curves
    python eval.py table runs/voting-ip runs/voting-sp               # their eval.jsonl, one table
    python eval.py report runs/voting-sp runs/voting-ip --out runs/voting.html  # curves, samples
    python eval.py calibrate --seed 0                                # the toy model at base
"""
from __future__ import annotations

import os
from typing import Callable

from infra.flags import number
from infra.plots import plot_runs
from infra.report import write_report
from infra.results import results_command
from infra.runfolder import WriteError, check_writable, usage_error, writing
from toyworld import toy_hooks


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


def run(args, roles: dict[str, list[str]], play: Callable, toy_engine: Callable):
    """What the parsed command gives back (and prints); `roles` are the workflows' roles (plot),
    `play` and `toy_engine` the toy world's rollout and engine (calibrate)."""
    if args.command == "table":
        return results_command(args.results)
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

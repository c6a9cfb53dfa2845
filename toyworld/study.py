"""The toy-world study, in one command: each seed's toy model built and calibrated, the
learning-rate sweep, every finding's runs over five seeds, held-out evaluation, paired statistics,
predeclared verdicts, the figures, docs/findings.md's tables and their compact results; then, as a
second command, the grid on further seeds.

What it is for: what docs/findings.md reports, each part fixed before the next one runs: (0) the
instruments, toy models built and calibrated side by side (eval.py calibrate), the first five seeds
that pass (CANDIDATES; a core that would wait idle calibrates the next candidate); (1) the sweep,
the single agent at three rates and the rule that picks the grid's (SWEEP_RULE); (2) the grid (GRID)
at that rate, RUNS runs a seed (DECLINE_RUNS for the decline comparisons'; run seeds seed + k x
RUN_SEED_STEP): train.py runs validated every 10 steps on 64 problems, then eval.py on 64 *other*
problems (`--split test`; MODES, and SWAPPED on the IP runs; the grid's single agent is the sweep's
run at that rate, copied); (3) the runs' compact results (findings.RESULTS) in one file beside the
page, and FINDINGS, the comparisons, thresholds and rules toyworld/declared.py wrote before the grid
ran, applied by toyworld/findings.py; (4) the figures, the page's tables between their markers, and
an `eval.py report` page per run. `--replicate N` then runs the grid on the next N calibrated seeds
and says, comparison by comparison, whether each repeats the study's sign and threshold. Each run is
an ordinary `python train.py` / `python eval.py` command in its own folder under --out: a finished
run is skipped, a stopped one resumed (Ctrl-C or SIGTERM stops each after its step). The terminal
shows a line per finished command, the minutes since the start and an estimate of those left. What
it is not: the method (it only calls train.py and eval.py), part of the test suite, or a place to
change a rate, a knob, a step count, a seed or a threshold after a comparison has been seen.

    python -m toyworld.study --dry-run   # the seeds' builds, the sweep, the grid, their commands
    # the whole study (docs/findings.md says how long it took):
    python -m toyworld.study --out runs/study --jobs 2 --results docs/findings/results \\
        --figures docs/findings --doc docs/findings.md
    # the grid on two more seeds:
    python -m toyworld.study --out runs/study --jobs 2 --replicate 2 \\
        --results docs/findings/results --doc docs/findings.md
    python -m toyworld.study --tables --results docs/findings/results --doc docs/findings.md \\
        --readme README.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from infra.runfolder import copy_run, read_results
from toyworld import declared, findings, toy, toy_model, verdicts
from toyworld.jobs import Clock, every_run, finished, kind_of, run_all, run_dir, run_log, run_seeds

# ---------------------------------------------------------------- the commands

def flags_of(name: str, lr: str) -> list[str]:
    """A configuration's flags: the sweep's own rate, or the grid's rate (a third of it for the
    control)."""
    if name in declared.SWEEP:
        return ["--workflow", "single", "--lr", declared.SWEEP[name]]
    flags = list(declared.GRID[name])
    if "third" in flags:  # (a dry run, before the sweep has chosen, shows the rate by name)
        flags[flags.index("third")] = f"{float(lr) / 3:.3g}" if lr[0].isdigit() else f"{lr}/3"
    return flags if "--lr" in flags else [*flags, "--lr", lr]


def train_command(out: str, name: str, seed: int, steps: int, lr: str,
                  run_seed: int | None = None) -> list[str]:
    """The study's run of `name` on `seed` (and `run_seed`): `run_command` into its folder."""
    return run_command(run_dir(out, name, seed, run_seed), flags_of(name, lr), seed, steps,
                       run_seed)


def run_command(folder: str, flags: list[str], seed: int, steps: int, run_seed: int | None = None,
                script: str = "train.py") -> list[str]:
    """A new toy run in the study's regime (declared.TRAIN) with `flags`, or the resumption of a
    stopped one (its folder holds a run already); with `run_seed`, a rerun on that run seed
    (`train.py --run-seed`); `script`: another checkout's train.py (toyworld/ablate.py)."""
    if os.path.exists(os.path.join(folder, "args.json")):
        return [sys.executable, script, "--resume", folder, "--steps", str(steps)]
    rerun = ["--run-seed", str(run_seed)] if run_seed is not None else []
    return [sys.executable, script, *declared.TRAIN, *flags, "--seed", str(seed), *rerun,
            "--steps", str(steps), "--run-dir", folder]


def eval_commands(out: str, name: str, seed: int, samples: int, names: list[str],
                  run_seed: int | None = None) -> list[list[str]]:
    """eval.py on the held-out test problems of a multi-agent run's final checkpoint (the
    single-agent run of its seed and run seed is the SA adapter); a mode already in the run's
    eval.jsonl is not run again. `trained` runs for every run; base and the two transfer modes load
    no adapter of the run, so they run once per workflow, seed and run seed, on the workflow's first
    configuration in the grid (voting-sp, evalopt-sp, orchworkers-sp): the transfer modes on each
    run seed the single agent has, base on the study's own run only (eval.py samples with its own
    seed, so base gives the same numbers on every run)."""
    folder = run_dir(out, name, seed, run_seed)
    sa = run_dir(out, "single", seed, run_seed)
    workflow_first = next(n for n in names if declared.GRID[n][1] == declared.GRID[name][1]) == name
    done = {r["mode"] for r in read_results(os.path.join(folder, "eval.jsonl"), ("mode",),
                                            warn=False)}
    once = {"base": run_seed is None, "sa-transfer": run_seed in run_seeds("single", seed)}
    modes = [m for m in declared.MODES if m not in done and (m == "trained" or workflow_first and
                                                             once.get(m, once["sa-transfer"]))]
    # an IP run's swapped writes trained beside it, same draws
    if name in declared.SWAPPED and "swapped" not in done:
        modes = [m for m in modes if m != "trained"] + ["swapped"]
    return [[sys.executable, "eval.py", "--run-dir", folder, "--mode", mode,
             "--samples", str(samples), "--split", "test",
             *(["--sa-run", sa] if mode.startswith("sa") else [])] for mode in modes]


def needs_build(seed: int) -> bool:
    """Whether the seed's toy model must be built: neither in the cache nor committed (which is
    copied)."""
    return not (toy.ready(seed) or toy_model.committed(seed))


def seed_chain(out: str, seed: int) -> list[tuple[list[str], str]]:
    """A seed's toy model built (unless the cache has it or it is committed, which the calibration
    copies: no build command, none for the clock to wait for) and calibrated, its record in
    out/calibration/, both commands' output in out/calibration/seedS.log."""
    record = os.path.join(out, "calibration", f"seed{seed}.jsonl")
    calibrate = [sys.executable, "eval.py", "calibrate", "--seed", str(seed)]
    log = record[:-6] + ".log"
    build = [] if not needs_build(seed) else [([*calibrate, "--build-only"], log)]
    return [*build, ([*calibrate, "--out", record], log)]


def sweep_twin(name: str, lr: str) -> str | None:
    """The sweep's configuration whose train.py command is the grid's `name` at rate `lr`, flag for
    flag (the single agent at the sweep's choice): its finished runs are copied, not trained again
    (a replication seed trains)."""
    return next((s for s in declared.SWEEP
                 if name in declared.GRID and flags_of(s, lr) == flags_of(name, lr)), None)


def run_chain(*commands: list[str]) -> list[tuple[list[str], str]]:
    """A run's commands, each with the log next to its folder."""
    return [(command, run_log(command)) for command in commands]


# ---------------------------------------------------------------- the phases

def recorded_misses(out: str, seed: int) -> list[str] | None:
    """The calibration targets the seed's toy model misses, from its record (None: not calibrated
    yet)."""
    path = os.path.join(out, "calibration", f"seed{seed}.jsonl")
    records = read_results(path, ("seed", "missed"), warn=False)
    return records[-1]["missed"] if records else None


def calibrated_seeds(out: str, wanted: int, candidates: list[int], jobs: int, clock: Clock | None,
                     dry_run: bool) -> tuple[list[int], list[dict]]:
    """(the first `wanted` of `candidates` whose toy model passes calibration, the ones before them
    set aside with the targets they missed), built and calibrated `jobs` at a time, in order, until
    enough have passed; a dry run calibrates nothing and counts a seed without a record as
    calibrated. Before any run: the study runs on calibrated instruments only."""
    started, spares = [], []

    def next_seed():
        known = [recorded_misses(out, s) for s in started]
        # a dry run: as if calibrated
        passing = sum(m == [] or (dry_run and m is None) for m in known)
        pending = 0 if dry_run else sum(m is None for m in known)
        # At most jobs - 1 spares: a core idle beside the last seeds needed calibrates the next
        # candidate, used if one of them misses (3 minutes less); more, started as the last ones
        # end, would hold the study back
        spare = passing + pending >= wanted
        if (passing >= wanted or (spare and len(spares) >= jobs - 1)
                or len(started) == len(candidates)):
            return None
        seed = candidates[len(started)]
        started.append(seed)
        spares.extend([seed] if spare else [])
        chain = [] if recorded_misses(out, seed) is not None else seed_chain(out, seed)
        # a cached model, a recorded calibration: nothing to wait for
        for kind in ("build", "calibrate"):
            runs = kind in [kind_of(command) for command, _ in chain]
            # a spare's commands are not in the plan; a needed seed's are
            if clock and runs != (not spare):
                clock.plan(kind, 1 if spare else -1)
        return chain

    def note(command):
        if kind_of(command) != "calibrate":
            return ""
        missed = recorded_misses(out, int(command[command.index("--seed") + 1]))
        return (": passes" if missed == [] else f": misses {len(missed)} target(s)" if missed
                else ": no record")
    run_all(next_seed, dry_run, jobs, clock, note)
    seeds, set_aside = [], []
    for seed in started:
        missed = recorded_misses(out, seed)
        if missed and len(seeds) < wanted:
            print(
                f"seed {seed}: its toy model misses {len(missed)} calibration target(s) "
                f"({', '.join(missed)}); set aside", flush=True)
            set_aside.append({"seed": seed, "missed": missed})
        elif not missed and len(seeds) < wanted:
            seeds.append(seed)
    if len(seeds) < wanted:
        raise SystemExit(
            f"error: only {len(seeds)} of seeds {candidates[0]}-{candidates[-1]} have a calibrated "
            f"toy model ({wanted} wanted); set aside: "
            f"{', '.join(str(r['seed']) for r in set_aside)}")
    return seeds, set_aside


def train_and_evaluate(out: str, names: list[str], seeds: list[int], steps: int, lr: str,
                       samples: int, jobs: int, clock: Clock | None, dry_run: bool) -> None:
    """Every configuration's runs on every seed (seed by seed, so that a stopped study has whole
    seeds to show), then eval.py on the grid's runs."""
    for source, target in [(run_dir(out, twin, s), run_dir(out, n, s))
                           for s in seeds for n in names
                           if (twin := sweep_twin(n, lr)) and finished(out, twin, s, steps)]:
        if not os.path.exists(target):
            copy_run(source, target)
    runs = every_run(names, seeds)
    trains = [run_chain(train_command(out, n, s, steps, lr, r)) for n, s, r in runs
              if dry_run or not finished(out, n, s, steps, r)]
    # a run trained by an earlier invocation is not waited for, and these runs are timed afresh
    if clock:
        clock.plan("train", len(trains) - len(runs))
        clock.took["train"] = []  # (the sweep's single agents take a fifth of a grid run's time)
    run_all(trains, dry_run, jobs, clock)
    grid = [n for n in names if n in declared.GRID]
    evals = [run_chain(*eval_commands(out, n, s, samples, grid, r)) for s in seeds
             for n in grid[1:] for r in run_seeds(n, s)]
    if clock and grid:  # nor a mode already in its run's eval.jsonl
        clock.plan("eval", sum(map(len, evals)) - evals_per_seed(grid) * len(seeds))
    run_all(evals, dry_run, jobs, clock)


def replicate(args, clock: Clock, results: str) -> None:
    """`--replicate N`: the grid at the study's rate on the next N seeds whose toy model passes
    calibration, and each comparison's replication (`replication`) in study.json and the page's
    replication table."""
    with open(os.path.join(args.out, "study.json")) as f:
        study = json.load(f)
    candidates = list(range(max(study["seeds"] + [r["seed"] for r in study["set_aside"]]) + 1,
                            declared.CANDIDATES))
    clock.plan("build", args.replicate), clock.plan("calibrate", args.replicate)
    grid = list(declared.GRID)
    clock.plan("train", sum(map(declared.runs_a_seed, grid)) * args.replicate)
    clock.plan("eval", evals_per_seed(grid) * args.replicate)
    seeds, set_aside = calibrated_seeds(args.out, args.replicate, candidates, args.jobs, clock,
                                        args.dry_run)
    train_and_evaluate(args.out, grid, seeds, study["steps"], study["lr"], args.samples, args.jobs,
                       clock, args.dry_run)
    if args.dry_run:
        return
    from toyworld.fold import fold
    study["replication"] = {"seeds": seeds, "set_aside": set_aside, "minutes": clock.minutes(),
                            **seed_records(args.out, seeds, set_aside)}
    fold(args.out, results, study, args.figures or args.out, args.doc, args.readme)
    print(f"replication: {clock.minutes():.1f} minutes; study.json in {args.out} and {results}")


def seed_records(out: str, seeds: list[int], set_aside: list[dict]) -> dict:
    """Each considered seed's build (toy.json) and calibration record, for study.json
    (calibration_warning reads it)."""
    considered = sorted(seeds + [r["seed"] for r in set_aside])
    return {"builds": [toy.build_record(s) for s in considered],
            "calibration": [read_results(os.path.join(out, "calibration", f"seed{s}.jsonl"),
                                         warn=False)[-1] for s in considered]}


def evals_per_seed(grid: list[str]) -> int:
    """eval.py commands a seed's grid runs (eval_commands, none of them run yet)."""
    return sum(len(eval_commands("", n, 0, 1, grid, r)) for n in grid if n != "single"
               for r in run_seeds(n, 0))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/study",
                   help="folder of the study's runs, logs and study.json")
    p.add_argument("--results", default=None,
                   help="folder of the compact results (toyworld/results.py) that the tables and "
                   "figures are drawn from (default: OUT/results; the page's: "
                   "docs/findings/results)")
    p.add_argument("--seeds", type=int, default=declared.SEEDS,
                   help="how many seeds: the first N of 0, 1, 2, ... whose toy model passes "
                   "calibration (the others set aside, named in study.json)")
    p.add_argument("--steps", type=int, default=declared.STEPS, help="training steps of every run")
    p.add_argument("--samples", type=int, default=2, help="eval.py samples per test problem")
    p.add_argument("--only", default=None,
                   help="comma-separated grid names (default: all; single always runs)")
    p.add_argument("--figures", default=None, help="folder for the figures (default: --out)")
    p.add_argument("--doc", default=None,
                   help="a findings page whose marked tables are rewritten from study.json")
    p.add_argument("--readme", default=None,
                   help="a README whose marked verdict table is rewritten too")
    p.add_argument("--tables", action="store_true",
                   help="train nothing: --doc's, --readme's tables from RESULTS")
    p.add_argument("--jobs", type=int, default=1,
                   help="commands run at once, one thread each when more than one (2 on a 2-core "
                   "machine: the toy model's small matrices keep one core busy, not two)")
    p.add_argument("--replicate", type=int, default=0,
                   help="after the study: its grid on the next N calibrated seeds, and whether "
                   "each comparison replicates")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    grid = list(declared.GRID) if not args.only else [
        "single", *[n for n in args.only.split(",") if n != "single"]]
    if unknown := [n for n in grid if n not in declared.GRID]:
        p.error(f"--only: unknown names {unknown}; the grid: {', '.join(declared.GRID)}")
    args.out = os.path.abspath(args.out)  # the commands run from the repository
    results = os.path.abspath(args.results or os.path.join(args.out, "results"))
    if args.tables:  # train nothing: the pages' tables from the study.json in `results`
        return verdicts.write_pages(results, None, args.doc, args.readme)
    if args.replicate and not os.path.exists(os.path.join(args.out, "study.json")):
        p.error(f"--replicate: {args.out} holds no study.json; run the study first")
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
        from toyworld.jobs import record_commit  # the code that runs, named in study.json
        print(f"the study's code: commit {record_commit(args.out)}", flush=True)
    clock = Clock(args.jobs)
    if args.replicate:
        return replicate(args, clock, results)
    clock.plan("build", sum(map(needs_build, range(args.seeds))))
    clock.plan("calibrate", args.seeds)
    clock.plan("train", sum(map(declared.runs_a_seed, [*declared.SWEEP, *grid])) * args.seeds)
    clock.plan("eval", evals_per_seed(grid) * args.seeds)
    seeds, set_aside = calibrated_seeds(args.out, args.seeds, list(range(declared.CANDIDATES)),
                                        args.jobs, clock, args.dry_run)
    train_and_evaluate(args.out, list(declared.SWEEP), seeds, args.steps, "", args.samples,
                       args.jobs, clock, args.dry_run)
    lr = "LR" if args.dry_run else findings.sweep_choice(
        args.out, seeds, declared.SWEEP, declared.SWEEP_RULE)["choice"]
    if lr is None:
        raise SystemExit(
            f"error: no swept rate holds ({declared.SWEEP_RULE}); the grid has no rate")
    print(f"the sweep's rate: {lr} ({declared.SWEEP_RULE})", flush=True)
    train_and_evaluate(args.out, grid, seeds, args.steps, lr, args.samples, args.jobs, clock,
                       args.dry_run)
    if args.dry_run:
        return
    from toyworld.fold import fold  # the compact results, study.json, figures, pages
    study = {"names": [*declared.SWEEP, *grid], "seeds": seeds, "steps": args.steps, "lr": lr,
             "minutes": clock.minutes(), "set_aside": set_aside,
             **seed_records(args.out, seeds, set_aside)}
    fold(args.out, results, study, args.figures or args.out, args.doc, args.readme)
    print(f"study: {clock.minutes():.1f} minutes; study.json in {args.out} and {results}")


if __name__ == "__main__":
    main()

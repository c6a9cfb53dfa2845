"""The toy-world study, in one command: each seed's toy model built and calibrated, the
learning-rate sweep, every finding's runs over five seeds, held-out evaluation, paired statistics,
predeclared verdicts, the figures, docs/findings.md's tables and their compact results; then, as a
second command, the grid on further seeds.

What it is for: what docs/findings.md reports, each part fixed before the next one runs: (0) the
instruments, toy models built and calibrated side by side (eval.py calibrate), the first five seeds
that pass (CANDIDATES; a core that would wait idle calibrates the next candidate); (1) the sweep,
the single agent at three rates and the rule that picks the grid's (SWEEP_RULE); (2) the grid (GRID)
at that rate: train.py runs validated every 10 steps on 64 problems, then eval.py on 64 *other*
problems (`--split test`; MODES, and SWAPPED on the IP runs; the grid's single agent is the sweep's
run at that rate, copied); (3) the runs' compact results (findings.RESULTS) in one file beside the
page, and FINDINGS, the comparisons, thresholds and rules written here before the grid ran, applied
by toyworld/findings.py; (4) the figures, the page's tables between their markers, and an `eval.py
report` page per run. `--replicate N` then runs the grid on the next N calibrated seeds and says,
comparison by comparison, whether each repeats the study's sign and threshold. Each run is an
ordinary `python train.py` / `python eval.py` command in its own folder under --out: a finished run
is skipped, a stopped one resumed (Ctrl-C or SIGTERM stops each after its step). The terminal shows
a line per finished command, the minutes since the start and an estimate of those left. What it is
not: the method (it only calls train.py and eval.py), part of the test suite, or a place to change a
rate, a knob, a step count, a seed or a threshold after a comparison has been seen.

    python -m toyworld.study --dry-run                  # the seeds' builds, the sweep, the grid and
    their commands python -m toyworld.study --out runs/study --jobs 2 --results
    docs/findings/results --figures docs/findings \\
        --doc docs/findings.md                       # the whole study (docs/findings.md says how
        long it took)
    python -m toyworld.study --out runs/study --jobs 2 --replicate 2 --results docs/findings/results
    \\
        --doc docs/findings.md                       # the grid on two more seeds
    python -m toyworld.study --tables --results docs/findings/results --doc docs/findings.md
    --readme README.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from infra.runfolder import copy_run, read_results
from toyworld import calibration, findings, toy, toy_model, verdicts
from toyworld.jobs import Clock, kind_of, run_all, run_log

SEEDS = 5
# The study's seeds: the first SEEDS of 0, 1, ..., CANDIDATES-1 whose toy model passes calibration
# (eval.py calibrate), a rule fixed before any RL run. A build that misses a target is not the
# instrument docs/toy_world.md describes, so it is set aside, named in study.json and
# docs/findings.md, never tuned until it passes. The replication seeds (--replicate) are the next
# ones by the same rule.
CANDIDATES = 20
STEPS = 150
# The regime, fixed before any run of the grid: the toy world's own (calibration.REGIME: 2 tasks x a
# group of 8, temperature 1, 32 new tokens, the setting calibration measures at), 115 training
# problems, so that 64 validation and 64 test problems of the 243 stay disjoint from them and from
# each other.
REGIME_FLAGS = [word for key, value in calibration.REGIME.items()
                for word in (f"--{key.replace('_', '-')}", str(value))]
TRAIN = ["--model", "toy", *REGIME_FLAGS, "--n-train", "115", "--n-val", "64", "--val-n", "2",
         "--val-every", "10",
         "--save-every", "50", "--difficulty", "0", "--micro-batch-size", "16"]
SWEEP = {"single-lr1e-3": "1e-3", "single-lr3e-4": "3e-4", "single-lr1e-4": "1e-4"}
SWEEP_RULE = "the largest rate whose runs do not decline (end within 0.05 of peak) in at least 4 of 5 seeds"
# name -> the flags that make it (on top of TRAIN and the sweep's rate); the names are the figures'
# labels
GRID = {
    "single": ["--workflow", "single"],
    "voting-sp": ["--workflow", "voting", "--policy", "sp"],
    "voting-sp-equal": ["--workflow", "voting", "--policy", "sp", "--role-weights", "equal"],
    "voting-ip": ["--workflow", "voting", "--policy", "ip"],
    "voting-ip-merged": ["--workflow", "voting", "--policy", "ip", "--merge-instance-steps"],
    # finding 4's control
    "voting-ip-third-lr": ["--workflow", "voting", "--policy", "ip", "--lr", "third"],
    "voting-ip-i6": ["--workflow", "voting", "--policy", "ip", "--coherence", "generator=0.3"],
    "voting-ip-i1": ["--workflow", "voting", "--policy", "ip", "--kl-coef",
                     "generator=0.1,aggregator=0.1"],
    "evalopt-sp": ["--workflow", "evalopt", "--policy", "sp"],
    "evalopt-ip": ["--workflow", "evalopt", "--policy", "ip"],
    "orchworkers-sp": ["--workflow", "orchworkers", "--policy", "sp"],
    "orchworkers-ip": ["--workflow", "orchworkers", "--policy", "ip"],
}
MODES = ("base", "trained", "sa-transfer", "sa-generator-transfer")


def c(label: str, a: tuple, b: tuple | None = None, rule: str = "greater", threshold: float = 0.05,
      target: float | None = None) -> dict:
    """One comparison: A (minus B), a rule of toyworld/findings.py, its threshold (and target for
    `near`)."""
    return {"label": label, "a": a, **({"b": b} if b else {}), "rule": rule, "threshold": threshold,
            **({"target": target} if target is not None else {})}


# eval.py's SWAPS (infra/ never imports it)
SWAPPED = {"voting-ip": ("Voting IP", ("generator", "aggregator")),
           "evalopt-ip": ("Eval-Opt IP", ("generator", "evaluator")),
           "orchworkers-ip": ("Orch-Workers IP", ("worker", "synthesizer"))}


def ev(name: str, mode: str = "trained", key: str = "accuracy") -> tuple:
    return (name, f"eval:{mode}", key)


# Written before the grid ran; a threshold of 0.05 is about two standard errors of a 5-seed mean of
# a difference at a spread of 0.05 per seed (what the 3-seed study saw between seeds for one
# configuration's end).
FINDINGS = [
    {"id": "1",
     "claim": "SA-RL in the structure matches or beats trained Voting and Orch-Workers; only "
     "Eval-Opt IP beats "
     "it", "preconditions": [c("Voting SP gains over its base", ev("voting-sp"), ev(
         "voting-sp", "base"))],
     "comparisons": [
         c("Voting: SA-RL - trained SP", ev("voting-sp", "sa-transfer"), ev("voting-sp"),
           "matches"),
         c("Voting: SA-RL - trained IP", ev("voting-sp", "sa-transfer"), ev("voting-ip"),
           "matches"),
         c("Orch-Workers: SA-RL - trained SP", ev("orchworkers-sp", "sa-transfer"), ev(
             "orchworkers-sp"), "matches"),
         c("Orch-Workers: SA-RL - trained IP", ev("orchworkers-sp", "sa-transfer"), ev(
             "orchworkers-ip"), "matches"),
         c("Eval-Opt: trained IP - SA-RL", ev("evalopt-ip"), ev("evalopt-sp", "sa-transfer"))]},
    {"id": "2", "claim": "Eval-Opt's evaluator learns when to retry", "comparisons": [
        c(f"{p.upper()}: P(retry | first wrong) - P(retry | first right), end - base",
          (f"evalopt-{p}", "change", "p_retry_first_wrong"), (
              f"evalopt-{p}", "change", "p_retry_first_right"),
          threshold=0.10) for p in ("sp", "ip")]},
    {"id": "3",
     "claim": "Under SP each role's share of the update is set by its outputs' count and length; "
     "re-weighting the roles gives SP IP's peak", "comparisons": [
         c("SP generators' loss share (3 of 4 outputs)", ("voting-sp", "train",
                                                          "generator/loss_share"),
           rule="near", threshold=0.05, target=0.75),
         c("peak: SP with equal role weights - SP", ("voting-sp-equal", "peak", "success"),
           ("voting-sp", "peak", "success"))]},
    {"id": "4",
     "claim": "IP steps once per instance and declines after its peak; merging the steps delays "
     "the decline", "comparisons": [
         c("decline (peak - end): IP - SP", ("voting-ip", "decline", "success"), (
             "voting-sp", "decline", "success")),
         c("decline: IP - IP merged", ("voting-ip", "decline", "success"),
           ("voting-ip-merged", "decline", "success")),
         c("decline: IP - IP at a third of the rate (the control)", (
             "voting-ip", "decline", "success"),
           ("voting-ip-third-lr", "decline", "success"))]},
    # 5 reads the box since 2026-12-03, before the re-run (the line counted none of the capture:
    # docs/findings.md)
    {"id": "5",
     "claim": "SP fails by role capture: the dominant role's format leaks into the others",
     "comparisons": [
         c("Voting aggregator boxes another role's kind, end: SP - IP",
           ("voting-sp", "end", "aggregator/foreign_box"), ("voting-ip", "end",
                                                            "aggregator/foreign_box")),
         c("Eval-Opt evaluator boxes another role's kind, end: SP - IP",
           ("evalopt-sp", "end", "evaluator/foreign_box"), ("evalopt-ip", "end",
                                                            "evaluator/foreign_box"))],
     "beside": [
         c("Voting aggregator writes another role's format, end: SP - IP",
           ("voting-sp", "end", "aggregator/foreign_format"), (
               "voting-ip", "end", "aggregator/foreign_format")),
         c("Eval-Opt evaluator writes another role's format, end: SP - IP",
           ("evalopt-sp", "end", "evaluator/foreign_format"), (
               "evalopt-ip", "end", "evaluator/foreign_format"))]},
    {"id": "I1/I6", "claim": "a KL anchor (I1) or coherence (I6) on IP slows its decline",
     "comparisons": [
        c("decline: IP - IP with I1", ("voting-ip", "decline", "success"), (
            "voting-ip-i1", "decline", "success")),
        c("decline: IP - IP with I6", ("voting-ip", "decline", "success"), (
            "voting-ip-i6", "decline", "success"))]},
    # Declared 2026-12-03, before the re-run: a role's own adapter, swapped (eval.py --mode
    # swapped), costs accuracy
    {"id": "specialisation",
     "claim": "IP's roles specialise: two roles on each other's adapter lose accuracy",
     "comparisons": [c(f"{label}: trained - swapped", ev(name), ev(name, "swapped"))
                     for name, (label, _) in SWAPPED.items()],
     "beside": [c(f"{label}: {role}'s own format, trained - swapped", ev(
         name, key=f"{role}/format_ok"),
                  ev(name, "swapped", f"{role}/format_ok")) for name, (
                      label, pair) in SWAPPED.items()
                for role in pair]},
]

# ---------------------------------------------------------------- the commands

def run_dir(out: str, name: str, seed: int) -> str:
    return os.path.join(out, f"{name}-s{seed}")


def flags_of(name: str, lr: str) -> list[str]:
    """A configuration's flags: the sweep's own rate, or the grid's rate (a third of it for the
    control)."""
    if name in SWEEP:
        return ["--workflow", "single", "--lr", SWEEP[name]]
    flags = list(GRID[name])
    if "third" in flags:  # (a dry run, before the sweep has chosen, shows the rate by name)
        flags[flags.index("third")] = f"{float(lr) / 3:.3g}" if lr[0].isdigit() else f"{lr}/3"
    return flags if "--lr" in flags else [*flags, "--lr", lr]


def train_command(out: str, name: str, seed: int, steps: int, lr: str) -> list[str]:
    """A new run, or the resumption of a stopped one (its folder holds a run already)."""
    folder = run_dir(out, name, seed)
    if os.path.exists(os.path.join(folder, "args.json")):
        return [sys.executable, "train.py", "--resume", folder, "--steps", str(steps)]
    return [sys.executable, "train.py", *TRAIN, *flags_of(name, lr), "--seed", str(seed), "--steps",
            str(steps),
            "--run-dir", folder]


def eval_commands(out: str, name: str, seed: int, samples: int, names: list[str]) -> list[list[
    str]]:
    """eval.py on the held-out test problems of a multi-agent run's final checkpoint (the
    single-agent run of its seed is the SA adapter); a mode already in the run's eval.jsonl is not
    run again. `trained` runs for every configuration; base and the two transfer modes load no
    adapter of the run, so they run once per workflow and seed, on the workflow's first
    configuration in the grid (voting-sp, evalopt-sp, orchworkers-sp)."""
    folder, sa = run_dir(out, name, seed), run_dir(out, "single", seed)
    workflow_first = next(n for n in names if GRID[n][1] == GRID[name][1]) == name
    done = {r["mode"] for r in read_results(os.path.join(folder, "eval.jsonl"), ("mode",),
                                            warn=False)}
    modes = [m for m in MODES if m not in done and (m == "trained" or workflow_first)]
    # an IP run's swapped writes trained beside it, same draws
    if name in SWAPPED and "swapped" not in done:
        modes = [m for m in modes if m != "trained"] + ["swapped"]
    return [[sys.executable, "eval.py", "--run-dir", folder, "--mode", mode, "--samples", str(
        samples),
             "--split", "test", *(["--sa-run", sa] if mode.startswith("sa") else [])]
             for mode in modes]


def needs_build(seed: int) -> bool:
    """Whether the seed's toy model must be built: neither in the cache nor committed (which is
    copied)."""
    return not (toy.ready(seed) or toy_model.committed(seed))


def seed_chain(out: str, seed: int) -> list[tuple[list[str], str]]:
    """A seed's toy model built (unless the cache has it or it is committed, which the calibration
    copies: no build command, none for the clock to wait for) and calibrated, its record in
    out/calibration/, both commands' output in out/calibration/seedS.log."""
    record = os.path.join(out, "calibration", f"seed{seed}.jsonl")
    build = [] if not needs_build(seed) else [
        ([sys.executable, "eval.py", "calibrate", "--seed", str(seed), "--build-only"], record[
            :-6] + ".log")]
    return [*build,
            ([sys.executable, "eval.py", "calibrate", "--seed", str(seed), "--out", record], record[
                :-6] + ".log")]


def sweep_twin(name: str, lr: str) -> str | None:
    """The sweep's configuration whose train.py command is the grid's `name` at rate `lr`, flag for
    flag (the single agent at the sweep's choice): its finished runs are copied, not trained again
    (a replication seed trains)."""
    return next((s for s in SWEEP if name in GRID and flags_of(s, lr) == flags_of(name, lr)), None)


def run_chain(*commands: list[str]) -> list[tuple[list[str], str]]:
    """A run's commands, each with the log next to its folder."""
    return [(command, run_log(command)) for command in commands]


def finished(out: str, name: str, seed: int, steps: int) -> bool:
    metrics = read_results(os.path.join(run_dir(out, name, seed), "metrics.jsonl"), ("step",),
                           warn=False)
    return any(m["step"] == steps for m in metrics)


# ---------------------------------------------------------------- the phases

def recorded_misses(out: str, seed: int) -> list[str] | None:
    """The calibration targets the seed's toy model misses, from its record (None: not calibrated
    yet)."""
    records = read_results(os.path.join(out, "calibration", f"seed{seed}.jsonl"), (
        "seed", "missed"), warn=False)
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
        if passing >= wanted or (spare and len(spares) >= jobs - 1) or len(started) == len(
            candidates):
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
        return ": passes" if missed == [
            ] else f": misses {len(missed)} target(s)" if missed else ": no record"
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
                       samples: int,
                       jobs: int, clock: Clock | None, dry_run: bool) -> None:
    """Every configuration's run on every seed (seed by seed, so that a stopped study has whole
    seeds to show), then eval.py on the grid's runs."""
    for source, target in [(run_dir(out, twin, s), run_dir(out, n, s)) for s in seeds for n in names
                           if (twin := sweep_twin(n, lr)) and finished(out, twin, s, steps)]:
        if not os.path.exists(target):
            copy_run(source, target)
    trains = [run_chain(train_command(out, name, seed, steps, lr)) for seed in seeds
              for name in names
              if dry_run or not finished(out, name, seed, steps)]
    # a run trained by an earlier invocation is not waited for, and these runs are timed afresh
    if clock:
        clock.plan("train", len(trains) - len(seeds) * len(names))
        clock.took["train"] = []  # (the sweep's single agents take a fifth of a grid run's time)
    run_all(trains, dry_run, jobs, clock)
    grid = [n for n in names if n in GRID]
    evals = [run_chain(*eval_commands(out, name, seed, samples, grid)) for seed in seeds
             for name in grid[1:]]
    if clock and grid:  # nor a mode already in its run's eval.jsonl
        clock.plan("eval", sum(map(len, evals)) - evals_per_seed(grid) * len(seeds))
    run_all(evals, dry_run, jobs, clock)


def report(results: str, names: list[str], seeds: list[int], steps: int, lr: str, minutes: float,
           figures: list[str]) -> dict:
    """study.json's content: each finding judged (toyworld/findings.py) on the compact results,
    sweep, settings."""
    multi_agent = [n for n in names if n in GRID and n != "single"]
    judged = [findings.judge_finding(results, seeds, f) for f in FINDINGS] if multi_agent else []
    return {"toy_version": toy.VERSION, "names": names, "seeds": seeds, "steps": steps, "lr": lr,
            "train": TRAIN,
            "minutes": minutes, "figures": figures, "sweep": findings.sweep_choice(
                results, seeds, SWEEP, SWEEP_RULE),
            "findings": judged}


def write_study(out: str, results: str, study: dict, doc: str | None,
                readme: str | None = None) -> None:
    for folder in (out, results):
        with open(os.path.join(folder, "study.json"), "w") as f:
            json.dump(study, f, indent=1)
    verdicts.write_pages(results, study, doc, readme)


def replicate(args, clock: Clock, results: str) -> None:
    """`--replicate N`: the grid at the study's rate on the next N seeds whose toy model passes
    calibration, and each comparison's replication (`replication`) in study.json and the page's
    replication table."""
    with open(os.path.join(args.out, "study.json")) as f:
        study = json.load(f)
    candidates = list(range(max(study["seeds"] + [r["seed"] for r in study["set_aside"]]) + 1,
                            CANDIDATES))
    clock.plan("build", args.replicate), clock.plan("calibrate", args.replicate)
    clock.plan("train", len(GRID) * args.replicate), clock.plan("eval", evals_per_seed(list(
        GRID)) * args.replicate)
    seeds, set_aside = calibrated_seeds(args.out, args.replicate, candidates, args.jobs, clock,
                                        args.dry_run)
    train_and_evaluate(args.out, list(GRID), seeds, study["steps"], study["lr"], args.samples,
                       args.jobs, clock,
                       args.dry_run)
    if args.dry_run:
        return
    findings.keep_results(args.out, [f"{n}-s{s}" for s in seeds for n in GRID], results,
                          "replication.jsonl")
    study["replication"] = {"seeds": seeds, "set_aside": set_aside, **seed_records(
        args.out, seeds, set_aside),
                            "rows": findings.replication(results, seeds, study["findings"],
                                                         FINDINGS),
                            "minutes": clock.minutes()}
    write_study(args.out, results, study, args.doc, args.readme)
    print(f"replication: {clock.minutes():.1f} minutes; study.json in {args.out} and {results}")


def seed_records(out: str, seeds: list[int], set_aside: list[dict]) -> dict:
    """Each considered seed's build (toy.json) and calibration record, for study.json
    (calibration_warning reads it)."""
    considered = sorted(seeds + [r["seed"] for r in set_aside])
    return {"builds": [toy.build_record(s) for s in considered],
            "calibration": [read_results(os.path.join(out, "calibration", f"seed{s}.jsonl"),
                                         warn=False)[-1]
                            for s in considered]}


def evals_per_seed(grid: list[str]) -> int:
    """eval.py commands a seed's grid runs: `trained` on each multi-agent run, three modes once per
    workflow."""
    return len(grid) - 1 + 3 * len({GRID[n][1] for n in grid if n != "single"})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/study",
                   help="folder of the study's runs, logs and study.json")
    p.add_argument("--results", default=None,
                   help="folder of the compact results (toyworld/results.py) that the tables and "
                   "figures are drawn from (default: OUT/results; the page's: "
                   "docs/findings/results)")
    p.add_argument("--seeds", type=int, default=SEEDS,
                   help="how many seeds: the first N of 0, 1, 2, ... whose toy model passes "
                   "calibration (the others set aside, named in study.json)")
    p.add_argument("--steps", type=int, default=STEPS, help="training steps of every run")
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
    args = p.parse_args(argv)
    grid = list(GRID) if not args.only else ["single", *[n for n in args.only.split(",")
                                                         if n != "single"]]
    if unknown := [n for n in grid if n not in GRID]:
        p.error(f"--only: unknown names {unknown}; the grid: {', '.join(GRID)}")
    args.out = os.path.abspath(args.out)  # the commands run from the repository
    results = os.path.abspath(args.results or os.path.join(args.out, "results"))
    if args.tables:  # train nothing: the pages' tables from the study.json in `results`
        return verdicts.write_pages(results, None, args.doc, args.readme)
    if args.replicate and not os.path.exists(os.path.join(args.out, "study.json")):
        p.error(f"--replicate: {args.out} holds no study.json; run the study first")
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.jobs)
    if args.replicate:
        return replicate(args, clock, results)
    clock.plan("build", sum(map(needs_build, range(args.seeds)))), clock.plan(
        "calibrate", args.seeds)
    clock.plan("train", (len(SWEEP) + len(grid)) * args.seeds), clock.plan("eval", evals_per_seed(
        grid) * args.seeds)
    seeds, set_aside = calibrated_seeds(args.out, args.seeds, list(range(CANDIDATES)), args.jobs,
                                        clock,
                                        args.dry_run)
    train_and_evaluate(args.out, list(SWEEP), seeds, args.steps, "", args.samples, args.jobs, clock,
                       args.dry_run)
    lr = "LR" if args.dry_run else findings.sweep_choice(args.out, seeds, SWEEP, SWEEP_RULE)[
        "choice"]
    if lr is None:
        raise SystemExit(f"error: no swept rate holds ({SWEEP_RULE}); the grid has no rate")
    print(f"the sweep's rate: {lr} ({SWEEP_RULE})", flush=True)
    train_and_evaluate(args.out, grid, seeds, args.steps, lr, args.samples, args.jobs, clock,
                       args.dry_run)
    if args.dry_run:
        return
    runs = [f"{n}-s{s}" for s in seeds for n in [*SWEEP, *grid] if finished(
        args.out, n, s, args.steps)]
    findings.keep_results(args.out, runs, results)
    from toyworld.figures import plot_study
    os.makedirs(args.figures or args.out, exist_ok=True)
    figures = plot_study(results, seeds, args.figures or args.out)
    # a page per run, next to it (eval.py report): what each role wrote
    from infra.report import write_report
    reports = [write_report([os.path.join(args.out, run)], os.path.join(args.out, run) + ".html")[
        "path"]
               for run in runs]
    study = report(results, [*SWEEP, *grid], seeds, args.steps, lr, clock.minutes(), figures)
    study.update(reports=reports, set_aside=set_aside, **seed_records(args.out, seeds, set_aside))
    write_study(args.out, results, study, args.doc, args.readme)
    print(f"study: {clock.minutes():.1f} minutes; study.json in {args.out} and {results}")


if __name__ == "__main__":
    main()

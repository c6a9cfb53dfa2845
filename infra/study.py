"""The toy-world study: the learning-rate sweep, every finding's runs on calibrated toy models over five seeds,
evaluation on held-out problems, paired statistics, predeclared verdicts, figures and docs/findings.md's tables.

What it is for: one command that does what docs/findings.md reports, in this order, each part fixed before the
next one runs: (0) each seed's toy model calibrated (eval.py calibrate; the study takes the first five seeds
whose model passes, CANDIDATES); (1) `--sweep`: the single agent at three learning rates, and the rule
(SWEEP_RULE) that picks the grid's rate; (2) the grid (GRID) at that rate: train.py runs validated every 10 steps
on 64 problems, then eval.py's four modes on 64 *other* problems (`--split test`); (3) FINDINGS, the
comparisons, thresholds and rules written here before the grid ran, applied by infra/findings.py to per-seed
paired differences; (4) the figures, the tables between the markers of docs/findings.md, and one `eval.py report`
page per run, next to it (RUN.html). Each run is an ordinary `python train.py` / `python eval.py` command in its
own folder under --out: a finished run is skipped, a stopped one resumed. What it is not: the method (it only
calls train.py and eval.py), nor part of the test suite, nor a place to change a rate, a knob, a step count, a
seed or a threshold after a comparison has been seen.

    python -m infra.study --dry-run                            # the sweep, the grid and their commands
    python -m infra.study --sweep --out runs/study --jobs 2    # the learning-rate sweep on the single agent
    python -m infra.study --out runs/study --jobs 2 --figures docs/findings --doc docs/findings.md    # the grid
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from infra import findings
from infra.runfolder import read_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = 5
# The study's seeds: the first SEEDS of 0, 1, ..., CANDIDATES-1 whose toy model passes calibration (eval.py
# calibrate), a rule fixed before any RL run of the v8 world. A build that misses a target is not the instrument
# docs/toy_world.md describes (v7 missed on four seeds of six, most where a role computes a number), so it is set
# aside, named in study.json and docs/findings.md, never tuned until it passes.
CANDIDATES = 10
STEPS = 150
# The regime, fixed before any run of the grid: 2 tasks x a group of 8 (16 episodes a step), sampled at
# temperature 1 (the warm-up's mixture as it is; infra/calibration.py measures at the same setting), 32 new
# tokens (the longest careful habit is 26), 115 training problems, so that 64 validation and 64 test problems
# of the 243 stay disjoint from them and from each other.
TRAIN = ["--model", "toy", "--tasks-per-step", "2", "--group-size", "8", "--max-new-tokens", "32",
         "--temperature", "1.0", "--n-train", "115", "--n-val", "64", "--val-n", "2", "--val-every", "10",
         "--save-every", "50", "--difficulty", "0", "--micro-batch-size", "16"]
SWEEP = {"single-lr1e-3": "1e-3", "single-lr3e-4": "3e-4", "single-lr1e-4": "1e-4"}
SWEEP_RULE = "the largest rate whose runs do not decline (end within 0.05 of peak) in at least 4 of 5 seeds"
LR: str | None = "1e-3"  # the sweep's choice (docs/findings.md: 4 of 5 seeds hold at 1e-3); the grid's rate
GRID = {  # name -> the flags that make it (on top of TRAIN and --lr LR); the names are the figures' labels
    "single": ["--workflow", "single"],
    "voting-sp": ["--workflow", "voting", "--policy", "sp"],
    "voting-sp-equal": ["--workflow", "voting", "--policy", "sp", "--role-weights", "equal"],
    "voting-ip": ["--workflow", "voting", "--policy", "ip"],
    "voting-ip-merged": ["--workflow", "voting", "--policy", "ip", "--merge-instance-steps"],
    "voting-ip-third-lr": ["--workflow", "voting", "--policy", "ip", "--lr", "third"],  # finding 4's control
    "voting-ip-i6": ["--workflow", "voting", "--policy", "ip", "--coherence", "generator=0.3"],
    "voting-ip-i1": ["--workflow", "voting", "--policy", "ip", "--kl-coef", "generator=0.1,aggregator=0.1"],
    "evalopt-sp": ["--workflow", "evalopt", "--policy", "sp"],
    "evalopt-ip": ["--workflow", "evalopt", "--policy", "ip"],
    "orchworkers-sp": ["--workflow", "orchworkers", "--policy", "sp"],
    "orchworkers-ip": ["--workflow", "orchworkers", "--policy", "ip"],
}
MODES = ("base", "trained", "sa-transfer", "sa-generator-transfer")


def c(label: str, a: tuple, b: tuple | None = None, rule: str = "greater", threshold: float = 0.05,
      target: float | None = None) -> dict:
    """One comparison: A (minus B), a rule of infra/findings.py, its threshold (and target for `near`)."""
    return {"label": label, "a": a, **({"b": b} if b else {}), "rule": rule, "threshold": threshold,
            **({"target": target} if target is not None else {})}


def ev(name: str, mode: str = "trained", key: str = "accuracy") -> tuple:
    return (name, f"eval:{mode}", key)


# Written before the grid ran; a threshold of 0.05 is about two standard errors of a 5-seed mean of a difference
# at a spread of 0.05 per seed (what the 3-seed study saw between seeds for one configuration's end).
FINDINGS = [
    {"id": "1", "claim": "SA-RL in the structure matches or beats trained Voting and Orch-Workers; only Eval-Opt IP "
     "beats it", "preconditions": [c("Voting SP gains over its base", ev("voting-sp"), ev("voting-sp", "base"))],
     "comparisons": [
         c("Voting: SA-RL - trained SP", ev("voting-sp", "sa-transfer"), ev("voting-sp"), "matches"),
         c("Voting: SA-RL - trained IP", ev("voting-sp", "sa-transfer"), ev("voting-ip"), "matches"),
         c("Orch-Workers: SA-RL - trained SP", ev("orchworkers-sp", "sa-transfer"), ev("orchworkers-sp"), "matches"),
         c("Orch-Workers: SA-RL - trained IP", ev("orchworkers-sp", "sa-transfer"), ev("orchworkers-ip"), "matches"),
         c("Eval-Opt: trained IP - SA-RL", ev("evalopt-ip"), ev("evalopt-sp", "sa-transfer"))]},
    {"id": "2", "claim": "Eval-Opt's evaluator learns when to retry", "comparisons": [
        c(f"{p.upper()}: P(retry | first wrong) - P(retry | first right), end - base",
          (f"evalopt-{p}", "change", "p_retry_first_wrong"), (f"evalopt-{p}", "change", "p_retry_first_right"),
          threshold=0.10) for p in ("sp", "ip")]},
    {"id": "3", "claim": "Under SP each role's share of the update is set by its outputs' count and length; "
     "re-weighting the roles gives SP IP's peak", "comparisons": [
         c("SP generators' loss share (3 of 4 outputs)", ("voting-sp", "train", "generator/loss_share"),
           rule="near", threshold=0.05, target=0.75),
         c("peak: SP with equal role weights - SP", ("voting-sp-equal", "peak", "success"),
           ("voting-sp", "peak", "success"))]},
    {"id": "4", "claim": "IP steps once per instance and declines after its peak; merging the steps delays the "
     "decline", "comparisons": [
         c("decline (peak - end): IP - SP", ("voting-ip", "decline", "success"), ("voting-sp", "decline", "success")),
         c("decline: IP - IP merged", ("voting-ip", "decline", "success"),
           ("voting-ip-merged", "decline", "success")),
         c("decline: IP - IP at a third of the rate (the control)", ("voting-ip", "decline", "success"),
           ("voting-ip-third-lr", "decline", "success"))]},
    {"id": "5", "claim": "SP fails by role capture: the dominant role's format leaks into the others",
     "comparisons": [
         c("Voting aggregator writes another role's format, end: SP - IP",
           ("voting-sp", "end", "aggregator/foreign_format"), ("voting-ip", "end", "aggregator/foreign_format")),
         c("Eval-Opt evaluator writes another role's format, end: SP - IP",
           ("evalopt-sp", "end", "evaluator/foreign_format"), ("evalopt-ip", "end", "evaluator/foreign_format"))]},
    {"id": "I1/I6", "claim": "a KL anchor (I1) or coherence (I6) on IP slows its decline", "comparisons": [
        c("decline: IP - IP with I1", ("voting-ip", "decline", "success"), ("voting-ip-i1", "decline", "success")),
        c("decline: IP - IP with I6", ("voting-ip", "decline", "success"), ("voting-ip-i6", "decline", "success"))]},
]


def run_dir(out: str, name: str, seed: int) -> str:
    return os.path.join(out, f"{name}-s{seed}")


def flags_of(name: str, lr: str) -> list[str]:
    """A configuration's flags: the sweep's own rate, or the grid's rate (a third of it for the control)."""
    if name in SWEEP:
        return ["--workflow", "single", "--lr", SWEEP[name]]
    flags = list(GRID[name])
    if "third" in flags:  # (a dry run before the sweep has chosen shows the rate by name)
        flags[flags.index("third")] = f"{float(lr) / 3:.3g}" if lr[0].isdigit() else f"{lr}/3"
    return flags if "--lr" in flags else [*flags, "--lr", lr]


def train_command(out: str, name: str, seed: int, steps: int, lr: str) -> list[str]:
    """A new run, or the resumption of a stopped one (its folder holds a run already)."""
    folder = run_dir(out, name, seed)
    if os.path.exists(os.path.join(folder, "args.json")):
        return [sys.executable, "train.py", "--resume", folder, "--steps", str(steps)]
    return [sys.executable, "train.py", *TRAIN, *flags_of(name, lr), "--seed", str(seed), "--steps", str(steps),
            "--run-dir", folder]


def eval_commands(out: str, name: str, seed: int, samples: int, names: list[str]) -> list[list[str]]:
    """eval.py on the held-out test problems of a multi-agent run's final checkpoint (the single-agent run of its
    seed is the SA adapter); a mode already in the run's eval.jsonl is not run again. `trained` runs for every
    configuration; base and the two transfer modes load no adapter of the run, so they run once per workflow and
    seed, on the workflow's first configuration in the grid (voting-sp, evalopt-sp, orchworkers-sp)."""
    folder, sa = run_dir(out, name, seed), run_dir(out, "single", seed)
    workflow_first = next(n for n in names if GRID[n][1] == GRID[name][1]) == name
    done = {r["mode"] for r in read_results(os.path.join(folder, "eval.jsonl"), ("mode",), warn=False)}
    return [[sys.executable, "eval.py", "--run-dir", folder, "--mode", mode, "--samples", str(samples),
             "--split", "test", *(["--sa-run", sa] if mode.startswith("sa") else [])]
            for mode in MODES if mode not in done and (mode == "trained" or workflow_first)]


def finished(out: str, name: str, seed: int, steps: int) -> bool:
    metrics = read_results(os.path.join(run_dir(out, name, seed), "metrics.jsonl"), ("step",), warn=False)
    return any(m["step"] == steps for m in metrics)


def folder_of(command: list[str]) -> str:
    """The run folder a train.py or eval.py command writes to."""
    flag = "--resume" if "--resume" in command else "--run-dir"
    return command[command.index(flag) + 1]


def run_all(chains: list[list[list[str]]], dry_run: bool, jobs: int = 1) -> None:
    """Run each chain's commands in order (one run's, which share its folder), `jobs` chains at a time, from the
    repository, each command's output appended to the log next to its run folder (RUN.log), with its time. With
    more than one job each command gets one thread: two torch processes of two threads each on 2 cores slow
    each other down by 10x or more (the threads spin)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if jobs > 1 else {})}
    waiting, running, failed = [list(chain) for chain in chains if chain], [], []
    while waiting or running:
        while waiting and len(running) < jobs:
            chain = waiting.pop(0)
            if dry_run:
                print("\n".join(" ".join(command[1:]) for command in chain), flush=True)
                continue
            command = chain.pop(0)
            print(" ".join(command[1:]), flush=True)
            with open(folder_of(command) + ".log", "a") as log:
                process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
            running.append((process, command, chain, time.time()))
        for entry in [e for e in running if e[0].poll() is not None]:
            process, command, chain, start = entry
            running.remove(entry)
            print(f"  {time.time() - start:.0f} s: {' '.join(command[1:4])}", flush=True)
            if process.returncode != 0:
                failed.append(f"{' '.join(command[1:3])}... failed (exit {process.returncode}); "
                              f"see {folder_of(command)}.log")
                waiting.clear()  # the running ones finish; no more start
            elif chain:
                waiting.insert(0, chain)
        time.sleep(0.5 if running else 0)
    if failed:
        raise SystemExit("error: " + "; ".join(failed))


def calibration_misses(out: str, seed: int, log: str, dry_run: bool) -> list[str]:
    """The calibration targets the seed's toy model misses (eval.py calibrate, run once; its record kept in
    calibration.jsonl). A dry run calibrates nothing and counts a seed without a record as calibrated."""
    path = os.path.join(out, "calibration.jsonl")
    records = [r for r in read_results(path, ("seed", "missed"), warn=False) if r["seed"] == seed]
    if not records:
        command = [sys.executable, "eval.py", "calibrate", "--seed", str(seed), "--out", path]
        print(" ".join(command[1:]), flush=True)
        if dry_run:
            return []
        with open(log, "a") as f:
            subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        records = [r for r in read_results(path, ("seed", "missed"), warn=False) if r["seed"] == seed]
    if not records:
        raise SystemExit(f"error: the calibration of seed {seed} wrote no record; see {log}")
    return records[-1]["missed"]


def calibrated_seeds(out: str, wanted: int, log: str, dry_run: bool) -> tuple[list[int], list[dict]]:
    """(the study's seeds: the first `wanted` of 0 .. CANDIDATES-1 whose toy model passes calibration, the ones
    set aside with the targets they missed), before any run: the study runs on calibrated instruments only."""
    seeds, set_aside = [], []
    for seed in range(CANDIDATES):
        if len(seeds) == wanted:
            break
        missed = calibration_misses(out, seed, log, dry_run)
        if missed:
            print(f"seed {seed}: its toy model misses {len(missed)} calibration target(s) ({', '.join(missed)}); "
                  "set aside", flush=True)
            set_aside.append({"seed": seed, "missed": missed})
        else:
            seeds.append(seed)
    if len(seeds) < wanted:
        raise SystemExit(f"error: only {len(seeds)} of seeds 0-{CANDIDATES - 1} have a calibrated toy model "
                         f"({wanted} wanted); set aside: {', '.join(str(r['seed']) for r in set_aside)}")
    return seeds, set_aside


def sweep_choice(out: str, seeds: list[int]) -> dict:
    """Each swept rate's per-seed peak and end (window means) and whether the run declined; the choice by
    SWEEP_RULE (None when no rate holds)."""
    rows = {}
    for name, lr in SWEEP.items():
        peaks = [findings.value(out, s, (name, "peak", "success")) for s in seeds]
        ends = [findings.value(out, s, (name, "end", "success")) for s in seeds]
        holds = [not math.isnan(p) and p - e <= 0.05 for p, e in zip(peaks, ends)]
        rows[lr] = {"peak": peaks, "end": ends, "holds": sum(holds), "base":
                    [findings.value(out, s, (name, "base", "success")) for s in seeds]}
    fine = [lr for lr, r in rows.items() if r["holds"] >= len(seeds) - 1]
    return {"rule": SWEEP_RULE, "rates": rows, "choice": max(fine, key=float) if fine else None}


def report(out: str, names: list[str], seeds: list[int], steps: int, minutes: float, figures: list[str]) -> dict:
    """study.json's content: every finding judged (infra/findings.py), the sweep, and the run's settings."""
    multi_agent = [n for n in names if n in GRID and n != "single"]  # none in the sweep: no finding to judge
    judged = [findings.judge_finding(out, seeds, f) for f in FINDINGS] if multi_agent else []
    return {"names": names, "seeds": seeds, "steps": steps, "lr": LR, "train": TRAIN, "minutes": minutes,
            "figures": figures, "sweep": sweep_choice(out, seeds), "findings": judged}


def write_tables(doc: str, study: dict) -> None:
    """docs/findings.md's tables (between their markers) from study.json: the sweep and each finding's."""
    sweep = ["| lr | base | peak (per seed) | end (per seed) | seeds that hold |", "|---|---|---|---|---|"]
    for lr, r in study["sweep"]["rates"].items():
        base, peak, end = (" ".join(findings.fmt(x, 2, signed=False) for x in r[k]) for k in ("base", "peak", "end"))
        sweep.append(f"| {lr} | {base} | {peak} | {end} | {r['holds']} of {len(study['seeds'])} |")
    sweep.append(f"\nChoice ({study['sweep']['rule']}): **{study['sweep']['choice']}**.")
    summary = ["| finding | the claim tested | its comparisons: shown / not shown / the opposite | verdict |",
               "|---|---|---|---|"]
    for f in study["findings"]:  # the sections' headings: "Finding 1" ... "Finding 5", "I1 and I6"
        anchor = f"finding-{f['id']}" if f["id"].isdigit() else f["id"].lower().replace("/", "-and-")
        counts = " / ".join(str(sum(c["verdict"] == v for c in f["comparisons"]))
                            for v in ("shown", "not shown", "the opposite"))
        summary.append(f"| [{f['id']}](#{anchor}) | {f['claim']} | {counts} | **{f['verdict']}** |")
    tables = {"sweep": "\n".join(sweep), **({"summary": "\n".join(summary)} if study["findings"] else {}),
              **{f"finding-{f['id']}": findings.finding_table(f) for f in study["findings"]}}
    missing = findings.fill_tables(doc, tables)
    if missing:
        print(f"warning: {doc} has no markers for the tables {missing}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/study", help="folder of the study's runs, logs and study.json")
    p.add_argument("--seeds", type=int, default=SEEDS, help="how many seeds: the first N of 0, 1, 2, ... whose toy "
                   "model passes calibration (the others set aside, named in study.json)")
    p.add_argument("--steps", type=int, default=STEPS, help="training steps of every run")
    p.add_argument("--samples", type=int, default=2, help="eval.py samples per test problem")
    p.add_argument("--sweep", action="store_true", help="run the learning-rate sweep (single agent) only")
    p.add_argument("--only", default=None, help="comma-separated grid names (default: all; single always runs)")
    p.add_argument("--figures", default=None, help="folder for the figures (default: --out)")
    p.add_argument("--doc", default=None, help="a findings page whose marked tables are rewritten from study.json")
    p.add_argument("--jobs", type=int, default=1, help="commands run at once, one thread each when more than one "
                   "(2 on a 2-core machine: the toy model's small matrices keep one core busy, not two)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    names = list(SWEEP) if args.sweep else list(GRID) if not args.only else \
        ["single", *[n for n in args.only.split(",") if n != "single"]]
    unknown = [n for n in names if n not in GRID and n not in SWEEP]
    if unknown:
        p.error(f"--only: unknown names {unknown}; the grid: {', '.join(GRID)}")
    if not args.sweep and LR is None and not args.dry_run:
        p.error("the grid's learning rate is not chosen yet: run --sweep first and write its choice into LR")
    args.out = os.path.abspath(args.out)  # the commands run from the repository
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)
    log, start = os.path.join(args.out, "study.log"), time.time()
    seeds, set_aside = calibrated_seeds(args.out, args.seeds, log, args.dry_run)
    for seed in seeds:  # seed by seed, so that a stopped study has whole seeds to show
        run_all([[train_command(args.out, name, seed, args.steps, LR or "LR")] for name in names
                 if not finished(args.out, name, seed, args.steps)], args.dry_run, args.jobs)
        grid = [n for n in names if n in GRID]
        run_all([eval_commands(args.out, name, seed, args.samples, grid) for name in grid[1:]],
                args.dry_run, args.jobs)
    if args.dry_run:
        return
    figures = []
    if not args.sweep:
        from infra.plots import plot_study
        os.makedirs(args.figures or args.out, exist_ok=True)
        figures = plot_study(args.out, seeds, args.figures or args.out)
    from infra.report import write_report  # a page per run, next to it (eval.py report): what each role wrote
    reports = [write_report([run_dir(args.out, n, s)], run_dir(args.out, n, s) + ".html")["path"]
               for s in seeds for n in names if finished(args.out, n, s, args.steps)]
    study = report(args.out, names, seeds, args.steps, (time.time() - start) / 60, figures)
    study["reports"], study["set_aside"] = reports, set_aside
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump(study, f, indent=1)
    if args.doc:
        write_tables(args.doc, study)
    print(f"study: {(time.time() - start) / 60:.1f} minutes; study.json in {args.out}")


if __name__ == "__main__":
    main()

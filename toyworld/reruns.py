"""Run-to-run noise: the decline comparisons' runs again, on the same toy models and seeds, with
other run seeds.

What it is for. A toy-world run is one draw: the same model, seed and command, run again with other
last bits (more threads, another CPU) or another sampling stream, ends elsewhere (docs/findings.md,
"What a rerun gives"). The decline comparisons (finding 4, I1, I6) measure effects of about the size
of that noise with one run per seed. This command trains each configuration they read
(RERUN_NAMES) on each study seed again, once per run seed of declared.RUN_SEED_OFFSETS (run seed =
offset + seed: `train.py --run-seed`, which moves sampling, LoRA init and the data order and leaves
the toy model and the data), one thread a run as the study runs them, and keeps their compact
results in results/reruns.jsonl. toyworld/findings.py then takes each seed's decline as the mean
over its runs (the study's own and these) and gives the run-to-run spread beside the seed-to-seed
one. The rules, thresholds, steps, rate and seeds are the study's; the run seeds were declared
before any rerun ran.

What it is not: new comparisons, or a change of any knob. A finished run is skipped, a stopped one
resumed.

    python -m toyworld.reruns --dry-run                      # the commands
    python -m toyworld.reruns --out runs/reruns --jobs 2 --results docs/findings/results \
        --doc docs/findings.md --readme README.md            # the runs, then study.json and pages
    python -m toyworld.reruns --fold --results docs/findings/results --doc docs/findings.md \
        --readme README.md                                   # study.json and the pages again
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from toyworld import declared, findings, toy
from toyworld.jobs import Clock, run_all, run_log
from toyworld.study import finished, run_dir, train_command

# the configurations the decline comparisons read (finding 4: IP - SP, IP - merged, IP - a third of
# the rate; I1; I6)
RERUN_NAMES = ("voting-ip", "voting-sp", "voting-ip-merged", "voting-ip-third-lr", "voting-ip-i1",
               "voting-ip-i6")


def rerun(name: str, seed: int, offset: int) -> str:
    """A rerun's name: the study's run and its run seed (study.run_dir's folder). Example:
    voting-ip, 3, 1000 -> voting-ip-s3-run1003."""
    return os.path.basename(run_dir("", name, seed, offset + seed))


def fold(results: str, doc: str | None, readme: str | None, minutes: float | None = None) -> dict:
    """study.json judged again from the compact results, the reruns' among them (each seed's decline
    the mean of its runs: findings.value), the replication's rows with it, a record of the reruns,
    and the pages' tables written again (verdicts.write_pages)."""
    from toyworld import verdicts
    with open(os.path.join(results, "study.json")) as f:
        study = json.load(f)
    study["findings"] = [findings.judge_finding(results, study["seeds"], f)
                         for f in declared.FINDINGS]
    if study.get("replication"):
        study["replication"]["rows"] = findings.replication(
            results, study["replication"]["seeds"], study["findings"], declared.FINDINGS)
    runs = [rerun(n, s, o) for o in declared.RUN_SEED_OFFSETS for s in study["seeds"]
            for n in RERUN_NAMES]
    study["reruns"] = {**study.get("reruns", {}), "names": list(RERUN_NAMES),
                       "offsets": list(declared.RUN_SEED_OFFSETS), "runs": runs,
                       **({"minutes": round(minutes, 1)} if minutes is not None else {})}
    with open(os.path.join(results, "study.json"), "w") as f:
        json.dump(study, f, indent=1)
    verdicts.write_pages(results, study, doc, readme)
    return study


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/reruns", help="a folder per run")
    p.add_argument("--results", default="docs/findings/results",
                   help="study.json is read here, reruns.jsonl written here")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--doc", default=None, help="a findings page whose tables are written again")
    p.add_argument("--readme", default=None, help="a README whose verdict table is written again")
    p.add_argument("--fold", action="store_true",
                   help="run nothing: study.json and the pages again from the results")
    args = p.parse_args(argv)
    if args.fold:
        fold(args.results, args.doc, args.readme)
        return
    with open(os.path.join(args.results, "study.json")) as f:
        study = json.load(f)
    runs = [(name, seed, offset) for offset in declared.RUN_SEED_OFFSETS
            for seed in study["seeds"] for name in RERUN_NAMES]
    todo = [(n, s, o) for n, s, o in runs if not finished(args.out, n, s, study["steps"], o + s)]
    # each seed's toy model into the cache first (copied from the committed tar), one at a time:
    # two runs of one seed must not build it side by side
    builds = [[sys.executable, "eval.py", "calibrate", "--seed", str(s), "--build-only"]
              for s in study["seeds"] if not toy.ready(s)]
    run_all([[(b, os.path.join(args.out, "builds.log"))] for b in builds], args.dry_run)
    clock = Clock(args.jobs)
    clock.plan("train", len(todo))
    commands = [train_command(args.out, n, s, study["steps"], study["lr"], o + s)
                for n, s, o in todo]
    run_all([[(c, run_log(c))] for c in commands], args.dry_run, args.jobs, clock)
    if not args.dry_run:
        findings.keep_results(args.out, [rerun(n, s, o) for n, s, o in runs], args.results,
                              "reruns.jsonl")
        fold(args.results, args.doc, args.readme, clock.minutes())
        print(f"reruns: {len(todo)} runs in {clock.minutes():.1f} minutes; "
              f"{args.results}/reruns.jsonl")


if __name__ == "__main__":
    main()

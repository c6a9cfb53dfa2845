"""The study's results from its run folders, with nothing run: the compact results packed
(findings.keep_results), study.json judged, the figures, a page per run and the pages' tables.

What it is for: the last part of toyworld/study.py, which ends the study and the replication with
`fold`; and, run alone on a finished study's folder, the same again as the code of the day reads the
same runs (a new table, a new statistic), the commits that ran them kept as they are. What it is
not: a run, or a place where a run's numbers change (bench/same_numbers.py and toyworld/reproduce.py
check those).

    python -m toyworld.fold --out runs/study --results docs/findings/results \
        --figures docs/findings --doc docs/findings.md --readme README.md
"""
from __future__ import annotations

import argparse
import json
import os

from toyworld import declared, findings, toy, verdicts
from toyworld.jobs import commits, every_run, finished, run_name


def study_runs(out: str, names: list[str], seeds: list[int], steps: int) -> list[str]:
    """The finished runs of these configurations on these seeds, by name, seed by seed."""
    return [run_name(n, s, r) for n, s, r in every_run(names, seeds)
            if finished(out, n, s, steps, r)]


def fold(out: str, results: str, study: dict, figures: str, doc: str | None = None,
         readme: str | None = None, reports: bool = True) -> dict:
    """study.json from `study` (its settings, seeds and records) and the runs in `out`: the study's
    and the replication's compact results packed into `results`, the findings judged and the
    sweep's choice (on the compact results, as a clone reads them), the figures in `figures`, with
    `reports` a page per run next to its folder (eval.py report), the commits the runs came from
    (out/commits.txt), then study.json written to `out` and `results` and the pages' tables to
    `doc` and `readme`. Returns the study."""
    runs = study_runs(out, study["names"], study["seeds"], study["steps"])
    findings.keep_results(out, runs, results)
    from toyworld.figures import plot_study
    os.makedirs(figures, exist_ok=True)
    grid = [n for n in study["names"] if n in declared.GRID and n != "single"]
    seeds = study["seeds"]
    study.update(
        toy_version=toy.VERSION, train=declared.TRAIN, figures=plot_study(results, seeds, figures),
        sweep=findings.sweep_choice(results, seeds, declared.SWEEP, declared.SWEEP_RULE),
        findings=[findings.judge_finding(results, seeds, f) for f in declared.FINDINGS]
        if grid else [], commits=commits(out))
    rep = study.get("replication")
    if rep:
        held_out = study_runs(out, list(declared.GRID), rep["seeds"], study["steps"])
        findings.keep_results(out, held_out, results, "replication.jsonl")
        rep["rows"] = findings.replication(results, rep["seeds"], study["findings"],
                                           declared.FINDINGS)
        runs += held_out
    if reports:
        from infra.report import write_report  # what each role wrote
        study["reports"] = [write_report([os.path.join(out, run)], os.path.join(out, run) + ".html")
                            ["path"] for run in runs]
    for folder in (out, results):
        with open(os.path.join(folder, "study.json"), "w") as f:
            json.dump(study, f, indent=1)
    verdicts.write_pages(results, study, doc, readme)
    return study


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/study", help="a finished study's folder (its study.json)")
    p.add_argument("--results", default=None, help="where the compact results and study.json go "
                   "(default: OUT/results; the page's: docs/findings/results)")
    p.add_argument("--figures", default=None, help="folder for the figures (default: --out)")
    p.add_argument("--doc", default=None, help="a findings page whose tables are written again")
    p.add_argument("--readme", default=None, help="a README whose verdict table is written again")
    p.add_argument("--no-reports", action="store_true", help="no page per run")
    args = p.parse_args(argv)
    path = os.path.join(args.out, "study.json")
    if not os.path.isfile(path):
        p.error(f"{args.out} holds no study.json: run the study first (python -m toyworld.study)")
    with open(path) as f:
        study = json.load(f)
    results = args.results or os.path.join(args.out, "results")
    os.makedirs(results, exist_ok=True)
    fold(args.out, results, study, args.figures or args.out, args.doc, args.readme,
         not args.no_reports)
    print(f"study.json in {args.out} and {results}; commits: {', '.join(study['commits'])}")


if __name__ == "__main__":
    main()

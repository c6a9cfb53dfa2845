"""The toy-world study's statistics: its runs' compact results (`keep_results`), per-seed numbers
read from them, and the verdict of each predeclared comparison (toyworld/declared.py's FINDINGS),
written as the tables of docs/findings.md.

What it does: reads each configuration's runs into per-seed values (a seed's value is the mean of
its runs), of validation curves as window means (infra/paired.py's QUANTITIES: the peak, the best
mean of 3 consecutive validation points; the end, the mean of the last 3; so neither is the
maximum of noisy points), of eval.py's accuracy on the held-out test problems, and of training
metrics averaged over the last steps; pairs two quantities seed by seed; and applies a
comparison's rule (`greater`, `matches`, `near`: infra/paired.py's verdict, which says each). A
finding is not testable here when one of its preconditions is not shown. What it is not: the
method, or a place to change a threshold after a comparison has been seen.
"""
from __future__ import annotations

import math
import os

from infra.paired import (
    collapsed,
    curve_values,
    mean_of,
    run_spread,
    summarise,
    verdict,
)
from infra.runfolder import read_results
from toyworld.declared import DECLINE_RUNS, RUN_SEED_STEP, RUNS
from toyworld.results import records, write_pack

TRAIN_LAST = 20  # training steps a training metric is averaged over at the end
# What the compact results keep of a run (docs/findings/results/study.jsonl: toyworld/results.py):
# its validation curves and these training curves, to 4 decimals, and its evaluations: what the
# tables, figures and prose read.
RESULTS = ("step", "success", "reward", "val/", "/loss_share", "/grad_share", "/grad_norm_share",
           "/opt_steps", "/kl_base", "/coherence_scale", "/entropy", "/careful", "/own_format",
           "/foreign_format", "/foreign_box")
# the kept calls of the README's figure's SP run at its last step (and the last step's of every
# run that collapses: keep_results)
KEPT_SAMPLES = {"voting-sp-s0": "samples/step_000150.json"}


def series(out: str, name: str, seed: int, key: str, run: str = "") -> list[tuple[int, float]]:
    """A run's curve of `key`: the study's own run of `name` on `seed`, or its run `run` on
    another run seed (`-runR`)."""
    metrics = records(out, f"{name}-s{seed}{run}", "metrics.jsonl")
    return [(m["step"], m[key]) for m in metrics if m.get(key) is not None]


def runs_of(out: str, name: str, seed: int) -> list[str]:
    """The runs of `name` on `seed` in `out`: the study's own ("") and those on the run seeds
    seed + k x RUN_SEED_STEP (toyworld/declared.py) that the results hold."""
    others = [f"-run{seed + k * RUN_SEED_STEP}" for k in range(1, max(RUNS, DECLINE_RUNS))]
    return [""] + [r for r in others if records(out, f"{name}-s{seed}{r}", "metrics.jsonl")]


def eval_value(out: str, name: str, seed: int, mode: str, key: str = "accuracy",
               run: str = "") -> float:
    """eval.py's `key` of `mode` on the test problems, from the run of `name` (base and the SA
    modes: from the workflow's first configuration, where the study runs them)."""
    evaluated = records(out, f"{name}-s{seed}{run}", "eval.jsonl")
    found = [r["metrics"].get(key) for r in evaluated
             if r["mode"] == mode and r.get("dataset", "").endswith("test")]
    return found[-1] if found and found[-1] is not None else float("nan")


def value(out: str, seed: int, spec: tuple) -> float:
    """One per-seed number: the mean over the seed's runs (`runs_of`) of each run's. spec:
    (configuration, quantity, key); quantities: base (validation at step 0), peak, end, decline
    (peak - end), change (end - base), train (the mean of the last TRAIN_LAST training steps),
    eval:<mode> (eval.py on the test problems; base on the study's own run only)."""
    return mean_of(list(run_values(out, seed, spec).values()))


def run_values(out: str, seed: int, spec: tuple) -> dict[str, float]:
    """`spec` on each of the seed's runs that has it (`runs_of`: "" the study's own, "-runR"), by
    run."""
    found = {run: run_value(out, seed, spec, run) for run in runs_of(out, spec[0], seed)}
    return {run: x for run, x in found.items() if not math.isnan(x)}


def run_value(out: str, seed: int, spec: tuple, run: str = "") -> float:
    """`value` of one run: the study's ("") or a rerun."""
    name, quantity, key = spec
    if quantity.startswith("eval:"):
        return eval_value(out, name, seed, quantity[5:], key, run)
    points = series(out, name, seed, key if quantity == "train" else f"val/{key}", run)
    values = [v for _, v in points]
    if not values:
        return float("nan")
    if quantity == "train":
        last = [v for s, v in points if s > 0][-TRAIN_LAST:]
        return sum(last) / len(last) if last else float("nan")
    if quantity == "base":
        return values[0] if points[0][0] == 0 else float("nan")
    return curve_values(values)[quantity]


def fallen(out: str, name: str, seed: int) -> set[str]:
    """The runs of `name` on `seed` (`runs_of`: "" the study's own, "-runR") whose validation curve
    collapses (infra/paired.py's `collapsed`: its end below half its peak)."""
    return {run for run in runs_of(out, name, seed)
            if collapsed([m["val/success"] for m in records(out, f"{name}-s{seed}{run}",
                                                            "metrics.jsonl")
                          if m.get("val/success") is not None])}


def collapses(out: str, names: list[str], seeds: list[int]) -> dict[str, tuple[int, list[str]]]:
    """Per configuration, (its runs on `seeds`, the names of those that collapse: `fallen`)."""
    found = {}
    for name in names:
        runs, fell = 0, []
        for seed in seeds:  # each seed's runs read once
            mine, down = runs_of(out, name, seed), fallen(out, name, seed)
            runs, fell = runs + len(mine), fell + [f"{name}-s{seed}{run}" for run in mine
                                                   if run in down]
        found[name] = (runs, fell)
    return found


def collapse_jumps(out: str, names: list[str], seeds: list[int],
                   quantity: tuple[str, str] = ("decline", "success")) -> dict:
    """Pooled over the configurations `names` on `seeds`: their runs, how many collapse (`fallen`),
    and what each that collapses did to `quantity` (its value less the mean of its configuration's
    uncollapsed runs on its seed, as infra/paired.py's `run_model` reads a jump)."""
    runs, collapsed_runs, jumps = 0, 0, []
    for name in names:
        for seed in seeds:
            values, fell = run_values(out, seed, (name, *quantity)), fallen(out, name, seed)
            kept = [x for run, x in values.items() if run not in fell]
            runs, collapsed_runs = runs + len(values), collapsed_runs + len(fell)
            jumps += [values[run] - mean_of(kept) for run in sorted(fell) if kept]
    return {"runs": runs, "collapsed": collapsed_runs, "jumps": jumps}


def compare(out: str, seeds: list[int], comparison: dict, without_collapses: bool = False) -> dict:
    """A comparison's per-seed differences (A - B, or A alone for `near`): each seed's runs read
    once, a seed's value on each side the mean of its runs (`without_collapses`: of those that do
    not collapse, `fallen`); their summary, the verdict, and the runs' spread (`run_spread`)."""
    a_runs, b_runs = (sides_runs(out, seeds, comparison[side], without_collapses)
                      if side in comparison else [{"": 0.0}] * len(seeds) for side in ("a", "b"))
    a, b = [mean_of(list(r.values())) for r in a_runs], [mean_of(list(r.values())) for r in b_runs]
    s = summarise([x - y for x, y in zip(a, b)])
    s.update(a=a, b=b, verdict=verdict(comparison["rule"], comparison["threshold"], s,
                                       comparison.get("target")), **run_spread(a_runs, b_runs))
    return s


def sides_runs(out: str, seeds: list[int], spec: tuple,
               without_collapses: bool = False) -> list[dict[str, float]]:
    """Per seed, one side's values by run (`run_values`), its runs that collapse left out when
    `without_collapses`."""
    found = [run_values(out, seed, spec) for seed in seeds]
    if without_collapses:
        fell = [fallen(out, spec[0], seed) for seed in seeds]  # once a seed, not once a run
        found = [{run: x for run, x in values.items() if run not in down}
                 for values, down in zip(found, fell)]
    return found


def judge_finding(out: str, seeds: list[int], finding: dict) -> dict:
    """Every comparison of a finding, then its verdict: not testable here (a precondition not
    shown), shown (every main comparison shown), the opposite (every main comparison the opposite),
    or not shown. Comparisons `beside` the main ones (an earlier metric kept for reference) are
    reported and take no part in the verdict."""
    pre = [dict(c, **compare(out, seeds, c)) for c in finding.get("preconditions", [])]
    main = [dict(c, **compare(out, seeds, c)) for c in finding["comparisons"]]
    beside = [dict(c, **compare(out, seeds, c)) for c in finding.get("beside", [])]
    verdicts = {c["verdict"] for c in main}
    if any(c["verdict"] != "shown" for c in pre):
        overall = "not testable here"
    elif verdicts == {"shown"}:
        overall = "shown"
    elif verdicts == {"the opposite"}:
        overall = "the opposite"
    else:
        overall = "not shown"
    return {"id": finding["id"], "claim": finding["claim"], "preconditions": pre,
            "comparisons": main, "beside": beside, "verdict": overall}


def replication(results: str, seeds: list[int], judged: list[dict],
                specs: list[dict]) -> list[dict]:
    """Comparison by comparison, whether each replication seed repeats the study's verdict: its
    difference has the sign of the study's mean, and passes the rule's threshold on its own
    (greater: >= t; matches: >= -t; near: within t of the target), with the runs a seed and their
    spread (run_spread) beside the held-out seeds' own. `judged`: the study's findings
    (judge_finding: a comparison's `a` and `b` are its per-seed values there); `specs`: the same
    findings as declared (toyworld/declared.py's FINDINGS)."""
    declared = {(f["id"], c["label"]): c for f in specs
                for c in f.get("preconditions", []) + f["comparisons"]}
    rows = []
    for finding in judged:
        for c in finding["preconditions"] + finding["comparisons"]:
            again = compare(results, seeds, declared[(finding["id"], c["label"])])
            per_seed = again["per_seed"]
            if c["rule"] == "near":
                passes = [abs(x - c["target"]) <= c["threshold"] for x in per_seed]
                sign = passes
            else:
                passes = [x >= (c["threshold"] if c["rule"] == "greater" else -c["threshold"])
                          for x in per_seed]
                sign = [math.copysign(1, x) == math.copysign(1, c["mean"]) for x in per_seed]
            rows.append({"finding": finding["id"], "label": c["label"], "rule": c["rule"],
                         "study": c["verdict"], "study_mean": c["mean"], "per_seed": per_seed,
                         "same_sign": sum(sign), "passes": sum(passes), "seeds": len(seeds),
                         "n": again["n"], "se": again["se"], "runs": again["runs"],
                         # one run a seed has no run-to-run spread: null, which JSON can hold
                         "run_sd": None if math.isnan(again["run_sd"]) else again["run_sd"]})
    return rows


def sweep_choice(out: str, seeds: list[int], sweep: dict[str, str], rule: str) -> dict:
    """The learning-rate sweep judged (toyworld/declared.py's SWEEP and SWEEP_RULE): each swept
    rate's per-seed peak and end (window means) and whether the run declined; the largest rate that
    holds in all but one seed (None: none)."""
    rows = {}
    for name, lr in sweep.items():
        peaks = [value(out, s, (name, "peak", "success")) for s in seeds]
        ends = [value(out, s, (name, "end", "success")) for s in seeds]
        holds = [not math.isnan(p) and p - e <= 0.05 for p, e in zip(peaks, ends)]
        rows[lr] = {"peak": peaks, "end": ends, "holds": sum(holds), "base":
                    [value(out, s, (name, "base", "success")) for s in seeds]}
    fine = [lr for lr, r in rows.items() if r["holds"] >= len(seeds) - 1]
    return {"rule": rule, "rates": rows, "choice": max(fine, key=float) if fine else None}


def kept_metrics(folder: str) -> list[dict]:
    """A run folder's metrics.jsonl as the compact results keep it: RESULTS, floats to 4
    decimals."""
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()
             if any(k == w or k.endswith(w) or k.startswith(w) for w in RESULTS)}
            for m in read_results(os.path.join(folder, "metrics.jsonl"), ("step",), warn=False)]


def keep_results(out: str, runs: list[str], results: str, pack: str = "study.jsonl") -> None:
    """The runs' compact results into one file, results/`pack` (toyworld/results.py): each run's
    metrics (RESULTS), its evaluations, KEPT_SAMPLES and the last step's kept calls of a run that
    collapses, what this module and toyworld/figures.py read, so that the tables and figures can be
    drawn again from a clone and a reader can see what a collapsed run's roles wrote."""
    rows = []
    for run in runs:
        kept = kept_metrics(os.path.join(out, run))
        rows += [(run, "metrics.jsonl", m) for m in kept]
        rows += [(run, "eval.jsonl", r) for r in records(out, run, "eval.jsonl")]
        validated = [(m["step"], m["val/success"]) for m in kept if "val/success" in m]
        samples = [KEPT_SAMPLES[run]] if run in KEPT_SAMPLES else []
        if collapsed([v for _, v in validated]):
            samples.append(f"samples/step_{validated[-1][0]:06d}.json")
        for name in dict.fromkeys(samples):
            rows += [(run, name, r) for r in records(out, run, name)]
    os.makedirs(results, exist_ok=True)
    write_pack(os.path.join(results, pack), rows)

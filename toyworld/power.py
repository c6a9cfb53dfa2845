"""What the study's seeds and runs can tell, comparison by comparison: each rule's chance of passing
when nothing is there, the smallest true difference the seeds detect, and the seeds or runs a
verdict would need, at a normal spread and, for the declines, with runs that collapse drawn as the
study and its replication showed them (infra/detection.py's simulations).

What it is for: the power figures of docs/findings.md (the verdict table, "What five seeds can
tell", the runs table) and the runs a seed that toyworld/declared.py declares for the next study's
declines, computed rather than guessed. Two models of a comparison's per-seed difference:
- normal: drawn from a normal distribution whose SD is the spread the seeds' means showed (a
  seed's value is the mean of its runs, so that SD holds the run-to-run noise too);
- with collapses (the declines only: `decline_models`): infra/detection.py's `RunModel`, the seeds'
  own spread and the run-to-run SD read from the comparison's runs that did not collapse
  (infra/paired.py's `run_model`), and each arm's run collapsing at the rate, by the jumps, pooled
  over every run of the six decline configurations on the study's and the replication's seeds:
  a configuration has 0-3 collapses of 42 runs, too few to read a rate of its own.
The figures: `false_pass`, how often a rule says "shown" where the claim is just false (`null`: no
difference for `greater`, B ahead by the whole margin for `matches`, from where every `matches`
figure is measured); `smallest_detected`, the smallest true difference (from `null`) whose
t-interval lies on its side of `null` 80% of the time; `seeds_needed` and `runs_needed`, the seeds
or runs a seed that would detect a difference 80% of the time. At a normal spread the detection is
exact (Student's noncentral t: detection.normal_detect_rate); a rule's passing and every figure with
collapses are drawn from STUDY_SIMULATIONS studies, enough that the pages' digits (differences to 2
decimals, rates to whole percents) are the same from another SIMULATION_SEED (tests/test_docs.py
draws a second). What it is not: the verdicts (infra/paired.py), or a test of significance.

    python -m toyworld.power docs/findings/results   # each comparison's numbers, from study.json
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os

import numpy as np

from infra import detection
from infra.detection import RunModel, fewest, null, pass_share, share_below, smallest_of
from infra.paired import run_model
from toyworld import declared, findings

STUDY_SIMULATIONS = 500_000  # a rate's SE at most 0.0007, 0.0002 near 2%: the pages' whole percents
SIMULATION_SEED = 0  # read at each call: a test draws the pages again from another


@functools.lru_cache(maxsize=8)
def unit_draws(n: int, seed: int) -> np.ndarray:
    """STUDY_SIMULATIONS x `n` standard normal draws (read-only): a normal spread's, scaled."""
    z = np.random.default_rng(seed).standard_normal((STUDY_SIMULATIONS, n))
    z.flags.writeable = False
    return z


@functools.lru_cache(maxsize=32)
def with_collapses(model: RunModel, n: int, runs: int, seed: int, rule: str,
                   threshold: float) -> tuple[np.ndarray, float]:
    """STUDY_SIMULATIONS studies of `n` seeds of `runs` runs under `model` (collapses drawn), as
    what the pages read of them: their detection.margins, and how often the rule passes where the
    claim is just false. Drawn by seed_noise's function, not its cache, which would keep each
    study's draws (20 MB) where the margins take a fifth of that."""
    noise = detection.seed_noise.__wrapped__(model, n, runs, seed, STUDY_SIMULATIONS)
    return detection.margins(noise), pass_share(rule, threshold, noise, null(rule, threshold))


def comparison_power(c: dict, model: RunModel | None = None, seed: int | None = None) -> dict:
    """A judged comparison's figures (findings.compare's summary `c`) at its seeds' spread: its
    false-pass rate (simulated), the smallest true difference its seeds detect, the seeds its mean
    would need and the runs a seed that would detect the rule's threshold (exact at a normal
    spread: detection.normal_detect_rate), and under `model` (a `RunModel`) the same with
    collapses drawn (`collapses`). Example: {"sd": 0.10, ..., "false_pass": 0.24} for `greater`
    0.05 at two seeds (infra/detection.py's worked example)."""
    seed = SIMULATION_SEED if seed is None else seed
    sd, n, zero = c["se"] * math.sqrt(c["n"]), c["n"], null(c["rule"], c["threshold"])
    if n < 2:  # no spread to read (a study still running)
        return {"sd": math.nan, "smallest_detected": math.nan, "seeds_needed": None,
                "false_pass": math.nan}
    found = {"sd": sd, "smallest_detected": sd * detection.normal_smallest(n),
             "seeds_needed": seeds_for(sd, c["mean"] - zero) if c["mean"] != zero else None}
    if c["rule"] in ("greater", "matches"):
        found["false_pass"] = normal_false_pass(c["rule"], c["threshold"], sd, n, seed)
    if not math.isnan(c.get("run_sd", math.nan)) and c["runs"] > 1:
        found["runs_needed"] = runs_for(n, sd, c["run_sd"], c["runs"], c["threshold"])
    if model is not None:
        found["collapses"] = collapse_power(model, c, seed)
    return found


@functools.lru_cache(maxsize=256)
def normal_false_pass(rule: str, threshold: float, sd: float, n: int, seed: int) -> float:
    """How often the rule passes where the claim is just false (`null`), at a normal spread `sd`
    of `n` seeds (simulated: the rule reads signs as well as the mean)."""
    return pass_share(rule, threshold, sd * unit_draws(n, seed), null(rule, threshold))


def normal_rate(sd: float, difference: float, n: int) -> float:
    """How often `n` seeds at a normal spread `sd` detect a true `difference` (exactly)."""
    return detection.normal_detect_rate(difference / sd, n) if sd else 1.0


def seeds_for(sd: float, difference: float) -> int | None:
    """The fewest seeds (2 or more) that detect a true `difference` 80% of the time at a normal
    spread `sd` a seed; None past detection.MOST_SEEDS."""
    return fewest(lambda m: normal_rate(sd, difference, m), 2, detection.MOST_SEEDS)


def runs_for(n: int, sd: float, run_sd: float, runs: int, difference: float) -> int | None:
    """The fewest runs a seed (at most detection.MOST_RUNS) whose `n` seeds' means detect a true
    `difference` 80% of the time at a normal spread, from a comparison whose seeds' means of
    `runs` runs spread `sd` and whose runs spread `run_sd` within a seed; None past MOST_RUNS."""
    between = detection.between_seeds(sd, run_sd, runs)
    return fewest(lambda r: normal_rate(math.hypot(between, run_sd / math.sqrt(r)), difference,
                                        n), 1, detection.MOST_RUNS)


def collapse_power(model: RunModel, c: dict, seed: int) -> dict:
    """A decline comparison's figures with collapses drawn (`model`), at its seeds and runs: the
    smallest true difference detected 80% of the time, the false-pass rate, and the fewest runs a
    seed (at most detection.MOST_RUNS) that would detect the rule's threshold."""
    n, runs, rule, t = c["n"], c["runs"], c["rule"], c["threshold"]
    margins, false_pass = with_collapses(model, n, runs, seed, rule, t)
    return {"smallest_detected": smallest_of(margins), "false_pass": false_pass,
            "threshold_detected": share_below(margins, t),
            "runs_needed": runs_to_detect(model, n, t, seed, rule)}


def runs_to_detect(model: RunModel, n: int, difference: float, seed: int,
                   rule: str = "greater") -> int | None:
    """The fewest runs a seed (at most detection.MOST_RUNS) at which `n` seeds detect a true
    `difference` 80% of the time under `model`; None when even MOST_RUNS fall short."""
    return fewest(lambda r: share_below(with_collapses(model, n, r, seed, rule, difference)[0],
                                        difference), 1, detection.MOST_RUNS)


def decline_models(results: str, study: dict) -> dict:
    """The decline comparisons' runs as the collapse-aware model draws them: the collapses pooled
    over the decline configurations' runs on the study's and the held-out seeds (their count, the
    runs, the rate and the jumps: findings.collapse_jumps), and per comparison (its label) a
    `RunModel` with its own spreads (paired.run_model on the study's seeds, the runs that did not
    collapse) and the pooled rate and jumps."""
    seeds = study["seeds"]
    pooled_seeds = seeds + study.get("replication", {}).get("seeds", [])
    pooled = findings.collapse_jumps(results, list(declared.DECLINE_NAMES), pooled_seeds)
    rate = pooled["collapsed"] / pooled["runs"] if pooled["runs"] else 0.0
    models = {}
    for spec in (c for f in declared.FINDINGS for c in f["comparisons"]):
        if spec["a"][1] == "decline":
            sides = [(findings.sides_runs(results, seeds, spec[s]),
                      [findings.fallen(results, spec[s][0], seed) for seed in seeds])
                     for s in ("a", "b")]
            own = run_model(sides[0][0], sides[1][0], sides[0][1], sides[1][1])
            models[spec["label"]] = RunModel(own.between, own.run, rate, tuple(pooled["jumps"]))
    return {**pooled, "seeds": pooled_seeds, "rate": rate, "models": models}


def next_decline_runs(models: dict[str, RunModel], seed: int | None = None) -> int | None:
    """The runs a seed the next study declares for its declines: the fewest (at most
    detection.MOST_RUNS) at which five seeds detect the rules' 0.05 80% of the time in every
    decline comparison under its collapse-aware model; None when some comparison needs more."""
    seed = SIMULATION_SEED if seed is None else seed
    needed = [runs_to_detect(m, declared.SEEDS, 0.05, seed) for m in models.values()]
    return None if None in needed or not needed else max(needed)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Each predeclared comparison's power numbers.")
    p.add_argument("results", help="a folder with study.json (docs/findings/results)")
    args = p.parse_args(argv)
    with open(os.path.join(args.results, "study.json")) as f:
        study = json.load(f)
    models = decline_models(args.results, study)
    rates = []
    for finding in study["findings"]:
        for c in finding["comparisons"]:
            found = comparison_power(c, models["models"].get(c["label"]))
            rates += [found["false_pass"]] if "false_pass" in found else []
            print(f"{c['label']}: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in found.items()))
    print(f"at least one of {len(rates)} passes with nothing there: "
          f"{detection.any_passes(rates):.3f}")
    print(f"collapses: {models['collapsed']} of {models['runs']} decline runs; the next study's "
          f"runs a seed for the declines: {next_decline_runs(models['models'])}")


if __name__ == "__main__":
    main()

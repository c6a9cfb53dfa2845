"""What the study's seeds and runs can tell: each rule's chance of passing when nothing is there,
the chance that at least one comparison does, the smallest true difference the seeds detect, and
the seeds or runs a verdict would need.

What it is for: the power statements of docs/findings.md ("What five seeds can tell") and the
runs a seed that toyworld/declared.py declared for the decline comparisons, computed rather than
guessed. The model: a comparison's per-seed difference is drawn independently from a normal
distribution whose mean is the true difference and whose SD is the spread the seeds showed (a
seed's value is the mean of its runs, so that SD holds the run-to-run noise too). Under it, by
seeded simulation (SIMULATIONS studies, the same standard normal draws for every difference asked
about, so that each answer moves smoothly with the difference):

- `pass_rate`: how often a rule of toyworld/findings.py says "shown". At `null(rule)`, where the
  claim is just false (no difference for `greater`; B ahead by the whole margin for `matches`),
  it is the rule's false-pass rate;
- `detect_rate`: how often the t-interval lies wholly on the difference's side of zero;
- `smallest_detected`: the smallest true difference detected POWER (80%) of the time;
- `seeds_needed`: the fewest seeds that detect a true difference POWER of the time;
- `runs_needed`: the fewest runs a seed that detect it with the study's seeds, the run-to-run
  spread apart from the seeds' own;
- `any_passes`: the chance that at least one of several rules passes with nothing there.

A worked example (tests/test_study.py holds it): two seeds, `greater` with t = 0.05, a spread of
0.10 a seed. With nothing there the mean of two seeds has SD 0.10 / sqrt 2 = 0.0707, a mean of
0.05 or more (which makes one seed positive at least) comes 1 - Phi(0.05 / 0.0707) = 24.0% of the
time, and that is the rule's false-pass rate. What it is not: the verdicts (findings.py), or a
test of significance of any one comparison.

    python -m toyworld.power docs/findings/results   # each comparison's numbers, from study.json
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os

import numpy as np

from toyworld.findings import t975

SIMULATIONS = 40_000  # a rate's standard error at most 0.0025 (at 50%)
SEED = 0
POWER = 0.8
MOST_RUNS = 20  # runs_needed looks no further


@functools.lru_cache(maxsize=32)
def draws(n: int) -> np.ndarray:
    """SIMULATIONS x n standard normal draws, the same for every call with the same n
    (read-only)."""
    z = np.random.default_rng(SEED).standard_normal((SIMULATIONS, n))
    z.flags.writeable = False
    return z


def rule_passes(rule: str, threshold: float, d: np.ndarray) -> np.ndarray:
    """findings.verdict's "shown" on each row of per-seed differences `d` (simulations x seeds)."""
    n, mean = d.shape[1], d.mean(axis=1)
    if rule == "greater":
        return (mean >= threshold) & ((d > 0).sum(axis=1) >= n - 1)
    if rule == "matches":
        return (mean >= -threshold) & ((d >= -threshold).sum(axis=1) >= n - 1)
    raise ValueError(f"no false-pass rate for the rule {rule!r}")


def null(rule: str, threshold: float) -> float:
    """The true difference at which the rule's claim is just false."""
    return -threshold if rule == "matches" else 0.0


@functools.lru_cache(maxsize=4096)
def pass_rate(rule: str, threshold: float, sd: float, difference: float, n: int = 5) -> float:
    """How often the rule passes at a true `difference`, the seeds' spread `sd`, `n` seeds."""
    return float(rule_passes(rule, threshold, difference + sd * draws(n)).mean())


def detect_rate(sd: float, difference: float, n: int = 5) -> float:
    """How often the t-interval (95%) over `n` seeds lies wholly on the side of zero that a true
    `difference` (> 0, or < 0) is on."""
    d = abs(difference) + sd * draws(n)
    half = t975(n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
    return float((d.mean(axis=1) - half > 0).mean())


@functools.lru_cache(maxsize=4096)
def smallest_detected(sd: float, n: int = 5, power: float = POWER) -> float:
    """The smallest true difference detected `power` of the time (bisection: with the same draws
    the rate rises with the difference)."""
    low, high = 0.0, 20.0 * sd
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if detect_rate(sd, middle, n) < power else (low, middle)
    return high


@functools.lru_cache(maxsize=4096)
def seeds_needed(sd: float, difference: float, most: int = 30, power: float = POWER) -> int | None:
    """The fewest seeds (2 or more) that detect a true `difference` `power` of the time at the
    spread `sd` a seed; None past `most`."""
    return next((n for n in range(2, most + 1) if detect_rate(sd, difference, n) >= power), None)


def between_seeds(seed_sd: float, run_sd: float, runs: int) -> float:
    """The seeds' own spread: the SD of seeds' means of `runs` runs, less the share the runs'
    noise puts in it (run_sd^2 / runs), not below 0."""
    return math.sqrt(max(0.0, seed_sd ** 2 - run_sd ** 2 / runs))


def runs_needed(seed_sd: float, run_sd: float, runs: int, difference: float, n: int = 5,
                most: int = MOST_RUNS, power: float = POWER) -> int | None:
    """The fewest runs a seed whose means, over `n` seeds, detect a true `difference` `power` of
    the time, from a comparison whose seeds' means of `runs` runs spread `seed_sd` and whose runs
    spread `run_sd` within a seed; None past `most` (the seeds' own spread is too large)."""
    between = between_seeds(seed_sd, run_sd, runs)
    return next((r for r in range(1, most + 1)
                 if detect_rate(math.sqrt(between ** 2 + run_sd ** 2 / r), difference, n)
                 >= power), None)


def any_passes(rates: list[float]) -> float:
    """The chance that at least one of rules passing at `rates` does, were they independent."""
    return 1.0 - math.prod(1.0 - p for p in rates)


def comparison_power(c: dict) -> dict:
    """A judged comparison's numbers (findings.compare's summary `c`), at its seeds' spread: its
    false-pass rate, the smallest true difference its seeds detect and the seeds its observed mean
    would need (both from `null`: for `matches`, from minus its margin), and with runs apart, the
    runs a seed to detect the rule's threshold. Example (the worked example): {"sd": 0.10, ...,
    "false_pass": 0.24} for `greater` 0.05 at two seeds and no difference."""
    sd, n, zero = c["se"] * math.sqrt(c["n"]), c["n"], null(c["rule"], c["threshold"])
    if n < 2:  # no spread to read (a study still running)
        return {"sd": math.nan, "smallest_detected": math.nan, "seeds_needed": None,
                "false_pass": math.nan}
    found = {"sd": sd, "smallest_detected": smallest_detected(sd, n),
             "seeds_needed": seeds_needed(sd, c["mean"] - zero) if c["mean"] != zero else None}
    if c["rule"] in ("greater", "matches"):
        found["false_pass"] = pass_rate(c["rule"], c["threshold"], sd, zero, n)
    if not math.isnan(c.get("run_sd", float("nan"))) and c["runs"] > 1:
        found["runs_needed"] = runs_needed(sd, c["run_sd"], c["runs"], c["threshold"], n)
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Each predeclared comparison's power numbers.")
    p.add_argument("results", help="a folder with study.json (docs/findings/results)")
    args = p.parse_args(argv)
    with open(os.path.join(args.results, "study.json")) as f:
        study = json.load(f)
    rates = []
    for finding in study["findings"]:
        for c in finding["comparisons"]:
            found = comparison_power(c)
            rates += [found["false_pass"]] if "false_pass" in found else []
            print(f"{c['label']}: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in found.items()))
    print(f"at least one of {len(rates)} passes with nothing there: {any_passes(rates):.3f}")


if __name__ == "__main__":
    main()

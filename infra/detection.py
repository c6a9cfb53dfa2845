"""What a paired comparison over seeds and runs can detect, by seeded simulation: a rule's chance
of passing, the t-interval's chance of excluding zero, the smallest true difference detected 80% of
the time, and the seeds or runs a seed a difference would need; at a normal spread, or with runs
that collapse drawn as the runs showed them (`RunModel`).

What it is for: the power figures of every comparison of runs (infra/paired.py): the toy study's
(toyworld/power.py, docs/findings.md), an ablation's (toyworld/ablate.py) and `eval.py compare`'s.
Two models of a comparison's per-seed difference (a seed's value is the mean of its runs):
- normal: drawn from a normal distribution whose mean is the true difference and whose SD is the
  spread the seeds' means showed (`draws`, `detect_rate`, `pass_rate`, `smallest_detected`);
- runs (`RunModel`): each seed's difference is the true one, plus the seed's own part (normal,
  `between`), plus the mean of its runs' parts: each run normal (`run`, the runs that did not
  collapse), and each arm's run collapsing with chance `rate`, which moves its value by one of the
  `jumps` the collapsed runs showed (A's collapse adds it to the difference, B's takes it away).
  A spread with rare large jumps is not a normal one: a mean of six runs with one collapse in it
  moves by a sixth of a collapse, which a normal spread of the same SD makes far rarer.
Both draw SIMULATIONS studies with the same draws for every difference asked about (common random
numbers), so each answer moves smoothly with the difference. A worked example (tests/test_power.py
holds it): two seeds, `greater` with t = 0.05, a spread of 0.10 a seed; with nothing there the
mean of two seeds has SD 0.10 / sqrt 2 = 0.0707, and a mean of 0.05 or more comes
1 - Phi(0.05 / 0.0707) = 24.0% of the time. What it is not: the verdicts (infra/paired.py), or a
test of significance of any one comparison.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

SIMULATIONS = 40_000  # a rate's standard error at most 0.0025 (at 50%)
SEED = 0
POWER = 0.8
MOST_RUNS = 20  # runs_needed and the runs to decide look no further
MOST_SEEDS = 30
# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom: a mean's interval over n
# paired seeds is mean +- T975[n - 1] x SE, which covers at n = 5 as it says (a percentile
# bootstrap over 5 seeds, the study's first interval, covers well under 95%)
T975 = dict(enumerate([12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                       2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042], 1))


def t975(df: int) -> float:
    """T975 at `df` degrees of freedom (past 30, 30's: slightly wider, never narrower)."""
    return T975[min(df, 30)]


class RunModel(NamedTuple):
    """A comparison's runs as the simulation draws them (see the header); `paired.run_model`
    reads one from runs."""
    between: float  # SD of a seed's own difference, apart from its runs
    run: float  # SD of one run's difference within its seed, the runs that collapse apart
    rate: float = 0.0  # the chance that one arm's run collapses
    jumps: tuple[float, ...] = ()  # what a collapse did to its run's value, as the runs showed


# ---------------------------------------------------------------- the draws

@functools.lru_cache(maxsize=32)
def draws(n: int) -> np.ndarray:
    """SIMULATIONS x n standard normal draws, the same for every call with the same n
    (read-only)."""
    z = np.random.default_rng(SEED).standard_normal((SIMULATIONS, n))
    z.flags.writeable = False
    return z


@functools.lru_cache(maxsize=256)
def seed_noise(model: RunModel, n: int, runs: int, seed: int = SEED,
               simulations: int = SIMULATIONS) -> np.ndarray:
    """`simulations` x `n` draws of a seed's difference less the true one, each the mean of `runs`
    runs under `model` (read-only; the same for every call with the same arguments)."""
    rng = np.random.default_rng(seed)
    shape = (simulations, n)
    # the mean of `runs` normal run parts is normal with SD run / sqrt(runs): one draw a seed
    means = (model.between * rng.standard_normal(shape)
             + model.run / math.sqrt(runs) * rng.standard_normal(shape))
    if model.rate > 0 and model.jumps:
        jumps = np.asarray(model.jumps)
        for sign in (1.0, -1.0):  # A's collapses add their jumps, B's take them away
            count = rng.binomial(runs, model.rate, size=shape)  # a seed's runs that collapse
            for k in range(int(count.max())):
                picked = jumps[rng.integers(len(jumps), size=shape)]
                means = means + sign * (count > k) * picked / runs
    means.flags.writeable = False
    return means


# ---------------------------------------------------------------- rates

def rule_passes(rule: str, threshold: float, d: np.ndarray) -> np.ndarray:
    """infra/paired.py's verdict "shown" on each row of per-seed differences `d` (simulations x
    seeds)."""
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


def pass_share(rule: str, threshold: float, noise: np.ndarray, difference: float) -> float:
    """How often the rule passes at a true `difference` over draws `noise` (`seed_noise`)."""
    return float(rule_passes(rule, threshold, difference + noise).mean())


def detect_share(noise: np.ndarray, difference: float) -> float:
    """How often the t-interval (95%) over the seeds of each row of `difference` + `noise` lies
    wholly on the side of zero that a true `difference` (> 0, or < 0) is on: the share of the rows'
    `margins` below it."""
    return share_below(margins(noise), difference)


def detect_rate(sd: float, difference: float, n: int = 5) -> float:
    """`detect_share` at a normal spread `sd` of `n` seeds."""
    return detect_share(sd * draws(n), difference)


def smallest_in(noise: np.ndarray, power: float = POWER) -> float:
    """The smallest true difference detected `power` of the time over draws `noise`: a quantile of
    their `margins`."""
    return smallest_of(margins(noise), power)


@functools.lru_cache(maxsize=4096)
def smallest_detected(sd: float, n: int = 5, power: float = POWER) -> float:
    """`smallest_in` at a normal spread `sd` of `n` seeds."""
    return smallest_in(sd * draws(n), power)


@functools.lru_cache(maxsize=4096)
def seeds_needed(sd: float, difference: float, most: int = MOST_SEEDS,
                 power: float = POWER) -> int | None:
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
    spread `run_sd` within a seed (a normal spread); None past `most` (the seeds' own spread is
    too large)."""
    between = between_seeds(seed_sd, run_sd, runs)
    return next((r for r in range(1, most + 1)
                 if detect_rate(math.sqrt(between ** 2 + run_sd ** 2 / r), difference, n)
                 >= power), None)


def any_passes(rates: list[float]) -> float:
    """The chance that at least one of rules passing at `rates` does, were they independent."""
    return 1.0 - math.prod(1.0 - p for p in rates)


# ---------------------------------------------------------------- with runs that collapse

def what_it_can_tell(model: RunModel, seed_sd: float, n: int, runs: int, mean: float) -> dict:
    """What `n` seeds of `runs` runs can detect: the smallest true difference detected POWER of
    the time at the normal spread `seed_sd` of the seeds' means and under `model` (collapses
    drawn), and under `model` the seeds (at `runs` runs) or runs a seed (at `n` seeds) that would
    detect a true difference of `mean` (None: more than MOST_SEEDS or MOST_RUNS)."""
    normal = smallest_detected(seed_sd, n) if n >= 2 and math.isfinite(seed_sd) else math.nan
    if n < 2 or not all(map(math.isfinite, model[:3])):
        return {"smallest_normal": normal, "smallest": math.nan, "seeds_to_decide": None,
                "runs_to_decide": None}
    if not (math.isfinite(mean) and mean != 0):
        return {"smallest_normal": normal, "smallest": smallest_in(seed_noise(model, n, runs)),
                "seeds_to_decide": None, "runs_to_decide": None}
    return {"smallest_normal": normal, "smallest": smallest_in(seed_noise(model, n, runs)),
            "seeds_to_decide": fewest(lambda m: detect_share(seed_noise(model, m, runs), mean),
                                      2, MOST_SEEDS),
            "runs_to_decide": fewest(lambda r: detect_share(seed_noise(model, n, r), mean),
                                     1, MOST_RUNS)}


# ---------------------------------------------------------------- every rate from one sort

def margins(noise: np.ndarray) -> np.ndarray:
    """Per simulated study (a row of `noise`), the true difference above which its t-interval (95%)
    lies wholly above zero: t x SE less the mean of its noise; sorted. A true difference d moves
    every row's mean by d and leaves its SE alone, so `detect_share(noise, d)` is the share of
    margins below |d| (`share_below`) and `smallest_in` is a quantile of them (`smallest_of`): a
    study's every rate read off one sort, where a search would draw each again."""
    n = noise.shape[1]
    return np.sort(t975(n - 1) * noise.std(axis=1, ddof=1) / math.sqrt(n) - noise.mean(axis=1))


def share_below(sorted_margins: np.ndarray, difference: float) -> float:
    """`detect_share` from `margins`: how often the interval excludes zero at a true
    `difference`."""
    return float(np.searchsorted(sorted_margins, abs(difference), side="left")
                 / len(sorted_margins))


def smallest_of(sorted_margins: np.ndarray, power: float = POWER) -> float:
    """`smallest_in` from `margins`: the smallest true difference detected `power` of the time."""
    return float(sorted_margins[math.ceil(power * len(sorted_margins)) - 1])


# ---------------------------------------------------------------- at a normal spread, exactly

ERFC = np.frompyfunc(math.erfc, 1, 1)  # numpy has no erfc; 4,001 calls take a millisecond


@functools.lru_cache(maxsize=64)
def chi_grid(df: int, points: int = 4001) -> tuple[np.ndarray, np.ndarray]:
    """The sample SD of `df` + 1 normal draws over their SD, sqrt(chi2_df / df), on a grid, with
    the trapezoid weights of its density (they sum to 1 within 1e-9)."""
    u = np.linspace(0.0, math.sqrt(df) + 12.0, points)  # sqrt(chi2_df): past +12, under 1e-30
    density = 2 * u ** (df - 1) * np.exp(-u * u / 2 - math.lgamma(df / 2)) / 2 ** (df / 2)
    weights = density * np.gradient(u) * np.where((u == 0) | (u == u[-1]), 0.5, 1.0)
    return u / math.sqrt(df), weights


def normal_detect_rate(standardised: float, n: int) -> float:
    """`detect_rate` without simulation: at a normal spread, the chance that the t-interval (95%)
    of `n` seeds lies wholly beyond zero on the side of a true difference of `standardised` spreads
    (|d| / sd): P(Z + |d| sqrt(n) / sd > t975 S), S the seeds' SD over sd, integrated over S
    (Student's noncentral t). Example: 0 -> 0.025, at any n."""
    s, weights = chi_grid(n - 1)
    x = (t975(n - 1) * s - abs(standardised) * math.sqrt(n)) / math.sqrt(2)
    return float(np.dot(weights, 0.5 * ERFC(x).astype(float)))


@functools.lru_cache(maxsize=64)
def normal_smallest(n: int, power: float = POWER) -> float:
    """`smallest_detected` without simulation, in spreads: the true difference over sd that `n`
    seeds detect `power` of the time (1.68 at 5 seeds and 80%; bisection: the rate rises with
    it)."""
    low, high = 0.0, 50.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if normal_detect_rate(middle, n) < power else (low, middle)
    return high


def fewest(rate, low: int, high: int) -> int | None:
    """The fewest k in [low, high] with rate(k) >= POWER, by bisection (a rate that rises with k:
    more seeds or runs), None when even `high` falls short."""
    if rate(high) < POWER:
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if rate(middle) < POWER else (low, middle)
    return low

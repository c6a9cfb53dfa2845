"""Paired statistics of two sets of runs, seed by seed: what a quantity of a validation curve is, a
run that collapses, the paired differences' mean and t-interval, the run-to-run and seed-to-seed
spreads, the rules that turn them into a verdict, and the comparison of two arms of runs, quantity
by quantity, with what its seeds and runs can detect (infra/detection.py).

What it is for: one statistics for every comparison of runs the project makes: the toy study's
predeclared comparisons (toyworld/findings.py, docs/findings.md), a fork's ablation in the toy world
(toyworld/ablate.py, docs/ablations.md) and any two sets of run folders (`eval.py compare`, a GPU
user's real-model runs). Each seed is one pair: a seed's value on each side is the mean of its
runs, and the t-interval is over the seeds' differences. The rules (`verdict`):
- `greater` (A beats B by at least t): shown when the mean paired difference is >= t and all seeds
  but one agree in sign; the opposite when it is <= -t and all seeds but one have B ahead; otherwise
  not shown;
- `matches` (A at least as good as B, give or take t; one-sided): shown when the mean difference is
  >= -t and in all seeds but one A is behind by at most t (ahead by any amount counts); the opposite
  when the mean is <= -t and B is ahead in all seeds but one; otherwise not shown;
- `near` (A equal to a value within t): shown or not shown.
What it is not: a test of significance (a rule is a threshold and a count of seeds), or a reader
of run folders (its callers read them).

    python eval.py compare --a runs/abl/clip-s* --b runs/abl/base-s* --threshold 0.05
"""
from __future__ import annotations

import math

from infra import detection
from infra.detection import t975

# A difference smaller than this in size is a tie: the tables print it as 0.00, and it counts as a
# sign for neither side (a decline of +0.00003, from metrics kept to 4 decimals, is no seed "up").
# Written after the data (2026-12-04); the predeclared rules count exact signs and keep them.
TIE = 0.005
WINDOW = 3  # validation points in a peak or end window
# A run collapses when its end falls below COLLAPSE of its peak: the toy study's rule, written on
# 2026-12-06 after the data (a Voting-SP run ended at 0.00 from a peak near 0.9;
# toyworld/declared.py), a count of runs, not a verdict
COLLAPSE = 0.5
# what each quantity of a validation curve is (`curve_values`), in the order they are reported
QUANTITIES = {"end": "the mean of the last 3 validation points",
              "peak": "the best mean of 3 validation points in a row",
              "decline": "peak - end",
              "change": "end - the first point (the base model's)"}


def window_peak(values: list[float]) -> float:
    return max(sum(values[i:i + WINDOW]) / WINDOW for i in range(len(values) - WINDOW + 1)) \
        if len(values) >= WINDOW else float("nan")


def window_end(values: list[float]) -> float:
    return sum(values[-WINDOW:]) / WINDOW if len(values) >= WINDOW else float("nan")


def curve_values(values: list[float]) -> dict[str, float]:
    """A validation curve's QUANTITIES, window means so that none is one noisy point. Example:
    [0.5, 0.8, 0.9, 0.9, 0.6, 0.6, 0.6] -> peak 0.867, end 0.6, decline 0.267, change 0.1."""
    peak, end = window_peak(values), window_end(values)
    first = values[0] if values else float("nan")
    return {"end": end, "peak": peak, "decline": peak - end, "change": end - first}


def collapsed(values: list[float]) -> bool:
    """Whether a run's validation curve collapses: its end below COLLAPSE of its peak."""
    return len(values) >= WINDOW and window_end(values) < COLLAPSE * window_peak(values)


def mean_of(values: list[float]) -> float:
    """The mean over the values that are numbers (nan when none is)."""
    found = [x for x in values if not math.isnan(x)]
    return sum(found) / len(found) if found else float("nan")


def summarise(diffs: list[float]) -> dict:
    """Mean, standard error, the t-interval (95%) over seeds, the signs of per-seed values, and
    what the seeds can tell: `detectable`, the smallest mean difference whose interval would
    exclude zero at the spread seen (the interval's half-width), and `seeds_needed`, the seeds at
    that spread whose interval would exclude zero at this mean."""
    d = [x for x in diffs if not math.isnan(x)]
    n = len(d)
    signs = {"positive": sum(x > 0 for x in d), "negative": sum(x < 0 for x in d),
             "per_seed": diffs}
    if n < 2:
        nan = float("nan")
        return {"n": n, "mean": mean_of(d), "se": nan, "ci": [nan, nan], "detectable": nan,
                "seeds_needed": None, **signs}
    mean = mean_of(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "se": sd / math.sqrt(n), "ci": [mean - half, mean + half],
            "detectable": half, "seeds_needed": seeds_to_exclude_zero(mean, sd), **signs}


def seeds_to_exclude_zero(mean: float, sd: float, most: int = 31) -> int | None:
    """The fewest seeds (2 or more) at spread `sd` whose t-interval around `mean` excludes zero;
    None past `most`. Example: mean 0.06, sd 0.05 -> 6 (t 2.571 x 0.05 / sqrt 6 = 0.052)."""
    for n in range(2, most + 1):
        if t975(n - 1) * sd / math.sqrt(n) < abs(mean):
            return n
    return None


def excludes_zero(c: dict) -> bool:
    """Whether a comparison's interval says what its verdict says: for `matches`, above minus its
    margin (shown) or below it (the opposite); otherwise wholly on the verdict's side of zero."""
    low, high = c["ci"]
    if c["rule"] == "matches":
        return low > -c["threshold"] if c["verdict"] == "shown" else high < -c["threshold"]
    return low > 0 if c["verdict"] == "shown" else high < 0


def verdict(rule: str, threshold: float, s: dict, target: float | None = None) -> str:
    """The rule of one comparison (see the header) applied to its summary `s`."""
    n, mean, per_seed = s["n"], s["mean"], [x for x in s["per_seed"] if not math.isnan(x)]
    if n < 2:
        return "not testable here"
    agree = n - 1  # all seeds but one
    if rule == "near":
        return "shown" if abs(mean - target) <= threshold else "not shown"
    if rule == "greater" and mean >= threshold and s["positive"] >= agree:
        return "shown"
    if rule == "matches" and mean >= -threshold and sum(x >= -threshold for x in per_seed) >= agree:
        return "shown"
    # written after the data (2026-12-04): a seed tied at zero is no seed for A
    if rule == "contradicts":
        ahead = sum(x >= TIE for x in per_seed)
        return "the opposite" if mean <= -threshold and ahead <= n - agree else "not shown"
    if mean <= -threshold and s["negative"] >= agree:
        return "the opposite"
    return "not shown"


def seed_verdict(rule: str, threshold: float, x: float, target: float | None = None) -> str:
    """A comparison's rule on one seed's difference `x`: its threshold alone (one seed has no others
    to agree; so `contradicts` reads as `greater`: shown when the seed goes the claim's way by t,
    the opposite by -t)."""
    if math.isnan(x):
        return "n/a"
    if rule == "near":
        return "shown" if abs(x - target) <= threshold else "not shown"
    if ((rule in ("greater", "contradicts") and x >= threshold)
            or (rule == "matches" and x >= -threshold)):
        return "shown"
    return "the opposite" if x <= -threshold else "not shown"


def run_differences(a: dict[str, float], b: dict[str, float]) -> list[float]:
    """One seed's differences run by run: A's and B's runs paired by run (their keys); a side with
    one run (base, or A alone: the same on every run) paired with each of the other side's."""
    if len(b) == 1:
        return [x - next(iter(b.values())) for x in a.values()]
    if len(a) == 1:
        return [next(iter(a.values())) - y for y in b.values()]
    return [x - b[run] for run, x in a.items() if run in b]


def run_spread(a_runs: list[dict], b_runs: list[dict]) -> dict:
    """A comparison's runs (per seed, A's and B's by run): per seed the differences of its runs
    (`run_differences`), the runs a seed's mean reads on each side (the fewest over the seeds), and
    the run-to-run standard deviation of one run's difference, pooled over the seeds (their
    variances averaged: each seed's runs differ from their own mean, so the seeds' spread is not in
    it; nan with fewer than 2 runs a seed), to set beside the seed-to-seed SD of the seeds' means
    (SE x sqrt n)."""
    per_run = [run_differences(a, b) for a, b in zip(a_runs, b_runs)]
    spread = [sum((x - mean_of(r)) ** 2 for x in r) / (len(r) - 1) for r in per_run if len(r) > 1]
    return {"runs": min((min(len(a), len(b)) if len(b) > 1 else len(a))
                        for a, b in zip(a_runs, b_runs)), "per_run": per_run,
            "run_sd": math.sqrt(sum(spread) / len(spread)) if spread else float("nan")}


# ---------------------------------------------------------------- two arms of runs

Arm = dict[int, dict[str, list[float]]]  # seed -> run (its key) -> its validation curve


def compare_arms(a: Arm, b: Arm, threshold: float) -> dict:
    """Arm A (the change) against arm B (the baseline), paired by seed over the seeds both have,
    each quantity (QUANTITIES) of each run's validation curve: the paired summary, the run and
    seed SDs, the collapses, `greater` at `threshold` (shown: A higher by t; the opposite: lower),
    and what the size can detect with collapses drawn at the rate the runs show
    (`run_model`, infra/detection.py)."""
    seeds = sorted(set(a) & set(b))
    # each seed's runs that collapse, by key, on each side
    fell = {side: [{k for k, curve in arm[s].items() if collapsed(curve)} for s in seeds]
            for side, arm in (("a", a), ("b", b))}
    out = {"seeds": seeds, "threshold": threshold,
           "collapses": {side: [f"seed {s} run {k}" for s, keys in zip(seeds, fell[side])
                                for k in sorted(keys)] for side in fell},
           "runs": {"a": sum(len(a[s]) for s in seeds), "b": sum(len(b[s]) for s in seeds)}}
    for quantity in QUANTITIES:
        a_runs = [{k: curve_values(c)[quantity] for k, c in a[s].items()} for s in seeds]
        b_runs = [{k: curve_values(c)[quantity] for k, c in b[s].items()} for s in seeds]
        diffs = [mean_of(list(x.values())) - mean_of(list(y.values()))
                 for x, y in zip(a_runs, b_runs)]
        s = summarise(diffs)
        s.update(run_spread(a_runs, b_runs), verdict=verdict("greater", threshold, s),
                 seed_sd=s["se"] * math.sqrt(s["n"]), rule="greater", threshold=threshold)
        s["verdict_words"] = s["verdict"] + (
            " by the rule only" if s["verdict"] != "not shown" and not excludes_zero(s) else "")
        model = run_model(a_runs, b_runs, fell["a"], fell["b"])
        s["model"] = model._asdict()
        s.update(detection.what_it_can_tell(model, s["seed_sd"], len(seeds), max(s["runs"], 1),
                                            s["mean"]))
        out[quantity] = s
    return out


def run_model(a_runs: list[dict], b_runs: list[dict], a_fell: list[set],
              b_fell: list[set]) -> detection.RunModel:
    """A comparison's runs as infra/detection.py draws them, from its runs (per seed, each side's
    values by run, and each side's runs that collapse): the runs that do not collapse give the
    run-to-run SD (`run_spread`) and, from their seeds' means, the seeds' own spread
    (detection.between_seeds); the collapses give the rate (over every run of both sides) and the
    jumps (a collapsed run's value less the mean of its side's other runs on its seed)."""
    def clean(runs, fell):
        return [{k: x for k, x in r.items() if k not in f and not math.isnan(x)}
                for r, f in zip(runs, fell)]
    kept = [(x, y) for x, y in zip(clean(a_runs, a_fell), clean(b_runs, b_fell)) if x and y]
    spread = run_spread(*zip(*kept)) if kept else {"run_sd": math.nan, "runs": 1}
    run = spread["run_sd"] if math.isfinite(spread["run_sd"]) else 0.0
    seed_sd = summarise([mean_of(list(x.values())) - mean_of(list(y.values()))
                         for x, y in kept])["se"] * math.sqrt(len(kept))
    jumps = tuple(r[k] - mean_of(list(c.values()))
                  for runs, fell in ((a_runs, a_fell), (b_runs, b_fell))
                  for r, f, c in zip(runs, fell, clean(runs, fell)) for k in sorted(f) if c)
    total = sum(len(r) for r in [*a_runs, *b_runs])
    rate = sum(len(f) for f in [*a_fell, *b_fell]) / total if total else 0.0
    return detection.RunModel(detection.between_seeds(seed_sd, run, spread["runs"]), run, rate,
                              jumps)


def describe(result: dict, names: tuple[str, str] = ("A", "B")) -> list[str]:
    """`compare_arms`' result as the lines a terminal shows, a block per quantity."""
    a, b = names
    t, n = result["threshold"], len(result["seeds"])
    lines = [f"{a} - {b}, paired over seeds {', '.join(map(str, result['seeds']))}; "
             f"collapses (end below {COLLAPSE:g} of peak): {a} {len(result['collapses']['a'])} of "
             f"{result['runs']['a']}, {b} {len(result['collapses']['b'])} of {result['runs']['b']}"]
    lines += [f"  collapsed: {', '.join(result['collapses'][side])}"
              for side in ("a", "b") if result["collapses"][side]]
    for quantity, meaning in QUANTITIES.items():
        s = result[quantity]
        low, high = s["ci"]
        decide = [f"{s['seeds_to_decide'] or 'over 30'} seeds at {s['runs']} runs a seed",
                  f"{s['runs_to_decide'] or 'over ' + str(detection.MOST_RUNS)} runs a seed "
                  f"at {n} seeds"]
        lines += [f"{quantity} ({meaning}): {s['mean']:+.3f} [{low:+.3f}, {high:+.3f}], 95% "
                  f"t-interval over {s['n']} seeds ({s['positive']} up, {s['negative']} down)",
                  f"  run SD {s['run_sd']:.3f} (one run's difference within a seed), seed SD "
                  f"{s['seed_sd']:.3f} (the seeds' means), {s['runs']} runs a seed",
                  f"  detected 80% of the time: {s['smallest_normal']:.3f} at a normal spread, "
                  f"{s['smallest']:.3f} with collapses drawn at {s['model']['rate']:.1%} of runs",
                  f"  would decide the mean seen: {' or '.join(decide)}",
                  f"  verdict at {t:g} ({a} higher by {t:g}: shown; lower: the opposite): "
                  f"{s['verdict_words']}"]
    return lines

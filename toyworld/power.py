"""What the study's seeds and runs can tell, comparison by comparison: each rule's chance of passing
when nothing is there, the chance that at least one comparison does, the smallest true difference
the seeds detect, and the seeds or runs a verdict would need (infra/detection.py's simulations).

What it is for: the power statements of docs/findings.md ("What five seeds can tell") and the
runs a seed that toyworld/declared.py declared for the decline comparisons, computed rather than
guessed. The model (infra/detection.py): a comparison's per-seed difference is drawn from a normal
distribution whose mean is the true difference and whose SD is the spread the seeds showed (a
seed's value is the mean of its runs, so that SD holds the run-to-run noise too):
- `pass_rate`: how often a rule of infra/paired.py says "shown". At `null(rule)`, where the claim
  is just false (no difference for `greater`; B ahead by the whole margin for `matches`), it is the
  rule's false-pass rate;
- `smallest_detected`: the smallest true difference whose t-interval excludes zero 80% of the time;
- `seeds_needed`, `runs_needed`: the fewest seeds, or runs a seed, that detect a true difference
  80% of the time;
- `any_passes`: the chance that at least one of several rules passes with nothing there.
What it is not: the verdicts (infra/paired.py), or a test of significance of any one comparison.

    python -m toyworld.power docs/findings/results   # each comparison's numbers, from study.json
"""
from __future__ import annotations

import argparse
import json
import math
import os

from infra.detection import (
    any_passes,
    null,
    pass_rate,
    runs_needed,
    seeds_needed,
    smallest_detected,
)


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

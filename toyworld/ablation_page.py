"""docs/ablations.md's results, written from what is committed: each judged ablation's lines (the
command's output, from docs/ablations/NAME.json) and what a quick look can tell (from the committed
study's runs), between the page's `<!-- ablation:NAME -->` markers.

What it is for: a number on the ablations page is the command's or the study's, never typed by
hand: tests/test_ablate.py recomputes every judged ablation from its committed curves and holds
the page's blocks to this module. What it is not: the judging (toyworld/ablate.py) or a run.

    python -m toyworld.ablation_page docs/ablations.md   # the page's blocks again, nothing run
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import sys

from infra import detection, paired
from toyworld import declared
from toyworld.ablation_size import QUANTITY, aa_model, committed_arm, committed_seeds
from toyworld.jobs import ROOT
from toyworld.tables import fill_tables

JUDGED = os.path.join(ROOT, "docs", "ablations")  # NAME.json and NAME.png of each judged ablation
EYE_SEEDS = [0, 1, 2]  # the loop the page used to give: three seeds, one run each, read by eye
WORDS = {"end": "end accuracy", "decline": "decline"}


def judged(name: str) -> dict:
    with open(os.path.join(JUDGED, f"{name}.json")) as f:
        return json.load(f)


def eye_pairs(quantity: str) -> list[float]:
    """The old loop's A/A differences: in each of the study's six configurations with 6 runs a
    seed (declared.DECLINE_NAMES), two arms of one run a seed on EYE_SEEDS, no run shared (run k
    against run j on every seed, each pair of k < j once), the difference of their means over the
    seeds, in size."""
    found = []
    for name in declared.DECLINE_NAMES:
        arm = committed_arm(name, EYE_SEEDS)
        for k, j in itertools.combinations(range(declared.DECLINE_RUNS), 2):
            means = [paired.mean_of([paired.curve_values(arm[s][str(r)])[quantity]
                                     for s in EYE_SEEDS]) for r in (k, j)]
            found.append(abs(means[0] - means[1]))
    return found


def quick_lines(name: str = "voting-ip", threshold: float = 0.05) -> list[str]:
    """What a quick look can and cannot tell, from the committed study's runs."""
    counts = []
    for quantity in (QUANTITY, "decline"):
        found = eye_pairs(quantity)
        big = sum(d >= threshold for d in found)
        counts.append(f"in {WORDS[quantity]} in {big} of {len(found)} pairs "
                      f"({big / len(found):.0%})")
    seeds = ", ".join(map(str, EYE_SEEDS))
    model = aa_model(committed_arm(name, committed_seeds()))
    found = {runs: detection.smallest_in(detection.seed_noise(model, 5, runs))
             for runs in (1, 3, 9)}
    return [f"- Two arms of one configuration, one run each on seeds {seeds} and no run shared, "
            f"differ by {threshold:g} or more {counts[0]} and {counts[1]}, with nothing changed "
            f"(each pair of runs of the {len(declared.DECLINE_NAMES)} configurations the study ran "
            f"{declared.DECLINE_RUNS} times a seed).",
            f"- At {name}'s committed spread, five seeds detect a true difference in "
            f"{WORDS[QUANTITY]} 80% of the time of {found[1]:.3f} with one run a seed (`--quick`, "
            f"a first look), {found[3]:.3f} with three and {found[9]:.3f} with nine."]


def blocks() -> dict[str, str]:
    """Each block of the page by its marker's name: `quick`, and each judged ablation's lines."""
    found = {"quick": "\n".join(quick_lines())}
    for path in sorted(glob.glob(os.path.join(JUDGED, "*.json"))):
        record = judged(os.path.basename(path)[:-5])
        found[record["name"]] = "```\n" + "\n".join(record["lines"]) + "\n```"
    return found


def write_page(page: str) -> None:
    """`page`'s blocks between their markers (`<!-- ablation:NAME -->`, `<!-- /ablation:NAME -->`),
    rewritten as the findings page's tables are (tables.fill_tables)."""
    if missing := fill_tables(page, blocks(), kind="ablation"):
        print(f"warning: {page} has no markers for {', '.join(missing)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("page", help="docs/ablations.md")
    write_page(p.parse_args(argv).page)


if __name__ == "__main__":
    main()

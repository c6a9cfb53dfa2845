"""Metrics as counts: every metric is a numerator and a denominator, added up, and divided once at the end.

What it is for: one convention for the episode metrics (workflows.episode_tallies) and the update's metrics
(grpo.update_policy), so that batches, mini-batches and the ranks of a torchrun launch combine by adding,
never by averaging averages. What it is not: which metrics exist (the concept files say that).

    t = {"success": [3.0, 4.0]}; rates(add_tallies([t, t])) == {"success": 0.75}
"""
from __future__ import annotations

from collections import defaultdict

Tallies = dict[str, list[float]]  # metric -> [numerator, denominator]


def add_tallies(parts: list[Tallies]) -> Tallies:
    out: Tallies = defaultdict(lambda: [0.0, 0.0])
    for part in parts:
        for key, (num, den) in part.items():
            out[key][0] += num
            out[key][1] += den
    return dict(out)


def rates(tallies: Tallies) -> dict[str, float | None]:
    """numerator / denominator for each metric; None (JSON null) where there was nothing to count."""
    return {k: num / den if den else None for k, (num, den) in sorted(tallies.items())}

"""Metrics as counts: every metric is a numerator and a denominator, added up, and divided once at
the end.

What it is for: one convention for the episode metrics (workflows.episode_tallies) and the update's
metrics (infra/update_report.py), so that batches, mini-batches and the ranks of a torchrun launch
combine by adding, never by averaging averages. What it is not: which metrics exist (the concept
files say that).

    tallies = {"success": [3.0, 4.0]}; rates(add_tallies([tallies, tallies])) == {"success": 0.75}
"""
from __future__ import annotations

from collections import defaultdict

import torch

Tallies = dict[str, list[float]]  # metric -> [numerator, denominator]


def add_mean(tallies: Tallies, key: str, value: float, count: float = 1) -> None:
    """Observations to average: `value` is the sum of `count` of them (one by default: an event,
    True counting 1, a length, a rank's own statistic; or a sum over tokens and the tokens). Every
    mean is counted this way, and `rates` divides once."""
    counts = tallies.setdefault(key, [0.0, 0.0])
    counts[0] += value
    counts[1] += count


def add_total(tallies: Tallies, key: str, value: float) -> None:
    """A number to report as a total: its denominator stays 1 (every rank adds the same total)."""
    counts = tallies.setdefault(key, [0.0, 0.0])
    counts[0] += value
    counts[1] = 1.0


def read_back(tallies: Tallies) -> None:
    """Numerators left on the device as tensors become floats, in one copy: on a GPU each float()
    waits for the device, and per row and metric that was thousands of waits per step."""
    on_device = [k for k, v in tallies.items() if isinstance(v[0], torch.Tensor)]
    if on_device:
        for key, value in zip(on_device, torch.stack([tallies[k][0].float()
                                                      for k in on_device]).tolist()):
            tallies[key][0] = value


def add_tallies(parts: list[Tallies]) -> Tallies:
    out: Tallies = defaultdict(lambda: [0.0, 0.0])
    for part in parts:
        for key, (num, den) in part.items():
            out[key][0] += num
            out[key][1] += den
    return dict(out)


def rates(tallies: Tallies) -> dict[str, float | None]:
    """numerator / denominator for each metric; None (JSON null) where there was nothing to
    count."""
    return {k: num / den if den else None for k, (num, den) in sorted(tallies.items())}

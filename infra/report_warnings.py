"""The report's warnings: what a reader of a run should look at, from its metrics alone.

What it is for: `role_warnings`, pure (metrics in, warnings out): per role, a response length that
grew or shrank, format compliance that fell, a gradient-norm or entropy jump; for the run, the
validation drop below its earlier peak; with the thresholds that decide each, and the two series
helpers the page's curves share (`series`, `smooth`). What it is not: the page that shows them
(infra/report.py) or a stop rule: a run is never halted by a warning.
"""
from __future__ import annotations

import statistics

# a role's format compliance below this: a warning
FORMAT_MIN = 0.8
# a role's response length up or down by more than this fraction
LENGTH_CHANGE = 0.5
# a step over this many times the median of the steps before it ...
JUMPS = {"grad_norm": 3.0, "entropy": 2.0}
# ... that median: over up to 10 steps before, once 5 exist
JUMP_WINDOW, JUMP_HISTORY = 10, 5
# training metrics: a running mean over 5 steps (series of 30 or more)
SMOOTH = 5
# validation accuracy this far below its earlier peak: a warning
DROP_MIN = 0.05


def series(metrics: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric, on the steps that logged it with a value."""
    return [(m["step"], float(m[key])) for m in metrics if isinstance(m.get(key), (int, float))]


def role_warnings(metrics: list[dict], roles: list[str]) -> list[dict]:
    """What a reader should look at, from the metrics alone: per role, a response length up or down
    by more than LENGTH_CHANGE, format compliance under FORMAT_MIN, a gradient-norm or entropy jump
    (JUMPS); for the run, the step where validation accuracy fell furthest below its earlier peak
    (at least DROP_MIN). Validation metrics are read where the run has them, training ones otherwise
    (jumps: of `smooth`ed training values; SP: the role's own gradient norm). Each: kind, role,
    step, chart, text."""
    out = []
    for role in roles:
        out += length_warning(metrics, role) + format_warning(metrics, role)
        for key, factor in JUMPS.items():  # SP: the role's own gradient, not the shared adapter's
            own = series(metrics, f"{role}/role_grad_norm") if key == "grad_norm" else []
            label = "own gradient norm" if own else key.replace("_", " ")
            out += jump_warning(smooth(own or series(metrics, f"{role}/{key}")), role, key, factor,
                                label)
    val = series(metrics, "val/success")
    peak, worst = (None, None), (0.0, None, None)
    for step, value in val:
        if peak[0] is not None and peak[0] - value > worst[0]:
            worst = (peak[0] - value, step, peak)
        if peak[0] is None or value > peak[0]:
            peak = (value, step)
    if worst[0] >= DROP_MIN:
        drop, step, (top, top_step) = worst
        out.append({"kind": "validation drop", "role": None, "step": step, "chart": "val", "text":
                    f"validation accuracy fell to {top - drop:.3f} at step {step}, {drop:.3f} "
                    f"below its peak {top:.3f} (step {top_step})"})
    return out


def preferred(metrics: list[dict], key: str) -> tuple[list[tuple[int, float]], str]:
    """The validation series of a role metric where there is one (held-out tasks, fixed), else the
    training one."""
    val = series(metrics, f"val/{key}")
    return (val, "validation") if val else (series(metrics, key), "training")


def length_warning(metrics: list[dict], role: str) -> list[dict]:
    points, where = preferred(metrics, f"{role}/response_len")
    if len(points) < 2:
        return []
    # training lengths are noisy: 5-step means
    k = 1 if where == "validation" else min(5, len(points) // 2)
    first = statistics.mean(v for _, v in points[:k])
    last = statistics.mean(v for _, v in points[-k:])
    if first <= 0 or abs(last / first - 1) <= LENGTH_CHANGE:
        return []
    return [{"kind": "length", "role": role, "step": points[-1][0], "chart": "len", "text":
             f"{role}'s {where} response length {'grew' if last > first else 'shrank'} from "
             f"{first:.1f} to {last:.1f} tokens (x{last / first:.2f}) by step {points[-1][0]}"}]


def format_warning(metrics: list[dict], role: str) -> list[dict]:
    points, where = preferred(metrics, f"{role}/format_ok")
    if not points or min(v for _, v in points) >= FORMAT_MIN:
        return []
    step, low = min(points, key=lambda p: p[1])
    start = "from the start, " if points[0][1] < FORMAT_MIN else ""
    return [{"kind": "format", "role": role, "step": step, "chart": "format", "text":
             f"{role}'s {where} format compliance is below {FORMAT_MIN} {start}at its lowest "
             f"{low:.3f} (step {step})"}]


def smooth(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A running mean over the last SMOOTH points, on series long enough to be noisy (per-step
    metrics)."""
    if len(points) < 6 * SMOOTH:
        return points
    return [(s, statistics.mean(v for _, v in points[max(0, i - SMOOTH + 1):i + 1]))
            for i, (s, _) in enumerate(points)]


def jump_warning(points: list[tuple[int, float]], role: str, key: str, factor: float,
                 label: str) -> list[dict]:
    """The first step whose (smoothed) value is over `factor` x the median of the JUMP_WINDOW steps
    before it."""
    jumps = []
    for i in range(JUMP_HISTORY, len(points)):
        before = statistics.median(v for _, v in points[max(0, i - JUMP_WINDOW):i])
        if before > 0 and points[i][1] > factor * before:
            jumps.append((points[i][0], points[i][1], before))
    if not jumps:
        return []
    step, value, before = jumps[0]
    more = f"; {len(jumps) - 1} more such steps" if len(jumps) > 1 else ""
    return [{"kind": f"{key} jump", "role": role, "step": step, "chart": "grad"
             if key == "grad_norm" else key,
             "text": f"{role}'s {label} jumped to {value:.3g} at step {step}, "
             f"x{value / before:.1f} the median {before:.3g} of the steps before{more}"}]

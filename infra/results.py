"""`python eval.py table`: evaluation records (RUN/eval.jsonl, or JSONL files of them) as one
markdown table.

What it is for: reading what eval.py appended, one row per record in order (the cell, the set it was
evaluated on, the mode, the step, the samples), then the metrics of TABLE_METRICS that some record
has. What it is not: the evaluation (eval.py) or its metrics (eval.evaluation_metrics).

    python eval.py table runs/voting-ip runs/voting-sp
"""
from __future__ import annotations

import os

from infra.plots import EVAL_KEYS
from infra.runfolder import read_results, usage_error

TABLE_METRICS = ["accuracy", "pass@2", "any_correct", "generator/acc", "aggregator/acc",
                 "aggregator/format_ok", "fallback_rate"]


def results_table(records: list[dict]) -> str:
    """A markdown table of evaluation records (one row each, in order: what ran on which set, then
    the metrics of TABLE_METRICS that some record has); accuracy with its std over samples (n > 1);
    `-`: the metric does not apply."""
    columns = [k for k in TABLE_METRICS if any(r["metrics"].get(k) is not None for r in records)]
    head = ["cell", "dataset", "mode", "step", "samples", *columns]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in records:
        m = r["metrics"]
        mode = f"{r['mode']} ({r['sa_cell']})" if r.get("sa_cell") else r["mode"]  # an SA mode
        mode += f" ({' <-> '.join(r['swap'])})" if r.get("swap") else ""  # swapped: which roles
        accuracy = f"{m['accuracy']:.3f}"
        if r["n"] > 1:  # a std needs two samples or more
            accuracy += f" ± {m['accuracy_std']:.3f}"
        row = [r["cell"], r["dataset"], mode, str(r["step"]), f"{r['n']} x {r['tasks']}"]
        for k in columns:
            row.append(accuracy if k == "accuracy" else "-" if m.get(k) is None else f"{m[k]:.3f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def results_command(paths: list[str]) -> str:
    """`eval.py table`: the records of the given runs' eval.jsonl (or JSONL files), printed as one
    table."""
    files = [os.path.join(p, "eval.jsonl") if os.path.isdir(p) else p for p in paths]
    for path in files:
        if not os.path.exists(path):
            usage_error(f"no evaluation results at {path} (run `python eval.py --run-dir RUN` "
                        "first)")
    records = [r for path in files for r in read_results(path, EVAL_KEYS)]
    if not records:
        usage_error(f"no evaluation records in {', '.join(paths)} "
                    "(run `python eval.py --run-dir RUN` first)")
    table = results_table(records)
    print(table)
    return table

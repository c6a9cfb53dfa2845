"""Plots of training runs, from their run folders: `python eval.py plot RUN [RUN ...]`.

What it is for: validation accuracy against training step (a dashed line for the base model), and a
2x2 panel of per-role training metrics (gradient norm, entropy, response length, loss share), one
line per run and role. What it is not: evaluation (eval.py computes the numbers; this file only
draws what the runs logged).
"""
from __future__ import annotations

import os

from infra.cells import cell_name
from infra.runfolder import NAME_KEYS, dataset_name, read_results, read_run_args, usage_error

# what plots and tables read of a record
EVAL_KEYS = ("cell", "dataset", "mode", "step", "n", "tasks", "metrics")
ROLE_PANELS = [("grad_norm", "gradient norm"), ("entropy", "entropy"),
               ("response_len", "response length (tokens)"), ("loss_share", "loss share")]


def read_runs(run_dirs: list[str]) -> list[tuple[dict, list[dict], list[dict]]]:
    """(args, metrics, evaluations) of each run, all read before anything is drawn."""
    runs = [(read_run_args(r, keys=NAME_KEYS),
             read_results(os.path.join(r, "metrics.jsonl"), ("step",)),
             read_results(os.path.join(r, "eval.jsonl"), EVAL_KEYS)) for r in run_dirs]
    for r, (_, metrics, _) in zip(run_dirs, runs):
        if not metrics:
            usage_error(f"{r}: no metrics yet (metrics.jsonl is missing or empty)")
    return runs


def plot_runs(run_dirs: list[str], out_dir: str, roles: dict[str, list[str]]) -> dict[str, tuple]:
    """Two PNGs: validation accuracy against training step (one line per run, a dashed base-model
    line per distinct workflow / model / data: an eval.jsonl `base` record, else the step-0
    validation), and a 2x2 panel of per-role training metrics (one line per run and role; `roles`:
    each workflow's role types, in the order their line styles follow). Returns {name: (figure,
    path)}."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    runs = read_runs(run_dirs)
    os.makedirs(out_dir, exist_ok=True)
    cells = [cell_name(args) for args, _, _ in runs]  # the folder name tells apart runs of one cell
    labels = [f"{c} ({os.path.basename(os.path.normpath(r))})" if cells.count(c) > 1 else c
              for c, r in zip(cells, run_dirs)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig_acc, ax = plt.subplots(figsize=(7, 4.5))
    bases: dict[tuple, tuple[float, str, str]] = {}
    for i, ((args, metrics, evals), label) in enumerate(zip(runs, labels)):
        val = [(m["step"], m["val/success"]) for m in metrics if "val/success" in m]
        if val:
            ax.plot(*zip(*val), marker="o", color=colors[i % len(colors)], label=label)
        base = [r["metrics"]["accuracy"] for r in evals if r["mode"] == "base"]
        base += [m["val/success"] for m in metrics if m["step"] == 0 and "val/success" in m]
        if base:  # named by the cell without its policy
            name = "-".join(cells[i].split("-")[:1] + cells[i].split("-")[2:])
            bases.setdefault((args["workflow"], args["model"], dataset_name(args)),
                             (base[0], name, colors[i]))
    for value, name, color in bases.values():  # several: each in the colour of its first run
        ax.axhline(value, color="gray" if len(bases) == 1 else color, linestyle="--",
                   label="base" if len(bases) == 1 else f"base ({name})")
    ax.set(xlabel="training step", ylabel="validation accuracy", ylim=(0, 1.02),
           title="Validation accuracy (step 0: before training)")
    fig_roles, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for i, ((args, metrics, _), label) in enumerate(zip(runs, labels)):
        steps = [m for m in metrics if m["step"] > 0]
        for j, role in enumerate(roles[args["workflow"]]):
            for panel, (key, _) in zip(axes.flat, ROLE_PANELS):
                points = [(m["step"], m[f"{role}/{key}"])
                          for m in steps if m.get(f"{role}/{key}") is not None]
                if points:
                    panel.plot(*zip(*points), color=colors[i % len(colors)],
                               linestyle=["-", "--", ":", "-."][j % 4], label=f"{label} {role}")
    for panel, (_, title) in zip([ax, *axes.flat], [("", ""), *ROLE_PANELS]):
        panel.set(xlabel="training step", **({"title": title} if title else {}))
        panel.xaxis.get_major_locator().set_params(integer=True)
        panel.grid(alpha=0.3)
    axes.flat[3].set_ylim(0, 1.05)  # a role's share of its adapter's loss weight (IP: always 1)
    for panel, size in ((ax, 8), (axes.flat[0], 7)):
        if panel.get_legend_handles_labels()[0]:  # a run without validation has no curve to name
            panel.legend(fontsize=size)
    fig_roles.suptitle("Per-role training metrics (colour: run, line style: role)")
    out = {}
    for name, fig in (("val_accuracy", fig_acc), ("roles", fig_roles)):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
        out[name] = (fig, os.path.join(out_dir, f"{name}.png"))
    return out

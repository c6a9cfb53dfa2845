"""The findings' figures (docs/findings.md), drawn from the study's compact results
(toyworld/results.py's `records`: a folder of compact files, or of run folders): finding 1's bars,
then a row of panels per figure (STUDY_FIGURES), each line the mean over seeds with a band from the
lowest to the highest.

What it is for: toyworld/study.py's figures. What it is not: a run's own curves (`eval.py plot`,
infra/plots.py).
"""
from __future__ import annotations

import os

from infra.paired import mean_of
from toyworld.findings import runs_of
from toyworld.results import records

WORKFLOW_PANELS = [("Voting", "voting"), ("Eval-Opt", "evalopt"), ("Orch-Workers", "orchworkers")]


def seed_curves(out: str, name: str, seeds: list[int],
                key: str) -> tuple[list[int], list[list[float]]]:
    """(steps, one list of `key` per seed: the mean over the seed's runs, findings.runs_of) of a
    grid configuration, on the steps every seed has."""
    per_seed = []
    for seed in seeds:
        runs = [{m["step"]: m[key] for m in records(out, f"{name}-s{seed}{run}", "metrics.jsonl")
                 if m.get(key) is not None} for run in runs_of(out, name, seed)]
        steps = set.intersection(*(set(r) for r in runs))
        per_seed.append({t: sum(r[t] for r in runs) / len(runs) for t in steps})
    steps = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    return steps, [[s[t] for t in steps] for s in per_seed]


def band(ax, out: str, name: str, seeds: list[int], key: str, label: str, style: str = "-",
         color=None, smooth: int = 1) -> None:
    """The mean over seeds of `key` against step, with a band from the lowest to the highest seed;
    `smooth`: a running mean over that many steps first (per-step training metrics are noisy)."""
    steps, curves = seed_curves(out, name, seeds, key)
    if not steps:
        return
    if smooth > 1:
        curves = [[sum(c[max(0, i - smooth + 1):i + 1]) / len(c[max(0, i - smooth + 1):i + 1])
                   for i in range(len(c))] for c in curves]
    mean = [sum(c) / len(c) for c in zip(*curves)]
    line, = ax.plot(steps, mean, style, color=color, label=label)
    ax.fill_between(steps, [min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)],
                    color=line.get_color(), alpha=0.15)


def _finish(fig, axes, folder: str, name: str, title: str) -> str:
    for ax in axes:
        ax.set_xlabel(ax.get_xlabel() or "training step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path = os.path.join(folder, f"{name}.png")
    fig.savefig(path, dpi=110)
    return path


def eval_accuracy(out: str, name: str, seeds: list[int], mode: str) -> list[float]:
    """eval.py's accuracy of `mode` on each seed's final checkpoints of a configuration, the mean
    over the seed's runs that have it (seeds without any left out)."""
    values = []
    for seed in seeds:
        found = [[r["metrics"]["accuracy"] for r in records(out, f"{name}-s{seed}{run}",
                                                            "eval.jsonl") if r["mode"] == mode][-1:]
                 for run in runs_of(out, name, seed)]
        values += [mean_of(sum(found, []))] if any(found) else []
    return values


def plot_transfer(out: str, seeds: list[int], folder: str, plt) -> str:
    """Finding 1: per workflow, eval.py's accuracy of the base model, the trained SP and IP runs,
    and the single-agent adapter in the structure (every role, or the solving roles only); bars: the
    mean, whiskers: the lowest and highest seed."""
    bars = [("base", "sp", "base"), ("trained SP", "sp", "trained"),
            ("trained IP", "ip", "trained"),
            ("SA-RL, every role", "sp", "sa-transfer"),
            ("SA-RL, solving roles", "sp", "sa-generator-transfer")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for j, (label, policy, mode) in enumerate(bars):
        for i, (_, workflow) in enumerate(WORKFLOW_PANELS):
            acc = eval_accuracy(out, f"{workflow}-{policy}", seeds, mode)
            if acc:
                mean = sum(acc) / len(acc)
                ax.bar(i + 0.16 * (j - 2), mean, 0.15, color=f"C{j}",
                       label=label if i == 0 else None, yerr=[[mean - min(acc)], [max(acc) - mean]],
                       capsize=3)
    ax.set_xticks(range(len(WORKFLOW_PANELS)), [t for t, _ in WORKFLOW_PANELS])
    ax.set(ylabel="accuracy (eval.py, 64 test problems x 2)", ylim=(0, 1.02), xlabel=" ")
    return _finish(fig, [ax], folder, "finding1_transfer",
                   "Finding 1: trained workflows against the single agent's adapter in the "
                   f"structure\n(mean of {len(seeds)} seeds; whiskers: lowest and highest; "
                   "held-out test problems)")


def plot_panels(out: str, seeds: list[int], folder: str, name: str, title: str, panels: list,
                plt) -> str:
    """One row of panels; each panel: (title, [(configuration, key, label, style, smooth)]). Lines
    whose labels start with the same word share a colour (one configuration or one role), told apart
    by their style."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (panel_title, lines) in zip(axes[0], panels):
        # a colour per first word
        groups = list(dict.fromkeys(label.split()[0] for _, _, label, _, _ in lines))
        for config, key, label, style, smooth in lines:
            band(ax, out, config, seeds, key, label, style, f"C{groups.index(label.split()[0])}",
                 smooth)
        ax.set_title(panel_title, fontsize=10)
    return _finish(fig, list(axes[0]), folder, name,
                   f"{title} (mean of {len(seeds)} seeds; band: lowest to highest)")


ACC = "val/success"
# The findings' line figures: (file name, title, panels); a panel: (title, [(configuration, metric,
# label, line style, running mean over that many steps)]). Validation metrics (`val/`) are measured
# every 10 steps on 64 held-out problems x 2; per-step training metrics are smoothed over 10 steps.
STUDY_FIGURES = [
    ("finding2_evalopt", "Finding 2: when Eval-Opt's evaluator asks for a retry", [
        ("validation accuracy", [("single", ACC, "single agent", "--", 1),
                                 ("evalopt-sp", ACC, "SP", "-", 1),
                                 ("evalopt-ip", ACC, "IP", "-", 1)]),
        ("P(retry | first attempt wrong), solid; right, dashed", [
            ("evalopt-sp", "val/p_retry_first_wrong", "SP, first wrong", "-", 1),
            ("evalopt-ip", "val/p_retry_first_wrong", "IP, first wrong", "-", 1),
            ("evalopt-sp", "val/p_retry_first_right", "SP, first right", "--", 1),
            ("evalopt-ip", "val/p_retry_first_right", "IP, first right", "--", 1)]),
        ("retries fixed (wrong to right), broken; verdicts right", [
            ("evalopt-sp", "val/fix_rate", "SP fix", "-", 1),
            ("evalopt-ip", "val/fix_rate", "IP fix", "-", 1),
            ("evalopt-sp", "val/break_rate", "SP break", ":", 1),
            ("evalopt-ip", "val/break_rate", "IP break", ":", 1),
            ("evalopt-sp", "val/evaluator/acc", "SP evaluator acc", "--", 1),
            ("evalopt-ip", "val/evaluator/acc", "IP evaluator acc", "--", 1)])]),
    ("finding3_shares", "Finding 3: SP's role shares (Voting)", [
        ("validation accuracy", [("single", ACC, "single agent", "--", 1),
                                 ("voting-sp", ACC, "SP", "-", 1),
                                 ("voting-sp-equal", ACC, "SP, equal role weights", "-", 1),
                                 ("voting-ip", ACC, "IP", "-", 1)]),
        ("SP: each role's share of the loss (solid) and of the gradient (dashed)", [
            ("voting-sp", f"{role}/{share}", f"{role} {what}", style, 10)
            for share, what, style in (("loss_share", "loss", "-"),
                                       ("grad_norm_share", "gradient", "--"))
            for role in ("generator", "aggregator")]),
        ("SP with equal role weights: the same shares", [
            ("voting-sp-equal", f"{role}/{share}", f"{role} {what}", style, 10)
            for share, what, style in (("loss_share", "loss", "-"),
                                       ("grad_norm_share", "gradient", "--"))
            for role in ("generator", "aggregator")])]),
    ("finding4_instance_steps", "Finding 4: IP's optimizer step per instance (Voting)", [
        ("validation accuracy", [("voting-ip", ACC, "IP (3 generator steps a step)", "-", 1),
                                 ("voting-ip-merged", ACC, "IP, merged (1 step)", "-", 1)]),
        ("generator entropy (training)", [
            ("voting-ip", "generator/entropy", "IP", "-", 10),
            ("voting-ip-merged", "generator/entropy", "IP, merged", "-", 10)]),
        ("validation: the generators' own accuracy", [
            ("voting-ip", "val/generator/acc", "IP", "-", 1),
            ("voting-ip-merged", "val/generator/acc", "IP, merged", "-", 1)])]),
    ("finding5_format", "Finding 5: does each role keep its own format (validation)?", [
        ("Voting aggregator: another role's format (solid), its own (dashed)", [
            (f"voting-{p}", f"val/aggregator/{key}", f"{p.upper()} {what}", style, 1)
            for key, what, style in (("foreign_format", "foreign", "-"),
                                     ("own_format", "own", "--"))
            for p in ("sp", "ip")]),
        ("Eval-Opt evaluator: another role's format (solid), its own (dashed)", [
            (f"evalopt-{p}", f"val/evaluator/{key}", f"{p.upper()} {what}", style, 1)
            for key, what, style in (("foreign_format", "foreign", "-"),
                                     ("own_format", "own", "--"))
            for p in ("sp", "ip")]),
        ("Orch-Workers: format_ok", [
            (f"orchworkers-{p}", f"val/{role}/format_ok", f"{p.upper()} {role}", style, 1)
            for role, style in (("orchestrator", "-"), ("synthesizer", "--"))
            for p in ("sp", "ip")]),
        ("response length (tokens): aggregator, evaluator", [
            (f"{w}-{p}", f"val/{role}/response_len", f"{p.upper()} {role}", style, 1)
            for w, role, style in (("voting", "aggregator", "-"), ("evalopt", "evaluator", "--"))
            for p in ("sp", "ip")])]),
    ("roles_careful",
     "What each role learns: its careful habit's rate (validation; SP solid, IP dashed)", [
         (title, [(f"{workflow}-{p}", f"val/{role}/careful", f"{role} {p.upper()}", style, 1)
                  for role in roles for p, style in (("sp", "-"), ("ip", "--"))])
         for title, workflow, roles in (
             ("Voting", "voting", ("generator", "aggregator")),
             ("Eval-Opt", "evalopt", ("generator", "evaluator")),
             ("Orch-Workers", "orchworkers", ("orchestrator", "worker", "synthesizer")))]),
    ("interventions", "I1 and I6 on Voting IP", [
        ("validation accuracy", [("voting-ip", ACC, "plain IP", "-", 1),
                                 ("voting-ip-i6", ACC, "I6 on IP", "-", 1),
                                 ("voting-ip-i1", ACC, "I1 on IP", "-", 1)]),
        ("I6: the generator's coherence scale", [
            ("voting-ip-i6", "generator/coherence_scale", "I6 on IP", "-", 10)]),
        ("I1: KL to the base model, per token", [
            ("voting-ip-i1", "generator/kl_base", "generator", "-", 10),
            ("voting-ip-i1", "aggregator/kl_base", "aggregator", "-", 10)])]),
]


def plot_study(out: str, seeds: list[int], folder: str) -> list[str]:
    """The findings' figures (docs/findings.md) from the grid's run folders in `out`, into `folder`:
    finding 1's bars, then STUDY_FIGURES. Returns the PNG paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [plot_transfer(out, seeds, folder, plt)]
    figures += [plot_panels(out, seeds, folder, name, title, panels, plt) for name, title,
                panels in STUDY_FIGURES]
    plt.close("all")
    return figures

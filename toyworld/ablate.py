"""A fork's ablation judged as the study judges: two arms of toy-world runs, a baseline and a
change, paired by seed with several runs a seed, and for each quantity of the validation curve
(end, peak, decline, change over base) the paired difference with its t-interval, the run and seed
SDs, what the size detects with collapsing runs drawn at the rate they show, the runs or seeds that
would decide it, each arm's collapses and the verdict at a threshold stated before anything ran
(infra/paired.py and infra/detection.py: the statistics of docs/findings.md).

What it is for: docs/ablations.md's question, "does my change move the curve?", answered with an
interval and a power instead of three curves read by eye (which two arms of the same configuration
fool one time in four). Each arm is flags on top of the study's regime (toyworld/declared.py's
TRAIN at the study's rate and steps); a change in code is this checkout against the committed
baseline, or against `--baseline-checkout DIR` (a checkout without it: `git worktree add DIR
HEAD`). Before it starts it prints what its seeds x runs x steps detect at the committed study's
spread for the configuration, and its minutes; the default runs a seed are the fewest that detect
the threshold there, within BUDGET_MINUTES; `--quick` is one run a seed, a first look. The
threshold and the rest of the declaration are written, dated, before any run, into the ablation's
one file (OUT/NAME/ablation.json), which the results join, beside a figure of each arm's mean
curve and its seed band. Baseline runs the committed study holds are reused only when a
reproduction of one of them by the baseline's checkout agrees value for value
(toyworld/reproduce.py); otherwise they run. Runs go as the study's do (toyworld/jobs.py): side by
side, a line per finished run, a stopped ablation resumed by the same command, Ctrl-C clean. What
it is not: a study (no predeclared findings), or a way to change a threshold once results exist.

    python -m toyworld.ablate clip1 --workflow voting --policy ip --change "--adv-clip 1" \\
        --threshold 0.05
    python -m toyworld.ablate aa --workflow voting --policy ip --change-run-seeds 10 \\
        --threshold 0.05      # an A/A check: the same configuration on other run seeds
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import tempfile
import time

from infra import detection, paired
from infra.flags import Parser
from infra.runfolder import read_results, usage_error
from toyworld import declared, toy, toy_model
from toyworld.ablation_size import (
    QUANTITY,
    RESULTS,
    aa_model,
    committed_arm,
    committed_name,
    committed_seeds,
    default_runs,
    full_flags,
    minutes,
    reproduced,
    reusable_runs,
)
from toyworld.jobs import Clock, code_commit, run_all
from toyworld.study import run_chain, run_command

# the flags an arm may not set: the ablation's own (seeds, runs, steps, folders) and the toy model
OWN_FLAGS = ("--seed", "--run-seed", "--steps", "--run-dir", "--resume", "--overwrite", "--model",
             "--cell")


# ---------------------------------------------------------------- the declaration

def arm_flags(text: str, side: str) -> list[str]:
    """An arm's flags from their text (shell words), or one line: an unreadable text or a flag
    the ablation sets itself."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        usage_error(f"--{side} {text!r}: {e}")
    if own := [w for w in words if w.split("=")[0] in OWN_FLAGS]:
        usage_error(f"--{side}: {own[0]} is the ablation's to set, not an arm's "
                    f"(the arms share {', '.join(OWN_FLAGS)})")
    return words


def named(flags: list[str]) -> set[str]:
    return {w.split("=")[0] for w in flags if w.startswith("--")}


def check_arm(args, flags: list[str], side: str) -> None:
    """One line for a flag train.py does not take, a value it refuses or a workflow whose roles the
    toy world does not know; nothing is loaded or written (train.py's own checks, in this
    process)."""
    import train  # (here: it imports torch, which --help and a refusal above need not wait for)
    from workflows import ROLES
    folder = os.path.join(tempfile.mkdtemp(), "run")  # never written: train.py's checks only
    argv = [*declared.TRAIN, *full_flags(args, flags), "--steps", str(args.steps),
            "--run-dir", folder]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            train.settings_from_flags(train.flags.parse_args(train.build_parser(), argv,
                                                             ROLES))
    except SystemExit:
        line = said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else "refused"
        usage_error(f"--{side} {' '.join(flags)!r}: {line.removeprefix('error: ')}")
    finally:
        os.rmdir(os.path.dirname(folder))


def declaration(args) -> dict:
    """What the ablation fixes before any run: compared with a resumed ablation's."""
    return {"workflow": args.workflow, "policy": args.policy, "baseline": args.baseline_flags,
            "change": args.change_flags, "threshold": args.threshold, "seeds": args.seeds,
            "runs": args.runs, "steps": args.steps, "lr": args.lr,
            "change_run_seeds": args.change_run_seeds, "quick": args.quick,
            "baseline_checkout": args.baseline_checkout}


def read_record(folder: str) -> dict | None:
    """A resumed ablation's record (OUT/NAME/ablation.json), or None for a new one."""
    path = os.path.join(folder, "ablation.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def declare(args, folder: str, saved: dict | None) -> dict:
    """OUT/NAME/ablation.json's declaration, written dated before any run; a resumed ablation's
    (`saved`) must be the same, or one line."""
    mine = declaration(args)
    if saved:
        differ = [k for k in mine if saved["declared"].get(k) != mine[k]]
        if differ:
            usage_error(f"{folder} was declared on {saved['date']} with other "
                        f"{', '.join(differ)} ({saved['declared'][differ[0]]!r}); an ablation's "
                        "declaration is fixed before its runs: give another name")
        return saved
    record = {"name": os.path.basename(folder), "date": time.strftime("%Y-%m-%d %H:%M"),
              "declared": mine, "commit": code_commit()}
    os.makedirs(folder, exist_ok=True)
    write_json(os.path.join(folder, "ablation.json"), record)
    return record


def write_json(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- the size


# ---------------------------------------------------------------- the runs

def run_seeds(seed: int, first: int, runs: int) -> list[tuple[str, int | None]]:
    """An arm's runs on `seed`: (its key, its run seed), k = first, first + 1, ...: run seed
    seed + k x RUN_SEED_STEP, and k = 0 the seed itself (no --run-seed), as the study's."""
    return [(str(k - first), seed + k * declared.RUN_SEED_STEP if k else None)
            for k in range(first, first + runs)]


def arm_chains(args, folder: str, side: str, flags: list[str], first: int, script: str,
               skip: int = 0) -> list:
    """The train.py commands of an arm's runs not finished yet (its first `skip` a seed are
    reused), each run's folder OUT/NAME/SIDE-sSEED-kK."""
    chains = []
    for seed in args.seeds:
        for key, run_seed in run_seeds(seed, first, args.runs)[skip:]:
            run_folder = os.path.join(folder, f"{side}-s{seed}-k{key}")
            if not finished(run_folder, args.steps):
                chains.append(run_chain(run_command(run_folder, full_flags(args, flags), seed,
                                                    args.steps, run_seed, script)))
    return chains


def finished(run_folder: str, steps: int) -> bool:
    path = os.path.join(run_folder, "metrics.jsonl")
    return any(m["step"] == steps for m in read_results(path, ("step",), warn=False))


def curves(args, folder: str, side: str, reused: str | None, skip: int) -> paired.Arm:
    """An arm's validation curves, seed -> run key -> val/success at each validation step: the
    committed study's first `skip` runs a seed of `reused`, then the arm's own."""
    arm = {}
    for seed in args.seeds:
        runs = dict(list(committed_arm(reused, [seed]).get(seed, {}).items())[:skip]) \
            if reused else {}
        for key, _ in run_seeds(seed, 0, args.runs)[skip:]:
            path = os.path.join(folder, f"{side}-s{seed}-k{key}", "metrics.jsonl")
            runs[key] = [m["val/success"] for m in read_results(path, ("step",), warn=False)
                         if m.get("val/success") is not None]
        arm[seed] = runs
    return arm


# ---------------------------------------------------------------- the judgment

def plot_arms(arms: dict[str, paired.Arm], steps: list[int], path: str, title: str) -> None:
    """Each arm's mean validation curve over seeds (a seed's curve the mean of its runs) and the
    band its seeds span."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for (side, arm), color, style in zip(arms.items(), ("tab:gray", "tab:blue"), ("--", "-")):
        by_seed = [[paired.mean_of([c[i] for c in runs.values() if len(c) > i])
                    for i in range(len(steps))] for runs in arm.values()]
        mean = [paired.mean_of(list(point)) for point in zip(*by_seed)]
        ax.fill_between(steps, [min(p) for p in zip(*by_seed)], [max(p) for p in zip(*by_seed)],
                        color=color, alpha=0.2, linewidth=0)
        label = f"{side} (mean of {len(arm)} seeds; band: their range)"
        ax.plot(steps, mean, style, color=color, label=label)
    ax.set(xlabel="step", ylabel="validation accuracy", title=title, ylim=(0, 1))
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def judge(args, folder: str, record: dict, reused: str | None, skip: int) -> dict:
    """Both arms' curves compared (infra/paired.py), printed, and written into ablation.json with
    the figure beside it."""
    arms = {"baseline": curves(args, folder, "baseline", reused, skip),
            "change": curves(args, folder, "change", None, 0)}
    result = paired.compare_arms(arms["change"], arms["baseline"], args.threshold)
    lines = paired.describe(result, ("change", "baseline"))
    if args.quick:
        lines.insert(0, "quick: a first look, one run a seed (no run-to-run SD; docs/ablations.md "
                        "says what it can and cannot tell)")
    print("\n".join(lines), flush=True)
    first = os.path.join(folder, f"change-s{args.seeds[0]}-k0", "metrics.jsonl")
    steps = [m["step"] for m in read_results(first, ("step",), warn=False)
             if m.get("val/success") is not None]
    plot_arms(arms, steps, os.path.join(folder, "curves.png"), record["name"])
    record.update(curves={side: {str(s): runs for s, runs in arm.items()}
                          for side, arm in arms.items()},
                  steps=steps, result=result, lines=lines, judged=time.strftime("%Y-%m-%d %H:%M"))
    write_json(os.path.join(folder, "ablation.json"), record)
    print(f"wrote {os.path.join(folder, 'ablation.json')} and curves.png", flush=True)
    return record


# ---------------------------------------------------------------- the command

def parser() -> Parser:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the ablation's name: its folder OUT/NAME")
    p.add_argument("--workflow", required=True, help="the workflow both arms run (an arm's own "
                   "--workflow wins)")
    p.add_argument("--policy", default="sp", help="sp or ip, as train.py's")
    p.add_argument("--baseline", default="", help="the baseline's train.py flags (default: none)")
    p.add_argument("--change", default="", help="the change's train.py flags")
    p.add_argument("--threshold", type=float, required=True,
                   help="the difference that counts, stated before anything runs (e.g. 0.05)")
    p.add_argument("--seeds", default=None,
                   help="comma-separated toy-world seeds (default: the committed study's)")
    p.add_argument("--runs", type=int, default=None,
                   help="runs a seed (default: from the committed spread, within the budget)")
    p.add_argument("--steps", type=int, default=declared.STEPS, help="training steps a run")
    p.add_argument("--quick", action="store_true", help="one run a seed: a first look")
    p.add_argument("--change-run-seeds", type=int, default=0, metavar="K",
                   help="the change's runs on run seeds k = K, K + 1, ... (the baseline's from 0); "
                   "an A/A check puts the same flags on other run seeds")
    p.add_argument("--baseline-checkout", default=None, metavar="DIR",
                   help="run the baseline from this checkout (a change in code: one without it)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    p.add_argument("--out", default="runs/ablations", help="the ablations' folder")
    return p


def check(args, p: Parser) -> None:
    """Every one-line refusal, before anything is written."""
    with open(os.path.join(RESULTS, "study.json")) as f:
        study = json.load(f)
    args.lr = study["lr"]
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else study["seeds"]
    except ValueError:
        p.error(f"--seeds {args.seeds}: expected comma-separated integers")
    for bad, line in ((args.threshold <= 0, "--threshold must be > 0"),
                      (len(args.seeds) < 2, "--seeds: a paired interval needs 2 seeds at least"),
                      (args.steps < 30, "--steps: at least 30 (three validation points)"),
                      (args.runs is not None and args.runs < 1, "--runs: at least 1"),
                      (args.jobs < 1, "--jobs: at least 1")):
        if bad:
            p.error(line)
    args.baseline_flags = arm_flags(args.baseline, "baseline")
    args.change_flags = arm_flags(args.change, "change")
    if both := sorted(named(args.baseline_flags) & named(args.change_flags)):
        p.error(f"{both[0]} is set in both arms; set it in the one it differs in")
    if missing := [s for s in args.seeds if not (toy.ready(s) or toy_model.committed(s))]:
        p.error(f"seed {missing[0]} has no toy model, committed or built: build it first with "
                f"`python -m toyworld.toy --build --seed {missing[0]}` (about 18 minutes)")
    if args.baseline_checkout:
        args.baseline_checkout = os.path.abspath(args.baseline_checkout)
        if not os.path.isfile(os.path.join(args.baseline_checkout, "train.py")):
            p.error(f"--baseline-checkout {args.baseline_checkout}: no train.py there")
        if not os.path.exists(os.path.join(args.baseline_checkout, ".git")):  # run_script's mark
            p.error(f"--baseline-checkout {args.baseline_checkout}: not a git checkout (git "
                    "worktree add DIR HEAD makes one); its runs would import this checkout's code")
    same = args.baseline_flags == args.change_flags and not args.change_run_seeds
    if same and not args.baseline_checkout and not code_commit().endswith("+changes"):
        p.error("the two arms are the same runs: give the change flags, a change in code (this "
                "checkout's against --baseline-checkout), or --change-run-seeds for an A/A check")
    check_arm(args, args.baseline_flags, "baseline")
    check_arm(args, args.change_flags, "change")


def plan_lines(args, model: detection.RunModel | None, base: str | None, why: str,
               reusable: int) -> list[str]:
    """What the size can tell at the committed spread, and its minutes, printed before it runs."""
    size = (f"{len(args.seeds)} seeds x {args.runs} runs a seed ({why}) x {args.steps} steps")
    lines = [f"ablation {args.name}: change {args.change!r} against baseline {args.baseline!r}, "
             f"{args.workflow} {args.policy}; threshold {args.threshold:g}", f"size: {size}"]
    if model is not None:
        noise = detection.seed_noise(model, len(args.seeds), args.runs)
        lines.append(f"this size detects {detection.smallest_in(noise):.3f} in {QUANTITY} accuracy "
                     f"80% of the time at the committed spread of {base} (one run's difference "
                     f"SD {model.run:.3f}, collapses in {model.rate:.1%} of its runs)")
    lines.append(f"estimated {minutes(args, args.runs, reusable):.0f} minutes on this machine "
                 f"({args.jobs} runs at a time)")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    check(args, p)
    folder = os.path.join(os.path.abspath(args.out), args.name)
    reused, reusable = reusable_runs(args)
    base = committed_name(args, args.baseline_flags) or committed_name(args, [])
    model = aa_model(committed_arm(base, committed_seeds())) if base else None
    saved = read_record(folder)
    if args.runs is None and saved:  # a resumed ablation keeps the size it declared
        args.runs, why = saved["declared"]["runs"], "as declared"
    else:
        args.runs, why = default_runs(args, model, reusable)
    print("\n".join(plan_lines(args, model, base, why, reusable)), flush=True)
    record = declare(args, folder, saved)  # dated, before any run
    skip = 0
    if reused and "baseline" not in record:
        try:
            agrees, said = reproduced(args, folder, reused)
        except KeyboardInterrupt:  # as run_all stops below: the same command goes on from here
            stopped = "stopped during the reproduction; the same command starts it again"
            raise SystemExit(stopped) from None
        if not agrees and code_commit().endswith("+changes") and not args.baseline_checkout:
            usage_error(f"{said}: this checkout's changes move the baseline's numbers; run the "
                        "baseline from a checkout without them: --baseline-checkout DIR")
        record["baseline"] = {"reused": reused if agrees else None, "reproduction": said}
        write_json(os.path.join(folder, "ablation.json"), record)
    if record.get("baseline", {}).get("reused"):
        skip = min(args.runs, reusable)
        print(f"baseline: the committed study's {reused} runs ({skip} a seed), reused: "
              f"{record['baseline']['reproduction']}", flush=True)
    else:
        print("baseline: runs here" if not args.baseline_checkout else
              f"baseline: runs from {args.baseline_checkout}", flush=True)
    script = os.path.join(args.baseline_checkout, "train.py") if args.baseline_checkout \
        else "train.py"
    chains = [*arm_chains(args, folder, "baseline", args.baseline_flags, 0, script, skip),
              *arm_chains(args, folder, "change", args.change_flags, args.change_run_seeds,
                          "train.py")]
    clock = Clock(args.jobs)
    clock.plan("train", len(chains))
    run_all(chains, False, args.jobs, clock)
    judge(args, folder, record, reused if skip else None, skip)


if __name__ == "__main__":
    main()

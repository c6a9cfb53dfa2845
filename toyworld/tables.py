"""The toy-world study's tables: the markdown that docs/findings.md, its history page,
docs/toy_world.md and the README show, written from the judged comparisons (toyworld/findings.py)
and the committed records, between the pages' markers.

What it is for: every table a reader of the findings sees (each finding's, the replication's, the
runs', the power of the declines, the sweep's, the calibration's) from study.json's content, so a
test can write them again and compare them byte for byte; a table goes to whichever of the pages
has its markers (`fill_pages`). What it is not: the statistics or the rules (toyworld/findings.py),
the power figures (toyworld/power.py), or the verdict table (toyworld/verdicts.py).
"""
from __future__ import annotations

import math
import os
import re

from infra import detection
from infra.paired import TIE, excludes_zero, mean_of, seed_verdict
from toyworld import declared, power


def fmt_seed(x: float) -> str:
    """A seed's difference in a table: two decimals, signed unless it is a tie (TIE)."""
    return "0.00" if abs(x) < TIE else fmt(x, 2)


def fmt(x: float, digits: int = 3, signed: bool = True) -> str:
    """A table's number: signed for a difference, plain for a value (a mean, an accuracy, a standard
    error)."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else \
        f"{x:{'+' if signed else ''}.{digits}f}"


def finding_table(result: dict) -> str:
    """The markdown table of one finding: each comparison with the means of A and B over seeds
    (each seed's the mean of its runs), the per-seed differences, their mean with its t-interval
    (95%) and the verdict (`verdict_words`); then the finding's verdict, with its comparisons'
    (`verdict_line`). The rules and what the seeds can tell are the verdict table's."""
    rows = ["| comparison | A / B | per seed | mean [95% t-interval] | verdict |",
            "|---|---|---|---|---|"]
    for kind, comparisons in (("precondition: ", result["preconditions"]),
                              ("", result["comparisons"]),
                              ("beside: ", result.get("beside", []))):
        for c in comparisons:
            # near: A alone
            means = [mean_of(c["a"]), *([mean_of(c["b"])] if c["rule"] != "near" else [])]
            a_b = " / ".join(fmt(x, 2, signed=False) for x in means)
            per_seed = " ".join(fmt(x, 2) for x in c["per_seed"])
            # P(retry | first wrong): a pipe would split the cell
            label = c["label"].replace("|", "\\|")
            rows.append(f"| {kind}{label} | {a_b} | {per_seed} | {mean_interval(c)} | "
                        f"{verdict_words(c)} |")
    rows.append("\n" + verdict_line(result))
    return "\n".join(rows)


def mean_interval(c: dict) -> str:
    """A comparison's mean and its t-interval (95%): `+0.045 [+0.02, +0.07]`."""
    return f"{fmt(c['mean'])} [{fmt(c['ci'][0], 2)}, {fmt(c['ci'][1], 2)}]"


def verdict_line(result: dict) -> str:
    """A finding's verdict and how its comparisons (and its precondition) came out: "**Verdict:
    not shown.** Its comparisons: 4 shown, 1 the opposite; its precondition shown."."""
    counts = [f"{n} {v}" for v in ("shown", "shown by the rule only", "not shown", "the opposite",
                                   "the opposite by the rule only")
              if (n := sum(verdict_words(c) == v for c in result["comparisons"]))]
    pre = "; ".join(f"its precondition {verdict_words(c)}" for c in result["preconditions"])
    # a finding whose every comparison is decided by the rule only is decided by the rule only
    only = result["verdict"] in ("shown", "the opposite") and all(
        verdict_words(c).endswith("by the rule only") for c in result["comparisons"])
    verdict = result["verdict"] + (" by the rule only" if only else "")
    return (f"**Verdict: {verdict}.** Its comparisons: {', '.join(counts)}"
            + (f"; {pre}" if pre else "") + ".")


def verdict_words(c: dict) -> str:
    """A comparison's verdict, and "by the rule only" for a shown or the opposite whose t-interval
    does not say the same (`excludes_zero`)."""
    decided = c["verdict"] in ("shown", "the opposite") and c["rule"] != "near"
    return c["verdict"] + (" by the rule only" if decided and not excludes_zero(c) else "")


def tell_cell(c: dict, model=None) -> str:
    """How far the true difference must be from the rule's reference (zero; for `matches`, minus
    its margin) for the seeds' t-interval to lie wholly beyond it 80% of the time, at the spread
    seen (toyworld/power.py) and, for a decline (`model`), with collapses drawn; for a verdict by
    the rule only, the seeds that would decide it 80% of the time were the true difference the
    mean seen."""
    if c["rule"] == "near" or c["n"] < 2 or math.isnan(c["se"]):
        return "n/a"
    found = power.comparison_power(c, model)
    more = ""
    if "collapses" in found:
        more = f"; {found['collapses']['smallest_detected']:.2f} with collapses"
    if verdict_words(c).endswith("by the rule only"):
        needed = found["seeds_needed"]
        more += f"; {needed} seeds would decide it" if needed else \
            f"; over {detection.MOST_SEEDS} seeds to decide it"
    return f"{found['smallest_detected']:.2f}{more}"


def pass_cell(c: dict, model=None) -> str:
    """How often the comparison's rule says shown with nothing there, at the spread seen
    (toyworld/power.py's false-pass rate) and, for a decline (`model`), with collapses drawn."""
    if c["rule"] not in ("greater", "matches") or c["n"] < 2 or math.isnan(c["se"]):
        return "n/a"
    found = power.comparison_power(c, model)
    more = (f"; {found['collapses']['false_pass']:.0%} with collapses" if "collapses" in found
            else "")
    return f"{found['false_pass']:.0%}{more}"


def runs_cell(c: dict) -> str:
    """A comparison's runs a seed and its run-to-run SD (of one run's difference) against the
    seed-to-seed SD (of the seeds' means); the run SD is n/a with one run a seed."""
    seed_sd, run_sd = c["se"] * math.sqrt(c["n"]), c.get("run_sd", float("nan"))
    return f"{c.get('runs', 1)}: {fmt(run_sd, 3, signed=False)} / {fmt(seed_sd, 3, signed=False)}"


def fill_tables(path: str, tables: dict[str, str], kind: str = "table") -> list[str]:
    """Replace what stands between `<!-- KIND:NAME -->` and `<!-- /KIND:NAME -->` in `path` by
    `tables[NAME]`; returns the names it found no markers for (the prose around the markers is the
    author's; KIND: table, or docs/ablations.md's ablation)."""
    with open(path) as f:
        text = f.read()
    missing = []
    for name, table in tables.items():
        # (what stands between the markers may be nothing: a table not written yet)
        start, end = (f"<!-- {kind}:{re.escape(name)} -->", f"<!-- /{kind}:{re.escape(name)} -->")
        pattern = re.compile(rf"({start}\n)(?:.*?\n)?({end})", re.S)
        if not pattern.search(text):
            missing.append(name)
        text = pattern.sub(lambda m, table=table: m.group(1) + table + "\n" + m.group(2), text)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return missing


# Pages beside a findings page (paths from its folder) that take some of its tables: the sweep to
# its history, the calibration to the toy world's page
COMPANIONS = ("findings/history.md", "toy_world.md")


def fill_pages(doc: str, tables: dict[str, str]) -> list[str]:
    """`fill_tables` on `doc` and on its COMPANIONS that exist: each table goes to whichever page
    has its markers; returns the names no page has markers for."""
    pages = [doc] + [p for p in (os.path.join(os.path.dirname(doc), c) for c in COMPANIONS)
                     if os.path.isfile(p)]
    missing = [set(fill_tables(page, tables)) for page in pages]
    return sorted(set.intersection(*missing), key=list(tables).index)


def calibration_table(records: list[dict], builds: list[dict]) -> str:
    """Seed by seed, its calibration record (eval.py calibrate) and its build (toy.json): the
    targets missed, the base model's and the oracle's accuracy in each workflow, the solver's gap to
    its rows, and the build's minutes, threads and vector instructions (a seed's model differs
    across them: docs/toy_world.md)."""
    rows = ["| seed | targets missed | single / Voting / Eval-Opt / Orch-Workers, base model "
            "| the oracle, same workflows | solver right - oracle | build |",
            "|---|---|---|---|---|---|"]
    workflows = ("single", "voting", "evalopt", "orchworkers")
    for record, build in zip(records, builds):
        missed = (f"{len(record['missed'])}: " + ", ".join(record["missed"]) if record["missed"]
                  else "**none**")
        base = " / ".join(f"{record['success'][w]:.3f}" for w in workflows)
        oracle = " / ".join(f"{record['oracle_success'][w]:.3f}" for w in workflows)
        solve = record["habits"]["solve"]
        threads = f"{build['threads']} thread{'s' if build['threads'] > 1 else ''}"
        cpu = build.get("versions", {}).get("cpu_capability", "CPU not recorded")
        rows.append(f"| {record['seed']} | {missed} | {base} | {oracle} | "
                    f"{solve['right'] - solve['oracle_right']:+.3f} | {build['minutes']:.0f} min, "
                    f"{threads}, {cpu} |")
    return "\n".join(rows)


def sweep_table(sweep: dict, seeds: int) -> str:
    """The sweep's table (`sweep_choice`): each rate's base, peak and end per seed, how many of
    the seeds hold, and the rule's choice."""
    rows = ["| lr | base | peak (per seed) | end (per seed) | seeds that hold |",
            "|---|---|---|---|---|"]
    for lr, r in sweep["rates"].items():
        base, peak, end = (" ".join(fmt(x, 2, signed=False) for x in r[k])
                           for k in ("base", "peak", "end"))
        rows.append(f"| {lr} | {base} | {peak} | {end} | {r['holds']} of {seeds} |")
    rows.append(f"\nChoice ({sweep['rule']}): **{sweep['choice']}**.")
    return "\n".join(rows)


def study_tables(study: dict) -> dict[str, str]:
    """The tables written from study.json's content alone: the sweep, each finding's, the seeds'
    calibration (the study's and the replication's), the replication's, and the runs'."""
    tables = {"sweep": sweep_table(study["sweep"], len(study["seeds"])),
              **{f"finding-{f['id']}": finding_table(f) for f in study["findings"]}}
    if study.get("builds"):  # the study's candidate seeds, then the replication's
        rep = study.get("replication", {})
        tables["calibration"] = calibration_table(study["calibration"] + rep.get("calibration", []),
                                                  study["builds"] + rep.get("builds", []))
    if study.get("replication"):
        tables["replication"] = replication_table(study["replication"], study["findings"])
    tables["runs"] = runs_table(study["findings"])
    return tables


def write_tables(doc: str, study: dict) -> None:
    """`study_tables` between their markers in `doc` and its companion pages (`fill_pages`)."""
    missing = fill_pages(doc, study_tables(study))
    if missing:
        print(f"warning: {doc} and its companions have no markers for the tables {missing}")


def replication_table(rep: dict, judged: list[dict], rows: list[dict] | None = None) -> str:
    """The replication's rows (`rows`, default rep's), each held-out seed judged by its comparison's
    rule alone (`seed_verdict`; `judged`: the study's findings, which carry each rule's threshold)
    and whether that agrees with the study's verdict. The seeds' values are the verdict table's."""
    declared = {(f["id"], c["label"]): c for f in judged
                for c in f["preconditions"] + f["comparisons"]}
    lines = [f"Seeds {', '.join(map(str, rep['seeds']))} (set aside: "
             f"{', '.join(str(r['seed']) for r in rep['set_aside']) or 'none'}).\n",
             "| comparison | each seed by the rule | agrees with the study |", "|---|---|---|"]
    for r in rows if rows is not None else rep["rows"]:
        c = declared[(r["finding"], r["label"])]
        each = [seed_verdict(c["rule"], c["threshold"], x, c.get("target")) for x in r["per_seed"]]
        label, n = r["label"].replace("|", "\\|"), len(each)
        agree = sum(v == r["study"] for v in each)
        lines.append(f"| {label} | {', '.join(each)} | {agree} of {n} |")
    return "\n".join(lines)


def runs_table(judged: list[dict]) -> str:
    """Each predeclared comparison's runs: a seed's runs, the run-to-run SD of one run's difference
    against the seed-to-seed SD of the seeds' means, the spread between seeds that more runs cannot
    remove (detection.between_seeds), and from those the runs a seed that would detect the rule's
    threshold 80% of the time at these seeds, at a normal spread (toyworld/power.py)."""
    rows = ["| comparison | runs a seed | run-to-run SD | seed-to-seed SD | between seeds, runs "
            "aside | runs a seed to detect the threshold |", "|---|---|---|---|---|---|"]
    for c in (c for f in judged for c in f["comparisons"] if c["rule"] != "near"):
        found, seed_sd, k = power.comparison_power(c), c["se"] * math.sqrt(c["n"]), c.get("runs", 1)
        spread = detection.between_seeds(seed_sd, c["run_sd"], k) if k > 1 else math.nan
        label = c["label"].replace("|", "\\|")
        rows.append(f"| {label} | {k} | {fmt(c.get('run_sd', math.nan), 3, signed=False)} | "
                    f"{seed_sd:.3f} | {fmt(spread, 3, signed=False)} | "
                    f"{runs_needed_cell(c, found, spread)} |")
    return "\n".join(rows)


def power_table(judged: list[dict], declines: dict) -> str:
    """The declines' power at a normal spread and with collapses drawn (toyworld/power.py;
    `declines`: power.decline_models), side by side: the smallest true difference detected 80% of
    the time, how often the rule passes with nothing there, and the runs a seed that would detect
    the threshold; then the pooled collapses the model draws and the next study's runs a seed
    (toyworld/declared.py)."""
    rows = ["| comparison | runs a seed | detected 80% of the time: normal / with collapses | "
            "passes with nothing there: normal / with collapses | runs a seed to detect the "
            "threshold: normal / with collapses |", "|---|---|---|---|---|"]
    most = f"over {detection.MOST_RUNS}"
    for c in (c for f in judged for c in f["comparisons"] if c["label"] in declines["models"]):
        found = power.comparison_power(c, declines["models"][c["label"]])
        fell = found["collapses"]
        rows.append(
            f"| {c['label']} | {c['runs']} | {found['smallest_detected']:.2f} / "
            f"{fell['smallest_detected']:.2f} | {found['false_pass']:.0%} / "
            f"{fell['false_pass']:.0%} | {found.get('runs_needed') or most} / "
            f"{fell['runs_needed'] or most} |")
    seeds = declines["seeds"]
    return "\n".join(rows + [
        "", f"Drawn with collapses: {declines['collapsed']} of the {declines['runs']} runs of the "
        f"{len(declared.DECLINE_NAMES)} decline configurations on seeds "
        f"{', '.join(map(str, seeds))} collapse ({declines['rate']:.1%}), each a jump in its run's "
        f"decline of {', '.join(f'{j:+.2f}' for j in sorted(declines['jumps']))}. The next study's "
        f"runs a seed for the declines (`NEXT_DECLINE_RUNS`, toyworld/declared.py): "
        f"{power_plan()}."])


def power_plan() -> str:
    """declared.NEXT_DECLINE_RUNS in words."""
    runs = declared.NEXT_DECLINE_RUNS
    if runs is None:
        return (f"none within {detection.MOST_RUNS}: at five seeds no number of runs up to "
                f"{detection.MOST_RUNS} detects the threshold 80% of the time in every decline "
                "comparison under the pooled collapse model, so by this model a next study at "
                "runs of this size needs more seeds")
    return f"{runs}, the fewest that detect the threshold 80% of the time in every decline"


def runs_needed_cell(c: dict, found: dict, between: float) -> str:
    """detection.runs_needed as a cell: the runs a seed, or why none up to its most (MOST_RUNS) do:
    the seeds' own spread `between` (detection.between_seeds) alone misses the threshold, or more
    runs than that would be needed."""
    if "runs_needed" not in found:
        return "n/a"
    if found["runs_needed"]:
        return str(found["runs_needed"])
    alone = detection.detect_rate(between, c["threshold"], c["n"]) if between > 0 else 1.0
    if alone < detection.POWER:
        return "none: the seeds differ too much"
    return f"over {detection.MOST_RUNS}"


def collapse_table(study: dict[str, tuple[int, list[str]]],
                   held_out: dict[str, tuple[int, list[str]]] | None) -> str:
    """Per configuration, its runs that collapse (findings.collapses: the end below half the peak,
    a rule written after the data) on the study's seeds and on the held-out ones."""
    rows = ["| configuration | the study's seeds: runs that collapse | which | held-out seeds: "
            "runs that collapse | which |", "|---|---|---|---|---|"]
    for name, (runs, fell) in study.items():
        held, held_fell = (held_out or {}).get(name, (0, []))
        rows.append(f"| {name} | {len(fell)} of {runs} | {', '.join(fell) or '-'} | "
                    f"{len(held_fell)} of {held} | {', '.join(held_fell) or '-'} |")
    return "\n".join(rows)

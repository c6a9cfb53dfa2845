"""The toy-world study's tables: the markdown that docs/findings.md and the README show, written
from the judged comparisons (toyworld/findings.py) and the committed records, between the pages'
markers.

What it is for: every table a reader of the findings sees (each finding's, the replication's, the
sweep's, the calibration's) from study.json's content, so a test can write them again and compare
them byte for byte. What it is not: the statistics or the rules (toyworld/findings.py), or the
verdict table (toyworld/verdicts.py).
"""
from __future__ import annotations

import math
import os
import re

from infra import detection
from infra.paired import TIE, excludes_zero, mean_of, seed_verdict
from toyworld import power


def fmt_seed(x: float) -> str:
    """A seed's difference in a table: two decimals, signed unless it is a tie (TIE)."""
    return "0.00" if abs(x) < TIE else fmt(x, 2)


def fmt(x: float, digits: int = 3, signed: bool = True) -> str:
    """A table's number: signed for a difference, plain for a value (a mean, an accuracy, a standard
    error)."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else \
        f"{x:{'+' if signed else ''}.{digits}f}"


def finding_table(result: dict) -> str:
    """The markdown table of one finding: each comparison with its rule, the means of A and B over
    seeds (each seed's the mean of its runs), the per-seed differences, their mean, SE, t-interval
    (95%), the seeds agreeing in sign, the runs a seed with the run-to-run against the seed-to-seed
    spread, the smallest true difference the seeds detect 80% of the time (`tell_cell`), and the
    verdict (`verdict_words`)."""
    rows = ["| comparison | rule | A / B | per seed | mean | SE | 95% t-interval | seeds + / - "
            "| runs a seed: run SD / seed SD | detected 80% of the time | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, comparisons in (("precondition: ", result["preconditions"]),
                              ("", result["comparisons"]),
                              ("beside, not in the verdict: ", result.get("beside", []))):
        for c in comparisons:
            near = c["rule"] == "near"
            rule = f"{c['rule']} {c['threshold']}" + (f" of {c['target']}" if near else "")
            # near: A alone
            means = [mean_of(c["a"]), *([mean_of(c["b"])] if c["rule"] != "near" else [])]
            a_b = " / ".join(fmt(x, 2, signed=False) for x in means)
            per_seed, se = " ".join(fmt(x, 2) for x in c["per_seed"]), fmt(c["se"], signed=False)
            # P(retry | first wrong): a pipe would split the cell
            label = c["label"].replace("|", "\\|")
            rows.append(
                f"| {kind}{label} | {rule} | {a_b} | {per_seed} | {fmt(c['mean'])} | {se} | "
                f"[{fmt(c['ci'][0], 2)}, {fmt(c['ci'][1], 2)}] | {c['positive']} / {c['negative']} "
                f"| {runs_cell(c)} | {tell_cell(c)} | {verdict_words(c)} |")
    rows.append(f"\n**Verdict: {result['verdict']}.**")
    return "\n".join(rows)


def verdict_words(c: dict) -> str:
    """A comparison's verdict, and "by the rule only" for a shown or the opposite whose t-interval
    does not say the same (`excludes_zero`)."""
    decided = c["verdict"] in ("shown", "the opposite") and c["rule"] != "near"
    return c["verdict"] + (" by the rule only" if decided and not excludes_zero(c) else "")


def tell_cell(c: dict) -> str:
    """The smallest true difference the seeds detect 80% of the time at the spread seen (their
    t-interval then excludes zero; toyworld/power.py; for `matches`, measured from minus its
    margin), and for a verdict by the rule only the seeds that would decide it 80% of the time were
    the true difference the mean seen."""
    if c["rule"] == "near" or c["n"] < 2 or math.isnan(c["se"]):
        return "n/a"
    found = power.comparison_power(c)
    more = ""
    if verdict_words(c).endswith("by the rule only"):
        needed = found["seeds_needed"]
        more = f"; {needed} seeds would decide it" if needed else "; over 30 seeds to decide it"
    return f"{found['smallest_detected']:.3f}{more}"


def pass_cell(c: dict) -> str:
    """How often the comparison's rule says shown with nothing there, at the spread seen
    (toyworld/power.py's false-pass rate)."""
    if c["rule"] not in ("greater", "matches") or c["n"] < 2 or math.isnan(c["se"]):
        return "n/a"
    return f"{power.comparison_power(c)['false_pass']:.1%}"


def runs_cell(c: dict) -> str:
    """A comparison's runs a seed and its run-to-run SD (of one run's difference) against the
    seed-to-seed SD (of the seeds' means); the run SD is n/a with one run a seed."""
    seed_sd, run_sd = c["se"] * math.sqrt(c["n"]), c.get("run_sd", float("nan"))
    return f"{c.get('runs', 1)}: {fmt(run_sd, 3, signed=False)} / {fmt(seed_sd, 3, signed=False)}"


def fill_tables(path: str, tables: dict[str, str]) -> list[str]:
    """Replace what stands between `<!-- table:NAME -->` and `<!-- /table:NAME -->` in `path` by
    `tables[NAME]`; returns the names it found no markers for (the prose around the markers is the
    author's)."""
    with open(path) as f:
        text = f.read()
    missing = []
    for name, table in tables.items():
        # (what stands between the markers may be nothing: a table not written yet)
        start, end = f"<!-- table:{re.escape(name)} -->", f"<!-- /table:{re.escape(name)} -->"
        pattern = re.compile(rf"({start}\n)(?:.*?\n)?({end})", re.S)
        if not pattern.search(text):
            missing.append(name)
        text = pattern.sub(lambda m, table=table: m.group(1) + table + "\n" + m.group(2), text)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return missing


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


def write_tables(doc: str, study: dict) -> None:
    """docs/md's tables (between their markers) from study.json: the seeds' calibration, the sweep,
    the summary, each finding's, and the replication's when there is one."""
    summary = ["| finding | the claim tested | its comparisons: shown / not shown / the opposite | "
               "verdict |", "|---|---|---|---|"]
    for f in study["findings"]:  # the sections' headings: "Finding 1" ... "Finding 5", "I1 and I6"
        anchor = (f"finding-{f['id']}" if f["id"].isdigit()
                  else f["id"].lower().replace("/", "-and-"))
        counts = " / ".join(str(sum(c["verdict"] == v for c in f["comparisons"]))
                            for v in ("shown", "not shown", "the opposite"))
        summary.append(f"| [{f['id']}](#{anchor}) | {f['claim']} | {counts} | **{f['verdict']}** |")
    tables = {"sweep": sweep_table(study["sweep"], len(study["seeds"])),
              **({"summary": "\n".join(summary)} if study["findings"] else {}),
              **{f"finding-{f['id']}": finding_table(f) for f in study["findings"]}}
    if study.get("builds"):
        tables["calibration"] = calibration_table(study["calibration"], study["builds"])
    if study.get("replication"):
        tables["replication"] = replication_table(study["replication"], study["findings"])
    tables["runs"] = runs_table(study["findings"])
    missing = fill_tables(doc, tables)
    if missing:
        print(f"warning: {doc} has no markers for the tables {missing}")


def replication_table(rep: dict, judged: list[dict], rows: list[dict] | None = None) -> str:
    """The replication's rows (`rows`, default rep's), each held-out seed judged by its comparison's
    rule alone (`seed_verdict`; `judged`: the study's findings, which carry each rule's threshold):
    whether it agrees with the study's verdict, and, apart, whether it goes the claim's way
    (shown); beside the per-seed values, the runs a seed and the run-to-run against the
    seed-to-seed SD (`runs_cell`)."""
    declared = {(f["id"], c["label"]): c for f in judged
                for c in f["preconditions"] + f["comparisons"]}
    lines = [f"Seeds {', '.join(map(str, rep['seeds']))} (set aside: "
             f"{', '.join(str(r['seed']) for r in rep['set_aside']) or 'none'}).\n",
             "| finding | comparison | rule | study: mean, verdict | per seed | "
             "runs a seed: run SD / seed SD | each seed by the rule | agrees with the study | "
             "goes the claim's way (shown) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows if rows is not None else rep["rows"]:
        c = declared[(r["finding"], r["label"])]
        each = [seed_verdict(c["rule"], c["threshold"], x, c.get("target")) for x in r["per_seed"]]
        label, n = r["label"].replace("|", "\\|"), len(each)
        lines.append(
            f"| {r['finding']} | {label} | {r['rule']} {c['threshold']} | {fmt(r['study_mean'])}, "
            f"{r['study']} | {' '.join(map(fmt_seed, r['per_seed']))} | {runs_cell(r)} | "
            f"{', '.join(each)} | "
            f"{sum(v == r['study'] for v in each)} of {n} | {each.count('shown')} of {n} |")
    return "\n".join(lines)


def runs_table(judged: list[dict]) -> str:
    """Each predeclared comparison's runs: per seed the mean of its runs, the run-to-run SD of one
    run's difference against the seed-to-seed SD of the means, the spread between seeds that more
    runs cannot remove (detection.between_seeds), and from those the runs a seed that would detect
    the rule's threshold 80% of the time at these seeds, and the seeds that would detect the mean
    seen (toyworld/power.py)."""
    rows = ["| comparison | per seed (mean of its runs) | mean | runs a seed | run-to-run SD | "
            "seed-to-seed SD | between seeds, runs aside | runs a seed to detect the threshold | "
            "seeds to detect the mean |", "|---|---|---|---|---|---|---|---|---|"]
    for c in (c for f in judged for c in f["comparisons"] if c["rule"] != "near"):
        found, seed_sd, k = power.comparison_power(c), c["se"] * math.sqrt(c["n"]), c.get("runs", 1)
        spread = detection.between_seeds(seed_sd, c["run_sd"], k) if k > 1 else math.nan
        runs = runs_needed_cell(c, found, spread)
        between = fmt(spread, 3, signed=False) if k > 1 else "n/a"
        label, per_seed = c["label"].replace("|", "\\|"), " ".join(fmt(x, 2) for x in c["per_seed"])
        rows.append(
            f"| {label} | {per_seed} | {fmt(c['mean'])} | {k} | "
            f"{fmt(c.get('run_sd', math.nan), 3, signed=False)} | {seed_sd:.3f} | {between} | "
            f"{runs} | "
            f"{found['seeds_needed'] or 'over 30'} |")
    return "\n".join(rows)


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

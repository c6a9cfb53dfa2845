"""The toy study's verdicts as a reader sees them first (README.md and the top of docs/findings.md):
each claim of the paper the toy world can address, the verdict of its comparisons by the study's
rule, the paired mean with its interval, and the held-out seeds; and the tests written after the
data (AFTER_THE_DATA), labelled so.

What it does: judges AFTER_THE_DATA with toyworld/findings.py (on the study's seeds and the
replication's), and writes the verdict table and the after-the-data tables from study.json's content
and those judgments, between the pages' markers. What it is not: a rule for the predeclared
comparisons (toyworld/declared.py's FINDINGS, fixed before the grid ran), or a reader of run folders
(findings.judge_finding reads them).
"""
from __future__ import annotations

import json
import os

from infra.runfolder import usage_error
from toyworld import findings, tables

# the day the tests below were written: after the grid and the replication had run
WRITTEN = "2026-12-04"
WORKFLOWS = {"voting": "Voting", "evalopt": "Eval-Opt", "orchworkers": "Orch-Workers"}


def on_test(name: str, mode: str = "trained") -> tuple:
    """eval.py's accuracy on the test problems (toyworld/declared.py's ev(); base and SA-RL run on
    the -sp run)."""
    return (name, f"eval:{mode}", "accuracy")


# Two claims of the paper's finding 1 that the page held numbers for and never tested, and the rule
# of each
AFTER_THE_DATA = [
    {"id": "gains", "claim": "every workflow gains over its base model (finding 1's first half)",
     "comparisons": [
        {"label": f"{label} {p.upper()}: trained - base", "a": on_test(f"{name}-{p}"),
         "b": on_test(f"{name}-sp", "base"), "rule": "greater", "threshold": 0.05}
        for name, label in WORKFLOWS.items() for p in ("sp", "ip")]},
    {"id": "exception",
     "claim": "Eval-Opt IP does not beat SA-RL, the contradiction of finding 1's exception",
     "comparisons": [{"label": "Eval-Opt: trained IP - SA-RL", "a": on_test("evalopt-ip"),
                      "b": on_test("evalopt-sp", "sa-transfer"), "rule": "contradicts",
                      "threshold": 0.05}]},
]
GAINS = [c["label"] for c in AFTER_THE_DATA[0]["comparisons"]]
SPECIALISE = [f"{label} IP: trained - swapped" for label in WORKFLOWS.values()]
# The paper's claims (and the project's own test of IP), each with its comparisons (finding, label)
# and a note
CLAIMS = [
    ("Every workflow gains over its base model", [("gains", g) for g in GAINS],
     "finding-1-tested-after-the-data", ""),
    ("SA-RL in the structure matches or beats trained Voting and Orch-Workers",
     [("1", f"{w}: SA-RL - trained {p}") for w in ("Voting", "Orch-Workers") for p in ("SP", "IP")],
     "finding-1", ""),
    ("Only Eval-Opt under IP beats SA-RL",
     [("1", "Eval-Opt: trained IP - SA-RL"), ("exception", "Eval-Opt: trained IP - SA-RL")],
     "finding-1", "predeclared, then tested for its contradiction after the data"),
    ("Eval-Opt's evaluator learns when to retry",
     [("2", f"{p}: P(retry | first wrong) - P(retry | first right), end - base")
      for p in ("SP", "IP")], "finding-2", ""),
    ("Under SP a role's share of the update is set by its outputs' count",
     [("3", "SP generators' loss share (3 of 4 outputs)")], "finding-3",
     "a check of the code, not a result: per-output averaging gives 3 of 4 outputs 0.75 by "
     "construction"),
    ("Re-weighting the roles gives SP IP's peak", [("3", "peak: SP with equal role weights - SP")],
     "finding-3", ""),
    ("IP declines after its peak (here: more than SP)", [("4", "decline (peak - end): IP - SP")],
     "finding-4", ""),
    ("Merging IP's per-instance steps delays the decline",
     [("4", "decline: IP - IP merged"),
      ("4", "decline: IP - IP at a third of the rate (the control)")],
     "finding-4",
     "a third of the rate does the same: the toy cannot tell the steps from their size"),
    ("SP fails by role capture",
     [("5", f"{r} boxes another role's kind, end: SP - IP")
      for r in ("Voting aggregator", "Eval-Opt evaluator")],
     "finding-5", "read by the box, a metric defined after the first grid, on 2026-12-03"),
    ("I1, a KL anchor, slows IP's decline", [("I1/I6", "decline: IP - IP with I1")], "i1-and-i6",
     ""),
    ("I6, coherence, slows IP's decline", [("I1/I6", "decline: IP - IP with I6")], "i1-and-i6", ""),
    ("IP's roles specialise (the project's test)", [("specialisation", s) for s in SPECIALISE],
     "specialisation", "declared after the first grid, on 2026-12-03"),
]


def after_the_data(results: str, study: dict) -> dict:
    """AFTER_THE_DATA judged on the study's seeds and, where study.json has a replication, each
    comparison on its seeds (findings.judge_finding and findings.replication, which read the compact
    results)."""
    judged = [findings.judge_finding(results, study["seeds"], f) for f in AFTER_THE_DATA]
    rep = study.get("replication")
    return {"findings": judged,
            "replication": findings.replication(results, rep["seeds"], judged, AFTER_THE_DATA)
            if rep else []}


def ties(values: list[float]) -> int:
    return sum(abs(x) < findings.TIE for x in values)


def verdict_cell(c: dict) -> str:
    """A comparison's verdict, with the seeds that tie (a tie is no seed for either side:
    findings.TIE)."""
    tied, low, high = ties(c["per_seed"]), *c["ci"]
    crosses = c["verdict"] == "shown" and c["rule"] == "greater" and low <= 0 <= high
    notes = [f"{tied} of {len(c['per_seed'])} tie at 0"] * bool(tied) + [
        "its interval crosses 0"] * crosses
    return f"**{c['verdict']}**" + (f" ({'; '.join(notes)})" if notes else "")


def mean_cell(c: dict) -> str:
    low, high = tables.fmt(c["ci"][0], 2), tables.fmt(c["ci"][1], 2)
    return f"{tables.fmt(c['mean'])} [{low}, {high}]"


def held_out_cell(c: dict, row: dict | None) -> str:
    """The held-out seeds' differences and how many agree with the study's verdict by the rule on
    one seed."""
    if row is None:
        return "n/a"
    each = [findings.seed_verdict(c["rule"], c["threshold"], x, c.get("target"))
            for x in row["per_seed"]]
    seeds = " ".join(map(tables.fmt_seed, row["per_seed"]))
    return f"{seeds}, agree {each.count(c['verdict'])} of {len(each)}"


def disagreements(compared: dict, rows: dict) -> list[str]:
    """Comparisons whose verdict is not shown while every seed, study and held-out, sides one way
    (ties aside) with a mean past the threshold: the rule's verdict and the seeds' say different
    things."""
    lines = []
    for key, c in compared.items():
        seeds = c["per_seed"] + (rows[key]["per_seed"] if key in rows else [])
        side = [x for x in seeds if abs(x) >= findings.TIE]
        below = all(x < 0 for x in side) and c["mean"] <= -c["threshold"]
        above = all(x > 0 for x in side) and c["mean"] >= c["threshold"]
        if c["verdict"] == "not shown" and c["rule"] != "near" and (below or above):
            # its test written after the data, if any
            test = compared.get(("exception", c["label"]))
            lines.append(
                f"{c['label']}: **not shown** by its rule, while no seed of {len(seeds)} is "
                f"{'above' if below else 'below'} zero ({ties(seeds)} tie at 0)"
                         + (f"; by the rule written after the data, **{test['verdict']}**" if test
                            else ""))
    return lines


def verdict_table(study: dict, after: dict, page: str = "") -> str:
    """CLAIMS, one row each: the claim, its comparisons, their verdicts by the study's rule, means
    and 95% intervals over the study's seeds, and the held-out seeds'; `page`: where the findings'
    sections are."""
    compared = {(f["id"], c["label"]): c for f in study["findings"] + after["findings"]
                for c in f["preconditions"] + f["comparisons"]}
    rows = {(r["finding"], r["label"]): r
            for r in study.get("replication", {}).get("rows", []) + after["replication"]}
    held = ", ".join(map(str, study.get("replication", {}).get("seeds", []))) or "none"
    lines = [
        "| the paper's claim | comparison (A - B), rule | verdict, seeds "
        f"{', '.join(map(str, study['seeds']))} | mean [95% interval] | "
        f"held-out seeds {held} |", "|---|---|---|---|---|"]
    for claim, keys, anchor, note in CLAIMS:
        cs = [compared[k] for k in keys]
        after_mark = [" †" if k[0] in ("gains", "exception") else "" for k in keys]
        cells = ["<br>".join(f"{c['label']}{m} ({c['rule']} {c['threshold']})".replace("|", "\\|")
                             for c, m in zip(cs, after_mark)),
                 "<br>".join(map(verdict_cell, cs)),
                 "<br>".join(map(mean_cell, cs)),
                 "<br>".join(held_out_cell(c, rows.get(k)) for c, k in zip(cs, keys))]
        # None: tested after the data
        finding = next((f for f in study["findings"] if f["id"] == keys[0][0]), None)
        name = "finding 1, tested after the data" if finding is None else \
            f"{'finding ' * finding['id'].isdigit()}{finding['id']}: {finding['verdict']}"
        link = f"[{name}]({page}#{anchor})"
        lines.append(f"| {claim} ({link}{'; ' + note if note else ''}) | " + " | ".join(
            cells) + " |")
    found = disagreements({k: compared[k] for _, keys, _, _ in CLAIMS for k in keys}, rows)
    lines += ["",
              f"† Rule written after the data ({WRITTEN}), not before the grid: `contradicts` "
              f"gives the opposite when the mean is at most -t and A is ahead (by {findings.TIE} "
              f"or more) in at most one seed. A difference under {findings.TIE} in size is a tie, "
              "printed 0.00. A held-out seed agrees when the rule applied to it alone (its "
              "threshold: one seed has no others to agree) gives the study's verdict.",
              *[f"\nRule and seeds disagree: {line}." for line in found],
              "\nNot tested here: the generator's learning to complete retried attempts (finding "
              "2's second half) and finding 4's rise in entropy have no comparison. Not testable "
              "in a toy world: scale (0.6B-4B) and code tasks."]
    return "\n".join(lines)


def page_tables(study: dict, after: dict) -> dict[str, str]:
    """docs/findings.md's verdict table and the after-the-data section's tables (each test on the
    study's seeds, then on the held-out seeds)."""
    written = {"verdicts": verdict_table(study, after)}
    for judged in after["findings"]:
        rows = [r for r in after["replication"] if r["finding"] == judged["id"]]
        # (the table's first line names the seeds, which the page's replication table does)
        held = tables.replication_table(study["replication"], after["findings"],
                                        rows).split("\n", 1)[1] if rows else ""
        written[f"after-{judged['id']}"] = tables.finding_table(judged) + (
            "\n\nHeld out:\n" + held) * bool(rows)
    return written


def write_pages(results: str, study: dict | None, doc: str | None, readme: str | None) -> None:
    """The page's tables (tables.write_tables), its verdicts and after-the-data tables, and the
    README's verdict table (its links into docs/findings.md), from study.json's content (None: the
    study.json in `results`)."""
    if study is None:
        if not os.path.exists(os.path.join(results, "study.json")):
            usage_error(f"--tables: {results} holds no study.json")
        with open(os.path.join(results, "study.json")) as f:
            study = json.load(f)
    after = after_the_data(results, study) if study["findings"] else None
    if doc:
        tables.write_tables(doc, study)
        missing = tables.fill_tables(doc, page_tables(study, after)) if after else []
        if missing:
            print(f"warning: {doc} has no markers for the tables {missing}")
    if readme and after:
        tables.fill_tables(readme, {"verdicts": verdict_table(study, after, "docs/findings.md")})

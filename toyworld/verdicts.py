"""The toy study's verdicts as a reader sees them first (README.md and the top of docs/findings.md):
each claim of the paper that a predeclared comparison tests, its verdict by the rule declared before
the first grid (toyworld/declared.py), the paired mean with its t-interval, what the seeds can tell
and the held-out seeds; beneath it, dated, what was decided after the data (POST_HOC,
AFTER_THE_DATA, the tie rule, the held-out agreement), as results, not verdicts.

What it does: judges AFTER_THE_DATA with toyworld/findings.py (on the study's seeds and the
replication's), and writes both tables and the after-the-data sections' tables from study.json's
content and those judgments, between the pages' markers. What it is not: a rule for the predeclared
comparisons (toyworld/declared.py's FINDINGS), or a reader of run folders (findings.judge_finding
reads them).
"""
from __future__ import annotations

import json
import os

from infra import detection, paired
from infra.runfolder import usage_error
from toyworld import declared, findings, power, tables

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
# The paper's claims the predeclared comparisons test (toyworld/declared.py's FINDINGS, fixed before
# the first grid ran, 2026-12-02), each with its comparisons (finding, label) and a note
CLAIMS = [
    ("SA-RL in the structure matches or beats trained Voting and Orch-Workers",
     [("1", f"{w}: SA-RL - trained {p}") for w in ("Voting", "Orch-Workers") for p in ("SP", "IP")],
     "finding-1", ""),
    ("Only Eval-Opt under IP beats SA-RL", [("1", "Eval-Opt: trained IP - SA-RL")], "finding-1",
     ""),
    ("Eval-Opt's evaluator learns when to retry",
     [("2", f"{p}: P(retry | first wrong) - P(retry | first right), end - base")
      for p in ("SP", "IP")], "finding-2", ""),
    ("Under SP a role's share of the loss is set by its outputs' count",
     [("3", "SP generators' loss share (3 of 4 outputs)")], "finding-3",
     "a check of the code, not a result: per-output averaging gives 3 of 4 outputs 0.75 by "
     "construction"),
    ("Re-weighting the roles gives SP IP's peak (tested here: equal role weights raise SP's peak; "
     "IP is not in the comparison)", [("3", "peak: SP with equal role weights - SP")],
     "finding-3", ""),
    ("IP declines after its peak (here: more than SP)", [("4", "decline (peak - end): IP - SP")],
     "finding-4", ""),
    ("Merging IP's per-instance steps delays the decline",
     [("4", "decline: IP - IP merged"),
      ("4", "decline: IP - IP at a third of the rate (the control)")],
     "finding-4",
     "a third of the rate also lowers it: this study does not tell the steps from their size"),
    ("I1, a KL anchor, slows IP's decline", [("I1/I6", "decline: IP - IP with I1")], "i1-and-i6",
     ""),
    ("I6, coherence, slows IP's decline", [("I1/I6", "decline: IP - IP with I6")], "i1-and-i6", ""),
]
# What was decided after the data, each with the day it was written and what it was written after
POST_HOC = [
    ("2026-12-03", "after the first grid", "SP fails by role capture, read by "
     "the box (finding 5's metric)", [("5", f"{r} boxes another role's kind, end: SP - IP")
                                      for r in ("Voting aggregator", "Eval-Opt evaluator")],
     "finding-5"),
    ("2026-12-03", "after the first grid", "Two IP roles on each other's adapter lose "
     "accuracy (the project's test of specialisation)",
     [("specialisation", s) for s in SPECIALISE], "specialisation"),
    (WRITTEN, "after the replication", "Every workflow gains over its base model",
     [("gains", g) for g in GAINS], "finding-1-tested-after-the-data"),
    (WRITTEN, "after the replication", "Eval-Opt IP does not beat SA-RL (the "
     "contradiction of finding 1's exception)", [("exception", "Eval-Opt: trained IP - SA-RL")],
     "finding-1"),
]


def after_the_data(results: str, study: dict) -> dict:
    """AFTER_THE_DATA judged on the study's seeds and, where study.json has a replication, each
    comparison on its seeds (findings.judge_finding and findings.replication, which read the compact
    results); the runs that collapse, on both; the declines' collapse-aware models
    (power.decline_models)."""
    judged = [findings.judge_finding(results, study["seeds"], f) for f in AFTER_THE_DATA]
    rep = study.get("replication")
    trained = [n for n in study["names"] if n in declared.GRID]
    return {"findings": judged,
            "replication": findings.replication(results, rep["seeds"], judged, AFTER_THE_DATA)
            if rep else [],
            "collapses": findings.collapses(results, trained, study["seeds"]),
            "held_out_collapses": findings.collapses(results, trained, rep["seeds"]) if rep
            else None,
            "declines": power.decline_models(results, study)}


def ties(values: list[float]) -> int:
    return sum(abs(x) < paired.TIE for x in values)


def agree_cell(c: dict, row: dict | None) -> str:
    """The held-out seeds' differences (ties printed 0.00) and how many agree with the study's
    verdict by the rule on one seed (both written after the data)."""
    if row is None:
        return "n/a"
    each = [paired.seed_verdict(c["rule"], c["threshold"], x, c.get("target"))
            for x in row["per_seed"]]
    seeds = " ".join(map(tables.fmt_seed, row["per_seed"]))
    return f"{seeds}, agree {each.count(c['verdict'])} of {len(each)}"


def disagreements(compared: dict, rows: dict, tests: dict) -> list[str]:
    """Comparisons whose verdict is not shown while every seed, study and held-out, sides one way
    (ties aside) with a mean past the threshold: the rule's verdict and the seeds' say different
    things."""
    lines = []
    for key, c in compared.items():
        seeds = c["per_seed"] + (rows[key]["per_seed"] if key in rows else [])
        side = [x for x in seeds if abs(x) >= paired.TIE]
        below = all(x < 0 for x in side) and c["mean"] <= -c["threshold"]
        above = all(x > 0 for x in side) and c["mean"] >= c["threshold"]
        if c["verdict"] == "not shown" and c["rule"] != "near" and (below or above):
            # its test written after the data, if any (`tests`: every comparison judged)
            test = tests.get(("exception", c["label"]))
            lines.append(
                f"{c['label']}: **not shown** by its rule, while no seed of {len(seeds)} is "
                f"{'above' if below else 'below'} zero ({ties(seeds)} tie at 0)"
                + (f"; by the rule written after the data, **{test['verdict']}**" if test
                   else ""))
    return lines


def verdict_table(study: dict, after: dict, page: str = "", post_hoc: bool = True) -> str:
    """The predeclared comparisons (CLAIMS), one row a claim: its comparisons, their verdicts by
    the rules declared before the grid, means with t-intervals over the study's seeds, how often
    each rule passes with nothing there and the smallest difference the seeds detect (for the
    declines also with collapses drawn: after's `declines`), the held-out seeds' differences; then
    what was decided after the data (`post_hoc_table`; without `post_hoc`, a line pointing at it,
    the README's). `page`: where the findings' sections are."""
    compared = {(f["id"], c["label"]): c for f in study["findings"] + after["findings"]
                for c in f["preconditions"] + f["comparisons"]}
    rows = {(r["finding"], r["label"]): r
            for r in study.get("replication", {}).get("rows", []) + after["replication"]}
    models = after.get("declines", {}).get("models", {})
    held = ", ".join(map(str, study.get("replication", {}).get("seeds", []))) or "none"
    lines = [
        "| the paper's claim | comparison (A - B), rule | verdict, seeds "
        f"{', '.join(map(str, study['seeds']))} | mean [95% t-interval] | passes with nothing "
        f"there | detected 80% of the time | held-out seeds {held} |",
        "|---|---|---|---|---|---|---|"]
    for claim, keys, anchor, note in CLAIMS:
        cs = [compared[k] for k in keys]
        cells = ["<br>".join(f"{c['label']} ({c['rule']} {c['threshold']})".replace("|", "\\|")
                             for c in cs),
                 "<br>".join(f"**{tables.verdict_words(c)}**" for c in cs),
                 "<br>".join(map(tables.mean_interval, cs)),
                 *("<br>".join(cell(c, models.get(c["label"])) for c in cs)
                   for cell in (tables.pass_cell, tables.tell_cell)),
                 "<br>".join(" ".join(map(tables.fmt_seed, rows[k]["per_seed"]))
                             if k in rows else "n/a" for k in keys)]
        finding = next(f for f in study["findings"] if f["id"] == keys[0][0])
        name = f"{'finding ' * finding['id'].isdigit()}{finding['id']}: {finding['verdict']}"
        lines.append(f"| {claim} ([{name}]({page}#{anchor}){'; ' + note if note else ''}) | "
                     + " | ".join(cells) + " |")
    lines += ["", verdict_notes(study, [compared[k] for _, keys, _, _ in CLAIMS for k in keys],
                                models, page)]
    if not post_hoc:
        return "\n".join(lines + ["", f"What was decided after the data, dated, and its results: "
                                   f"[the table beneath this one]({page}#the-verdicts)."])
    return "\n".join(lines + ["", post_hoc_table(study, held, compared, rows, page)])


def verdict_notes(study: dict, claimed: list[dict], models: dict, page: str) -> str:
    """What the verdict table's words and figures mean, and the chance that at least one of its
    rules passes with nothing there (the declines' rates drawn with collapses)."""
    rates = []
    for c in (c for c in claimed if c["rule"] in ("greater", "matches")):
        found = power.comparison_power(c, models.get(c["label"]))
        rates.append(found["collapses"]["false_pass"] if "collapses" in found
                     else found["false_pass"])
    n = len(study["seeds"])
    return (
        "Verdicts by the rules declared before the first grid ran (toyworld/declared.py), on each "
        f"seed's mean over its runs; intervals are t-intervals over the {n} paired differences. A "
        "rule's reference is zero, for `matches` minus its margin. **By the rule only**: the "
        "interval is not wholly on the verdict's side of the reference. *Passes with nothing "
        "there*: how often the rule says shown when the true difference is the reference. "
        "*Detected 80% of the time*: how far from the reference a true difference must be for the "
        "interval to lie wholly beyond it 80% of the time (beside a verdict by the rule only: the "
        "seeds that would decide it, were the mean seen the truth). Both at the seeds' spread "
        "(toyworld/power.py), for the declines also with collapsing runs drawn ([What five seeds "
        f"can tell]({page}#what-five-seeds-can-tell)). At least one of these {len(rates)} rules "
        f"would pass with nothing there {detection.any_passes(rates):.0%} of the time were they "
        "independent (the declines at their collapse-aware rates; they share runs: a rough "
        "figure).")


def post_hoc_table(study: dict, held: str, compared: dict, rows: dict, page: str) -> str:
    """What was decided after the data (POST_HOC, the tie rule, the held-out agreement), each
    with the day it was written: results, not verdicts. `held`: the held-out seeds, as named;
    `compared`, `rows`: every comparison judged and its held-out row, by (finding, label)."""
    lines = ["Decided after the data, each dated; its results are post hoc, their rules' verdicts "
             "not predeclared ones:", "",
             "| written | what | comparison (A - B), rule | result, seeds "
             f"{', '.join(map(str, study['seeds']))} | mean [95% t-interval] | held-out seeds "
             f"{held}, agreeing |", "|---|---|---|---|---|---|"]
    for written, when, what, keys, anchor in POST_HOC:
        cs = [compared[k] for k in keys]
        lines.append(
            f"| {written} ({when}) | [{what}]({page}#{anchor}) | "
            + "<br>".join(f"{c['label']} ({c['rule']} {c['threshold']})".replace("|", "\\|")
                          for c in cs) + " | "
            + "<br>".join(f"{tables.verdict_words(c)}" + (f" ({ties(c['per_seed'])} of "
                          f"{len(c['per_seed'])} tie at 0)" if ties(c["per_seed"]) else "")
                          for c in cs) + " | "
            + "<br>".join(map(tables.mean_interval, cs)) + " | "
            + "<br>".join(agree_cell(c, rows.get(k)) for c, k in zip(cs, keys)) + " |")
    agreeing = [agree_cell(compared[k], rows.get(k)).split("agree ")[-1]
                for _, keys, _, _ in CLAIMS for k in keys if compared[k]["verdict"] != "not shown"]
    counts = ", ".join(f"{agreeing.count(f'{n} of 2')} on {word}"
                       for n, word in ((2, "both"), (1, "one"), (0, "neither")))
    found = disagreements({k: compared[k] for _, keys, _, _ in CLAIMS for k in keys}, rows,
                          compared)
    return "\n".join(lines + [
        "", f"{WRITTEN} (after the study and the replication): `contradicts` gives the opposite "
        f"when the mean is at most -t and A is ahead (by {paired.TIE} or more) in at most one "
        f"seed; a difference under {paired.TIE} in size is a tie, printed 0.00; a held-out seed "
        "agrees when the rule applied to it alone (its threshold: one seed has no others to "
        f"agree) gives the study's verdict. By that reading, of the {len(agreeing)} predeclared "
        f"comparisons decided shown or the opposite, {counts} of the held-out seeds agree.",
        *[f"\nRule and seeds disagree: {line}." for line in found],
        "\nNot tested here: the generator's learning to complete retried attempts (finding 2's "
        "second half) and finding 4's rise in entropy have no comparison. Not testable in a toy "
        "world: scale (0.6B-4B) and code tasks."])


def page_tables(study: dict, after: dict) -> dict[str, str]:
    """docs/findings.md's verdict table (with what was decided after the data, whose results it
    gives), the runs that collapse and the declines' power."""
    return {"verdicts": verdict_table(study, after),
            "collapses": tables.collapse_table(after["collapses"], after.get("held_out_collapses")),
            "power": tables.power_table(study["findings"], after["declines"])}


def write_pages(results: str, study: dict | None, doc: str | None, readme: str | None) -> None:
    """The page's tables and those of its companions (tables.fill_pages), its verdicts and
    after-the-data tables, and the README's verdict table (its links into docs/findings.md), from
    study.json's content (None: the study.json in `results`)."""
    if study is None:
        if not os.path.exists(os.path.join(results, "study.json")):
            usage_error(f"--tables: {results} holds no study.json")
        with open(os.path.join(results, "study.json")) as f:
            study = json.load(f)
    after = after_the_data(results, study) if study["findings"] else None
    if doc:
        written = {**tables.study_tables(study), **(page_tables(study, after) if after else {})}
        missing = tables.fill_pages(doc, written)
        if missing:
            print(f"warning: {doc} and its companions have no markers for the tables {missing}")
    if readme and after:
        tables.fill_tables(readme, {"verdicts": verdict_table(study, after, "docs/findings.md",
                                                               post_hoc=False)})

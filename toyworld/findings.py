"""The toy-world study's statistics: its runs' compact results (`keep_results`), per-seed numbers
read from them, paired differences, and the verdict of each predeclared comparison
(toyworld/declared.py's FINDINGS), written as the tables of docs/findings.md.

What it does: reads each configuration's runs (one per seed) into per-seed values, of validation
curves as window means (the peak: the best mean of 3 consecutive validation points; the end: the
mean of the last 3; so neither is the maximum of noisy points), of eval.py's accuracy on the
held-out test problems, and of training metrics averaged over the last steps; pairs two quantities
seed by seed; and applies a comparison's rule:
- `greater` (A beats B by at least t): shown when the mean paired difference is >= t and all seeds
  but one agree in sign; the opposite when it is <= -t and all seeds but one have B ahead; otherwise
  not shown;
- `matches` (A at least as good as B, give or take t; one-sided): shown when the mean difference is
  >= -t and in all seeds but one A is behind by at most t (ahead by any amount counts); the opposite
  when the mean is <= -t and B is ahead in all seeds but one; otherwise not shown;
- `near` (A equal to a value within t): shown or not shown.
A finding is not testable here when one of its preconditions is not shown. What it is not: the
method, or a place to change a threshold after a comparison has been seen.
"""
from __future__ import annotations

import math
import os
import random
import re

from infra.runfolder import read_results
from toyworld.results import records, write_pack

# A difference smaller than this in size is a tie: the tables print it as 0.00, and it counts as a
# sign for neither side (a decline of +0.00003, from metrics kept to 4 decimals, is no seed "up").
# Written after the data (2026-12-04); the predeclared rules count exact signs and keep them.
TIE = 0.005
WINDOW = 3          # validation points in a peak or end window
TRAIN_LAST = 20     # training steps a training metric is averaged over at the end
BOOTSTRAP = 2000    # resamples of the seeds for the 95% interval of a mean

# What the compact results keep of a run (docs/findings/results/study.jsonl: toyworld/results.py):
# its validation curves and these training curves, to 4 decimals, and its evaluations: what the
# tables, figures and prose read.
RESULTS = ("step", "success", "reward", "val/", "/loss_share", "/grad_share", "/grad_norm_share",
           "/opt_steps", "/kl_base", "/coherence_scale", "/entropy", "/careful", "/own_format",
           "/foreign_format", "/foreign_box")
# the kept calls the README's caption counts
KEPT_SAMPLES = {"voting-sp-s0": "samples/step_000150.json"}


def series(out: str, name: str, seed: int, key: str) -> list[tuple[int, float]]:
    metrics = records(out, f"{name}-s{seed}", "metrics.jsonl")
    return [(m["step"], m[key]) for m in metrics if m.get(key) is not None]


def window_peak(values: list[float]) -> float:
    return max(sum(values[i:i + WINDOW]) / WINDOW for i in range(len(values) - WINDOW + 1)) \
        if len(values) >= WINDOW else float("nan")


def window_end(values: list[float]) -> float:
    return sum(values[-WINDOW:]) / WINDOW if len(values) >= WINDOW else float("nan")


def eval_value(out: str, name: str, seed: int, mode: str, key: str = "accuracy") -> float:
    """eval.py's `key` of `mode` on the test problems, from the run of `name` (base and the SA
    modes: from the workflow's first configuration, where the study runs them)."""
    evaluated = records(out, f"{name}-s{seed}", "eval.jsonl")
    found = [r["metrics"].get(key) for r in evaluated
             if r["mode"] == mode and r.get("dataset", "").endswith("test")]
    return found[-1] if found and found[-1] is not None else float("nan")


def value(out: str, seed: int, spec: tuple) -> float:
    """One per-seed number. spec: (configuration, quantity, key); quantities: base (validation at
    step 0), peak, end, decline (peak - end), change (end - base), train (the mean of the last
    TRAIN_LAST training steps), eval:<mode> (eval.py on the test problems)."""
    name, quantity, key = spec
    if quantity.startswith("eval:"):
        return eval_value(out, name, seed, quantity[5:], key)
    points = series(out, name, seed, key if quantity == "train" else f"val/{key}")
    values = [v for _, v in points]
    if not values:
        return float("nan")
    if quantity == "train":
        last = [v for s, v in points if s > 0][-TRAIN_LAST:]
        return sum(last) / len(last) if last else float("nan")
    if quantity == "base":
        return values[0] if points[0][0] == 0 else float("nan")
    numbers = {"peak": window_peak(values), "end": window_end(values)}
    numbers.update(decline=numbers["peak"] - numbers["end"], change=numbers["end"] - values[0])
    return numbers[quantity]


def mean_of(values: list[float]) -> float:
    """The mean over the seeds that have a value (nan when none has)."""
    found = [x for x in values if not math.isnan(x)]
    return sum(found) / len(found) if found else float("nan")


def summarise(diffs: list[float], seed: int = 0) -> dict:
    """Mean, standard error, a bootstrap 95% interval over seeds, and the signs of per-seed
    values."""
    d = [x for x in diffs if not math.isnan(x)]
    n = len(d)
    if n == 0:
        return {"n": 0, "mean": float("nan"), "se": float("nan"), "ci": [float("nan")] * 2,
                "positive": 0, "negative": 0, "per_seed": diffs}
    mean = mean_of(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(d) for _ in range(n)) / n for _ in range(BOOTSTRAP))
    return {"n": n, "mean": mean, "se": se,
            "ci": [means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]],
            "positive": sum(x > 0 for x in d), "negative": sum(x < 0 for x in d), "per_seed": diffs}


def verdict(rule: str, threshold: float, s: dict, target: float | None = None) -> str:
    """The rule of one comparison (see the header) applied to its summary `s`."""
    n, mean, per_seed = s["n"], s["mean"], [x for x in s["per_seed"] if not math.isnan(x)]
    if n < 2:
        return "not testable here"
    agree = n - 1  # all seeds but one
    if rule == "near":
        return "shown" if abs(mean - target) <= threshold else "not shown"
    if rule == "greater" and mean >= threshold and s["positive"] >= agree:
        return "shown"
    if rule == "matches" and mean >= -threshold and sum(x >= -threshold for x in per_seed) >= agree:
        return "shown"
    # written after the data (2026-12-04): a seed tied at zero is no seed for A
    if rule == "contradicts":
        ahead = sum(x >= TIE for x in per_seed)
        return "the opposite" if mean <= -threshold and ahead <= n - agree else "not shown"
    if mean <= -threshold and s["negative"] >= agree:
        return "the opposite"
    return "not shown"


def seed_verdict(rule: str, threshold: float, x: float, target: float | None = None) -> str:
    """A comparison's rule on one seed's difference `x`: its threshold alone (one seed has no others
    to agree; so `contradicts` reads as `greater`: shown when the seed goes the claim's way by t,
    the opposite by -t)."""
    if math.isnan(x):
        return "n/a"
    if rule == "near":
        return "shown" if abs(x - target) <= threshold else "not shown"
    if ((rule in ("greater", "contradicts") and x >= threshold)
            or (rule == "matches" and x >= -threshold)):
        return "shown"
    return "the opposite" if x <= -threshold else "not shown"


def fmt_seed(x: float) -> str:
    """A seed's difference in a table: two decimals, signed unless it is a tie (TIE)."""
    return "0.00" if abs(x) < TIE else fmt(x, 2)


def compare(out: str, seeds: list[int], comparison: dict) -> dict:
    """A comparison's per-seed differences (A - B, or A alone for `near`), their summary and the
    verdict."""
    a = [value(out, seed, comparison["a"]) for seed in seeds]
    b = ([value(out, seed, comparison["b"]) for seed in seeds] if "b" in comparison
         else [0.0] * len(seeds))
    s = summarise([x - y for x, y in zip(a, b)])
    s.update(a=a, b=b, verdict=verdict(comparison["rule"], comparison["threshold"], s,
                                       comparison.get("target")))
    return s


def judge_finding(out: str, seeds: list[int], finding: dict) -> dict:
    """Every comparison of a finding, then its verdict: not testable here (a precondition not
    shown), shown (every main comparison shown), the opposite (every main comparison the opposite),
    or not shown. Comparisons `beside` the main ones (an earlier metric kept for reference) are
    reported and take no part in the verdict."""
    pre = [dict(c, **compare(out, seeds, c)) for c in finding.get("preconditions", [])]
    main = [dict(c, **compare(out, seeds, c)) for c in finding["comparisons"]]
    beside = [dict(c, **compare(out, seeds, c)) for c in finding.get("beside", [])]
    verdicts = {c["verdict"] for c in main}
    if any(c["verdict"] != "shown" for c in pre):
        overall = "not testable here"
    elif verdicts == {"shown"}:
        overall = "shown"
    elif verdicts == {"the opposite"}:
        overall = "the opposite"
    else:
        overall = "not shown"
    return {"id": finding["id"], "claim": finding["claim"], "preconditions": pre,
            "comparisons": main, "beside": beside, "verdict": overall}


def fmt(x: float, digits: int = 3, signed: bool = True) -> str:
    """A table's number: signed for a difference, plain for a value (a mean, an accuracy, a standard
    error)."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else \
        f"{x:{'+' if signed else ''}.{digits}f}"


def finding_table(result: dict) -> str:
    """The markdown table of one finding: each comparison with its rule, the means of A and B over
    seeds, the per-seed differences, their mean, SE, bootstrap interval, the seeds agreeing in sign,
    and the verdict."""
    rows = ["| comparison | rule | A / B | per seed | mean | SE | 95% interval | seeds + / - "
            "| verdict |", "|---|---|---|---|---|---|---|---|---|"]
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
                f"| {c['verdict']} |")
    rows.append(f"\n**Verdict: {result['verdict']}.**")
    return "\n".join(rows)


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


def replication(results: str, seeds: list[int], judged: list[dict],
                specs: list[dict]) -> list[dict]:
    """Comparison by comparison, whether each replication seed repeats the study's verdict: its
    difference has the sign of the study's mean, and passes the rule's threshold on its own
    (greater: >= t; matches: >= -t; near: within t of the target). `judged`: the study's findings
    (judge_finding: a comparison's `a` and `b` are its per-seed values there); `specs`: the same
    findings as declared (toyworld/declared.py's FINDINGS)."""
    declared = {(f["id"], c["label"]): c for f in specs
                for c in f.get("preconditions", []) + f["comparisons"]}
    rows = []
    for finding in judged:
        for c in finding["preconditions"] + finding["comparisons"]:
            again = compare(results, seeds, declared[(finding["id"], c["label"])])
            per_seed = again["per_seed"]
            if c["rule"] == "near":
                passes = [abs(x - c["target"]) <= c["threshold"] for x in per_seed]
                sign = passes
            else:
                passes = [x >= (c["threshold"] if c["rule"] == "greater" else -c["threshold"])
                          for x in per_seed]
                sign = [math.copysign(1, x) == math.copysign(1, c["mean"]) for x in per_seed]
            rows.append({"finding": finding["id"], "label": c["label"], "rule": c["rule"],
                         "study": c["verdict"], "study_mean": c["mean"], "per_seed": per_seed,
                         "same_sign": sum(sign), "passes": sum(passes), "seeds": len(seeds)})
    return rows


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
    missing = fill_tables(doc, tables)
    if missing:
        print(f"warning: {doc} has no markers for the tables {missing}")


def replication_table(rep: dict, judged: list[dict], rows: list[dict] | None = None) -> str:
    """The replication's rows (`rows`, default rep's), each held-out seed judged by its comparison's
    rule alone (`seed_verdict`; `judged`: the study's findings, which carry each rule's threshold):
    whether it agrees with the study's verdict, and, apart, whether it goes the claim's way
    (shown)."""
    declared = {(f["id"], c["label"]): c for f in judged
                for c in f["preconditions"] + f["comparisons"]}
    lines = [f"Seeds {', '.join(map(str, rep['seeds']))} (set aside: "
             f"{', '.join(str(r['seed']) for r in rep['set_aside']) or 'none'}).\n",
             "| finding | comparison | rule | study: mean, verdict | per seed | each seed by the "
             "rule | agrees with the study | goes the claim's way (shown) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows if rows is not None else rep["rows"]:
        c = declared[(r["finding"], r["label"])]
        each = [seed_verdict(c["rule"], c["threshold"], x, c.get("target")) for x in r["per_seed"]]
        label, n = r["label"].replace("|", "\\|"), len(each)
        lines.append(
            f"| {r['finding']} | {label} | {r['rule']} {c['threshold']} | {fmt(r['study_mean'])}, "
            f"{r['study']} | {' '.join(map(fmt_seed, r['per_seed']))} | {', '.join(each)} | "
            f"{sum(v == r['study'] for v in each)} of {n} | {each.count('shown')} of {n} |")
    return "\n".join(lines)


def sweep_choice(out: str, seeds: list[int], sweep: dict[str, str], rule: str) -> dict:
    """The learning-rate sweep judged (toyworld/declared.py's SWEEP and SWEEP_RULE): each swept
    rate's per-seed peak and end (window means) and whether the run declined; the largest rate that
    holds in all but one seed (None: none)."""
    rows = {}
    for name, lr in sweep.items():
        peaks = [value(out, s, (name, "peak", "success")) for s in seeds]
        ends = [value(out, s, (name, "end", "success")) for s in seeds]
        holds = [not math.isnan(p) and p - e <= 0.05 for p, e in zip(peaks, ends)]
        rows[lr] = {"peak": peaks, "end": ends, "holds": sum(holds), "base":
                    [value(out, s, (name, "base", "success")) for s in seeds]}
    fine = [lr for lr, r in rows.items() if r["holds"] >= len(seeds) - 1]
    return {"rule": rule, "rates": rows, "choice": max(fine, key=float) if fine else None}


def keep_results(out: str, runs: list[str], results: str, pack: str = "study.jsonl") -> None:
    """The runs' compact results into one file, results/`pack` (toyworld/results.py): each run's
    metrics (RESULTS), its evaluations and KEPT_SAMPLES, what this module and toyworld/figures.py
    read, so that the tables and figures can be drawn again from a clone."""
    rows = []
    for run in runs:
        kept = [{k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()
                 if any(k == w or k.endswith(w) or k.startswith(w) for w in RESULTS)}
                for m in read_results(os.path.join(out, run, "metrics.jsonl"), ("step",),
                                      warn=False)]
        rows += [(run, "metrics.jsonl", m) for m in kept]
        rows += [(run, "eval.jsonl", r) for r in records(out, run, "eval.jsonl")]
        if run in KEPT_SAMPLES:
            rows += [(run, KEPT_SAMPLES[run], r) for r in records(out, run, KEPT_SAMPLES[run])]
    os.makedirs(results, exist_ok=True)
    write_pack(os.path.join(results, pack), rows)

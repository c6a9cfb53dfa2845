"""A run's report as one HTML file: role-level curves, warnings, and what each role wrote (`eval.py
report`).

What it is for: seeing role-level drift, which aggregate accuracy hides. Per run: its cell, the
flags that differ from the defaults train.py wrote (RUN/defaults.json), per-role curves of
metrics.jsonl (validation accuracy, own accuracy, length, format, fallbacks, entropy, gradient norm,
SP's shares, optimizer steps), the base model's level (step-0 validation) dashed; warnings from the
metrics (`role_warnings`), each linking to its curve and episodes; the validation samples train.py
keeps (RUN/samples/) at the first, best and last validation step side by side, filtered by role and
outcome. Several runs go side by side. Self-contained: inline SVG, CSS and JS, nothing fetched. What
it is not: evaluation (eval.py), or the PNG figures of `eval.py plot` (infra/plots.py).

    python eval.py report runs/voting-sp runs/voting-ip --out runs/voting.html
"""
from __future__ import annotations

import html
import json
import os
import pathlib
import re

from infra import runfolder
from infra.cells import cell_name
from infra.report_warnings import SMOOTH, role_warnings, series, smooth
from infra.samples import read_samples

# The curves: (id, title, [(metric, style)]); `{role}` is drawn for each role, `*` matches any
# parser path
CHARTS = [
    ("val", "validation accuracy; dashed: the base model (step 0)",
     [("val/success", "val"), ("success", "train")]),
    ("acc", "each role's own accuracy", [("val/{role}/acc", "val"), ("{role}/acc", "train")]),
    ("len", "response length (tokens)",
     [("val/{role}/response_len", "val"), ("{role}/response_len", "train")]),
    ("format", "format compliance",
     [("val/{role}/format_ok", "val"), ("{role}/format_ok", "train")]),
    ("fallback", "parser fallbacks taken",
     [("val/{role}/fallback_*", "val"), ("{role}/fallback_*", "train")]),
    ("entropy", "entropy (per token)", [("{role}/entropy", "train")]),
    ("grad", "gradient norm: the adapter's; dashed: the role's own (SP)",
     [("{role}/grad_norm", "train"), ("{role}/role_grad_norm", "alt")]),
    ("share", "loss share (solid), gradient share (dashed): SP",
     [("{role}/loss_share", "train"), ("{role}/grad_norm_share", "alt")]),
    ("steps", "optimizer steps per training step (IP: per instance)",
     [("{role}/opt_steps", "train")]),
]
RATES = {"val", "acc", "format", "fallback", "share"}  # the charts of rates, drawn from 0 to 1
# one per role, in the workflow's order
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
STYLE = {"val": 'stroke-width="2"', "train": 'stroke-width="1" opacity=".55"',
         "alt": 'stroke-dasharray="5 3"'}
DASH = {"val": "solid 2px", "train": "solid 1px", "alt": "dashed 1px"}  # the same in the legends


# ---------------------------------------------------------------- reading a run

def read_run(run_dir: str) -> dict:
    """What the report shows of one run folder; a folder that is not a run, or has no metrics, is
    one line."""
    args = runfolder.read_run_args(run_dir, keys=runfolder.NAME_KEYS)
    metrics = runfolder.read_results(os.path.join(run_dir, "metrics.jsonl"), ("step",), warn=False)
    if not metrics:
        runfolder.usage_error(f"{run_dir}: no metrics yet (metrics.jsonl is missing or empty)")
    # train.py's defaults when it wrote the run (older runs: none)
    path = pathlib.Path(run_dir, "defaults.json")
    defaults = runfolder.today_names(json.loads(path.read_text())) if path.exists() else None
    samples, keys = read_samples(run_dir), dict.fromkeys(k for m in metrics for k in m)
    # call order
    roles = dict.fromkeys(c["role"] for eps in samples.values() for e in eps for c in e["calls"])
    roles.update(dict.fromkeys(k.split("/")[-2] for k in keys
                               if re.fullmatch(r"(val/)?\w+/response_len", k)))
    return {"dir": run_dir, "name": cell_name(args), "args": args, "metrics": metrics,
            "defaults": defaults, "roles": list(roles), "samples": samples}


def differing_flags(run: dict, runs: list[dict]) -> tuple[str, dict]:
    """The flags that differ from train.py's defaults (a run from before defaults.json: from the
    other runs)."""
    if run["defaults"] is not None:
        base, what = run["defaults"], "differ from train.py's defaults"
    else:  # an older train.py's run: compared with another run
        other = next((r for r in runs if r is not run), run)
        base = other["args"]
        what = f"differ from {other['name']}'s (no defaults.json: an older train.py)"
    empty = (None, {}, [], "")
    return what, {k: v for k, v in run["args"].items()
                  if k not in ("run_dir", "resume", "overwrite")
                  and v != base.get(k) and not (v in empty and base.get(k) in empty)}


# ---------------------------------------------------------------- curves as inline SVG

def fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def chart_lines(run: dict, keys: list[tuple[str, str]]) -> list[dict]:
    """The lines of one chart for one run: one per role (colour) and metric (style) that the run
    logged."""
    names = list(dict.fromkeys(k for m in run["metrics"] for k in m))
    lines = []
    for pattern, style in keys:
        for j, role in enumerate(run["roles"] if "{role}" in pattern else [None]):
            regex = re.escape(pattern.format(role=role)).replace(r"\*", r"\w+")
            for key in (k for k in names if re.fullmatch(regex, k)):
                points = series(run["metrics"], key)
                points = points if style == "val" else smooth(points)
                if points:
                    lines.append({"key": key, "role": role, "style": style, "points": points,
                                  "color": COLORS[j % len(COLORS)] if role else "#333"})
    return lines


def svg_chart(lines: list[dict], xmax: int, ylim: tuple[float, float], marks: list[int]) -> str:
    """A line chart: gridlines with their values, a line per metric (dots with their values on
    validation lines), a dashed base-model level per validation line that has step 0, a red mark at
    each warned step."""
    w, h, left, bottom, top, lo, hi = 420, 170, 44, 20, 8, *ylim
    x = lambda s: f"{left + (w - left - 8) * s / max(xmax, 1):.1f}"  # noqa: E731
    span = (hi - lo) or 1
    y = lambda v: f"{top + (h - top - bottom) * (1 - (v - lo) / span):.1f}"  # noqa: E731
    out = [f'<svg viewBox="0 0 {w} {h}" width="100%" role="img">']
    out += [f'<line x1="{left}" x2="{w - 8}" y1="{y(v)}" y2="{y(v)}" stroke="#ddd"/>'
            f'<text x="{left - 4}" y="{float(y(v)) + 3:.1f}" text-anchor="end">{fmt(v)}</text>'
            for v in (lo, (lo + hi) / 2, hi)]
    out += [f'<text x="{x(s)}" y="{h - 5}" text-anchor="middle">{s}</text>'
            for s in (0, xmax // 2, xmax)]
    out += [
        f'<line x1="{x(s)}" x2="{x(s)}" y1="{top}" y2="{h - bottom}" stroke="#e33" '
        f'stroke-dasharray="2 2"><title>warning at step {s}</title></line>' for s in marks]
    for line in lines:
        color, key = line["color"], html.escape(line["key"])
        out.append(
            f'<polyline data-key="{key}" data-role="{line["role"] or ""}" fill="none" '
            f'stroke="{color}" {STYLE[line["style"]]} '
            f'points="{" ".join(f"{x(s)},{y(v)}" for s, v in line["points"])}"/>')
        if line["style"] == "val":
            out += [
                f'<circle cx="{x(s)}" cy="{y(v)}" r="2.2" fill="{color}"><title>{key} step {s}: '
                f'{fmt(v)}</title></circle>' for s, v in line["points"]]
        if line["style"] == "val" and line["points"][0][0] == 0:
            base = y(line["points"][0][1])
            out.append(f'<line x1="{left}" x2="{w - 8}" y1="{base}" y2="{base}" stroke="{color}" '
                       'stroke-dasharray="6 4" opacity="0.6"><title>base model (step '
                       '0)</title></line>')
    return "\n".join(out) + "</svg>"


def chart_rows(runs: list[dict], warnings: list[list[dict]]) -> str:
    """A row per chart, a column per run; the runs of a row share its axes, so they compare at a
    glance."""
    rows = []
    xmax = max(m["step"] for r in runs for m in r["metrics"])
    for chart, title, keys in CHARTS:
        per_run = [chart_lines(r, keys) for r in runs]
        values = [v for lines in per_run for ln in lines for _, v in ln["points"]]
        if not values:
            continue
        lo, hi = min(0.0, min(values)), max(values)
        hi = 1.0 if chart in RATES else hi or 1.0  # rates on their whole range
        cells = []
        for i, lines in enumerate(per_run):
            marks = sorted({w["step"] for w in warnings[i] if w["chart"] == chart})
            keys = "".join(
                f'<span class="key"><i style="border-top:{DASH[ln["style"]]} {ln["color"]}"></i>'
                f'{html.escape(ln["key"])}</span>' for ln in lines)
            body = svg_chart(lines, xmax, (lo, hi), marks) + f'<div class="legend">{keys}</div>' \
                if lines else '<p class="none">not logged by this run</p>'
            cells.append(
                f'<div class="chart" id="r{i}-{chart}" '
                f'data-chart="{chart}"><h4>{title}</h4>{body}</div>')
        rows.append("".join(cells))
    if len(runs) == 1:  # one run: its charts flow in columns
        return f'<div class="grid flow">{"".join(rows)}</div>'
    return "\n".join(f'<div class="grid" style="--n:{len(runs)}">{row}</div>' for row in rows)


# ---------------------------------------------------------------- the sampled episodes

def shown_steps(run: dict) -> list[tuple[int, str]]:
    """The sampled validation steps shown: the first, the best (highest val/success, the earliest of
    ties) and the last, each once, with its label."""
    steps, acc = sorted(run["samples"]), dict(series(run["metrics"], "val/success"))
    best = max(steps, key=lambda s: (acc.get(s, -1.0), -s))
    labels: dict[int, list[str]] = {}
    for step, what in ((steps[0], "first"), (best, "best"), (steps[-1], "last")):
        labels.setdefault(step, []).append(what)
    return [(s, f"step {s} ({', '.join(labels[s])}" + (f"; val acc {acc[s]:.3f})" if s in acc
                                                       else ")"))
            for s in sorted(labels)]


def call_cell(c: dict | None, step: int) -> str:
    """One call at one step: adapter, parsed answer, own correctness, reward; the prompt folded; the
    output."""
    if c is None:
        return f'<td class="absent" data-step="{step}">no such call at this step</td>'
    own = "" if c.get("correct") is None else "right" if c["correct"] else "wrong"
    # what each role's parser read: an answer, a pick, a verdict, strategies
    m = c.get("metrics", {})
    verdict = {True: "Correct", False: "Incorrect", None: "unparseable"}.get(m.get("verdict"))
    parsed = (f"answer {c['parsed']!r}" if c.get("parsed") is not None
              else f"pick {m['pick'] + 1}" if "pick" in m
              else f"verdict {verdict}" if "verdict" in m
              else f"{m['strategies']} strategies" if "strategies" in m
              else "no answer parsed")
    meta = [f"adapter {c['adapter']}", parsed, own and f"own {own}", f"reward {c['reward']:g}",
            f"{c['response_tokens']} tokens"]
    meta += ["cut at the length limit"] if c.get("truncated") else []
    meta += [f"parser path {m['parse']}"] if m.get("parse") else []
    prompt = "\n\n".join(f"[{msg['role']}]\n{msg['content']}" for msg in c["messages"])
    meta_text = html.escape(" · ".join(filter(None, meta)))
    return (f'<td class="{own}" data-step="{step}"><div class="meta">{meta_text}</div>'
            f'<details><summary>prompt ({len(c["messages"])} messages)</summary>'
            f'<pre>{html.escape(prompt)}</pre></details>'
            f'<pre class="out">{html.escape(c["output"])}</pre></td>')


def episode_block(eps: list[dict | None], shown: list[tuple[int, str]]) -> str:
    """One task and sample: a row per call (in order), a column per shown step, the outcome in the
    last row."""
    task, sample = next((e["task"], e["sample"]) for e in eps if e)
    calls = list(dict.fromkeys((c["name"], c["turn"], c["role"]) for e in eps if e
                               for c in e["calls"]))
    outcome = ["" if e is None else str(int(bool(e["correct"]))) for e in eps]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in shown)
    rows = [f'<tr><th>call</th>{head}</tr>']
    for name, turn, role in calls:
        cells = "".join(call_cell(next((c for c in e["calls"] if (c["name"], c["turn"]) == (
            name, turn)), None)
                                  if e else None, step) for e, (step, _) in zip(eps, shown))
        label = f"{name}" + (f" (turn {turn})" if turn else "")
        rows.append(f'<tr data-role="{html.escape(role)}" data-call="{html.escape(name)}@{turn}">'
                    f'<th>{html.escape(label)}</th>{cells}</tr>')
    ends = "".join("<td>-</td>" if e is None
                   else f'<td class="{"right" if e["correct"] else "wrong"}">final answer '
                   f'{html.escape(repr(e["final_answer"]))}: '
                   f'{"right" if e["correct"] else "wrong"}</td>'
                   for e in eps)
    rows.append(f'<tr class="outcome"><th>episode</th>{ends}</tr>')
    return (f'<div class="task" data-task="{html.escape(task["id"])}" data-sample="{sample}" '
            f'data-first="{outcome[0]}" data-last="{outcome[-1]}"><h4>{html.escape(task["id"])}, '
            f'sample {sample}: answer {html.escape(str(task["answer"]))}</h4><pre '
            f'class="question">{html.escape(task["question"])}'
            f'</pre><table>{"".join(rows)}</table></div>')


OUTCOMES = [("all", "every episode"), ("right", "right at the last step"),
            ("wrong", "wrong at the last step"), ("improved", "wrong first, right last"),
            ("worse", "right first, wrong last")]


def episodes_section(run: dict, i: int) -> str:
    """The run's sampled episodes at the shown steps, with the role and outcome filters (the page's
    script)."""
    if not run["samples"]:
        return (
            f'<section id="r{i}-episodes"><h3>{html.escape(run["name"])}: no validation '
            'samples</h3><p class="none">(a run from before train.py kept them, or with '
            '--val-samples 0 or --val-every 0)</p></section>')
    shown = shown_steps(run)
    by_step = {s: {(e["task"]["id"], e["sample"]): e for e in run["samples"][s]} for s, _ in shown}
    keys = list(dict.fromkeys(k for s, _ in shown for k in by_step[s]))
    roles = "".join(
        f'<label><input type="checkbox" data-role="{html.escape(r)}" checked> '
        f'{html.escape(r)}</label>'
                    for r in run["roles"])
    options = "".join(f'<option value="{v}">{t}</option>' for v, t in OUTCOMES)
    blocks = "\n".join(episode_block([by_step[s].get(k) for s, _ in shown], shown) for k in keys)
    return (
        f'<section id="r{i}-episodes" class="episodes"><h3>{html.escape(run["name"])}: sampled '
        f'validation episodes ({len(keys)}), the same tasks at every step</h3><div '
        f'class="filters">roles: {roles} &nbsp; outcome: '
        f'<select>{options}</select></div>{blocks}</section>')


# ---------------------------------------------------------------- the page

def run_header(run: dict, runs: list[dict], i: int, warnings: list[dict]) -> str:
    """The run's name, folder, settings, validation accuracy at a glance, differing flags and
    warnings."""
    a, val = run["args"], series(run["metrics"], "val/success")
    facts = [("folder", run["dir"]), ("workflow", a["workflow"]), ("policy", a["policy"]),
             ("model", a["model"]), ("task", a["task"]),
             ("steps logged", str(max(m["step"] for m in run["metrics"])))]
    if val:
        best = max(val, key=lambda p: p[1])
        facts.append(("validation accuracy",
                      f"{val[0][1]:.3f} at step {val[0][0]}, best {best[1]:.3f} (step {best[0]}), "
                      f"last {val[-1][1]:.3f} (step {val[-1][0]})"))
    what, flags = differing_flags(run, runs)
    flag_text = " ".join(
        f"<code>{html.escape(f'--{k} ' + (v if isinstance(v, str) else json.dumps(v)))}</code>"
                         for k, v in ((k.replace("_", "-"), v) for k, v in flags.items())) or "none"
    items = "".join(
        f'<li class="warn" data-kind="{w["kind"]}" '
        f'data-role="{w["role"] or ""}">{html.escape(w["text"])} <a '
        f'href="#r{i}-{w["chart"]}">curve</a> <a href="#r{i}-episodes" class="to-episodes" '
        f'data-run="r{i}" data-role="{w["role"] or ""}">episodes</a></li>'
                    for w in warnings)
    return (f'<div class="run"><h2>{html.escape(run["name"])}</h2><table>'
            + "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
            + f'</table><p><b>flags that {what}:</b> {flag_text}</p>'
            + f'<div class="warnings"><h3>warnings ({len(warnings)})</h3>'
            + f'<ul>{items or "<li>none</li>"}</ul></div></div>')


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222}h2{margin:4px 0}
h4{margin:6px 0 2px;font-size:13px}.run,.chart{border:1px solid #ddd;border-radius:6px;padding:8px}
.grid{display:grid;grid-template-columns:repeat(var(--n),minmax(360px,600px));gap:12px}
.grid{margin-bottom:8px}.flow{grid-template-columns:repeat(auto-fill,minmax(380px,1fr))}
.heads{grid-template-columns:repeat(var(--n),1fr)}.heads .run{columns:2 430px}
.run h2{column-span:all}.warnings{break-inside:avoid}code{white-space:nowrap}
svg text{font-size:10px;fill:#555}.legend{font-size:11px}.key{margin-right:10px;white-space:nowrap}
.key i{display:inline-block;width:18px;margin:0 3px 3px 0}.warn{color:#a00}.none,.absent{color:#888}
table{border-collapse:collapse}th,td{text-align:left;vertical-align:top;padding:3px 6px}
.task table{width:100%;table-layout:fixed}.task td,.task th{border:1px solid #e4e4e4}
.task tr>th:first-child{width:120px}td.right{background:#f0fff0}td.wrong{background:#fff3f3}
.meta{font-size:11px;color:#555}
pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;font-size:12px}
pre.out{background:#f7f7f7;padding:3px}.task{border-top:2px solid #ccc;margin-top:12px}
.filters{position:sticky;top:0;background:#fff;padding:4px 0}"""
SCRIPT = """function applyFilter(sec){
  const roles = new Set([...sec.querySelectorAll('input[data-role]')].filter(b => b.checked)
                         .map(b => b.dataset.role));
  const o = sec.querySelector('select').value;
  sec.querySelectorAll('tr[data-role]').forEach(tr => { tr.hidden = !roles.has(tr.dataset.role); });
  sec.querySelectorAll('.task').forEach(t => { const f = t.dataset.first, l = t.dataset.last;
    t.hidden = !(o === 'all' || (o === 'right' && l === '1') || (o === 'wrong' && l === '0')
                 || (o === 'improved' && f === '0' && l === '1')
                 || (o === 'worse' && f === '1' && l === '0')); });
}
document.querySelectorAll('section.episodes').forEach(sec => sec.querySelectorAll('input, select')
  .forEach(el => el.addEventListener('change', () => applyFilter(sec))));
document.querySelectorAll('a.to-episodes').forEach(a => a.addEventListener('click', () => {
  const sec = document.getElementById(a.dataset.run + '-episodes'), only = a.dataset.role;
  if (!sec.classList.contains('episodes')) return;  // a run without samples
  sec.querySelectorAll('input[data-role]')
    .forEach(b => { b.checked = !only || b.dataset.role === only; });
  applyFilter(sec);
}));"""


def page(runs: list[dict], warnings: list[list[dict]]) -> str:
    title = " | ".join(r["name"] for r in runs)
    headers = "".join(run_header(r, runs, i, w) for i, (r, w) in enumerate(zip(runs, warnings)))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>report: '
        f'{html.escape(title)}</title><style>{CSS}</style></head><body><h1>Training report: '
        f'{html.escape(title)}</h1><div class="grid heads" '
        f'style="--n:{len(runs)}">{headers}</div><h2>Curves over training</h2><p '
        f'class="legend">solid with dots: validation; thin: training (long runs: a {SMOOTH}-step '
        'running mean); dashed level: the base model (step-0 validation); red: warned '
        f'steps.</p>{chart_rows(runs, warnings)}<h2>What each role '
        f'wrote</h2>{"".join(episodes_section(r, i) for i, r in enumerate(runs))}'
        f'<script>{SCRIPT}</script></body></html>\n')


def write_report(run_dirs: list[str], out_html: str) -> dict:
    """The report of `run_dirs` (side by side, in that order) as one self-contained HTML file
    `out_html`. Every run is read and checked, and `out_html` checked writable, before it is written
    (atomically); bad input is one line. Returns {"path", "runs" (names), "warnings" (per run),
    "bytes"}."""
    runfolder.check_writable(out_html, "--out", folder=False)
    if not run_dirs:
        runfolder.usage_error("report: name at least one run folder")
    runs = [read_run(r) for r in run_dirs]
    warnings = [role_warnings(r["metrics"], r["roles"]) for r in runs]
    text = page(runs, warnings)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out_html)), exist_ok=True)
        pathlib.Path(out_html + ".tmp").write_text(text, encoding="utf-8")
        os.replace(out_html + ".tmp", out_html)
    except OSError as e:
        runfolder.usage_error(f"--out {out_html}: cannot write it ({e.strerror or e})")
    return {"path": out_html, "runs": [r["name"] for r in runs], "warnings": warnings,
            "bytes": os.path.getsize(out_html)}

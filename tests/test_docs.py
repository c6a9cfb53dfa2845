"""The pages a reader follows: every relative link in README.md, docs/*.md, docs/findings/*.md and
bench/README.md reaches a file that exists, and a `#anchor` into a markdown page reaches one of its headings
(GitHub's slugs); the README stays a first page (at most README_MAX_LINES lines), its file map's
arrows are the imports the code has, and its test command is the one .ci/run runs; the toy study's
tables are what the study command writes from the committed results, from any simulation seed
(the numbers of the prose around them: tests/test_findings_prose.py).

    python -m pytest -q tests/test_docs.py
"""
import glob
import os
import re

import pytest
from test_layering import CONCEPT, project_imports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDS = os.path.join(ROOT, "docs", "findings", "builds.jsonl")  # the toy builds' records the page quotes
README_MAX_LINES = 210
PAGES = sorted(["README.md", "bench/README.md",
                *(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))),
                *(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "findings", "*.md")))])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code removed (links there are code)."""
    lines, in_code = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            lines.append(INLINE_CODE.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, inline-code ticks and punctuation dropped (not
    '-' or '_'), each space a '-'. Example: "Stopping and resuming" -> "stopping-and-resuming"."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Every heading's slug in a markdown file; a repeated heading gets -1, -2... as on GitHub."""
    with open(path) as f:
        text = f.read()
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: str, root: str = ROOT) -> list[str]:
    """The relative links of ``page`` (a path under ``root``) that reach no file or no heading."""
    path = os.path.join(root, page)
    with open(path) as f:
        text = f.read()
    broken = []
    for line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            if not os.path.exists(linked):
                broken.append(f"{page}: {target} (no file {os.path.relpath(linked, root)})")
            elif anchor and linked.endswith(".md") and anchor not in anchors(linked):
                broken.append(f"{page}: {target} (no heading #{anchor})")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_readme_is_a_first_page():
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_the_check_catches_a_broken_file_and_a_broken_anchor(tmp_path):
    """Not vacuous: a missing file, a missing heading and a missing image are each reported, a
    link in a code block or inline code is not, and a link to a real heading passes."""
    (tmp_path / "docs").mkdir()
    page = "# A page\n\n## Stopping and resuming\n\n## Run\n\n## Run\n"
    (tmp_path / "docs" / "page.md").write_text(page)
    (tmp_path / "README.md").write_text(
        "See [the page](docs/page.md), [a section](docs/page.md#stopping-and-resuming),\n"
        "[the second Run](docs/page.md#run-1), [the web](https://example.com/x.md).\n"
        "Broken: [gone](docs/gone.md), [no heading](docs/page.md#stopping), ![img](docs/x.png),\n"
        "[here](#nowhere). Not links: `[code](docs/nope.md)`\n"
        "```\n[in a block](docs/nope.md)\n```\n")
    assert broken_links("README.md", str(tmp_path)) == [
        "README.md: docs/gone.md (no file docs/gone.md)",
        "README.md: docs/page.md#stopping (no heading #stopping)",
        "README.md: docs/x.png (no file docs/x.png)",
        "README.md: #nowhere (no heading #nowhere)",
    ]


def test_slugs_follow_github():
    assert slug("The files, and where the code shows them") == \
        "the-files-and-where-the-code-shows-them"
    assert slug("`--resume`: continue a run") == "--resume-continue-a-run"
    assert slug("I1 and I6") == "i1-and-i6"
    assert slug("Over-long prompts (and responses)") == "over-long-prompts-and-responses"


def readme_arrows() -> dict[str, set[str]]:
    """The README's file map: `train.py  ──► eval.py grpo.py ...  what it holds`, as
    {"train": {"eval", "grpo", ...}}; "(infra/ only)" is the empty set."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    arrows = {}
    for line in text.split("\n"):
        match = re.match(r"^(\w+)\.py\s+──►\s+(.*?)(?:\s{3,}|$)", line)
        if match:
            arrows[match.group(1)] = set(re.findall(r"(\w+)\.py", match.group(2)))
    return arrows


def test_the_readme_file_map_draws_the_imports_the_code_has():
    arrows = readme_arrows()
    assert set(arrows) == set(CONCEPT)
    for module in CONCEPT:
        imported = project_imports(module) & set(CONCEPT)
        assert arrows[module] == imported, f"README draws {module}.py -> {sorted(arrows[module])}"


def test_the_readme_test_command_is_what_ci_runs():
    """.ci/run runs `python3 -m pytest -q -n auto` last: the README gives the same command."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = [line.strip() for line in f if "pytest" in line and "$" not in line]
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = [line.strip() for line in f if line.startswith("python -m pytest")]
    assert ci == ["python3 -m pytest -q -n auto"]
    assert readme == [ci[0].replace("python3", "python", 1)]


# ---------------------------------------------------------------- measured times, stated in one place

TIMES = os.path.join(ROOT, "bench", "times.json")
# Where a page states a toy-world time or the toy model's size, it writes it with one of these phrases, filled in
# from bench/times.json (the measurements, with how each was taken): a new measurement changes every page or fails.
STATED = {
    "README.md": ["a {toy_parameters_m}M model", "built once in about {build_minutes} minutes",
                  "a first toy run from a fresh clone took {first_toy_run_seconds} seconds",
                  "recipe 1 at that size took {ablation_clip1_minutes} minutes on 2 cores, recipe 2 took "
                  "{ablation_majority_minutes}"],
    "docs/toy_world.md": ["a {toy_parameters_m}M-parameter Llama", "in about {build_minutes} minutes on 2 CPU cores",
                          "took {first_toy_run_seconds} seconds"],
    "docs/ablations.md": ["a {toy_parameters_m}M-parameter model", "about {build_minutes} minutes",
                          "recipe 1 at that size took {ablation_clip1_minutes} minutes on 2 cores, recipe 2 took "
                          "{ablation_majority_minutes}"],
    "bench/README.md": ["{build_minutes} minutes", "took {first_toy_run_seconds} seconds",
                        "{study_rerun_minutes} minutes from the first build to the last table",
                        "it took {study_fresh_clone_minutes} minutes",
                        "the one-commit study took about {study_one_commit_minutes} minutes"],
    "docs/findings/history.md": ["about {build_minutes} minutes each on 2 cores",
                                 "About {study_one_commit_minutes} minutes in all",
                                 "about {replication_one_commit_minutes} minutes of wall clock"],
}


def test_the_pages_state_the_measured_toy_times_and_size_from_one_place():
    """Every page in STATED writes the build's minutes, the first toy run's, the study's and the model's size as
    bench/times.json has them; the build's own message (toy_model.BUILD_MINUTES) says the same; the size is the
    model's: a Llama of toy_model.SHAPE with its 1,024-token vocabulary, counted."""
    import json

    import transformers

    from toyworld import toy_model
    with open(TIMES) as f:
        times = json.load(f)
    times["toy_parameters_m"] = f"{times['toy_parameters'] / 1e6:.2f}"
    for page, phrases in STATED.items():
        with open(os.path.join(ROOT, page)) as f:
            text = " ".join(f.read().split())  # a phrase may wrap
        for phrase in phrases:
            assert phrase.format(**times) in text, f"{page}: no {phrase.format(**times)!r}"
        assert "0.76M" not in text and "about 30 minutes" not in text, page  # what the pages said before v8
    assert toy_model.BUILD_MINUTES == times["build_minutes"]
    config = transformers.LlamaConfig(vocab_size=toy_model.VOCAB, tie_word_embeddings=True, **toy_model.SHAPE)
    model = transformers.LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == times["toy_parameters"]


def test_the_sweep_table_is_the_committed_sweep_runs():
    """The history page's sweep table (docs/findings/history.md) is the sweep's rule applied (`findings.sweep_choice`)
    to the committed compact results of its 15 runs (single-lrR-sS in docs/findings/results/study.jsonl), on the
    study's seeds: the first five of the AVX512 builds whose calibration record misses nothing (0, 1, 2, 3 and 5;
    seed 4 misses the solver)."""
    from toyworld import declared, findings, tables
    from toyworld.results import file_records
    records = [file_records(BUILDS, f"avx512/seed{seed}.calibration.jsonl")[-1] for seed in range(6)]
    seeds = [r["seed"] for r in records if not r["missed"]][:declared.SEEDS]
    assert seeds == [0, 1, 2, 3, 5]
    sweep = findings.sweep_choice(os.path.join(ROOT, "docs", "findings", "results"), seeds, declared.SWEEP,
                                    declared.SWEEP_RULE)
    assert sweep["choice"] == "1e-3"
    text = open(os.path.join(ROOT, "docs", "findings", "history.md")).read()
    assert tables.sweep_table(sweep, len(seeds)) in text


# docs/findings.md and the pages beside it that take some of its tables (toyworld/tables.py's COMPANIONS)
TABLE_PAGES = ("findings.md", "findings/history.md", "toy_world.md")


def pages_written_again(tmp_path, study) -> dict[str, str]:
    """The findings page, its companions and the README as the study command writes them from `study` (study.json's
    content) and the committed compact results, into copies under tmp_path: {page: its text}."""
    import shutil

    from toyworld import verdicts
    results = os.path.join(ROOT, "docs", "findings", "results")
    (tmp_path / "findings").mkdir(exist_ok=True)
    for page in TABLE_PAGES:
        shutil.copy(os.path.join(ROOT, "docs", page), tmp_path / page)
    shutil.copy(os.path.join(ROOT, "README.md"), tmp_path / "README.md")
    verdicts.write_pages(results, study, str(tmp_path / "findings.md"), str(tmp_path / "README.md"))
    return {page: (tmp_path / page).read_text() for page in (*TABLE_PAGES, "README.md")}


def committed_pages() -> dict[str, str]:
    return {page: open(os.path.join(ROOT, "docs", page)).read() for page in TABLE_PAGES} | {
        "README.md": open(os.path.join(ROOT, "README.md")).read()}


def test_every_table_of_the_findings_page_is_the_committed_study(tmp_path):
    """docs/findings/results/study.json is the study judged again from the committed compact runs beside it
    (study.jsonl and replication.jsonl: each finding's comparisons and verdict, the sweep), and docs/findings.md, its
    history page and docs/toy_world.md are what the study command writes from it: every table between markers (each
    finding's, the replication's, the runs', the collapses', the declines' power, the verdicts and the tests written
    after the data; the sweep on the history page, the calibration on docs/toy_world.md) as committed, and the
    README's verdict table. So a number in a table is checked from a clone by reading files, not by re-running the
    study."""
    import json

    from toyworld import declared, findings
    results = os.path.join(ROOT, "docs", "findings", "results")
    committed = json.load(open(os.path.join(results, "study.json")))
    seeds = committed["seeds"]
    assert seeds == [0, 1, 2, 3, 5] and len(committed["findings"]) == len(declared.FINDINGS)
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa: E731 (NaN == NaN)
    assert same(committed["findings"], [findings.judge_finding(results, seeds, f) for f in declared.FINDINGS])
    assert same(committed["sweep"], findings.sweep_choice(results, seeds, declared.SWEEP, declared.SWEEP_RULE))
    assert committed["commits"] == ["4ff703f"]  # every run of the study from one commit, as the page says
    for name in declared.GRID:  # the runs a seed declared before the study ran, every one in the results
        assert [len(findings.runs_of(results, name, seed)) for seed in seeds] == [declared.runs_a_seed(name)] * 5
    replication = committed["replication"]
    held_out = replication["seeds"]
    assert held_out == [6, 10] and [r["seed"] for r in replication["set_aside"]] == [7, 8, 9]
    assert replication["commits"] == ["4ff703f"]  # the replication from the study's commit too
    for name in declared.GRID:  # and its runs a seed, declared before it ran
        assert [len(findings.runs_of(results, name, seed)) for seed in held_out] == [declared.runs_a_seed(name)] * 2
    rows = findings.replication(results, held_out, committed["findings"], declared.FINDINGS)
    assert same(replication["rows"], rows) and len(rows) == 20
    assert pages_written_again(tmp_path, committed) == committed_pages()
    for text in (committed_pages()["findings.md"], committed_pages()["README.md"]):  # each has its verdict table
        assert re.search(r"<!-- table:verdicts -->\n\| the paper's claim .*\n<!-- /table:verdicts -->", text, re.S)


def test_the_pages_power_figures_are_the_same_from_another_simulation_seed(tmp_path, monkeypatch):
    """The power figures (toyworld/power.py) are simulated from SIMULATION_SEED: drawn again from another seed, every
    page prints the same digits, so a printed figure is not the noise of one simulation. The smallest difference
    detected at a normal spread is exact (no draw); the rules' passing and every figure with collapses are drawn,
    STUDY_SIMULATIONS studies each (their digits: differences to 2 decimals, rates to whole percents, runs as
    "over 20"), and the seeds' draws differ: the unrounded figures move."""
    import json

    from toyworld import power
    results = os.path.join(ROOT, "docs", "findings", "results")
    committed = json.load(open(os.path.join(results, "study.json")))
    label = "decline: IP - IP with I6"
    (c,) = [c for f in committed["findings"] for c in f["comparisons"] if c["label"] == label]
    model = power.decline_models(results, committed)["models"][label]
    first, second = (power.comparison_power(c, model, seed)["collapses"]["false_pass"] for seed in (0, 1))
    assert first != second and abs(first - second) < 0.002  # other draws, the same whole percent
    monkeypatch.setattr(power, "SIMULATION_SEED", 1)
    assert pages_written_again(tmp_path, committed) == committed_pages()


def test_the_verdicts_a_reader_sees_first_are_the_committed_results():
    """The verdicts the README's table of findings states, recomputed from the committed compact results: finding
    1's precondition shown and its exception the opposite (Eval-Opt IP below the SA adapter in every seed, its
    interval below zero) by the predeclared rule and by the contradiction test written after the data, so finding 1
    is not shown; Orch-Workers SP's gain over its base not shown (after the data); finding 4's control shown,
    merging not, and SP declining more than IP the opposite; finding 5 the opposite."""
    import json

    from toyworld import verdicts
    results = os.path.join(ROOT, "docs", "findings", "results")
    committed = json.load(open(os.path.join(results, "study.json")))
    judged = {(f["id"], c["label"]): c for f in committed["findings"] for c in f["preconditions"] + f["comparisons"]}
    verdict = {f["id"]: f["verdict"] for f in committed["findings"]}
    assert judged[("1", "Voting SP gains over its base")]["verdict"] == "shown"
    exception = judged[("1", "Eval-Opt: trained IP - SA-RL")]
    assert exception["verdict"] == "the opposite" and exception["negative"] == 5 and exception["ci"][1] < 0
    assert (verdict["1"], verdict["4"], verdict["5"]) == ("not shown", "not shown", "the opposite")
    after = verdicts.after_the_data(results, committed)
    gains = {c["label"]: c for c in after["findings"][0]["comparisons"]}
    assert gains["Orch-Workers SP: trained - base"]["verdict"] == "not shown"
    (contradiction,) = after["findings"][1]["comparisons"]
    assert contradiction["verdict"] == "the opposite"
    declines = [judged[("4", label)]["verdict"] for label in (
        "decline (peak - end): IP - SP", "decline: IP - IP merged",
        "decline: IP - IP at a third of the rate (the control)")]
    assert declines == ["the opposite", "not shown", "shown"]
    readme = " ".join(open(os.path.join(ROOT, "README.md")).read().split())
    assert "but Eval-Opt IP ends below it, the opposite of the exception" in readme
    assert ("merging (not shown) and a third of the rate (shown) both lower IP's decline, and are not told apart; SP "
            "declines more than IP on the study's seeds (the opposite") in readme


def test_the_calibration_tables_are_the_committed_records():
    """The calibration tables, of the study's candidate seeds (built on AVX512: avx512/, in docs/toy_world.md) and of
    the seeds rebuilt on an unrecorded CPU (rebuilt/, on the history page), are `tables.calibration_table` of the
    committed calibration records and builds (seedS.toy.json) in docs/findings/builds.jsonl, seed by seed: the
    targets missed, the base model's and the oracle's accuracy in each workflow, the solver's gap to its rows, the
    build."""
    from toyworld import tables
    from toyworld.results import file_records
    for folder, suffix, seeds, page in (("avx512", ".calibration.jsonl", 6, "toy_world.md"),
                                        ("rebuilt", ".jsonl", 7, "findings/history.md")):
        records = [file_records(BUILDS, f"{folder}/seed{seed}{suffix}")[-1] for seed in range(seeds)]
        builds = [file_records(BUILDS, f"{folder}/seed{seed}.toy.json")[0] for seed in range(seeds)]
        table = tables.calibration_table(records, builds)
        assert table in open(os.path.join(ROOT, "docs", page)).read(), folder


def test_the_findings_page_is_one_a_reader_finishes():
    """docs/findings.md holds at most 6,000 words, its tables included (as `wc -w` counts them); the history is
    on a page of its own, which it links."""
    with open(os.path.join(ROOT, "docs", "findings.md")) as f:
        text = f.read()
    assert len(text.split()) <= 6000 and "(findings/history.md)" in text

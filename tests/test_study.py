"""The toy-world study (infra/study.py) and its statistics (infra/findings.py): the grid's commands, window means,
paired differences against hand-computed values, each rule's verdicts, and the tables written into a page."""
import json
import math
import os

import pytest

from infra import findings, study


def test_the_study_dry_run_lists_the_grid(tmp_path, capsys, monkeypatch):
    """`python -m infra.study --dry-run`: seed by seed, every configuration as a train.py command, then eval.py on
    the test problems: `trained` on each of the 11 multi-agent runs, and base and the two SA modes (which load no
    adapter of the run) once per workflow, on its first configuration, with the single-agent run of the same
    seed; nothing is written. (Before the sweep has chosen, the rate shows by name.)"""
    monkeypatch.setattr(study, "LR", None)
    study.main(["--dry-run", "--out", str(tmp_path / "study"), "--seeds", "3"])
    lines = capsys.readouterr().out.splitlines()
    calibrations = [ln for ln in lines if ln.startswith("eval.py calibrate")]
    assert [ln.split()[3] for ln in calibrations] == ["0", "1", "2"]  # each seed's model, before its runs
    lines = [ln for ln in lines if ln not in calibrations]
    trains, evals = [ln for ln in lines if ln.startswith("train.py")], [ln for ln in lines if ln.startswith("eval.py")]
    per_seed = 12 + 11 + 3 * 3
    assert len(trains) == 12 * 3 and len(evals) == 3 * (11 + 3 * 3) and len(lines) == len(trains) + len(evals)
    assert all("-s0 " in ln or ln.endswith("-s0") for ln in lines[:per_seed]) and "-s1" in lines[per_seed]
    assert all("--split test" in ln for ln in evals)
    i6 = "--workflow voting --policy ip --coherence generator=0.3 --lr LR --seed 2 --steps 150"
    assert sum(i6 in ln for ln in trains) == 1
    assert sum("--policy ip --lr LR/3 --seed" in ln for ln in trains) == 3  # finding 4's control
    sa = [ln for ln in evals if f"--mode sa-transfer --samples 2 --split test --sa-run "
          f"{tmp_path / 'study' / 'single-s1'}" in ln]
    assert [ln.split()[2].rsplit("/", 1)[1] for ln in sa] == ["voting-sp-s1", "evalopt-sp-s1", "orchworkers-sp-s1"]
    assert sum("--mode trained" in ln for ln in evals) == 33
    assert not os.path.exists(tmp_path / "study")


def test_the_sweep_runs_the_single_agent_at_its_three_rates(tmp_path, capsys):
    study.main(["--dry-run", "--sweep", "--out", str(tmp_path / "s"), "--seeds", "5"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("eval.py calibrate")]
    assert len(lines) == 15 and all("--workflow single" in ln for ln in lines)
    assert sorted({ln.split("--lr ")[1].split()[0] for ln in lines}) == ["1e-3", "1e-4", "3e-4"]


def test_the_grid_waits_for_the_sweeps_choice(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(study, "LR", None)
    with pytest.raises(SystemExit):
        study.main(["--out", str(tmp_path / "s")])
    assert "run --sweep first" in capsys.readouterr().err and not os.path.exists(tmp_path / "s")


def test_run_all_keeps_each_chains_order_runs_two_at_once_and_names_a_failure(tmp_path):
    """`--jobs 2`: chains (one run's commands) run two at a time, each in order, one thread each; a failing
    command stops new ones and is named with its log."""
    import sys
    stamp = ("import os, sys, time; t = time.time(); time.sleep(1.0); "
             "open(sys.argv[1], 'a').write(f'{sys.argv[2]} {os.environ[\"OMP_NUM_THREADS\"]} {t} {time.time()}\\n')")

    def step(run, label):
        return [sys.executable, "-c", stamp, str(tmp_path / "order.txt"), label, "--run-dir", str(tmp_path / run)]
    study.run_all([[step("a", "a1"), step("a", "a2")], [step("b", "b1"), step("b", "b2")]], False, jobs=2)
    lines = [line.split() for line in (tmp_path / "order.txt").read_text().splitlines()]
    assert [x[0] for x in lines if x[0][0] == "a"] == ["a1", "a2"] and all(x[1] == "1" for x in lines)
    times = {x[0]: (float(x[2]), float(x[3])) for x in lines}
    assert times["a1"][1] <= times["a2"][0]  # in order within a chain
    assert times["b1"][0] < times["a1"][1] and times["a1"][0] < times["b1"][1]  # two chains at once
    assert os.path.exists(tmp_path / "a.log")
    with pytest.raises(SystemExit, match="exit 3.*c.log"):
        study.run_all([[[sys.executable, "-c", "raise SystemExit(3)", "--run-dir", str(tmp_path / "c")]]], False, 2)


def test_windows_read_the_best_and_the_last_three_points():
    values = [0.2, 0.9, 0.3, 0.6, 0.6, 0.3, 0.0, 0.3]  # the single best point (0.9) is not the peak
    assert findings.window_peak(values) == pytest.approx(0.6)   # (0.9 + 0.3 + 0.6) / 3 and (0.3 + 0.6 + 0.6) / 3
    assert findings.window_end(values) == pytest.approx(0.2)    # (0.3 + 0.0 + 0.3) / 3
    assert math.isnan(findings.window_peak([0.5, 0.5]))


def test_paired_differences_by_hand():
    s = findings.summarise([0.1, 0.2, 0.3, -0.1, 0.0])
    assert s["mean"] == pytest.approx(0.1)
    assert s["se"] == pytest.approx(math.sqrt(0.1 / 4 / 5))  # squares about the mean: 0+0.01+0.04+0.04+0.01
    assert (s["positive"], s["negative"]) == (3, 1)
    assert s["ci"][0] < 0.1 < s["ci"][1] and -0.1 <= s["ci"][0] and s["ci"][1] <= 0.3


@pytest.mark.parametrize("rule, diffs, verdict", [
    ("greater", [0.1, 0.08, 0.12, 0.06, -0.01], "shown"),          # mean 0.07 >= 0.05; 4 of 5 positive
    ("greater", [0.3, 0.2, -0.1, -0.05, 0.0], "not shown"),        # mean 0.07, but only 2 of 5 positive
    ("greater", [-0.1, -0.08, -0.12, -0.06, 0.01], "the opposite"),
    ("matches", [-0.03, 0.0, 0.02, -0.04, -0.19], "shown"),        # mean -0.048 >= -0.05; 4 of 5 within 0.05
    ("matches", [-0.1, -0.2, -0.1, -0.3, 0.1], "the opposite"),
    ("matches", [-0.1, 0.0, 0.05, -0.1, -0.02], "not shown"),      # mean -0.034, but 2 of 5 beyond -0.05
])
def test_each_rule_gives_its_verdict(rule, diffs, verdict):
    assert findings.verdict(rule, 0.05, findings.summarise(diffs)) == verdict


def write_run(out, name, seed, points, evals=()):
    folder = out / f"{name}-s{seed}"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": 10 * i, "val/success": v}) + "\n"
                                                  for i, v in enumerate(points)))
    (folder / "eval.jsonl").write_text("".join(json.dumps({"mode": m, "dataset": "math-d0-test",
                                                           "metrics": {"accuracy": a}}) + "\n" for m, a in evals))


def test_a_finding_is_judged_from_run_folders_and_its_table_written(tmp_path):
    """IP declines by 0.3 in every seed, SP holds: 'decline: IP - SP' is shown; the table replaces the text
    between its markers and leaves the prose alone."""
    for seed in range(5):
        write_run(tmp_path, "voting-ip", seed, [0.4, 0.7, 0.7, 0.7, 0.4, 0.4, 0.4])
        write_run(tmp_path, "voting-sp", seed, [0.4, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6 - 0.01 * seed])
    finding = {"id": "4", "claim": "IP declines", "comparisons": [
        study.c("decline: IP - SP", ("voting-ip", "decline", "success"), ("voting-sp", "decline", "success"))]}
    result = findings.judge_finding(str(tmp_path), list(range(5)), finding)
    assert result["verdict"] == "shown"
    assert result["comparisons"][0]["mean"] == pytest.approx(0.3 - 0.01 * 2 / 3, abs=1e-9)  # SP's mean decline
    page = tmp_path / "findings.md"
    page.write_text("Prose.\n<!-- table:finding-4 -->\nold\n<!-- /table:finding-4 -->\nMore prose.\n")
    assert findings.fill_tables(str(page), {"finding-4": findings.finding_table(result), "other": "x"}) == ["other"]
    text = page.read_text()
    assert text.startswith("Prose.\n") and text.endswith("More prose.\n") and "old" not in text
    assert "| decline: IP - SP | greater 0.05 | 0.30 / 0.01 |" in text and "**Verdict: shown.**" in text


def test_the_study_writes_the_sweep_the_summary_and_each_findings_table(tmp_path):
    """write_tables fills every marker from study.json's content: the sweep unsigned, one summary row a finding
    linking to its section, and the finding's table."""
    page = tmp_path / "findings.md"
    page.write_text("".join(f"<!-- table:{n} -->\nold\n<!-- /table:{n} -->\n"
                            for n in ("sweep", "summary", "finding-I1/I6")))
    sweep = {"rule": "r", "choice": "1e-3", "rates": {"1e-3": {"base": [0.5, 0.4], "peak": [0.9, 0.8],
                                                              "end": [0.85, 0.7], "holds": 1}}}
    compared = [dict(study.c(label, ("x", "end", "y")), **findings.summarise(diffs), a=diffs, b=[0.0, 0.0],
                     verdict=verdict)
                for label, diffs, verdict in (("P(a | b)", [0.1, 0.1], "shown"), ("I6", [-0.1, -0.1], "the opposite"))]
    judged = {"id": "I1/I6", "claim": "anchors help", "verdict": "not shown", "preconditions": [],
              "comparisons": compared}
    study.write_tables(str(page), {"seeds": [0, 1], "sweep": sweep, "findings": [judged]})
    text = page.read_text()
    assert "\nold\n" not in text and "| 1e-3 | 0.50 0.40 | 0.90 0.80 | 0.85 0.70 | 1 of 2 |" in text
    assert "| [I1/I6](#i1-and-i6) | anchors help | 1 / 0 / 1 | **not shown** |" in text
    assert "| I6 | greater 0.05 | -0.10 / 0.00 | -0.10 -0.10 | -0.100 | 0.000 |" in text
    assert "| P(a \\| b) | greater 0.05 |" in text  # a pipe in a label is escaped, not a new cell
    assert "**Verdict: not shown.**" in text


def test_eval_values_come_from_the_test_problems(tmp_path):
    write_run(tmp_path, "voting-sp", 0, [0.5], evals=[("trained", 0.7), ("base", 0.4)])
    assert findings.value(str(tmp_path), 0, study.ev("voting-sp")) == 0.7
    assert findings.value(str(tmp_path), 0, study.ev("voting-sp", "base")) == 0.4
    assert math.isnan(findings.value(str(tmp_path), 0, study.ev("voting-sp", "sa-transfer")))


def test_a_seed_whose_model_misses_calibration_is_set_aside_and_the_next_one_taken(tmp_path, capsys):
    """The study's seeds are the first N whose toy model passes calibration: seed 1's record names a missed
    target, so a 3-seed study runs seeds 0, 2 and 3 (a dry run counts a seed without a record as calibrated),
    and says which seed it set aside and why."""
    out = tmp_path / "s"
    out.mkdir()
    records = [{"seed": 0, "missed": []}, {"seed": 1, "missed": ["solve: right - oracle"]}]
    (out / "calibration.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    study.main(["--dry-run", "--sweep", "--out", str(out), "--seeds", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[3] for ln in lines if ln.startswith("eval.py calibrate")] == ["2", "3"]  # 0, 1 recorded
    assert sorted({ln.split("--seed ")[1].split()[0] for ln in lines if ln.startswith("train.py")}) == \
        ["0", "2", "3"]
    assert any(ln.startswith("seed 1: ") and "solve: right - oracle" in ln and "set aside" in ln for ln in lines)


def test_too_few_calibrated_seeds_stop_the_study_before_a_run(tmp_path, monkeypatch):
    """When fewer than N of the CANDIDATES seeds pass, the study stops before any run, naming the ones set
    aside."""
    out = tmp_path / "s"
    out.mkdir()
    records = [{"seed": s, "missed": [] if s == 0 else ["judge: right - oracle"]} for s in range(3)]
    (out / "calibration.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(study, "CANDIDATES", 3)
    monkeypatch.setattr(study, "LR", "1e-4")
    with pytest.raises(SystemExit) as stopped:
        study.main(["--out", str(out), "--seeds", "2"])
    assert "only 1 of seeds 0-2" in str(stopped.value) and "set aside: 1, 2" in str(stopped.value)
    assert not list(out.glob("single*"))


def test_the_figures_read_the_studys_own_seeds(tmp_path):
    """With seed 1 set aside, the bands read seeds 0 and 2 by name (seed 1 has no run folder, and a seed with no
    steps would leave its configuration out of the figure)."""
    from infra import plots
    write_run(tmp_path, "voting-sp", 0, [0.2, 0.4])
    write_run(tmp_path, "voting-sp", 2, [0.6, 0.8])
    steps, curves = plots.seed_curves(str(tmp_path), "voting-sp", [0, 2], "val/success")
    assert steps == [0, 10] and curves == [[0.2, 0.4], [0.6, 0.8]]


def test_a_near_rows_table_gives_a_alone(tmp_path):
    """A `near` comparison has no B: its row shows A's mean, not 'A / 0.00'."""
    for seed in range(2):
        folder = tmp_path / f"voting-sp-s{seed}"
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "generator/loss_share": 0.75}) + "\n"
                                                      for s in range(1, 4)))
    finding = {"id": "3", "claim": "shares", "comparisons": [
        study.c("share", ("voting-sp", "train", "generator/loss_share"), rule="near", target=0.75)]}
    table = findings.finding_table(findings.judge_finding(str(tmp_path), [0, 1], finding))
    assert "| share | near 0.05 of 0.75 | 0.75 | +0.75 +0.75 | +0.750 | 0.000 |" in table

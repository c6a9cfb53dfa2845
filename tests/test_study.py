"""The toy-world study (toyworld/study.py) and its statistics (toyworld/findings.py): the grid's commands, window means,
paired differences against hand-computed values, each rule's verdicts, and the tables written into a page."""
import json
import math
import os
import subprocess
import sys

import pytest

from infra import paired
from toyworld import declared, findings, jobs, study, tables


def test_a_seed_of_the_study_is_calibrated_from_its_committed_model_and_another_is_built_first(tmp_path,
                                                                                              monkeypatch):
    """seed_chain: seeds 0-5 have committed models (docs/findings/models/), which the calibration copies into the
    cache, so their chain is the calibration alone; seed 6 has none, so it is built first."""
    from toyworld import toy
    monkeypatch.setattr(toy, "CACHE_DIR", str(tmp_path / "cache"))  # an empty cache, as in a fresh clone
    chains = {seed: study.seed_chain(str(tmp_path), seed) for seed in (0, 5, 6)}
    assert [len(chains[s]) for s in (0, 5, 6)] == [1, 1, 2]
    assert "--build-only" in chains[6][0][0] and all("--out" in chain[-1][0] for chain in chains.values())


@pytest.mark.parametrize("committed", [True, False])
def test_the_clock_plans_a_build_only_for_a_seed_without_a_model(committed, tmp_path, monkeypatch, capsys):
    """From a fresh clone (an empty cache) the study's first estimate waits for no build: seeds 0-4 have committed
    models, which their calibration copies (it said 'about 147 min left' after its first calibration, 51 of them for
    three builds that never ran); without them, 5 builds."""
    from toyworld import toy, toy_model
    monkeypatch.setattr(toy, "CACHE_DIR", str(tmp_path / "cache"))
    if not committed:
        monkeypatch.setattr(toy_model, "COMMITTED", str(tmp_path / "no-models"))
    first_plans = []

    class Recorded(jobs.Clock):
        def plan(self, kind, count):
            if kind not in dict(first_plans):
                first_plans.append((kind, count))
            super().plan(kind, count)
    monkeypatch.setattr(study, "Clock", Recorded)
    study.main(["--dry-run", "--out", str(tmp_path / "study"), "--seeds", "5"])
    assert dict(first_plans)["build"] == (0 if committed else 5) and dict(first_plans)["calibrate"] == 5


def test_the_study_dry_run_lists_the_builds_the_sweep_and_the_grid(tmp_path, capsys, monkeypatch):
    """`python -m toyworld.study --dry-run`: each seed's toy model built and calibrated, the sweep (the single agent
    at three rates, once a seed), then seed by seed every configuration's runs as train.py commands at the sweep's
    rate (by name before it has chosen): 3 runs a seed, the six decline configurations 6 (declared.RUNS,
    DECLINE_RUNS), the study's own first, then run seeds seed + 1000, + 2000, ...; then eval.py on the test
    problems: `trained` on each of the 51 multi-agent runs a seed (`swapped`, with trained beside it, on the three
    workflows' IP runs), base once per workflow (it loads no adapter of the run: on the study's own run), and the
    two SA modes on each of the workflow's first configuration's runs that the single agent has a run of the same
    run seed for; nothing is written. (No committed models and an empty cache: every seed is built.)"""
    from toyworld import toy, toy_model
    monkeypatch.setattr(toy, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(toy_model, "COMMITTED", str(tmp_path / "no-models"))
    study.main(["--dry-run", "--out", str(tmp_path / "study"), "--seeds", "3"])
    lines = capsys.readouterr().out.splitlines()
    builds = [ln for ln in lines if ln.startswith("eval.py calibrate")]
    assert [ln.split()[3] for ln in builds] == ["0", "0", "1", "1", "2", "2"]  # built, then calibrated
    assert all(("--build-only" in ln) == (i % 2 == 0) for i, ln in enumerate(builds))
    trains, evals = [ln for ln in lines if ln.startswith("train.py")], [ln for ln in lines[6:] if ln.startswith("eval")]
    sweep, grid = trains[:9], trains[9:]
    assert all("--workflow single" in ln and "--run-seed" not in ln for ln in sweep)
    assert sorted({ln.split("--lr ")[1].split()[0] for ln in sweep}) == ["1e-3", "1e-4", "3e-4"]
    per_seed = 6 * 6 + 6 * 3  # the six decline configurations 6 runs, the other six 3
    assert len(grid) == 3 * per_seed and len(evals) == 3 * (51 + 3 + 2 * 3 * 3)
    assert all("-s0" in ln for ln in grid[:per_seed]) and "-s1" in grid[per_seed]
    assert all("--split test" in ln for ln in evals)
    i6 = "--workflow voting --policy ip --coherence generator=0.3 --lr LR --seed 2"
    assert [ln.split(i6)[1].split("--steps")[0].strip() for ln in grid if i6 in ln] == [
        "", "--run-seed 1002", "--run-seed 2002", "--run-seed 3002", "--run-seed 4002", "--run-seed 5002"]
    assert [ln.rsplit("/", 1)[1] for ln in grid if "--workflow evalopt --policy ip --lr LR --seed 1" in ln] == [
        "evalopt-ip-s1", "evalopt-ip-s1-run1001", "evalopt-ip-s1-run2001"]
    assert sum("--policy ip --lr LR/3 --seed" in ln for ln in grid) == 3 * 6  # finding 4's control
    regime = "--tasks-per-step 2 --group-size 8 --max-new-tokens 32 --temperature 1.0"  # calibration.REGIME
    assert all(regime in ln for ln in trains)
    sa = [(ln.split()[2].rsplit("/", 1)[1], ln.split("--sa-run ")[1].rsplit("/", 1)[1])
          for ln in evals if "--mode sa-transfer" in ln and "-s1" in ln]
    assert sa == [(f"{w}-sp-s1{r}", f"single-s1{r}") for w in ("voting", "evalopt", "orchworkers")
                  for r in ("", "-run1001", "-run2001")]
    assert [ln.split()[2].rsplit("/", 1)[1] for ln in evals if "--mode base" in ln] == [
        f"{w}-sp-s{s}" for s in range(3) for w in ("voting", "evalopt", "orchworkers")]
    # the IP runs of the three workflows run `swapped`, which writes `trained` beside it (eval.py)
    swapped = [ln.split()[2].rsplit("/", 1)[1] for ln in evals if "--mode swapped" in ln]
    assert swapped == [f"{w}-ip-s{s}{r}" for s in range(3) for w, runs in (("voting", 6), ("evalopt", 3),
                                                                            ("orchworkers", 3))
                       for r in [""] + [f"-run{k * 1000 + s}" for k in range(1, runs)]]
    assert sum("--mode trained" in ln for ln in evals) == 3 * (51 - 12)
    assert not os.path.exists(tmp_path / "study")


def test_run_all_keeps_each_chains_order_runs_two_at_once_and_names_a_failure(tmp_path, capsys):
    """`--jobs 2`: chains (one run's commands) run two at a time, each in order, one thread each, each command's
    output in its log; a line per finished command; a failing command stops new ones and is named with its log."""
    import sys
    stamp = tmp_path / "stamp.py"
    stamp.write_text("import os, sys, time\nimport torch\nt = time.time(); time.sleep(1.0)\n"
                     "open(sys.argv[1], 'a').write(f'{sys.argv[2]} {os.environ[\"OMP_NUM_THREADS\"]} '\n"
                     "                             f'{torch.get_num_threads()} {t} {time.time()}\\n')\n")

    def step(run, label):
        command = [sys.executable, str(stamp), str(tmp_path / "order.txt"), label, "--run-dir", str(tmp_path / run)]
        return command, str(tmp_path / run) + ".log"
    clock = jobs.Clock(2)
    jobs.run_all([[step("a", "a1"), step("a", "a2")], [step("b", "b1"), step("b", "b2")]], False, 2, clock)
    lines = [line.split() for line in (tmp_path / "order.txt").read_text().splitlines()]
    assert [x[0] for x in lines if x[0][0] == "a"] == ["a1", "a2"] and all(x[1:3] == ["1", "1"] for x in lines)
    times = {x[0]: (float(x[3]), float(x[4])) for x in lines}
    assert times["a1"][1] <= times["a2"][0]  # in order within a chain
    assert times["b1"][0] < times["a1"][1] and times["a1"][0] < times["b1"][1]  # two chains at once
    assert os.path.exists(tmp_path / "a.log")
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and all("min left" in ln for ln in printed)
    (tmp_path / "fail.py").write_text("print('failing here'); raise SystemExit(3)\n")
    with pytest.raises(SystemExit, match="exit 3.*c.log"):
        jobs.run_all([[([sys.executable, str(tmp_path / "fail.py")], str(tmp_path / "c.log"))]], False, 2)
    assert (tmp_path / "c.log").read_text() == "failing here\n"


def test_a_command_runs_as_python_script_would_with_the_libraries_imported_once(tmp_path, monkeypatch):
    """jobs.run_script, in a process forked from the forkserver that imported torch, transformers and peft: the
    script runs as __main__ from the repository, with its arguments, the repository first on its path, the
    environment it was given and its output in its log; the libraries come loaded (no 4-5 s of imports), the
    project's own modules import afresh (a module the server never saw is new in the command)."""
    import sys
    script = tmp_path / "probe.py"
    script.write_text("import json, os, sys\nloaded = 'torch' in sys.modules and 'peft' in sys.modules\n"
                      "fresh = 'tasks' not in sys.modules\nimport tasks\n"
                      "print(json.dumps([__name__, sys.argv, os.getcwd(), sys.path[0], os.environ['PROBE'], loaded, "
                      "fresh]))\n")
    log = tmp_path / "probe.log"
    monkeypatch.setenv("PROBE", "given")  # the study's environment, set after the server started
    jobs.run_all([[([sys.executable, str(script), "a", "--run-dir", "b"], str(log))]], False, 1)
    name, argv, cwd, first, probe, loaded, fresh = json.loads(log.read_text())
    assert (name, argv, cwd, first, probe) == ("__main__", [str(script), "a", "--run-dir", "b"], jobs.ROOT, jobs.ROOT,
                                               "given")
    assert loaded and fresh


def test_a_stopped_study_stops_each_command_once_and_says_how_to_go_on(tmp_path, capsys):
    """SIGTERM (or Ctrl-C) reaching the study: each running command gets one SIGINT, as train.py expects (it
    saves after its step), the study waits for it, starts nothing more, and exits 130 with a line, no traceback."""
    import signal
    import sys
    import threading
    import time
    trap = tmp_path / "trap.py"
    trap.write_text("import signal, sys, time; seen = []; signal.signal(signal.SIGINT, lambda *_: seen.append(1)); "
                    "open(sys.argv[1] + '.started', 'w').close(); t = time.time()\n"
                    "while not seen and time.time() - t < 20: time.sleep(0.05)\n"
                    "time.sleep(0.5); open(sys.argv[1], 'w').write(str(len(seen)))\n")
    chains = [[([sys.executable, str(trap), str(tmp_path / name), "--run-dir", str(tmp_path / name)],
                str(tmp_path / name) + ".log")] for name in ("a", "b", "c")]
    def stop_once_started():  # the scheduler's SIGTERM, once a and b run (c waits for a job)
        t = time.time()
        while not all(os.path.exists(tmp_path / f"{name}.started") for name in "ab") and time.time() - t < 60:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    with pytest.raises(SystemExit) as stopped:
        jobs.run_all(chains, False, 2)
    stopper.join()
    assert stopped.value.code == 130 and "stopped; the same command goes on" in capsys.readouterr().err
    assert (tmp_path / "a").read_text() == "1" and (tmp_path / "b").read_text() == "1"  # one SIGINT each
    assert not os.path.exists(tmp_path / "c.started")  # nothing started after the stop
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_the_clock_estimates_the_time_left_from_what_each_kind_took():
    """Planned commands count at their kind's measured mean once one has finished (MINUTES before), shared by
    the jobs: 2 builds left at 4 minutes and 10 runs at the prior minute, over 2 jobs, are 9 minutes."""
    clock = jobs.Clock(2)
    clock.plan("build", 3), clock.plan("train", 10)
    clock.finished(["python", "eval.py", "calibrate", "--seed", "0", "--build-only"], "s/seed0.log", 4.0)
    assert clock.planned == {"build": 2, "calibrate": 0, "train": 10, "eval": 0, "other": 0}
    assert clock.left() == pytest.approx((2 * 4.0 + 10 * jobs.MINUTES["train"]) / 2)


def test_windows_read_the_best_and_the_last_three_points():
    values = [0.2, 0.9, 0.3, 0.6, 0.6, 0.3, 0.0, 0.3]  # the single best point (0.9) is not the peak
    assert paired.window_peak(values) == pytest.approx(0.6)   # (0.9 + 0.3 + 0.6) / 3 and (0.3 + 0.6 + 0.6) / 3
    assert paired.window_end(values) == pytest.approx(0.2)    # (0.3 + 0.0 + 0.3) / 3
    assert math.isnan(paired.window_peak([0.5, 0.5]))


def test_paired_differences_by_hand():
    s = paired.summarise([0.1, 0.2, 0.3, -0.1, 0.0])
    assert s["mean"] == pytest.approx(0.1)
    assert s["se"] == pytest.approx(math.sqrt(0.1 / 4 / 5))  # squares about the mean: 0+0.01+0.04+0.04+0.01
    assert (s["positive"], s["negative"]) == (3, 1)
    # the t-interval: 0.1 +- 2.776 x sqrt(0.1 / 4 / 5) = 0.1 +- 0.1756 (t, 4 degrees of freedom, 0.975)
    assert s["ci"] == pytest.approx([0.1 - 2.776 * math.sqrt(0.005), 0.1 + 2.776 * math.sqrt(0.005)])
    assert s["detectable"] == pytest.approx(2.776 * math.sqrt(0.005))
    # at that spread (sd 0.1581) a mean of 0.1 needs 13 seeds: n = 12 gives 2.201 x 0.1581 / 3.464 = 0.1005,
    # n = 13 gives 2.179 x 0.1581 / 3.606 = 0.0955
    assert s["seeds_needed"] == 13


def test_seeds_needed_and_the_interval_that_says_the_verdict_by_hand():
    """seeds_needed: the fewest seeds whose t-interval excludes zero at a mean and spread; excludes_zero reads a
    verdict against its interval (matches: against minus the margin)."""
    assert paired.seeds_to_exclude_zero(0.06, 0.05) == 6  # n = 5: 2.776 x 0.05 / 2.236 = 0.062; n = 6: 0.0525
    assert paired.seeds_to_exclude_zero(0.001, 0.5) is None
    shown = {"rule": "greater", "verdict": "shown", "threshold": 0.05}
    assert paired.excludes_zero({**shown, "ci": [0.01, 0.2]}) and not paired.excludes_zero(
        {**shown, "ci": [-0.01, 0.2]})
    assert paired.excludes_zero({**shown, "verdict": "the opposite", "ci": [-0.28, -0.01]})
    matches = {"rule": "matches", "verdict": "shown", "threshold": 0.05}
    assert paired.excludes_zero({**matches, "ci": [-0.04, 0.2]}) and not paired.excludes_zero(
        {**matches, "ci": [-0.06, 0.2]})


@pytest.mark.parametrize("rule, diffs, verdict", [
    ("greater", [0.1, 0.08, 0.12, 0.06, -0.01], "shown"),          # mean 0.07 >= 0.05; 4 of 5 positive
    ("greater", [0.3, 0.2, -0.1, -0.05, 0.0], "not shown"),        # mean 0.07, but only 2 of 5 positive
    ("greater", [-0.1, -0.08, -0.12, -0.06, 0.01], "the opposite"),
    ("matches", [-0.03, 0.0, 0.02, -0.04, -0.19], "shown"),        # mean -0.048 >= -0.05; 4 of 5 within 0.05
    ("matches", [-0.1, -0.2, -0.1, -0.3, 0.1], "the opposite"),
    ("matches", [-0.1, 0.0, 0.05, -0.1, -0.02], "not shown"),      # mean -0.034, but 2 of 5 beyond -0.05
])
def test_each_rule_gives_its_verdict(rule, diffs, verdict):
    assert paired.verdict(rule, 0.05, paired.summarise(diffs)) == verdict


def write_run(out, name, seed, points, evals=(), run_seed=None):
    folder = out / (f"{name}-s{seed}" + (f"-run{run_seed}" if run_seed is not None else ""))
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
        declared.c("decline: IP - SP", ("voting-ip", "decline", "success"), ("voting-sp", "decline", "success"))]}
    result = findings.judge_finding(str(tmp_path), list(range(5)), finding)
    assert result["verdict"] == "shown"
    assert result["comparisons"][0]["mean"] == pytest.approx(0.3 - 0.01 * 2 / 3, abs=1e-9)  # SP's mean decline
    page = tmp_path / "findings.md"
    page.write_text("Prose.\n<!-- table:finding-4 -->\nold\n<!-- /table:finding-4 -->\nMore prose.\n")
    assert tables.fill_tables(str(page), {"finding-4": tables.finding_table(result), "other": "x"}) == ["other"]
    text = page.read_text()
    assert text.startswith("Prose.\n") and text.endswith("More prose.\n") and "old" not in text
    assert "| decline: IP - SP | 0.30 / 0.01 |" in text
    assert "**Verdict: shown.** Its comparisons: 1 shown." in text


def test_a_comparison_beside_the_main_ones_is_reported_and_takes_no_part_in_the_verdict(tmp_path):
    """Finding 5 keeps its first metric beside the predeclared one: IP declines by 0.3 in every seed (the main
    comparison, shown); beside it, SP minus IP (the opposite) shows in the table, marked, and the verdict stays
    the main comparison's."""
    for seed in range(5):
        write_run(tmp_path, "voting-ip", seed, [0.4, 0.7, 0.7, 0.7, 0.4, 0.4, 0.4])
        write_run(tmp_path, "voting-sp", seed, [0.4, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6])
    decline = (("voting-ip", "decline", "success"), ("voting-sp", "decline", "success"))
    finding = {"id": "5", "claim": "x", "comparisons": [declared.c("decline: IP - SP", *decline)],
               "beside": [declared.c("decline: SP - IP", *decline[::-1])]}
    result = findings.judge_finding(str(tmp_path), list(range(5)), finding)
    assert result["verdict"] == "shown" and [c["verdict"] for c in result["beside"]] == ["the opposite"]
    table = tables.finding_table(result)
    assert "| decline: IP - SP | 0.30 / 0.00 |" in table
    assert "| beside: decline: SP - IP | 0.00 / 0.30 |" in table and "| the opposite |" in table
    assert "Its comparisons: 1 shown." in table  # the verdict line counts the main comparison alone


def test_the_studys_swapped_pairs_are_eval_pys():
    """infra/ never imports eval.py, so the study copies the pairs `--mode swapped` exchanges by default; a change
    to one must reach the other."""
    import eval
    assert {name: pair for name, (_, pair) in declared.SWAPPED.items()} == \
        {f"{w}-ip": eval.swap_pair({"workflow": w, "policy": "ip"}, None) for w in ("voting", "evalopt", "orchworkers")}


def test_the_study_writes_the_sweep_and_each_findings_table_on_the_page_that_has_its_markers(tmp_path):
    """write_tables fills every marker from study.json's content, on the findings page or its companion pages
    (tables.COMPANIONS): the sweep unsigned, on its history page, and the finding's table with its verdict line,
    which counts the comparisons' verdicts (a `greater` the opposite by the rule only: its interval crosses zero)."""
    page = tmp_path / "findings.md"
    (tmp_path / "findings").mkdir()
    (tmp_path / "findings" / "history.md").write_text("<!-- table:sweep -->\nold\n<!-- /table:sweep -->\n")
    page.write_text("<!-- table:finding-I1/I6 -->\n<!-- /table:finding-I1/I6 -->\n")  # not written yet: empty
    sweep = {"rule": "r", "choice": "1e-3", "rates": {"1e-3": {"base": [0.5, 0.4], "peak": [0.9, 0.8],
                                                              "end": [0.85, 0.7], "holds": 1}}}
    compared = [dict(declared.c(label, ("x", "end", "y")), **paired.summarise(diffs), a=diffs, b=[0.0, 0.0],
                     verdict=verdict)
                for label, diffs, verdict in (("P(a | b)", [0.1, 0.1], "shown"), ("I6", [-0.1, -0.1], "the opposite"))]
    judged = {"id": "I1/I6", "claim": "anchors help", "verdict": "not shown", "preconditions": [],
              "comparisons": compared}
    tables.write_tables(str(page), {"seeds": [0, 1], "sweep": sweep, "findings": [judged]})
    text, history = page.read_text(), (tmp_path / "findings" / "history.md").read_text()
    assert "\nold\n" not in history and "| 1e-3 | 0.50 0.40 | 0.90 0.80 | 0.85 0.70 | 1 of 2 |" in history
    assert "| I6 | -0.10 / 0.00 | -0.10 -0.10 | -0.100 [-0.10, -0.10] | the opposite |" in text
    assert "| P(a \\| b) | 0.10 / 0.00 |" in text  # a pipe in a label is escaped, not a new cell
    assert ("**Verdict: not shown.** Its comparisons: 1 shown, 1 the opposite.\n<!-- /table:finding-I1/I6 -->"
            in text)


def test_the_calibration_table_names_each_seeds_misses_its_gap_and_where_it_was_built(tmp_path):
    """A seed's row: its misses (or none, in bold), the base and oracle accuracies in the four workflows, the
    solver's right rate minus the oracle's (0.46 - 0.52 = -0.060), and its build's minutes, threads and CPU kind
    (an older toy.json without one says so)."""
    accuracy = {"single": 0.5, "voting": 0.55, "evalopt": 0.7, "orchworkers": 0.6}
    record = {"success": accuracy, "oracle_success": {w: a + 0.1 for w, a in accuracy.items()},
              "habits": {"solve": {"right": 0.46, "oracle_right": 0.52}}}
    table = tables.calibration_table(
        [dict(record, seed=3, missed=[]), dict(record, seed=4, missed=["retry: careful rate"])],
        [{"minutes": 36.04, "threads": 1, "versions": {"cpu_capability": "AVX512"}}, {"minutes": 18.2, "threads": 2}])
    rows = table.splitlines()
    assert len(rows) == 4 and rows[0].startswith("| seed | targets missed |")
    assert rows[2] == ("| 3 | **none** | 0.500 / 0.550 / 0.700 / 0.600 | 0.600 / 0.650 / 0.800 / 0.700 | -0.060 | "
                       "36 min, 1 thread, AVX512 |")
    assert rows[3].startswith("| 4 | 1: retry: careful rate | ") and rows[3].endswith(
        "| 18 min, 2 threads, CPU not recorded |")


def test_eval_values_come_from_the_test_problems(tmp_path):
    write_run(tmp_path, "voting-sp", 0, [0.5], evals=[("trained", 0.7), ("base", 0.4)])
    assert findings.value(str(tmp_path), 0, declared.ev("voting-sp")) == 0.7
    assert findings.value(str(tmp_path), 0, declared.ev("voting-sp", "base")) == 0.4
    assert math.isnan(findings.value(str(tmp_path), 0, declared.ev("voting-sp", "sa-transfer")))


def write_calibrations(out, records):
    (out / "calibration").mkdir(parents=True)
    for r in records:
        (out / "calibration" / f"seed{r['seed']}.jsonl").write_text(json.dumps(r) + "\n")


def test_a_seed_whose_model_misses_calibration_is_set_aside_and_the_next_one_taken(tmp_path, capsys,
                                                                                   monkeypatch):
    """The study's seeds are the first N whose toy model passes calibration: seed 1's record names a missed
    target, so a 3-seed study runs seeds 0, 2 and 3 (a dry run counts a seed without a record as calibrated),
    and says which seed it set aside and why. Seed 2 is built then calibrated; seed 3's model is in the
    cache, so it is only calibrated."""
    out = tmp_path / "s"
    write_calibrations(out, [{"seed": 0, "missed": []}, {"seed": 1, "missed": ["solve: right - oracle"]}])
    monkeypatch.setattr(study.toy, "ready", lambda seed: seed == 3)
    monkeypatch.setattr(study.toy_model, "COMMITTED", str(tmp_path / "no-models"))  # every seed built here
    study.main(["--dry-run", "--out", str(out), "--seeds", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[3] for ln in lines if ln.startswith("eval.py calibrate")] == ["2", "2", "3"]
    assert [ln.split()[3] for ln in lines if ln.endswith("--build-only")] == ["2"]
    assert sorted({ln.split("--seed ")[1].split()[0] for ln in lines if ln.startswith("train.py")}) == \
        ["0", "2", "3"]
    assert any(ln.startswith("seed 1: ") and "solve: right - oracle" in ln and "set aside" in ln for ln in lines)


def test_the_clock_waits_only_for_the_builds_and_calibrations_a_seed_runs(tmp_path, monkeypatch):
    """Planned for 3 seeds, the clock waits for none of seed 0's (calibrated before), only seed 1's calibration
    (its model is cached) and both of seed 2's: 1 build and 2 calibrations left, at 34 and 3 minutes each."""
    out = tmp_path / "s"
    write_calibrations(out, [{"seed": 0, "missed": []}])
    monkeypatch.setattr(study.toy, "ready", lambda seed: seed == 1)
    monkeypatch.setattr(study.toy_model, "COMMITTED", str(tmp_path / "no-models"))  # every seed built here
    clock = jobs.Clock(1)
    clock.plan("build", 3), clock.plan("calibrate", 3)
    study.calibrated_seeds(str(out), 3, [0, 1, 2, 3], 1, clock, dry_run=True)
    assert (clock.planned["build"], clock.planned["calibrate"]) == (1, 2)
    assert clock.left() == 1 * 34.0 + 2 * 3.0


def test_the_clock_waits_only_for_the_runs_and_evaluations_left(tmp_path, monkeypatch):
    """A study invoked again finds seed 0's 54 runs trained and evaluated: planned for 2 seeds, the clock waits
    for seed 1's 54 runs (six configurations x 6, six x 3) and 72 evaluations only (51 multi-agent runs, base on
    three workflows, two SA modes on their first configuration's 3 runs each; before, such an invocation ended
    saying 'about 52 min left')."""
    out = tmp_path / "s"
    for name, seed, run_seed in jobs.every_run(list(declared.GRID), [0]):
        folder = out / jobs.run_name(name, seed, run_seed)
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 150}) + "\n")
        (folder / "eval.jsonl").write_text("".join(json.dumps({"mode": m}) + "\n"
                                                   for m in [*declared.MODES, "swapped"]))
    started = []
    monkeypatch.setattr(study, "run_all", lambda chains, *args: started.append(sum(map(len, chains))))
    clock = jobs.Clock(2)
    assert sum(map(declared.runs_a_seed, declared.GRID)) == 54 and study.evals_per_seed(list(declared.GRID)) == 72
    clock.plan("train", 54 * 2), clock.plan("eval", 72 * 2)
    clock.took["train"] = [0.4] * 15  # the sweep's single-agent runs
    study.train_and_evaluate(str(out), list(declared.GRID), [0, 1], 150, "1e-3", 2, 2, clock, dry_run=False)
    assert started == [54, 72]  # commands: seed 1's runs, then its evaluations
    assert (clock.planned["train"], clock.planned["eval"]) == (54, 72)
    # the grid's runs are estimated afresh, not at the sweep's 0.4 minutes (after the sweep the study said
    # 'about 27 min left' with 56 to go)
    assert clock.left() == pytest.approx((54 * jobs.MINUTES["train"] + 72 * jobs.MINUTES["eval"]) / 2)


def test_a_replication_takes_the_seeds_after_the_studys_and_keeps_their_calibration(tmp_path, monkeypatch):
    """`--replicate 2` after a study of seeds 0-3 and 5 (4 set aside): the candidates start at 6, the grid runs on
    the seeds that pass, and study.json (in --out and --results) gains the replication: its seeds, each one's build
    and calibration record (a clone's `--model toy --seed 7` reads it), and each comparison's rows."""
    out, results = tmp_path / "s", tmp_path / "results"
    write_calibrations(out, [{"seed": 6, "missed": ["solve: right - oracle"]}, {"seed": 7, "missed": []},
                             {"seed": 8, "missed": []}])
    results.mkdir()
    (out / "study.json").write_text(json.dumps({"seeds": [0, 1, 2, 3, 5], "set_aside": [{"seed": 4, "missed": []}],
                                                "steps": 150, "lr": "1e-3", "findings": [], "sweep": {},
                                                "names": ["single"]}))
    ran = []
    monkeypatch.setattr(study.toy, "ready", lambda seed: True)
    monkeypatch.setattr(study.toy, "build_record", lambda seed: {"seed": seed, "minutes": 30.0})
    def run_all(chains, *args):  # every seed is calibrated already: each seed's chain is empty
        while chains() is not None:
            pass
    monkeypatch.setattr(study, "run_all", run_all)
    monkeypatch.setattr(study, "train_and_evaluate", lambda out, names, seeds, *args: ran.append(seeds))
    monkeypatch.setattr(study.findings, "keep_results", lambda *args: None)
    study.main(["--out", str(out), "--replicate", "2", "--results", str(results)])
    assert ran == [[7, 8]]
    for folder in (out, results):
        rep = json.loads((folder / "study.json").read_text())["replication"]
        assert rep["seeds"] == [7, 8] and rep["set_aside"] == [{"seed": 6, "missed": ["solve: right - oracle"]}]
        assert [r["seed"] for r in rep["calibration"]] == [6, 7, 8] and rep["builds"][1] == {"seed": 7, "minutes": 30}
        assert rep["rows"] == []


def test_too_few_calibrated_seeds_stop_the_study_before_a_run(tmp_path, monkeypatch):
    """When fewer than N of the CANDIDATES seeds pass, the study stops before any run, naming the ones set
    aside."""
    out = tmp_path / "s"
    write_calibrations(out, [{"seed": s, "missed": [] if s == 0 else ["judge: right - oracle"]} for s in range(3)])
    monkeypatch.setattr(declared, "CANDIDATES", 3)
    with pytest.raises(SystemExit) as stopped:
        study.main(["--out", str(out), "--seeds", "2"])
    assert "only 1 of seeds 0-2" in str(stopped.value) and "set aside: 1, 2" in str(stopped.value)
    assert not list(out.glob("single*"))


def test_the_figures_read_the_studys_own_seeds(tmp_path):
    """With seed 1 set aside, the bands read seeds 0 and 2 by name (seed 1 has no run folder, and a seed with no
    steps would leave its configuration out of the figure)."""
    from toyworld import figures
    write_run(tmp_path, "voting-sp", 0, [0.2, 0.4])
    write_run(tmp_path, "voting-sp", 2, [0.6, 0.8])
    steps, curves = figures.seed_curves(str(tmp_path), "voting-sp", [0, 2], "val/success")
    assert steps == [0, 10] and curves == [[0.2, 0.4], [0.6, 0.8]]


def test_a_near_rows_table_gives_a_alone(tmp_path):
    """A `near` comparison has no B: its row shows A's mean, not 'A / 0.00'."""
    for seed in range(2):
        folder = tmp_path / f"voting-sp-s{seed}"
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "generator/loss_share": 0.75}) + "\n"
                                                      for s in range(1, 4)))
    finding = {"id": "3", "claim": "shares", "comparisons": [
        declared.c("share", ("voting-sp", "train", "generator/loss_share"), rule="near", target=0.75)]}
    table = tables.finding_table(findings.judge_finding(str(tmp_path), [0, 1], finding))
    assert "| share | 0.75 | +0.75 +0.75 | +0.750 [+0.75, +0.75] | shown |" in table


def test_the_compact_results_keep_the_curves_the_page_reads_and_draw_the_same_tables(tmp_path):
    """keep_results copies a run's validation curves, the RESULTS training curves (to 4 decimals), its evaluations
    and voting-sp-s0's kept samples at step 150 (KEPT_SAMPLES), and nothing else, into one file, a line per record;
    a finding judged on the copy equals the one judged on the run."""
    from toyworld.results import records
    out, kept = tmp_path / "runs", tmp_path / "results"
    for seed in range(3):
        folder = out / f"voting-sp-s{seed}"
        (folder / "samples").mkdir(parents=True)
        # values a float holds exactly at 4 decimals: a judgment on the copy is the same float for float
        rows = [{"step": s, "val/success": 0.5 + 0.00625 * s * (seed + 1), "generator/loss_share": 0.75123456,
                 "aggregator/adv_std": 0.3, "time/rollout": 1.0} for s in range(0, 40, 10)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "eval.jsonl").write_text(json.dumps({"mode": "trained", "dataset": "math-d0-test",
                                                       "metrics": {"accuracy": 0.6}}) + "\n")
        for step in (140, 150):
            (folder / "samples" / f"step_000{step}.json").write_text(json.dumps({"step": step, "episodes": []}))
    findings.keep_results(str(out), [f"voting-sp-s{s}" for s in range(3)], str(kept))
    lines = [json.loads(line) for line in (kept / "study.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * (4 + 1) + 1 and os.listdir(kept) == ["study.jsonl"]
    assert lines[0] == {"run": "voting-sp-s0", "file": "metrics.jsonl",
                        "record": {"step": 0, "val/success": 0.5, "generator/loss_share": 0.7512}}
    assert records(str(kept), "voting-sp-s2", "eval.jsonl") == records(str(out), "voting-sp-s2", "eval.jsonl")
    assert records(str(kept), "voting-sp-s0", "samples/step_000150.json") == [{"step": 150, "episodes": []}]
    assert records(str(kept), "voting-sp-s1", "samples/step_000150.json") == []  # only the caption's run
    finding = {"id": "x", "claim": "c", "comparisons": [declared.c("end", ("voting-sp", "end", "success")),
                                                        declared.c("test", declared.ev("voting-sp"))]}
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # noqa: E731 (NaN == NaN)
    assert same(findings.judge_finding(str(kept), [0, 1, 2], finding),
                findings.judge_finding(str(out), [0, 1, 2], finding))


def test_a_replication_seed_repeats_a_comparison_when_its_sign_and_threshold_hold(tmp_path):
    """Per comparison, how many replication seeds have the study's sign and pass the rule's threshold alone:
    each seed's two runs end +d and +d + 0.02 above SP's, so its value is d + 0.01: +0.31, +0.03 and -0.09
    against a study mean of +0.2 are 2 of 3 in sign, 1 of 3 past `greater`'s 0.05. Beside them the runs' spread:
    each seed's two run differences sit 0.01 from their mean, so the run SD is sqrt(2 x 0.01^2 / 1) = 0.014; the
    seed SD of +0.31, +0.03, -0.09 is 0.205 (by hand: deviations +0.2267, -0.0533, -0.1733, squares summed
    0.0843, over 2, square root)."""
    for seed, d in {5: 0.30, 6: 0.02, 7: -0.10}.items():
        for run_seed, e in ((None, d), (1000 + seed, d + 0.02)):
            write_run(tmp_path, "voting-ip", seed, [0.4, 0.5 + e, 0.5 + e, 0.5 + e], run_seed=run_seed)
            write_run(tmp_path, "voting-sp", seed, [0.4, 0.5, 0.5, 0.5], run_seed=run_seed)
    spec = {"id": "4", "claim": "", "comparisons": [
        declared.c("end: IP - SP", ("voting-ip", "end", "success"), ("voting-sp", "end", "success"))]}
    judged = findings.judge_finding(str(tmp_path), [5], spec)  # as study.json keeps it: `a` the per-seed values
    judged["comparisons"][0].update(mean=0.2, verdict="shown")
    (row,) = findings.replication(str(tmp_path), [5, 6, 7], [judged], [spec])
    assert row["per_seed"] == pytest.approx([0.31, 0.03, -0.09])
    assert (row["same_sign"], row["passes"], row["seeds"], row["study"]) == (2, 1, 3, "shown")
    assert (row["runs"], row["run_sd"]) == (2, pytest.approx(math.sqrt(2 * 0.01 ** 2)))  # exact to rounding
    table = tables.replication_table({"seeds": [5, 6, 7], "set_aside": [{"seed": 8}], "rows": [row]}, [judged])
    # each seed by the rule alone (greater 0.05): +0.31 shown, +0.03 not shown, -0.09 the opposite; 1 agrees
    assert table.startswith("Seeds 5, 6, 7 (set aside: 8).")
    assert "| end: IP - SP | shown, not shown, the opposite | 1 of 3 |" in table
    assert tables.runs_cell(row) == "2: 0.014 / 0.205"


def test_a_replication_seed_agrees_with_the_studys_verdict_apart_from_the_claims_direction(tmp_path):
    """A study verdict of "the opposite" (I6's -0.06): a held-out seed at +0.09 goes the claim's way (shown) and
    does not agree; one at -0.06 agrees; one at +0.00003 is a tie, printed 0.00, neither."""
    for seed, d in {6: 0.09, 10: -0.06, 11: 0.00003}.items():
        write_run(tmp_path, "voting-ip", seed, [0.4, 0.5 + d, 0.5 + d, 0.5 + d])
        write_run(tmp_path, "voting-sp", seed, [0.4, 0.5, 0.5, 0.5])
    spec = {"id": "I1/I6", "claim": "", "comparisons": [
        declared.c("end: I6", ("voting-ip", "end", "success"), ("voting-sp", "end", "success"))]}
    judged = findings.judge_finding(str(tmp_path), [6], spec)
    judged["comparisons"][0].update(mean=-0.06, verdict="the opposite")
    rows = findings.replication(str(tmp_path), [6, 10, 11], [judged], [spec])
    table = tables.replication_table({"seeds": [6, 10, 11], "set_aside": [], "rows": rows}, [judged])
    # one run a seed: no run SD; the seeds' SD of +0.09, -0.06, +0.00003 is 0.075; the tie is printed 0.00
    assert "| end: I6 | shown, the opposite, not shown | 1 of 3 |" in table
    assert tables.runs_cell(rows[0]) == "1: n/a / 0.075"
    assert " ".join(map(tables.fmt_seed, rows[0]["per_seed"])) == "+0.09 -0.06 0.00"
    assert rows[0]["run_sd"] is None  # null in study.json, not NaN


@pytest.mark.parametrize("diffs, verdict", [
    ([0.0, -0.13, 0.0, -0.09, -0.16], "the opposite"),  # Eval-Opt IP - SA-RL: ties are no seed for A
    ([0.02, -0.13, 0.01, -0.09, -0.16], "not shown"),   # two seeds ahead by 0.005 or more
    ([0.004, -0.13, 0.0, -0.09, -0.16], "the opposite"),  # +0.004 is a tie (paired.TIE)
    ([-0.01, -0.02, 0.0, -0.01, -0.02], "not shown"),   # the mean, -0.012, is not past -0.05
])
def test_the_contradiction_rule_counts_a_tie_for_neither_side(diffs, verdict):
    assert paired.verdict("contradicts", 0.05, paired.summarise(diffs)) == verdict
    assert paired.verdict("greater", 0.05, paired.summarise([0.0, -0.13, 0.0, -0.09, -0.16])) == "not shown"


@pytest.mark.parametrize("rule, x, verdict", [
    ("greater", 0.05, "shown"), ("greater", 0.049, "not shown"), ("greater", -0.05, "the opposite"),
    ("matches", -0.05, "shown"), ("matches", -0.0547, "the opposite"), ("contradicts", -0.08, "the opposite"),
    ("contradicts", 0.06, "shown"), ("near", 0.79, "shown"), ("near", 0.81, "not shown"),
])
def test_one_seed_is_judged_by_its_rules_threshold_alone(rule, x, verdict):
    assert paired.seed_verdict(rule, 0.05, x, target=0.75 if rule == "near" else None) == verdict


def test_the_verdict_table_says_a_rules_verdict_and_the_seeds_when_they_disagree():
    """The main table holds a predeclared comparison: its verdict by its rule (here not shown), the mean with its
    t-interval, what the seeds tell apart from 0, the held-out differences as they are. The test written after the
    data is in the dated table beneath, with its ties and the held-out agreement; a verdict 'not shown' with no seed
    of seven on A's side (two ties) gets a line saying both."""
    from toyworld import verdicts

    def compared(label, per_seed, verdict, rule="greater"):
        return dict(declared.c(label, ("x", "end", "y"), rule=rule), **paired.summarise(per_seed), verdict=verdict)
    exception = [0.0, -0.13, 0.0, -0.09, -0.16]
    study_json = {"seeds": [0, 1, 2, 3, 5], "findings": [
        {"id": "1", "verdict": "not testable here", "preconditions": [],
         "comparisons": [compared("Eval-Opt: trained IP - SA-RL", exception, "not shown")]}],
        "replication": {"seeds": [6, 10], "rows": [
            {"finding": "1", "label": "Eval-Opt: trained IP - SA-RL", "per_seed": [-0.08, -0.24]}]}}
    after = {"findings": [{"id": "exception", "preconditions": [], "comparisons": [
        compared("Eval-Opt: trained IP - SA-RL", exception, "the opposite", "contradicts")]}], "replication": [
        {"finding": "exception", "label": "Eval-Opt: trained IP - SA-RL", "per_seed": [-0.08, -0.24]}]}
    claims = [c for c in verdicts.CLAIMS if c[0] == "Only Eval-Opt under IP beats SA-RL"]
    post_hoc = [p for p in verdicts.POST_HOC if p[3][0][0] == "exception"]
    original = verdicts.CLAIMS, verdicts.POST_HOC
    verdicts.CLAIMS, verdicts.POST_HOC = claims, post_hoc
    try:
        table = verdicts.verdict_table(study_json, after)
    finally:
        verdicts.CLAIMS, verdicts.POST_HOC = original
    assert "| the paper's claim | comparison (A - B), rule | verdict, seeds 0, 1, 2, 3, 5 |" in table
    # the mean -0.076 and its t-interval, half-width 2.776 x 0.0330 (the SE) = 0.091: [-0.17, +0.02]
    # the seeds' SD is 0.074 (0.0330 x sqrt 5); with nothing there the rule passes about 5.5% of the time at that
    # spread (simulated: printed to the whole percent), and a true difference of 0.124 (1.68 x 0.074) is detected
    # 80% of the time (toyworld/power.py; tests/test_power.py holds both by hand)
    assert ("| Only Eval-Opt under IP beats SA-RL ([finding 1: not testable here](#finding-1)) | Eval-Opt: trained "
            "IP - SA-RL (greater 0.05) | **not shown** | -0.076 [-0.17, +0.02] | 5% | 0.12 | -0.08 -0.24 |") in table
    assert ("| 2026-12-04 (after the replication) | [Eval-Opt IP does not beat SA-RL (the "
            "contradiction of finding 1's exception)](#finding-1) | Eval-Opt: trained IP - SA-RL (contradicts 0.05) "
            "| the opposite by the rule only (2 of 5 tie at 0) | -0.076 [-0.17, +0.02] | -0.08 -0.24, agree 2 of 2 |"
            ) in table
    assert ("Rule and seeds disagree: Eval-Opt: trained IP - SA-RL: **not shown** by its rule, while no seed of 7 "
            "is above zero (2 tie at 0); by the rule written after the data, **the opposite**.") in table


def test_the_tables_alone_are_rewritten_from_a_results_folder_and_a_folder_without_one_is_refused(tmp_path,
                                                                                                 capsys):
    with pytest.raises(SystemExit) as stop:
        study.main(["--tables", "--results", str(tmp_path), "--doc", str(tmp_path / "page.md")])
    assert stop.value.code == 2 and "holds no study.json" in capsys.readouterr().err
    assert not (tmp_path / "page.md").exists()


def test_the_toy_preset_is_the_studys_single_agent_which_rises_by_its_last_step():
    """`--model toy` runs the single agent at the sweep's rate for FIRST_RUN's steps: in the study's committed run
    of every seed, validation accuracy at that step is above step 0's by more than 0.2 (the smallest rise: seed 3,
    0.469 to 0.836)."""
    from toyworld import toy_hooks
    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "findings", "results")
    committed = json.load(open(os.path.join(results, "study.json")))
    preset = toy_hooks.FIRST_RUN
    assert (preset["workflow"], float(committed["lr"])) == ("single", preset["lr"])
    rises = {}
    for seed in committed["seeds"]:
        points = dict(findings.series(results, "single", seed, "val/success"))
        rises[seed] = (points[0], points[preset["steps"]])
        assert points[preset["steps"]] - points[0] > 0.2, seed
    assert min(rises, key=lambda s: rises[s][1] - rises[s][0]) == 3 and rises[3] == (0.4688, 0.8359)
    quoted = ", ".join(f"{rises[s][1]:.2f}" for s in (0, 1, 2)), ", ".join(f"{rises[s][0]:.2f}" for s in (0, 1, 2))
    assert quoted == ("0.91, 0.91, 0.86", "0.52, 0.48, 0.47")  # the README's first paragraph quotes them


def test_a_spare_core_calibrates_the_next_candidate_beside_the_last_seed_needed(tmp_path, monkeypatch):
    """Seeds 0-3 pass, one more is wanted, two jobs: seed 5 starts beside seed 4 (before, it waited for seed 4's
    result and ran alone, 3 minutes with a core idle). Seed 4 misses, so seed 5 is the study's fifth; had seed 4
    passed, seed 5's record would be kept and not used. When seed 4 misses, no second spare (seed 6) starts beside
    seed 5, which is about to end: the study would wait for it (it did: 2.7 minutes with a core idle)."""
    out = tmp_path / "s"
    write_calibrations(out, [{"seed": s, "missed": []} for s in range(4)])
    monkeypatch.setattr(study.toy, "ready", lambda seed: True)  # no builds: one calibration per seed
    started_together = []

    def record(seed):
        missed = ["solve: right - oracle"] if seed == 4 else []
        (out / "calibration" / f"seed{seed}.jsonl").write_text(json.dumps({"seed": seed, "missed": missed}))

    def run_all(chains, dry_run, jobs_, clock, note):  # both jobs start; seed 4 ends, then seed 5
        commands = [chain[0][0] for chain in iter(chains, None) if chain]  # a recorded seed's chain is empty
        started_together.append([int(c[c.index("--seed") + 1]) for c in commands])
        record(4)
        assert chains() is None  # seed 5 still runs: no seed 6
        record(5)
        assert chains() is None
    monkeypatch.setattr(study, "run_all", run_all)
    clock = jobs.Clock(2)
    clock.plan("calibrate", 5)
    seeds, set_aside = study.calibrated_seeds(str(out), 5, list(range(10)), 2, clock, dry_run=False)
    assert started_together == [[4, 5]]
    assert seeds == [0, 1, 2, 3, 5] and set_aside == [{"seed": 4, "missed": ["solve: right - oracle"]}]
    assert clock.planned["calibrate"] == 2  # 5 planned, 4 recorded before: seed 4 and the spare


def test_the_grids_single_agent_run_is_the_sweeps_run_at_its_rate_copied(tmp_path, monkeypatch):
    """The grid's `single` at the sweep's rate is the sweep's train.py command flag for flag, so its finished run
    is copied (args.json naming the new folder, the log beside it), not trained again; on a seed without a sweep
    run (a replication seed) it trains."""
    out = tmp_path / "s"
    sweep = out / "single-lr3e-4-s0"
    (sweep / "checkpoints" / "step_000150").mkdir(parents=True)
    (sweep / "metrics.jsonl").write_text(json.dumps({"step": 150}) + "\n")
    (sweep / "args.json").write_text(json.dumps({"workflow": "single", "lr": 3e-4, "run_dir": str(sweep)}))
    (out / "single-lr3e-4-s0.log").write_text("step 150\n")
    started = []
    monkeypatch.setattr(study, "run_all", lambda chains, *args: started.extend(c[0][0] for c in chains))
    study.train_and_evaluate(str(out), ["single", "voting-sp"], [0, 1], 150, "3e-4", 2, 2, None, dry_run=False)
    copy = out / "single-s0"
    assert json.loads((copy / "args.json").read_text()) == {"workflow": "single", "lr": 3e-4, "run_dir": str(copy)}
    assert (copy / "metrics.jsonl").read_text() == (sweep / "metrics.jsonl").read_text()
    assert (out / "single-s0.log").read_text() == "step 150\n" and (copy / "checkpoints" / "step_000150").is_dir()
    trained = [c[c.index("--run-dir") + 1].rsplit("/", 1)[1] for c in started if c[1] == "train.py"]
    # the single agent's other runs train (run seeds 1000 + seed, 2000 + seed), and voting-sp's 6
    assert trained == ["single-s0-run1000", "single-s0-run2000", *[f"voting-sp-s0{r}" for r in (
        "", "-run1000", "-run2000", "-run3000", "-run4000", "-run5000")], "single-s1", "single-s1-run1001",
        "single-s1-run2001", *[f"voting-sp-s1{r}" for r in ("", "-run1001", "-run2001", "-run3001", "-run4001",
                                                              "-run5001")]]
    assert study.sweep_twin("single", "1e-3") == "single-lr1e-3" and study.sweep_twin("voting-sp", "1e-3") is None


def test_a_run_the_compact_results_lack_is_one_line(tmp_path, capsys):
    """`python -m toyworld.results FOLDER RUN FILE`: a run's file, a record a line; a run the folder
    does not hold is one line on stderr, exit status 2."""
    from toyworld import results
    results.write_pack(str(tmp_path / "study.jsonl"), [("voting-sp-s0", "eval.jsonl", {"mode": "base"}),
                                                       ("voting-sp-s0", "eval.jsonl", {"mode": "trained"})])
    results.main([str(tmp_path), "voting-sp-s0", "eval.jsonl"])
    assert capsys.readouterr().out == '{"mode": "base"}\n{"mode": "trained"}\n'
    with pytest.raises(SystemExit) as stop:
        results.main([str(tmp_path), "voting-sp-s9", "eval.jsonl"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: {tmp_path} has no eval.jsonl of the run voting-sp-s9\n"


def test_a_configurations_other_runs_are_its_command_with_a_run_seed(tmp_path):
    """A configuration's runs on a seed after the study's own are its command (study.train_command) with
    --run-seed seed + k x 1000, each in a folder named for it; a stopped one resumes."""
    from toyworld.jobs import run_name, run_seeds
    from toyworld.study import flags_of, train_command
    folder = str(tmp_path / "voting-ip-s3-run1003")
    assert run_seeds("voting-ip", 3) == [None, 1003, 2003, 3003, 4003, 5003]
    assert run_seeds("evalopt-sp", 3) == [None, 1003, 2003] and run_seeds("single-lr1e-4", 3) == [None]
    assert run_name("voting-ip", 3, 1003) == "voting-ip-s3-run1003" and run_name("voting-ip", 3) == "voting-ip-s3"
    assert train_command(str(tmp_path), "voting-ip", 3, 150, "1e-3", 1003) == [
        sys.executable, "train.py", *declared.TRAIN, *flags_of("voting-ip", "1e-3"), "--seed", "3", "--run-seed",
        "1003", "--steps", "150", "--run-dir", folder]
    os.makedirs(folder)
    (tmp_path / "voting-ip-s3-run1003" / "args.json").write_text("{}")
    assert train_command(str(tmp_path), "voting-ip", 3, 150, "1e-3", 1003)[2:] == ["--resume", folder, "--steps",
                                                                                 "150"]
    assert (declared.RUNS, declared.DECLINE_RUNS, declared.RUN_SEED_STEP) == (3, 6, 1000)


def test_a_seeds_value_is_the_mean_of_its_runs_and_their_spread_is_reported(tmp_path):
    """With several runs of a configuration on a seed in the results, every quantity (a decline, a peak) is each
    seed's mean over its runs, and a comparison reports the runs a seed and the run-to-run SD of one run's
    difference, runs paired by run seed. By hand, from curves of 6 validation points (the peak and the end are the
    means of the first and the last 3): on seed 0 A's runs decline 0.3, 0.1 and 0.2, B's 0.0, 0.0 and 0.1; the run
    differences 0.3, 0.1, 0.1 have mean 0.1667 and SD sqrt((0.1333^2 + 2 x 0.0667^2) / 2) = 0.1155. Seed 1 has one
    run (0.2 - 0.0): nothing to the spread, and the fewest runs a seed is 1. A's peaks on seed 0: 0.8, 0.6, 0.7,
    their mean 0.7."""
    from toyworld.results import write_pack

    def curve(run, points):  # windows of 3: peak = the best 3-point mean, end = the last 3
        return [(run, "metrics.jsonl", {"step": 10 * i, "val/success": v}) for i, v in enumerate(points)]
    flat = [0.5, 0.5, 0.5]
    study_rows = curve("a-s0", [0.8, 0.8, 0.8, 0.5, 0.5, 0.5]) + curve("b-s0", flat * 2) + \
        curve("a-s1", [0.7, 0.7, 0.7, 0.5, 0.5, 0.5]) + curve("b-s1", flat * 2)
    rerun_rows = curve("a-s0-run1000", [0.6, 0.6, 0.6, 0.5, 0.5, 0.5]) + curve("b-s0-run1000", flat * 2) + \
        curve("a-s0-run2000", [0.7, 0.7, 0.7, 0.5, 0.5, 0.5]) + curve("b-s0-run2000", [0.6, 0.6, 0.6] + flat)
    write_pack(str(tmp_path / "study.jsonl"), study_rows + rerun_rows)
    out = str(tmp_path)
    assert findings.runs_of(out, "a", 0) == ["", "-run1000", "-run2000"] and findings.runs_of(out, "a", 1) == [""]
    runs = findings.run_values(out, 0, ("a", "decline", "success"))
    assert list(runs) == ["", "-run1000", "-run2000"] and list(runs.values()) == pytest.approx([0.3, 0.1, 0.2])
    assert findings.value(out, 0, ("a", "decline", "success")) == pytest.approx(0.2)
    assert findings.value(out, 0, ("a", "peak", "success")) == pytest.approx(0.7)
    # a side with one run (eval.py's base: the same on every run) paired with each run of the other
    assert paired.run_differences({"": 0.5, "-run1000": 0.7}, {"": 0.4}) == pytest.approx([0.1, 0.3])
    assert paired.run_differences({"": 0.5, "-run1000": 0.7, "-run2000": 0.6},
                                    {"": 0.4, "-run2000": 0.1}) == pytest.approx([0.1, 0.5])
    c = findings.compare(out, [0, 1], declared.c("decline: a - b", ("a", "decline", "success"),
                                                 ("b", "decline", "success")))
    assert c["per_seed"] == pytest.approx([0.2 - 0.1 / 3, 0.2]) and c["runs"] == 1
    assert c["per_run"][0] == pytest.approx([0.3, 0.1, 0.1]) and c["run_sd"] == pytest.approx(0.11547, abs=1e-5)


def test_a_run_collapses_when_its_end_falls_below_half_its_peak_and_keeps_its_last_calls(tmp_path):
    """paired.COLLAPSE (0.5, written after the data): a run whose end (the mean of its last 3 validation points)
    is below half its peak (the best mean of 3 in a row) collapses, and the compact results keep its last step's
    calls. By hand: 0.5, 0.9, 0.9, 0.9, 0.3, 0.2, 0.1: peak 0.9, end 0.2 < 0.45; with 0.5, 0.5, 0.5 at the end
    instead, 0.5 >= 0.45."""
    assert paired.collapsed([0.5, 0.9, 0.9, 0.9, 0.3, 0.2, 0.1])
    assert not paired.collapsed([0.5, 0.9, 0.9, 0.9, 0.5, 0.5, 0.5])
    assert not paired.collapsed([0.9, 0.1])  # fewer points than a window: no peak, no end
    for run, curve in (("voting-ip-s1", [0.5, 0.9, 0.9, 0.9, 0.3, 0.2, 0.1]),
                       ("voting-ip-s1-run1001", [0.5, 0.9, 0.9, 0.9, 0.5, 0.5, 0.5])):
        (tmp_path / run / "samples").mkdir(parents=True)
        (tmp_path / run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": 10 * i, "val/success": v}) + "\n" for i, v in enumerate(curve)))
        for step in (50, 60):
            (tmp_path / run / "samples" / f"step_{step:06d}.json").write_text(json.dumps({"step": step}))
    findings.keep_results(str(tmp_path), ["voting-ip-s1", "voting-ip-s1-run1001"], str(tmp_path / "results"))
    rows = [json.loads(line) for line in (tmp_path / "results" / "study.jsonl").read_text().splitlines()]
    assert [(r["run"], r["file"]) for r in rows if r["file"] != "metrics.jsonl"] == [
        ("voting-ip-s1", "samples/step_000060.json")]


def test_a_committed_run_is_run_again_and_its_first_difference_named(tmp_path, monkeypatch, capsys):
    """`python -m toyworld.reproduce RUN --steps N`: the run's name gives its command (the study's, with its run
    seed), its new metrics are compared with the committed ones value by value up to step N, and the first that
    differs is printed (exit 1); a name that is not a study run's is one line (exit 2)."""
    from toyworld import reproduce
    assert reproduce.parse_run("voting-ip-merged-s3-run1003") == ("voting-ip-merged", 3, 1003)
    assert reproduce.parse_run("single-lr1e-4-s0") == ("single-lr1e-4", 0, None)
    with pytest.raises(ValueError):
        reproduce.parse_run("voting-xp-s0")
    results = tmp_path / "results"
    results.mkdir()
    (results / "study.json").write_text(json.dumps({"lr": "1e-3", "steps": 150}))
    committed = [{"step": 0, "val/success": 0.5}, {"step": 1, "success": 0.25}, {"step": 2, "success": 0.75},
                 {"step": 3, "success": 0.5}]
    (results / "study.jsonl").write_text("".join(json.dumps({"run": "voting-ip-s3-run1003", "file": "metrics.jsonl",
                                                             "record": r}) + "\n" for r in committed))
    fresh = [{"step": 0, "val/success": 0.5, "time_update": 1.0}, {"step": 1, "success": 0.250001},
             {"step": 2, "success": 0.5}]
    commands = []

    def run(command, cwd, env, stdout, stderr):
        commands.append(command)
        folder = command[command.index("--run-dir") + 1]
        os.makedirs(folder)
        with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in fresh)
        return subprocess.CompletedProcess(command, 0)
    monkeypatch.setattr(reproduce.subprocess, "run", run)
    argv = ["voting-ip-s3-run1003", "--steps", "2", "--results", str(results), "--out", str(tmp_path / "again")]
    with pytest.raises(SystemExit) as stop:
        reproduce.main(argv)
    assert stop.value.code == 1
    assert commands[0][commands[0].index("--seed"):commands[0].index("--run-dir")] == [
        "--seed", "3", "--run-seed", "1003", "--steps", "2"]
    # 0.250001 kept to 4 decimals is 0.25: the same
    assert capsys.readouterr().out.splitlines()[1:] == [
        "voting-ip-s3-run1003: 2 of 3 values agree (steps 0-2)", "first differs at step 2: success 0.5, committed 0.75"]
    with pytest.raises(SystemExit) as stop:
        reproduce.main(argv)  # its folder exists now: refused, nothing run
    assert stop.value.code == 2 and len(commands) == 1
    with pytest.raises(SystemExit) as stop:
        reproduce.main(["voting-xp-s0", "--results", str(results)])
    assert stop.value.code == 2 and "not a study run's name" in capsys.readouterr().err

"""A fork's ablation judged as the study judges: `eval.py compare` on made-up runs worked out by hand (the
t-interval, the run and seed SDs, the verdict), the runs model of infra/detection.py (collapses drawn) against
cases worked by hand, and toyworld/ablate.py's one-line refusals, its size and a tiny ablation end to end.

    python -m pytest -q tests/test_ablate.py
"""
import json
import math
import os
import re

import numpy as np
import pytest

import eval as E
from infra import detection, paired
from infra.detection import RunModel

# ---------------------------------------------------------------- eval.py compare, by hand

# end accuracy of each run: seed -> (run k0, run k1); each curve is [0, x, x, x], so end = peak = x, decline 0
A_ENDS = {0: (0.8, 0.6), 1: (0.9, 0.7), 2: (0.5, 0.7)}
B_ENDS = {0: (0.5, 0.5), 1: (0.6, 0.4), 2: (0.6, 0.4)}


def write_runs(folder, ends, prefix):
    """Run folders as train.py writes them (args.json's seed and run seed, metrics.jsonl's validation points),
    a log beside each as the ablation leaves it."""
    paths = []
    for seed, values in ends.items():
        for k, x in enumerate(values):
            run = folder / f"{prefix}-s{seed}-k{k}"
            run.mkdir(parents=True)
            (run / "args.json").write_text(json.dumps({"seed": seed, "run_seed": seed + 1000 * k if k else None}))
            (run / "metrics.jsonl").write_text("".join(
                json.dumps({"step": 10 * i, "val/success": v}) + "\n" for i, v in enumerate([0.0, x, x, x])))
            (folder / f"{prefix}-s{seed}-k{k}.log").write_text("a log, not a run\n")
            paths += [str(run), str(run) + ".log"]
    return paths


def test_compare_pairs_by_seed_and_gives_the_interval_and_both_sds_worked_by_hand(tmp_path, capsys):
    """Per seed, the means' difference: 0.7 - 0.5 = 0.2, 0.8 - 0.5 = 0.3, 0.6 - 0.5 = 0.1; mean 0.2, SD
    sqrt((0 + 0.01 + 0.01) / 2) = 0.1 (the seed SD), t-interval 0.2 +- 4.303 x 0.1 / sqrt 3 = 0.2 +- 0.2484. Run by
    run (paired by run seed): 0.3, 0.1 | 0.3, 0.3 | -0.1, 0.3, within-seed variances 0.02, 0, 0.08, pooled
    0.0333: run SD 0.1826. At 0.05: mean 0.2 >= 0.05 with 3 of 3 seeds up, shown; the interval crosses zero, so by
    the rule only."""
    a = write_runs(tmp_path, A_ENDS, "a")
    b = write_runs(tmp_path, B_ENDS, "b")
    result = E.main(["compare", "--a", *a, "--b", *b, "--threshold", "0.05"])
    end = result["end"]
    assert end["per_seed"] == pytest.approx([0.2, 0.3, 0.1])
    assert end["mean"] == pytest.approx(0.2) and end["seed_sd"] == pytest.approx(0.1)
    assert end["ci"] == pytest.approx([0.2 - 4.303 * 0.1 / math.sqrt(3), 0.2 + 4.303 * 0.1 / math.sqrt(3)])
    assert end["run_sd"] == pytest.approx(math.sqrt(0.1 / 3)) and end["runs"] == 2
    assert end["verdict_words"] == "shown by the rule only"
    assert result["decline"]["mean"] == pytest.approx(0.0) and result["decline"]["verdict"] == "not shown"
    shown = capsys.readouterr().out
    assert "end (the mean of the last 3 validation points): +0.200 [-0.048, +0.448]" in shown
    assert "run SD 0.183 (one run's difference within a seed), seed SD 0.100" in shown


def test_compare_refuses_in_one_line(tmp_path, capsys):
    """Fewer than two shared seeds, a folder that is not a run, a run with too few validation points: exit 2."""
    a = write_runs(tmp_path, {0: (0.8,)}, "a")
    b = write_runs(tmp_path, {0: (0.5,), 1: (0.5,)}, "b")
    cases = [(a, "share 1 seed(s)"), ([str(tmp_path / "nothing")], "not a run folder")]
    short = tmp_path / "short"
    short.mkdir()
    (short / "args.json").write_text(json.dumps({"seed": 0}))
    (short / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/success": 0.5}) + "\n")
    cases.append(([str(short)], "1 validation points"))
    for arm, said in cases:
        with pytest.raises(SystemExit) as e:
            E.main(["compare", "--a", *arm, "--b", *b, "--threshold", "0.05"])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and said in err, err


# ---------------------------------------------------------------- the runs model, by hand

def test_a_runs_model_without_collapses_is_the_normal_one():
    """between^2 + run^2 / runs = sd^2: the smallest difference five seeds of 4 runs detect is the normal model's
    at sd = sqrt(0.03^2 + 0.08^2 / 4) = 0.05 (both 1.68 sd, test_power.py; to the simulation's error: 40,000
    draws put a rate near 80% within 0.002, a difference within about 0.002 / 6 sd at that slope)."""
    found = detection.smallest_in(detection.seed_noise(RunModel(0.03, 0.08), 5, 4))
    assert found == pytest.approx(detection.smallest_detected(0.05), rel=0.01)


def test_collapses_drawn_at_their_rate_pass_a_rule_as_often_as_counted_by_hand():
    """No spread but collapses: one run a seed, each arm's run collapsing with chance p = 0.1 and then moving by
    J = 0.5. A seed's difference is +J (A alone collapses: q = p (1 - p) = 0.09), -J (B alone: q) or 0 (neither or
    both: r = 0.82). Two seeds, `greater` 0.2: it passes when the mean is >= 0.2 and one seed at least is up: (J,
    J) or (J, 0) in either order, q^2 + 2 q r = 0.0081 + 0.1476 = 0.1557 (draws: SE 0.0018, so 0.006 is over
    three)."""
    noise = detection.seed_noise(RunModel(0.0, 0.0, 0.1, (0.5,)), 2, 1)
    q, r = 0.1 * 0.9, 0.9 * 0.9 + 0.1 * 0.1
    assert detection.pass_share("greater", 0.2, noise, 0.0) == pytest.approx(q * q + 2 * q * r, abs=0.006)
    assert sorted(np.unique(noise)) == pytest.approx([-0.5, 0.0, 0.5])


def test_the_runs_model_is_read_from_runs_by_hand():
    """Two seeds of three runs; A's run "2" on seed 1 collapses (its end 0.1 against its seed's others 0.8 and
    0.8: a jump of -0.7). Clean run differences: seed 0 0.1, 0.0, 0.2 (variance 0.01), seed 1 0.0, 0.2 (0.02):
    run SD sqrt(0.015); the seeds' clean means differ 0.1 and 0.1, no spread between them; rate 1 of 12 runs."""
    a = [{"0": 0.8, "1": 0.7, "2": 0.9}, {"0": 0.8, "1": 0.8, "2": 0.1}]
    b = [{"0": 0.7, "1": 0.7, "2": 0.7}, {"0": 0.8, "1": 0.6, "2": 0.7}]
    model = paired.run_model(a, b, [set(), {"2"}], [set(), set()])
    assert model.run == pytest.approx(math.sqrt(0.015)) and model.between == 0.0
    assert model.rate == pytest.approx(1 / 12) and model.jumps == pytest.approx((-0.7,))



# ---------------------------------------------------------------- toyworld/ablate.py

@pytest.fixture
def ablate(monkeypatch):
    from toyworld import ablate
    monkeypatch.setattr(ablate, "code_commit", lambda root=None: "abc1234")  # a clean checkout, whatever this is
    return ablate


@pytest.mark.parametrize("words, said", [
    (["--workflow", "voting"], "required: --threshold"),
    (["--workflow", "voting", "--threshold", "0.05"], "the two arms are the same runs"),
    (["--workflow", "voting", "--threshold", "0.05", "--change", "--lr 3e-4", "--baseline", "--lr 1e-3"],
     "--lr is set in both arms"),
    (["--workflow", "voting", "--threshold", "0.05", "--change", "--seed 3"], "--seed is the ablation's to set"),
    (["--workflow", "voting", "--threshold", "0.05", "--change", "--no-such-flag 1"],
     "--change '--no-such-flag 1': unrecognized arguments"),
    (["--workflow", "voting", "--threshold", "0.05", "--change", "--clip-high -1"], "must be > 0"),
    (["--workflow", "voting", "--threshold", "0.05", "--change", "--kl-coef generator=0.1", "--seeds", "0,17"],
     "seed 17 has no toy model"),
    (["--workflow", "voting", "--threshold", "0", "--change", "--clip-high 0.3"], "--threshold must be > 0"),
    (["--workflow", "voting", "--threshold", "0.05", "--change", "--clip-high 0.3", "--runs", "0"],
     "--runs: at least 1"),  # not the default size in silence
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(ablate, words, said, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ablate.main(["bad", *words, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and said in err, err
    assert not (tmp_path / "out").exists()


def test_a_baseline_checkout_without_git_is_one_line(ablate, tmp_path, capsys):
    """A copy without .git would run this checkout's modules (jobs.run_script tells another checkout by its .git)."""
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "train.py").write_text("")
    with pytest.raises(SystemExit) as e:
        ablate.main(["bad", "--workflow", "voting", "--threshold", "0.05", "--baseline-checkout", str(copy),
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "not a git checkout" in err, err
    assert not (tmp_path / "out").exists()


def test_a_workflow_the_toy_world_cannot_run_is_one_line(ablate, monkeypatch, tmp_path, capsys):
    """A fork's workflow with a role the toy world was never taught (here Voting given a `critic`): train.py's own
    check refuses it (toyworld/toy_hooks.role_problem), named with its arm, before anything runs."""
    import workflows
    monkeypatch.setitem(workflows.ROLES, "voting", ["generator", "aggregator", "critic"])
    with pytest.raises(SystemExit) as e:
        ablate.main(["bad", "--workflow", "voting", "--threshold", "0.05", "--change", "--clip-high 0.3",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: --baseline") and "has the role critic, which the toy world does not know" in err
    assert not (tmp_path / "out").exists()


def test_an_arm_is_the_committed_configuration_its_flags_make():
    """committed_name: the plain Voting IP arm is the study's voting-ip, one with --merge-instance-steps its
    voting-ip-merged, one whose own --policy sp wins voting-sp; a flag the study never set is none of them."""
    from types import SimpleNamespace

    from toyworld.ablation_size import committed_name
    args = SimpleNamespace(workflow="voting", policy="ip", lr="1e-3")
    assert committed_name(args, []) == "voting-ip"
    assert committed_name(args, ["--merge-instance-steps"]) == "voting-ip-merged"
    assert committed_name(args, ["--policy", "sp"]) == "voting-sp"
    assert committed_name(SimpleNamespace(workflow="single", policy="sp", lr="1e-3"), []) == "single"
    assert committed_name(args, ["--clip-high", "0.3"]) is None


def test_the_committed_spread_of_two_arms_by_hand():
    """aa_model: one seed's clean ends 0.8, 0.6 (deviations +-0.1), another's 0.7, 0.7, 0.7 and a collapse at 0.2
    (a jump of -0.5): pooled within-seed variance (0.02 + 0) / (1 + 2) = 0.00667, a run's difference sqrt 2 times
    its SD, 0.1155; 1 collapse in 6 runs."""
    from toyworld.ablation_size import aa_model
    flat = lambda x: [0.5, x, x, x]  # noqa: E731
    arm = {0: {"0": flat(0.8), "1": flat(0.6)},
           1: {"0": flat(0.7), "1": flat(0.7), "2": flat(0.7), "3": [0.5, 0.9, 0.9, 0.9, 0.2, 0.2, 0.2]}}
    model = aa_model(arm)
    assert model.run == pytest.approx(math.sqrt(2 * 0.02 / 3)) and model.between == 0.0
    assert model.rate == pytest.approx(1 / 6) and model.jumps == pytest.approx((0.2 - 0.7,))


def test_a_tiny_ablation_runs_judges_and_keeps_its_declaration(ablate, tmp_path, capsys):
    """Two seeds, one run a seed, 30 steps of the single agent: the size printed before any run, each arm's runs
    through the study's job machinery, the four quantities judged and written with the curves and the figure
    into ablation.json; the same command again trains nothing, and another threshold is refused (the
    declaration is fixed before the runs)."""
    words = ["tiny", "--workflow", "single", "--change", "--clip-high 0.3", "--threshold", "0.05", "--seeds",
             "0,1", "--runs", "1", "--steps", "30", "--jobs", "1", "--out", str(tmp_path)]
    ablate.main(words)
    shown = capsys.readouterr().out
    assert "size: 2 seeds x 1 runs a seed (as asked) x 30 steps" in shown
    assert shown.index("this size detects") < shown.index("trained")  # said before it runs
    record = json.loads((tmp_path / "tiny" / "ablation.json").read_text())
    assert record["declared"]["threshold"] == 0.05 and record["date"]
    assert set(record["curves"]) == {"baseline", "change"} and record["steps"] == [0, 10, 20, 30]
    assert {q: record["result"][q]["n"] for q in paired.QUANTITIES} == {q: 2 for q in paired.QUANTITIES}
    assert (tmp_path / "tiny" / "curves.png").stat().st_size > 0
    ablate.main(words)  # resumed: every run finished, judged again
    assert "trained" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        ablate.main([*words[:6], "0.1", *words[7:]])
    assert e.value.code == 2 and "declared on" in capsys.readouterr().err


# ---------------------------------------------------------------- docs/ablations.md, from what is committed

JUDGED = ("aa", "clip1", "majority", "near-miss")  # the A/A check and the page's three recipes


def test_the_ablations_page_shows_what_is_committed():
    """Every block of docs/ablations.md between its markers is toyworld/ablation_page.py's: what the old loop and
    a quick look tell (from the committed study's runs) and each judged ablation's lines (docs/ablations/)."""
    from toyworld import ablation_page
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "ablations.md")) as f:
        page = f.read()
    blocks = ablation_page.blocks()
    assert set(blocks) == {"quick", *JUDGED}
    for name, block in blocks.items():
        assert f"<!-- ablation:{name} -->\n{block}\n<!-- /ablation:{name} -->" in page, name
    # the README's default size detects what the quick block computes for nine runs a seed
    nine = re.search(r"and (0\.\d+) with nine", blocks["quick"]).group(1)
    with open(os.path.join(os.path.dirname(__file__), "..", "README.md")) as f:
        readme = " ".join(f.read().split())
    assert f"At Voting IP's default size, 5 seeds x 9 runs a seed, it detects {nine} in end accuracy" in readme


def test_voting_ips_default_size_is_nine_runs_a_seed_within_the_budget(ablate):
    """The size the README and the recipes state: at MINUTES_A_RUN's 1.7 minutes a Voting run, 9 runs a seed on
    5 seeds with the committed 6 reused train 5 x (9 + 3) + 1 (the reproduction) = 61 runs, 51.85 minutes two at
    a time; 10 would take 71 runs, 60.35 minutes, past the hour. 0.05 needs more than either."""
    from toyworld import ablation_size
    p = ablate.parser()
    args = p.parse_args(["x", "--workflow", "voting", "--policy", "ip", "--change", "--clip-high 0.3",
                         "--threshold", "0.05"])
    ablate.check(args, p)
    reused, reusable = ablation_size.reusable_runs(args)
    model = ablation_size.aa_model(ablation_size.committed_arm("voting-ip", ablation_size.committed_seeds()))
    runs, why = ablation_size.default_runs(args, model, reusable)
    assert (reused, reusable, runs) == ("voting-ip", 6, 9) and "0.05 needs more" in why
    assert ablation_size.minutes(args, 9, reusable) == pytest.approx(61 * 1.7 / 2)
    assert ablation_size.minutes(args, 10, reusable) == pytest.approx(71 * 1.7 / 2)


@pytest.mark.parametrize("name", JUDGED)
def test_a_judged_ablation_is_its_committed_curves_judged_again(name):
    """Its lines are infra/paired.py's on the curves it committed, and its figure is beside it."""
    from toyworld import ablation_page
    record = ablation_page.judged(name)
    arms = {side: {int(s): runs for s, runs in curves.items()} for side, curves in record["curves"].items()}
    result = paired.compare_arms(arms["change"], arms["baseline"], record["declared"]["threshold"])
    lines = paired.describe(result, ("change", "baseline"))
    assert [line for line in record["lines"] if not line.startswith("quick:")] == lines
    assert os.path.getsize(os.path.join(ablation_page.JUDGED, f"{name}.png")) > 0


def test_the_aa_check_covers_zero_and_shows_nothing():
    """Two arms of Voting IP with nothing changed, on other run seeds: each quantity's interval covers zero and no
    verdict is shown."""
    from toyworld import ablation_page
    result = ablation_page.judged("aa")["result"]
    for quantity in paired.QUANTITIES:
        low, high = result[quantity]["ci"]
        assert low < 0 < high and result[quantity]["verdict"] == "not shown", quantity


def test_another_checkouts_script_runs_there_in_a_new_interpreter(tmp_path):
    """An ablation's --baseline-checkout: jobs.run_script runs a script of another checkout (a folder with its own
    .git) from that folder, by a new interpreter, so that its imports are its own, not this checkout's."""
    import sys

    from toyworld import jobs
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "tasks.py").write_text("WHERE = 'the other checkout'\n")
    (checkout / "probe.py").write_text("import json, os, sys, tasks\n"
                                       "print(json.dumps([os.getcwd(), sys.argv[1:], tasks.WHERE]))\n")
    log = tmp_path / "probe.log"
    jobs.run_all([[([sys.executable, str(checkout / "probe.py"), "a"], str(log))]], False, 1)
    assert json.loads(log.read_text()) == [str(checkout), ["a"], "the other checkout"]


def test_the_page_writer_fills_each_block_between_its_own_markers(tmp_path, monkeypatch):
    """An empty block and a filled one, side by side: each is replaced up to its own closing marker, and the text
    between them is kept (an empty block once swallowed the page up to the next block's closing marker)."""
    from toyworld import ablation_page
    monkeypatch.setattr(ablation_page, "blocks", lambda: {"one": "A", "two": "B\nC"})
    page = tmp_path / "page.md"
    page.write_text("<!-- ablation:one -->\n<!-- /ablation:one -->\n\nkept\n\n"
                    "<!-- ablation:two -->\nold\n<!-- /ablation:two -->\n")
    ablation_page.write_page(str(page))
    assert page.read_text() == ("<!-- ablation:one -->\nA\n<!-- /ablation:one -->\n\nkept\n\n<!-- ablation:two -->\n"
                                "B\nC\n<!-- /ablation:two -->\n")

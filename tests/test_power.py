"""What the study's seeds and runs can tell (infra/detection.py, toyworld/power.py): each rule's false-pass rate, the
t-interval's detection rate, the smallest true difference detected, and the seeds and runs a verdict would need, against
cases worked by hand; the exact normal rate against the simulated one; the declines' collapse model read from the
committed runs, and the next study's runs a seed from it. detection's rates are simulated (SIMULATIONS = 40,000 draws,
seeded): a rate near p has a standard error of sqrt(p (1 - p) / 40,000) <= 0.0025, so a tolerance of 0.01 is four of
them."""
import math
import os

import numpy as np
import pytest

from infra import detection, paired
from toyworld import declared, power

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_the_worked_example_two_seeds_greater_by_hand():
    """Two seeds, `greater` 0.05, a spread of 0.10 a seed, no true difference: a mean of 0.05 or more (which puts
    one seed above zero at least) has chance 1 - Phi(0.05 / (0.10 / sqrt 2)) = 1 - Phi(0.7071) = 0.2398."""
    assert 1 - phi(0.05 / (0.10 / math.sqrt(2))) == pytest.approx(0.2398, abs=1e-4)
    assert detection.pass_rate("greater", 0.05, 0.10, 0.0, n=2) == pytest.approx(0.2398, abs=0.01)


def test_matches_at_its_margin_passes_as_often_as_the_signs_allow_whatever_the_spread():
    """`matches` t at a true difference of -t: a seed is within the margin exactly when its draw is above the
    mean, so the rate does not depend on the spread. Two seeds: the mean at or above -t, 1/2. Five seeds: the
    mean above and 4 of 5 draws above it, about 18% (the simulation at two spreads agrees with itself to the
    draw)."""
    assert detection.pass_rate("matches", 0.05, 0.1, -0.05, n=2) == pytest.approx(0.5, abs=0.01)
    five = detection.pass_rate("matches", 0.05, 0.1, -0.05)
    assert five == detection.pass_rate("matches", 0.05, 0.3, -0.05) and five == pytest.approx(0.18, abs=0.01)


def test_the_interval_excludes_zero_on_the_right_side_2_5_percent_of_the_time_with_nothing_there():
    """With no true difference the t statistic of n seeds has Student's t with n - 1 degrees of freedom, so the
    interval's low end is above zero with chance 0.025 exactly, at 2 seeds and at 5."""
    for n in (2, 5):
        assert detection.detect_rate(0.1, 0.0, n) == pytest.approx(0.025, abs=0.003)


def test_the_smallest_difference_five_seeds_detect_is_about_1_35_times_the_intervals_half_width():
    """At 5 seeds, 80% detection needs a true difference of about (t975 + t80) sd / sqrt 5 = (2.776 + 0.941) sd /
    2.236 = 1.66 sd (the normal approximation to the noncentral t, which slightly understates it: 1.68 here), 1.35
    times the half-width of an interval at that spread, 2.776 sd / 2.236 = 1.24 sd, which is detected only about
    half the time (0.56: the sample's SD varies around sd)."""
    sd = 0.05
    found = detection.smallest_detected(sd)
    assert found / sd == pytest.approx(1.68, abs=0.03)
    assert detection.detect_rate(sd, found) == pytest.approx(0.8, abs=0.002)
    half = detection.t975(4) * sd / math.sqrt(5)
    assert found / half == pytest.approx(1.35, abs=0.03)
    assert detection.detect_rate(sd, half) == pytest.approx(0.56, abs=0.01)


def test_seeds_and_runs_needed_by_hand():
    """Seeds: a true difference of one spread needs about (1.96 + 0.84)^2 = 7.8 seeds by the normal approximation,
    more with t's wider intervals at few seeds: 10. Runs: a comparison whose seeds' 3-run means spread 0.02 and whose
    runs spread 0.045 has no spread of its own between seeds (0.02^2 - 0.045^2 / 3 < 0), so its means of r runs
    over 5 seeds spread 0.045 / sqrt r; 80% detection of 0.05 needs 0.045 / sqrt r <= 0.05 / 1.68, r >= 2.3: 3
    runs (2 runs detect it 75% of the time, 3 runs 89%)."""
    assert detection.seeds_needed(1.0, 1.0) == 10
    assert detection.between_seeds(0.02, 0.045, 3) == 0.0
    assert detection.between_seeds(0.05, 0.06, 3) == pytest.approx(math.sqrt(0.05 ** 2 - 0.06 ** 2 / 3))
    assert detection.runs_needed(0.02, 0.045, 3, 0.05) == 3
    assert detection.detect_rate(0.045 / math.sqrt(2), 0.05) == pytest.approx(0.75, abs=0.01)
    assert detection.runs_needed(0.2, 0.06, 3, 0.05) is None  # the seeds' own spread is too large


def test_the_simulated_rules_are_findings_verdicts():
    """rule_passes is paired.verdict's "shown", row by row, on differences with ties at the threshold."""
    rng = np.random.default_rng(1)
    d = np.round(rng.normal(0.02, 0.08, size=(400, 5)), 2)
    for rule in ("greater", "matches"):
        simulated = detection.rule_passes(rule, 0.05, d)
        judged = [paired.verdict(rule, 0.05, paired.summarise(list(row))) == "shown" for row in d]
        assert simulated.tolist() == judged and 20 < sum(judged) < 380


def test_at_least_one_of_several_rules_passing():
    """Independent rules at 5% and 10%: 1 - 0.95 x 0.9 = 0.145."""
    assert detection.any_passes([0.05, 0.10]) == pytest.approx(0.145)


def test_the_decline_configurations_runs_a_seed_are_what_the_power_analysis_asked_for():
    """declared.DECLINE_RUNS (6), declared before the study's third run from the committed 3-run results of
    2026-12-05: runs_needed at each decline comparison's seed-to-seed and run-to-run SD, for 80% detection of
    the rules' 0.05 over five seeds, is 4, 3, 6 and 5, and none for IP - SP; 6 is the most."""
    needed = {label: detection.runs_needed(seed_sd, run_sd, 3, 0.05)
              for label, (seed_sd, run_sd) in declared.DECLINE_POWER_INPUTS.items()}
    assert needed == {"IP - SP": None, "IP - merged": 4, "IP - third": 3, "IP - I1": 6, "IP - I6": 5}
    assert declared.DECLINE_RUNS == max(r for r in needed.values() if r)


def test_a_comparison_with_fewer_than_two_seeds_has_no_power_numbers():
    """A study still running may judge a comparison on one seed: no spread, so every number is nan (a table
    prints it), not a KeyError from t975(-1) or t975(0)."""
    for n in (0, 1):
        found = power.comparison_power({"se": 0.0, "n": n, "mean": 0.1, "rule": "greater", "threshold": 0.05})
        assert math.isnan(found["sd"]) and math.isnan(found["smallest_detected"]) and math.isnan(found["false_pass"])
        assert found["seeds_needed"] is None


def test_the_runs_cell_says_why_no_number_of_runs_detects_the_threshold():
    """runs_needed's None has two causes the runs table tells apart: the seeds' own spread alone (SD 0.2 between
    seeds, 0.06 of runs) misses a difference of 0.05 whatever the runs, but with no spread between seeds and runs of
    SD 0.5 more than 20 runs would (0.5 / sqrt(20) = 0.11 a seed still hides 0.05); at SD 0.045 of runs, 3 do
    (test_seeds_and_runs_needed_by_hand)."""
    from toyworld import tables
    base = {"threshold": 0.05, "n": 5, "rule": "greater", "mean": 0.05}
    wide = {**base, "run_sd": 0.06}
    assert tables.runs_needed_cell(wide, power.comparison_power({**wide, "se": 0.2 / 5 ** 0.5, "runs": 3}),
                                   detection.between_seeds(0.2, 0.06, 3)) == "none: the seeds differ too much"
    noisy = {**base, "run_sd": 0.5}
    seed_sd = 0.5 / 3 ** 0.5  # the runs' share alone: nothing between seeds
    assert tables.runs_needed_cell(noisy, power.comparison_power({**noisy, "se": seed_sd / 5 ** 0.5, "runs": 3}),
                                   detection.between_seeds(seed_sd, 0.5, 3)) == "over 20"
    tight = {**base, "run_sd": 0.045}
    assert tables.runs_needed_cell(tight, power.comparison_power({**tight, "se": 0.02 / 5 ** 0.5, "runs": 3}),
                                   detection.between_seeds(0.02, 0.045, 3)) == "3"


def test_the_exact_normal_rate_is_the_simulated_one_and_the_noncentral_t_by_hand():
    """normal_detect_rate integrates Student's noncentral t: with nothing there the interval's low end is above zero
    2.5% of the time at any number of seeds (to the rounding of T975's three decimals); elsewhere it agrees with
    detection.detect_rate's 40,000 draws to their noise (0.01: four standard errors); 5 seeds detect a true
    difference of 1.68 spreads 80% of the time (test_the_smallest_difference_five_seeds_detect_...)."""
    for n in (2, 5, 10):
        assert detection.normal_detect_rate(0.0, n) == pytest.approx(0.025, abs=2e-4)
    for x in (0.5, 1.0, 2.0):
        assert detection.normal_detect_rate(x, 5) == pytest.approx(detection.detect_rate(1.0, x), abs=0.01)
    assert detection.normal_smallest(5) == pytest.approx(1.68, abs=0.005)
    assert detection.normal_detect_rate(detection.normal_smallest(5), 5) == pytest.approx(0.8, abs=1e-6)


def test_every_rate_read_off_the_sorted_margins_is_the_searched_one():
    """margins sorts each simulated study's smallest detected difference once: share_below is the share of studies
    whose t-interval over |d| + noise lies above zero, counted here study by study, and smallest_of a bisection on
    that share over the same draws (on draws with collapses); detect_share and smallest_in are read off them."""
    noise = detection.seed_noise(detection.RunModel(0.01, 0.06, 0.05, (0.4, 0.7)), 5, 6, 3, 4000)
    margins = detection.margins(noise)

    def counted(d: float) -> float:  # the t-interval of each simulated study, as summarise writes it
        x = abs(d) + noise
        half = paired.t975(4) * x.std(axis=1, ddof=1) / math.sqrt(5)
        return float((x.mean(axis=1) - half > 0).mean())
    for d in (0.0, 0.02, 0.05, -0.05, 0.1):
        assert detection.share_below(margins, d) == counted(d) == detection.detect_share(noise, d)
    low, high = 0.0, 20.0 * float(noise.std())
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if counted(middle) < detection.POWER else (low, middle)
    assert detection.smallest_of(margins) == pytest.approx(high, abs=1e-9) == detection.smallest_in(noise)


def test_without_collapses_the_collapse_aware_figures_are_the_normal_ones():
    """A RunModel that never collapses, with no spread between seeds and runs of SD 0.06, is a normal spread of
    0.06 / sqrt 6 = 0.0245 a seed at 6 runs: its smallest difference detected is 1.68 times that, 0.041, within the
    simulation's noise (500,000 studies: well under 0.001), and its rule passes with nothing there as the normal
    spread's does."""
    c = {"se": 0.0245 / math.sqrt(5), "n": 5, "mean": 0.04, "rule": "greater", "threshold": 0.05, "runs": 6,
         "run_sd": 0.06}
    found = power.comparison_power(c, detection.RunModel(0.0, 0.06))
    assert found["collapses"]["smallest_detected"] == pytest.approx(found["smallest_detected"], abs=0.001)
    assert found["smallest_detected"] == pytest.approx(1.68 * 0.0245, abs=0.0005)
    assert found["collapses"]["false_pass"] == pytest.approx(found["false_pass"], abs=0.002)


def test_the_declines_collapse_model_is_read_from_the_committed_runs():
    """power.decline_models pools the collapses of the six decline configurations over the study's and the held-out
    seeds: 6 of 252 runs (voting-sp 3, voting-ip-i6 1, voting-ip 2), each a jump up in its run's decline, and gives
    every decline comparison the pooled rate and jumps with its own spreads (paired.run_model of its runs)."""
    import json
    results = os.path.join(ROOT, "docs", "findings", "results")
    study = json.load(open(os.path.join(results, "study.json")))
    declines = power.decline_models(results, study)
    assert (declines["collapsed"], declines["runs"], len(declines["jumps"])) == (6, 252, 6)
    assert declines["rate"] == pytest.approx(6 / 252) and min(declines["jumps"]) > 0.3
    assert sorted(declines["models"]) == sorted(c["label"] for f in declared.FINDINGS for c in f["comparisons"]
                                                if c["a"][1] == "decline")
    assert all(m.rate == declines["rate"] and m.jumps == tuple(declines["jumps"])
               for m in declines["models"].values())


def test_the_next_studys_decline_runs_follow_the_collapse_aware_model():
    """declared.NEXT_DECLINE_RUNS is power.next_decline_runs on the committed runs: at five seeds, some decline
    comparison falls short of detecting 0.05 80% of the time even at detection.MOST_RUNS (20) runs a seed, so None;
    IP - SP, the widest, detects it well under 80% at 20 runs (about 65%), whatever the simulation seed."""
    import json
    results = os.path.join(ROOT, "docs", "findings", "results")
    study = json.load(open(os.path.join(results, "study.json")))
    models = power.decline_models(results, study)["models"]
    assert power.next_decline_runs(models) == declared.NEXT_DECLINE_RUNS is None
    widest = models["decline (peak - end): IP - SP"]
    for seed in (0, 1):
        rate = detection.share_below(power.with_collapses(widest, 5, detection.MOST_RUNS, seed, "greater", 0.05)[0],
                                     0.05)
        assert 0.6 < rate < 0.7

"""Calibration of the toy world: is a seed's warmed-up toy model, before any RL, a fair instrument?

What it does: reads the base model's rollouts of every workflow (eval.py `calibrate` plays them:
`python -m toyworld.toy --calibrate --seed S`) and holds them against targets written here before
any RL run (docs/toy_world.md, "Calibration"):
- fidelity: each habit's careful rate and its accuracy given its inputs within 0.05 of the oracle's
  on the same prompts (the oracle answers every prompt the model answered, `ORACLE_SAMPLES` times);
- headroom: each habit careful between 0.3 and 0.6 of the time (room to learn, and something to
  learn from);
- consequence: one role played by an always-careful against an always-hurried oracle, the model in
  the others, moves episode accuracy by at least 0.10 (the role matters);
- structure: Voting above the single agent, Orch-Workers not below it, the evaluator at least 0.10
  better than the best constant verdict, a retry of a wrong attempt right at least 0.2 of the time
  and a retry of a right one sometimes wrong (so *when* to retry matters);
- no shortcut: a solver output's correctness predicted from its length alone no better than 0.65; no
  evaluator output gives the answer away (at most 1 in 100 for a sampled model; the oracle's: none);
- format: each role's outputs in its own format at least 95% of the time.
What it is not: a judgement of RL; nothing here changes after a study's comparison has been seen.
"""
from __future__ import annotations

import json
import math
import os
import random
from collections import defaultdict

from toyworld.reading import judged
from toyworld.toy import KNOBS, VERSION, Oracle, folder, oracle_text

# The regime the toy model is calibrated at (`measure`) and the study runs (toyworld/study.py):
# sampled at temperature 1 (the warm-up's mixture as it is), 32 new tokens (the longest careful
# habit is 26), 2 tasks x a group of 8. `train.py --model toy` takes these as its defaults; a flag
# given on the command line wins.
REGIME = {"tasks_per_step": 2, "group_size": 8, "max_new_tokens": 32, "temperature": 1.0}
TEMPERATURE, MAX_NEW_TOKENS = REGIME["temperature"], REGIME["max_new_tokens"]  # the regime's
# Episodes per problem: >= 2,000 calls of each habit but the retries' (about 1,500), so that a
# careful rate's difference from the oracle's has a standard error near 0.012, not the 0.02 of 729
# calls (at which a true difference of 0.03 crosses the 0.05 line one time in six)
EPISODES = {"single": 3, "voting": 9, "evalopt": 12, "orchworkers": 9}
SWAPS = [("voting", "solve", "generators"), ("voting", "select", "aggregator"),
         ("evalopt", "judge", "evaluator"), ("evalopt", "retry", "retries"),
         ("orchworkers", "plan", "orchestrator"), ("orchworkers", "solve", "workers"),
         ("orchworkers", "synthesise", "synthesizer")]
# per problem and side of a swap: a difference of two accuracies, each over 729 episodes
SWAP_EPISODES = 3
# oracle answers per model prompt for its careful and right rates on the same inputs
ORACLE_SAMPLES = 4
KINDS = ("solve", "work", "retry", "select", "judge", "plan", "synthesise")
FIDELITY, HEADROOM, CONSEQUENCE, EVALUATOR_EDGE = 0.05, (0.3, 0.6), 0.10, 0.10
FIX_AT_LEAST, LENGTH_AT_MOST, STATES_AT_MOST = 0.2, 0.65, 0.01
FORMAT_AT_LEAST, MIN_CALLS = 0.95, 500


class MixedEngine:
    """The model in every role but the habits in `forced` (habit -> always careful?), which the
    oracle plays: calibration's consequence swaps."""

    def __init__(self, model_engine, tokenizer, forced: dict[str, bool], seed: int):
        self.model_engine, self.tokenizer, self.forced = model_engine, tokenizer, forced
        self.oracle = Oracle(seed, KNOBS, tokenizer, forced)

    def generate(self, prompts: list[list[int]], adapters: list[str], desc: str = "") -> list:
        texts = [self.tokenizer.decode(ids) for ids in prompts]
        mine = [i for i, (t, name) in enumerate(zip(texts, adapters)) if self.oracle.plays(name, t)]
        others = [i for i in range(len(prompts)) if i not in set(mine)]
        out = [None] * len(prompts)
        for idx, engine in ((mine, self.oracle), (others, self.model_engine)):
            if idx:
                for i, g in zip(idx,
                                engine.generate([prompts[i] for i in idx],
                                                [adapters[i] for i in idx], desc)):
                    out[i] = g
        return out


def call_kind(record: dict, prompt: str) -> str:
    if record["habit"] == "solve" and "your main approach" in prompt:
        return "work"
    return record["habit"]


def call_records(episodes: list, decode, seed: int) -> dict[str, list[dict]]:
    """Every call judged (toyworld/reading.py `judged`), with the oracle's careful and right rates
    on the same prompt and the output's length, grouped by habit kind (a worker is `work`)."""
    rng, by_kind = random.Random(seed), defaultdict(list)
    for ep in episodes:
        for c in ep.calls:
            prompt = decode(c.prompt_ids)
            record = judged(c.name, prompt, c.text)
            oracle = [judged(c.name, prompt, oracle_text(c.name, prompt, rng, KNOBS))
                      for _ in range(ORACLE_SAMPLES)]
            record.update(oracle_careful=sum(o["careful"] for o in oracle) / ORACLE_SAMPLES,
                          oracle_right=sum(o["right"] for o in oracle) / ORACLE_SAMPLES,
                          length=len(c.completion_ids))
            by_kind[call_kind(record, prompt)].append(record)
    return by_kind


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def length_predictability(records: list[dict]) -> float:
    """How well the output's length alone tells right from wrong: the balanced accuracy (the mean of
    the accuracy on right and on wrong outputs, so 0.5 is chance whatever the solver's accuracy) of
    the best rule on length."""
    by_length = defaultdict(lambda: [0, 0])
    for r in records:
        by_length[r["length"]][r["right"]] += 1
    wrong, right = sum(c[0] for c in by_length.values()), sum(c[1] for c in by_length.values())
    if not wrong or not right:
        return 0.5
    return 0.5 * sum(max(c[0] / wrong, c[1] / right) for c in by_length.values())


def habit_table(by_kind: dict[str, list[dict]]) -> dict[str, dict]:
    return {kind: {"calls": len(rs), "careful": mean(r["careful"] for r in rs),
                   "oracle_careful": mean(r["oracle_careful"] for r in rs),
                   "right": mean(r["right"] for r in rs),
                   "oracle_right": mean(r["oracle_right"] for r in rs),
                   "own_format": mean(r["own"] for r in rs),
                   "foreign_format": mean(r["foreign"] for r in rs)}
            for kind, rs in ((k, by_kind.get(k, [])) for k in KINDS)}


def structure(success: dict[str, float], by_kind: dict[str, list[dict]]) -> dict[str, float]:
    """The signs that make the workflows worth using, from the base rollouts."""
    judge, retries = by_kind.get("judge", []), by_kind.get("retry", [])
    attempts_right = mean(r["attempt_right"] for r in judge)
    solvers = by_kind.get("solve", []) + by_kind.get("work", [])
    return {"voting_minus_single": success["voting"] - success["single"],
            "orchworkers_minus_single": success["orchworkers"] - success["single"],
            "evaluator_edge": (mean(r["right"] for r in judge)
                               - max(attempts_right, 1 - attempts_right)),
            "retry_fixes": mean(r["right"] for r in retries if not r["attempt_right"]),
            "retry_breaks": mean(not r["right"] for r in retries if r["attempt_right"]),
            "length_predicts_right": length_predictability(solvers),
            "evaluator_states_answer": mean(r["states_answer"] for r in judge)}


def checks(habits: dict, struct: dict,
           swaps: dict[str, tuple[float, float]]) -> list[tuple[str, float, str, bool]]:
    """Every target as (name, measured value, target, held?)."""
    rows = []
    for kind, h in habits.items():
        rows += [(f"{kind}: calls", h["calls"], f">= {MIN_CALLS}", h["calls"] >= MIN_CALLS),
                 (f"{kind}: careful - oracle", h["careful"] - h["oracle_careful"],
                  f"within {FIDELITY}", abs(h["careful"] - h["oracle_careful"]) <= FIDELITY),
                 (f"{kind}: right - oracle", h["right"] - h["oracle_right"], f"within {FIDELITY}",
                  abs(h["right"] - h["oracle_right"]) <= FIDELITY),
                 (f"{kind}: careful rate", h["careful"], f"in [{HEADROOM[0]}, {HEADROOM[1]}]",
                  HEADROOM[0] <= h["careful"] <= HEADROOM[1]),
                 (f"{kind}: own format", h["own_format"], f">= {FORMAT_AT_LEAST}",
                  h["own_format"] >= FORMAT_AT_LEAST)]
    for name, (careful, hurried) in swaps.items():
        rows.append((f"consequence: {name}", careful - hurried, f">= {CONSEQUENCE}",
                     careful - hurried >= CONSEQUENCE))
    s = struct
    rows += [("Voting - single", s["voting_minus_single"], "> 0", s["voting_minus_single"] > 0),
             ("Orch-Workers - single", s["orchworkers_minus_single"], ">= 0",
              s["orchworkers_minus_single"] >= 0),
             ("evaluator - best constant verdict", s["evaluator_edge"], f">= {EVALUATOR_EDGE}",
              s["evaluator_edge"] >= EVALUATOR_EDGE),
             ("retry of a wrong attempt: right", s["retry_fixes"], f">= {FIX_AT_LEAST}",
              s["retry_fixes"] >= FIX_AT_LEAST),
             ("retry of a right attempt: wrong", s["retry_breaks"], "> 0", s["retry_breaks"] > 0),
             ("solver right, guessed from length", s["length_predicts_right"],
              f"<= {LENGTH_AT_MOST}", s["length_predicts_right"] <= LENGTH_AT_MOST),
             ("evaluator gives the answer away", s["evaluator_states_answer"],
              f"<= {STATES_AT_MOST}", s["evaluator_states_answer"] <= STATES_AT_MOST)]
    return rows


def report(seed: int, temperature: float, success: dict, oracle_success: dict, habits: dict,
           struct: dict, swaps: dict) -> tuple[str, dict]:
    """The printed table and the JSON record of one seed's calibration; `record["missed"]` names
    what failed."""
    accuracy = ", ".join(f"{w} {success[w]:.3f} / {oracle_success[w]:.3f}" for w in success)
    lines = [f"toy model, seed {seed}: the base model against its targets (temperature "
             f"{temperature})", f"workflow accuracy (base model / oracle): {accuracy}",
             f"{'habit':<11}{'calls':>6}{'careful':>9}{'oracle':>8}{'right':>8}{'oracle':>8}"
             f"{'own fmt':>9}{'foreign':>9}"]
    for kind, h in habits.items():
        lines.append(f"{kind:<11}{h['calls']:>6}{h['careful']:>9.3f}{h['oracle_careful']:>8.3f}"
                     f"{h['right']:>8.3f}{h['oracle_right']:>8.3f}{h['own_format']:>9.3f}"
                     f"{h['foreign_format']:>9.3f}")
    rows = checks(habits, struct, swaps)
    lines += [f"{'ok  ' if held else 'MISS'} {name:<40} {value:>8.3f}   target {target}"
              for name, value, target, held in rows]
    missed = [name for name, _, _, held in rows if not held]
    lines.append("calibration: every target holds" if not missed else
                 f"calibration: {len(missed)} target(s) missed: {', '.join(missed)}")
    record = {"seed": seed, "temperature": temperature, "success": success,
              "oracle_success": oracle_success, "habits": habits, "structure": struct,
              "swaps": swaps, "missed": missed}
    return "\n".join(lines), json_safe(record)


def json_safe(value):
    """NaN (a measure with nothing to count, e.g. no retry of a right attempt) as None, as JSON has
    no NaN."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def keep_beside_model(seed: int, record: dict) -> None:
    """The record, beside the seed's toy model (`toy.calibration_record` reads it): written aside
    and renamed."""
    path = os.path.join(folder(seed), "calibration.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


# The study's compact results, committed: its calibration records say which seeds' models pass
# (toyworld/study.py)
STUDY_RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                             "findings", "results", "study.json")


def calibration_record(seed: int) -> dict | None:
    """The calibration record of the seed's toy model: the one `eval.py calibrate` wrote beside it,
    else the study's (STUDY_RESULTS, the seeds it and its replication calibrated at this VERSION);
    None when there is none."""
    try:
        with open(os.path.join(folder(seed), "calibration.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    try:
        with open(STUDY_RESULTS) as f:
            study = json.load(f)
    except (OSError, ValueError):
        return None
    records = [*study.get("calibration", []), *study.get("replication", {}).get("calibration", [])]
    records = records if study.get("toy_version") == VERSION else []
    return next((r for r in records if r.get("seed") == seed), None)


def calibration_warning(seed: int) -> str | None:
    """One line when the seed's toy model misses a calibration target, or has no record; None when
    it passes."""
    record = calibration_record(seed)
    if record is None:
        return (f"note: no calibration record for the toy model of seed {seed} here "
                f"(python -m toyworld.toy --calibrate --seed {seed}, about 3 minutes)")
    if record["missed"]:
        return (
            f"warning: the toy model of seed {seed} misses {len(record['missed'])} calibration "
            f"target(s) ({', '.join(record['missed'])}); the study sets such a seed aside "
            "(docs/toy_world.md)")
    return None


def measure(play, engine, tokenizer, encode, seed: int, episodes: int | None,
            temperature: float) -> tuple[str, dict]:
    """Every workflow played by the model (`engine`) alone, by the oracle alone, and with one habit
    at a time played by an always-careful and an always-hurried oracle (`SWAPS`); `play` is
    eval.play_every_problem. Returns `report`'s table and record."""
    def route(name: str) -> str:  # a plain model: names pick no adapter
        return name
    say = lambda what: print(f"[toy] seed {seed} calibration: {what}", flush=True)  # noqa: E731
    say("the model plays every workflow on all 243 problems "
        f"({', '.join(map(str, EPISODES.values()))} episodes a problem)")
    runs = {w: play(w, episodes or n, engine, encode, route) for w, n in EPISODES.items()}
    say("the oracle plays the same")
    oracle = Oracle(seed, KNOBS, tokenizer)
    by_oracle = {w: play(w, episodes or n, oracle, encode) for w, n in EPISODES.items()}
    swaps = {}
    say(f"{len(SWAPS)} roles, each played by an always-careful and an always-hurried oracle")
    for workflow, habit, name in SWAPS:
        accuracy = []
        for careful in (True, False):
            mixed = MixedEngine(engine, tokenizer, {habit: careful}, seed)
            played = play(workflow, episodes or SWAP_EPISODES, mixed, encode, route)
            accuracy.append(sum(e.correct for e in played) / len(played))
        swaps[f"{workflow} {name}"] = tuple(accuracy)
    by_kind = call_records([e for eps in runs.values() for e in eps], tokenizer.decode, seed)
    success = {w: sum(e.correct for e in eps) / len(eps) for w, eps in runs.items()}
    oracle_success = {w: sum(e.correct for e in eps) / len(eps) for w, eps in by_oracle.items()}
    return report(seed, temperature, success, oracle_success, habit_table(by_kind),
                  structure(success, by_kind), swaps)

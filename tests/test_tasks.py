"""Tests for tasks.py: the math reward table, synthetic tasks, splits, and the loader.

Run from the repo root: python -m pytest tests/test_tasks.py -q
The grade table also pins what math-verify 0.9 decides on the edge cases
(fraction vs decimal, "x = 19", units, percent...), so an upgrade that changes
the reward shows up here.
"""
import json
import re
import threading
import time
from fractions import Fraction

import pytest

from tasks import DataError, Grade, Task, grade, grade_math, last_boxed, load_tasks, math_splits, synthetic_math


def load_math(source, **kwargs):
    return load_tasks("dapo", source, **kwargs)

B = lambda s: "\\boxed{" + s + "}"  # noqa: E731

# (case id, model output, gold, reward, parsed, formatted, reason)
GRADE_CASES = [
    ("plain", "The answer is " + B("85"), "85", 1.0, "85", True, "correct"),
    ("wrong", B("84"), "85", 0.0, "84", True, "wrong"),
    ("no_box", "The answer is 85.", "85", 0.0, None, False, "no_box"),
    ("box_without_braces", "\\boxed 85", "85", 0.0, None, False, "no_box"),
    ("empty_box", "so " + B(""), "85", 0.0, "", False, "empty_box"),
    ("whitespace_box", B("   "), "85", 0.0, "", False, "empty_box"),
    ("spaces_inside_box", B("  85 "), "85", 1.0, "85", True, "correct"),
    ("last_box_wins", B("3") + " no wait " + B("4"), "4", 1.0, "4", True, "correct"),
    ("last_box_wins_even_if_wrong", B("4") + " no wait " + B("3"), "4", 0.0, "3", True, "wrong"),
    ("unbalanced_last_box_skipped", B("7") + " then \\boxed{8", "7", 1.0, "7", True, "correct"),
    ("only_unbalanced_box", "\\boxed{\\frac{1}{2}", "1/2", 0.0, None, False, "no_box"),
    ("fbox", "\\fbox{12}", "12", 1.0, "12", True, "correct"),
    ("fbox_after_boxed", B("1") + "\\fbox{2}", "2", 1.0, "2", True, "correct"),
    ("nested_braces", B("\\frac{1}{2}"), "1/2", 1.0, "\\frac{1}{2}", True, "correct"),
    ("nested_box_inner_wins", B(B("5")), "5", 1.0, "5", True, "correct"),
    ("think_box_before_ignored", B("85") + "</think> I give up", "85", 0.0, None, False, "no_box"),
    ("think_box_after_counts", B("1") + "</think>" + B("85"), "85", 1.0, "85", True, "correct"),
    ("last_think_used", "</think>" + B("85") + "</think>" + B("9"), "85", 0.0, "9", True, "wrong"),
    ("fraction_vs_decimal", B("0.5"), "1/2", 1.0, "0.5", True, "correct"),
    ("decimal_gold_vs_fraction", B("1/2"), "0.5", 1.0, "1/2", True, "correct"),
    ("improper_fraction_vs_decimal", B("3.5"), "7/2", 1.0, "3.5", True, "correct"),
    ("third_rounded_3dp", B("0.333"), "1/3", 0.0, "0.333", True, "wrong"),  # off by > 1e-6
    ("third_rounded_7dp", B("0.3333333"), "1/3", 1.0, "0.3333333", True, "correct"),
    ("latex_frac", B("\\frac{7}{2}"), "7/2", 1.0, "\\frac{7}{2}", True, "correct"),
    ("latex_dfrac", B("\\dfrac{7}{2}"), "7/2", 1.0, "\\dfrac{7}{2}", True, "correct"),
    ("latex_gold_vs_slash", B("1/2"), "\\frac{1}{2}", 1.0, "1/2", True, "correct"),
    ("unreduced_fraction", B("14/4"), "7/2", 1.0, "14/4", True, "correct"),
    ("spaced_fraction", B("3 / 4"), "3/4", 1.0, "3 / 4", True, "correct"),
    ("negative", B("-3"), "-3", 1.0, "-3", True, "correct"),
    ("sign_error", B("3"), "-3", 0.0, "3", True, "wrong"),
    ("negative_latex_frac", B("-\\frac{1}{6}"), "-1/6", 1.0, "-\\frac{1}{6}", True, "correct"),
    ("negative_in_numerator", B("\\frac{-1}{6}"), "-1/6", 1.0, "\\frac{-1}{6}", True, "correct"),
    ("trailing_zero_decimal", B("19.0"), "19", 1.0, "19.0", True, "correct"),
    ("trailing_period", B("19."), "19", 1.0, "19.", True, "correct"),
    ("equation_x_equals", B("x = 19"), "19", 1.0, "x = 19", True, "correct"),  # math-verify takes the rhs
    ("equation_negative", B("x = -3"), "-3", 1.0, "x = -3", True, "correct"),
    ("units_text", B("12 apples"), "12", 1.0, "12 apples", True, "correct"),
    ("thousands_comma", B("1,000"), "1000", 1.0, "1,000", True, "correct"),
    ("percent_sign_dropped", B("19\\%"), "19", 1.0, "19\\%", True, "correct"),
    ("word_answer", B("\\text{five}"), "5", 0.0, "\\text{five}", True, "wrong"),
    ("garbage", B("["), "5", 0.0, "[", True, "wrong"),
    # Copying the question is not solving it: math-verify alone would accept these.
    ("unevaluated_sum", B("47 + 38"), "85", 0.0, "47 + 38", True, "wrong"),
    ("unevaluated_times", B("67 \\times 70"), "4690", 0.0, "67 \\times 70", True, "wrong"),
    ("unevaluated_minus", B("5 - 2"), "3", 0.0, "5 - 2", True, "wrong"),
    # ...but symbolic golds keep full math-verify equivalence.
    ("symbolic_reordered", B("\\sqrt{3}+2"), "2+\\sqrt{3}", 1.0, "\\sqrt{3}+2", True, "correct"),
    ("too_long", B("1" * 501), "5", 0.0, "1" * 501, True, "unparseable"),
    ("nothing_math_in_box", B("$$"), "5", 0.0, "$$", True, "unparseable"),
]


@pytest.mark.parametrize("output,gold,reward,parsed,formatted,reason",
                         [c[1:] for c in GRADE_CASES], ids=[c[0] for c in GRADE_CASES])
def test_grade_math_table(output, gold, reward, parsed, formatted, reason):
    assert grade_math(output, gold) == Grade(reward, parsed, formatted, reason)


def test_two_integers_are_graded_as_math_verify_grades_them():
    """The integer fast path (no 2 ms math-verify parse) gives math-verify's verdict on every pair of these,
    leading zeros, signs and zero included."""
    from math_verify import parse, verify
    values = ["0", "-0", "7", "-7", "42", "042", "-42", "81", "18", "100"]
    for pred in values:
        for gold in values:
            expected = float(verify(parse("\\boxed{" + gold + "}"), parse("\\boxed{" + pred + "}")))
            assert grade_math("\\boxed{" + pred + "}", gold).reward == expected, (pred, gold)


def test_grade_table_is_large_and_mixed():
    assert len(GRADE_CASES) >= 30
    assert {c[6] for c in GRADE_CASES} == {"correct", "wrong", "no_box", "empty_box", "unparseable"}


def test_long_output_with_thousands_of_braces_is_fast():
    noise = "\\boxed{x^{" * 3000 + "{a}" * 5000  # thousands of unbalanced boxes and braces
    output = (noise + " " * 100_000)[:99_980] + B("42")
    assert len(output) == 99_980 + len(B("42")) and output.count("{") > 8000
    start = time.perf_counter()
    result = grade_math(output, "42")
    assert time.perf_counter() - start < 1.0
    assert result == Grade(1.0, "42", True, "correct")


def test_long_output_without_box_is_fast():
    output = ("{ let me think " * 10_000)[:100_000]
    start = time.perf_counter()
    result = grade_math(output, "42")
    assert time.perf_counter() - start < 1.0
    assert result == Grade(0.0, None, False, "no_box")


def test_last_boxed_is_linear_on_many_unbalanced_boxes():
    text = "\\boxed{" * 40_000  # naive forward matching (or rfind from the end) is quadratic here
    start = time.perf_counter()
    assert last_boxed(text) is None
    assert last_boxed(B("1") + text) == "1"
    assert time.perf_counter() - start < 1.0  # linear: ~0.2 s; quadratic: several seconds


@pytest.mark.parametrize("text,expected", [
    ("", None),
    ("\\boxed{}", ""),
    ("\\boxed{a{b}c}", "a{b}c"),
    ("\\boxed{1}\\boxed{2}", "2"),
    ("\\boxed{1} \\boxed{2", "1"),
    ("\\boxed{1} \\boxed{2}}", "2"),
    ("\\fbox{\\frac{1}{2}} tail", "\\frac{1}{2}"),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_pathological_answer_times_out():
    start = time.perf_counter()
    result = grade_math(B("9^{9^{9^{9}}}"), "x+1", timeout_s=1.0)
    assert time.perf_counter() - start < 3.0
    assert result == Grade(0.0, "9^{9^{9^{9}}}", True, "timeout")


def test_grade_math_works_outside_the_main_thread():
    # math-verify's signal-based timeouts raise in worker threads; grade_math must not.
    results: list[Grade] = []
    worker = threading.Thread(target=lambda: results.append(grade_math(B("\\frac{7}{2}"), "7/2")))
    worker.start()
    worker.join(timeout=30)
    assert results == [Grade(1.0, "\\frac{7}{2}", True, "correct")]


def test_grade_dispatches_on_kind():
    task = Task(id="t", question="What is 1 + 1?", answer="2", kind="math")
    assert grade(task, B("2")) == Grade(1.0, "2", True, "correct")
    assert grade(task, B("3")).reward == 0.0
    with pytest.raises(ValueError, match="unknown task kind 'poetry'"):
        grade(Task(id="t", question="q", answer="", kind="poetry"), "x")


# ---- synthetic tasks ----

def _fractionize(expr: str) -> str:
    """'3 / 4' -> 'Fraction(3) / Fraction(4)', so eval computes exactly."""
    return re.sub(r"\d+", lambda m: f"Fraction({m.group()})", expr)


def _value_of_question(question: str) -> Fraction:
    """Recompute an arithmetic question independently: 'What is (3 × 4) ÷ 8?' -> 3/2."""
    assert question.startswith("What is ") and question.endswith("?")
    expr = question[len("What is "):-1].replace("×", "*").replace("÷", "/")
    assert set(expr) <= set("0123456789+-*/() ")
    return eval(_fractionize(expr), {"Fraction": Fraction})


def _as_fraction(answer: str) -> Fraction:
    assert answer == answer.strip() and " " not in answer
    return Fraction(answer)


def test_synthetic_math_is_deterministic_per_seed():
    first, again = synthetic_math(50, difficulty=1, seed=7), synthetic_math(50, difficulty=1, seed=7)
    assert first == again
    other = synthetic_math(50, difficulty=1, seed=8)
    assert [t.question for t in other] != [t.question for t in first]


@pytest.mark.parametrize("difficulty", [0, 1])
def test_synthetic_math_shape(difficulty):
    tasks = synthetic_math(200, difficulty=difficulty, seed=0)
    assert len(tasks) == 200
    assert tasks[17].id == f"arith-d{difficulty}-00017"
    assert len({t.question for t in tasks}) == 200  # no duplicates
    for t in tasks:
        assert t.kind == "math" and "boxed" not in t.question
        assert t.metadata["difficulty"] == difficulty
        value = _as_fraction(t.answer)
        assert value == eval(_fractionize(t.metadata["expression"]), {"Fraction": Fraction})
        assert grade(t, f"So the answer is \\boxed{{{t.answer}}}.").reward == 1.0


def test_difficulty_1_answers_are_correct():
    for t in synthetic_math(300, difficulty=1, seed=3):
        expr = t.question[len("What is "):-1]
        a, op, b = expr.split(" ")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and op in "+-×"
        assert _as_fraction(t.answer) == _value_of_question(t.question)


PINNED_D1 = [("What is 59 + 63?", "122"), ("What is 43 - 75?", "-32")]


def test_seed_0_is_pinned():
    # Guards against silent changes to the generators: saved runs name tasks by id.
    assert [(t.question, t.answer) for t in synthetic_math(2, difficulty=1, seed=0)] == PINNED_D1


@pytest.mark.parametrize("bad", [-1, 2, "1"])
def test_bad_difficulty(bad):
    with pytest.raises(ValueError, match="difficulty must be 0 or 1"):
        synthetic_math(5, difficulty=bad)


def test_difficulty_0_is_one_op_on_digits_and_has_243_problems():
    tasks = synthetic_math(243, difficulty=0, seed=0)  # 9 * 9 * 3 distinct questions: all of them
    for t in tasks:
        a, op, b = t.metadata["expression"].split()
        assert 1 <= int(a) <= 9 and 1 <= int(b) <= 9 and op in "+-*"
        assert t.answer == str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
    with pytest.raises(ValueError, match="could only draw 243"):
        synthetic_math(244, difficulty=0, seed=0)


def test_math_splits_are_disjoint_and_fixed():
    train, val = math_splits(n_train=1500, n_val=150, difficulty=1, seed=0)
    assert (len(train), len(val)) == (1500, 150)
    assert not {t.question for t in train} & {t.question for t in val}
    assert len({t.question for t in train}) == 1500
    assert train[0].id == "arith-d1-train-00000" and val[3].id == "arith-d1-val-00003"
    assert not {t.id for t in train} & {t.id for t in val}
    assert math_splits(n_train=1500, n_val=150, difficulty=1, seed=0) == (train, val)
    _, val_small_train = math_splits(n_train=10, n_val=150, difficulty=1, seed=0)
    assert val_small_train == val  # val does not move when the train size changes
    _, val_other_seed = math_splits(n_train=10, n_val=150, difficulty=1, seed=1)
    assert [t.question for t in val_other_seed] != [t.question for t in val]


# ---- loading DAPO-style files ----

def _dapo_row(i: int, chat: bool) -> dict:
    question = f"Compute {i} + {i}. Give the final answer."
    return {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
        if chat else question,
        "solution": str(2 * i),
        "data_source": "math_dapo",
        "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": f"uuid-{i}"},
    }


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _write_parquet(path, rows) -> str:
    import datasets
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def test_load_math_jsonl_with_chat_prompts(tmp_path):
    source = _write_jsonl(tmp_path / "dapo.jsonl", [_dapo_row(i, chat=True) for i in range(5)])
    tasks = load_math(source)
    assert [t.id for t in tasks] == [f"uuid-{i}" for i in range(5)]
    assert tasks[3].question == "Compute 3 + 3. Give the final answer."  # last user message
    assert tasks[3].answer == "6" and tasks[3].kind == "math"
    assert tasks[3].metadata["data_source"] == "math_dapo"
    assert [t.id for t in load_math(source, limit=2)] == ["uuid-0", "uuid-1"]


def test_load_math_parquet_with_string_prompts(tmp_path):
    rows = [_dapo_row(i, chat=False) for i in range(4)]
    for row in rows:
        del row["extra_info"]  # ids fall back to <file stem>-<row>
    tasks = load_math(_write_parquet(tmp_path / "dapo.parquet", rows))
    assert [t.id for t in tasks] == ["dapo-0", "dapo-1", "dapo-2", "dapo-3"]
    assert (tasks[2].question, tasks[2].answer) == ("Compute 2 + 2. Give the final answer.", "4")
    assert grade(tasks[2], B("4")).reward == 1.0


def test_load_math_answer_from_reward_model(tmp_path):
    rows = [_dapo_row(i, chat=False) for i in range(3)]
    for row in rows:
        del row["solution"]
        row["reward_model"]["ground_truth"] = f"\\frac{{{row['reward_model']['ground_truth']}}}{{3}}"
    tasks = load_math(_write_jsonl(tmp_path / "rm.jsonl", rows))
    assert [t.answer for t in tasks] == ["\\frac{0}{3}", "\\frac{2}{3}", "\\frac{4}{3}"]


def test_load_math_missing_field_names_file_and_row(tmp_path):
    rows = [_dapo_row(i, chat=True) for i in range(3)]
    del rows[1]["solution"]
    source = _write_jsonl(tmp_path / "broken.jsonl", rows)
    with pytest.raises(DataError) as err:
        load_math(source)
    assert str(err.value) == f"{source}: row 1: missing or empty field 'solution'"


def test_load_math_empty_answer_names_file_and_row(tmp_path):
    rows = [_dapo_row(i, chat=False) for i in range(4)]
    rows[3]["solution"] = "  "
    source = _write_parquet(tmp_path / "empty.parquet", rows)
    with pytest.raises(DataError, match="row 3: missing or empty field 'solution'") as err:
        load_math(source)
    assert source in str(err.value) and "\n" not in str(err.value)
    assert len(load_math(source, limit=3)) == 3  # rows past the limit are not checked


def test_load_math_no_user_message(tmp_path):
    rows = [_dapo_row(0, chat=True), _dapo_row(1, chat=True)]
    rows[1]["prompt"] = [{"role": "system", "content": "Be brief."}]
    source = _write_jsonl(tmp_path / "nouser.jsonl", rows)
    with pytest.raises(DataError, match="row 1: missing or empty field 'prompt'"):
        load_math(source)


def test_load_math_no_question_column(tmp_path):
    source = _write_jsonl(tmp_path / "cols.jsonl", [{"text": "hi", "solution": "1"}])
    with pytest.raises(DataError, match="no question field"):
        load_math(source)


def test_load_math_missing_file(tmp_path):
    source = str(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="not found") as err:
        load_math(source)
    assert source in str(err.value)


def test_a_hub_id_without_a_network_is_one_line_at_once(monkeypatch):
    """No network (the hub's host does not resolve): one line that names the remedies, without the hub client's
    ~30 s of retries. getaddrinfo is patched to fail, so the test behaves alike on a machine with a network."""
    import socket
    import time

    from huggingface_hub import constants

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    start = time.monotonic()
    with pytest.raises(DataError, match=r"^org/dataset: the hub cannot be reached from here \(no network\?\); pass "
                                        r"a local copy with --data FILE"):
        load_math("org/dataset")
    assert time.monotonic() - start < 5  # was ~26 s: five retries, 1 + 2 + 4 + 8 + 8 s apart

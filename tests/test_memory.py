"""The memory plan's terms (infra/memory.py), each against a hand computation. The plan is what bench/bench_memory.py
prints per model, task and GPU, and what bounds the HF engine's generate() calls on CUDA (--gen-max-tokens 0)."""
import pytest

from infra import memory

GIB = 2 ** 30


def test_the_padded_mask_of_a_micro_batch_is_in_the_plan():
    """transformers builds a [rows, 1, W, W] bool mask when a micro-batch's rows differ in length, and SDPA a bf16
    copy: 3 bytes a cell. At a 262,144-token budget with 35,840-token rows (math Eval-Opt): 262144 // 35840 = 7
    rows, 7 x 35,840^2 x 3 = 7 x 1,284,505,600 x 3 = 26,974,617,600 bytes, 27.0 GB that the plan before this term
    did not count."""
    assert memory.mask_bytes(262144, 35840) == 7 * 35840 ** 2 * 3 == 26_974_617_600
    assert memory.mask_bytes(1000, 4000) == 4000 ** 2 * 3  # a row wider than the budget goes alone


def test_the_update_counts_every_ip_adapter_and_the_mask():
    """Round numbers: 1e9 parameters (bf16: 2e9 bytes), 1e7 LoRA parameters at 16 bytes each per adapter, a
    1,000-token budget of 100-token rows in 10 layers at 2 bytes per checkpointed layer-token plus 50 for one
    layer's recompute, a 1e6-byte LM head chunk, 3 GiB of slack."""
    args = dict(params=1e9, lora_params=1e7, budget=1000, longest_row=100, layers=10, ckpt_layer_token=2.0,
                full_layer_token=50.0, head=1e6)
    mask = 10 * 100 * 100 * 3  # 1000 // 100 = 10 rows
    one = 2e9 + 16e7 + 3 * GIB + 1000 * (10 * 2 + 50) + mask + 1e6
    assert memory.update_bytes(adapters=1, **args) == pytest.approx(one, rel=1e-12)
    assert memory.update_bytes(adapters=3, **args) - memory.update_bytes(adapters=1, **args) == \
        pytest.approx(2 * 16e7, rel=1e-12)  # Orch-Workers IP: orchestrator, worker, synthesizer
    drift = 2e9 + 16e7 + 3 * GIB + 1000 * 50 + mask + 1e6  # no gradient: one layer's activations at a time
    assert memory.drift_bytes(1e9, 1e7, 1, 1000, 100, 50.0, 1e6) == pytest.approx(drift, rel=1e-12)


def test_the_hf_engines_token_bound_is_the_kv_cache_that_fits():
    """Qwen3-0.6B: 28 layers x 8 KV heads x 128 dims x (key + value) x 2 bytes = 114,688 bytes a token; 80% of
    40 GiB free holds 299,593 tokens (int(0.8 x 42,949,672,960 / 114,688))."""
    kv = memory.kv_bytes_per_token(28, 8, 128)
    assert kv == 114_688
    assert memory.generation_tokens(40 * GIB, kv) == 299_593

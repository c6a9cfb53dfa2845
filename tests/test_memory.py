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


# ---------------------------------------------------------------- what the vLLM engine does to torch's counters

@pytest.fixture
def fake_cuda_vllm(monkeypatch):
    """A stand-in `vllm` package and CUDA counters (the suite hides CUDA: tests/conftest.py), so that VLLMEngine's
    memory accounting runs on CPU. torch's allocated bytes and the device's free bytes are `state`; every call that
    matters is appended to `log` in order. The stand-in LLM allocates 50 GiB (weights and KV cache) in torch's
    counters and takes 52 GiB of the device; its KV cache is 1,000 blocks of 16 tokens."""
    import sys
    import types

    import torch
    state, log = {"allocated": 2 * GIB, "free": 130 * GIB, "peak": 0}, []

    class LLM:
        def __init__(self, **kw):
            state["allocated"] += 50 * GIB
            state["free"] -= 52 * GIB
            cache = types.SimpleNamespace(num_gpu_blocks=1000, block_size=16)
            self.llm_engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(cache_config=cache),
                                                    add_lora=lambda r: None, remove_lora=lambda i: None)

        def sleep(self, level):
            log.append(f"sleep {level}")
            state["allocated"] -= state.pop("released", 0)

        def wake_up(self):
            log.append("wake_up")

    platform = types.SimpleNamespace(is_sleep_mode_available=lambda: True, is_cpu=lambda: False)
    modules = {"vllm": types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw),
               "vllm.lora": types.ModuleType("vllm.lora"),
               "vllm.lora.request": types.SimpleNamespace(LoRARequest=lambda *a: types.SimpleNamespace(
                   lora_name=a[0], lora_int_id=a[1], lora_path=a[2])),
               "vllm.platforms": types.SimpleNamespace(current_platform=platform)}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: state["allocated"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (state["free"], 141 * GIB))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: state["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: log.append("reset_peak_memory_stats"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    return state, log


def _engine(make_lora_model):
    from infra.vllm_engine import VLLMEngine
    from policies import to_generation
    return VLLMEngine("unused-folder", make_lora_model(), None, {0}, to_generation, dtype="float32")


def test_vllm_sleep_resets_the_peak_counters_and_wake_up_empties_the_cache_first(fake_cuda_vllm, make_lora_model):
    """The peak after sleep is the drift check's and the update's (not the rollout's, vLLM awake); the trainer's
    cached blocks are returned to the device before vLLM re-maps its memory."""
    state, log = fake_cuda_vllm
    engine = _engine(make_lora_model)
    log.clear()
    engine.sleep()
    engine.wake_up()
    assert log == ["sleep 1", "reset_peak_memory_stats", "empty_cache", "wake_up"]


def test_memory_peak_is_the_trainers_own_and_vllms_footprint_is_logged_once(fake_cuda_vllm, make_lora_model,
                                                                           capsys):
    """torch counts vLLM's 50 GiB through its sleep: an update peaking at 62 GiB in torch's counters is 12 GiB of
    the trainer's. Where the sleep returns 20 GiB to torch's counters, 30 GiB are vLLM's and the same 62 GiB peak
    is 32 GiB of the trainer's. The KV cache: 1,000 blocks x 16 tokens x (2 layers x 2 KV heads x 16 dims x key
    and value x 4 bytes = 512 bytes) = 8,192,000 bytes = 0.0076 GiB; the footprint 52 GiB of the device."""
    state, log = fake_cuda_vllm
    engine = _engine(make_lora_model)
    assert engine.kv_cache_bytes == 1000 * 16 * 512 == 8_192_000
    out = capsys.readouterr().out
    assert out.count("vLLM: KV cache") == 1
    assert "KV cache 0.01 GiB, awake footprint 52.00 GiB of the device (50.00 GiB in torch's counters)" in out
    engine.sleep()
    state["peak"] = 62 * GIB
    assert engine.trainer_peak_bytes() == 12 * GIB
    engine.wake_up()
    state["released"] = 20 * GIB
    engine.sleep()
    assert engine.trainer_peak_bytes() == 32 * GIB


@pytest.mark.parametrize("small", [True, False])
def test_the_gpu_checks_memory_rows_are_three_padded_micro_batches_at_the_budget(small):
    """bench/gpu_check.py's memory check must exercise what a cell's update does: an IP generator group cut into
    3 mini-batches of 4 (the later two need the old-log-prob pass), each one micro-batch whose rows differ in
    length (so transformers builds the 4D mask) and fill the budget exactly: 4 x 12,800 = 51,200 tokens on the
    GPU, 4 x 256 = 1,024 in --small."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import gpu_check

    from policies import micro_batches
    rows, budget, longest = gpu_check.generator_rows(small, 1000)
    assert (budget, longest) == ((1024, 256) if small else (51200, 12800))
    assert len(rows) == 12 and {r.adapter for r in rows} == {"generator"}
    for start in (0, 4, 8):
        mb = rows[start:start + 4]
        cut = micro_batches([r.prompt_ids for r in mb], [r.completion_ids for r in mb], 512, budget)
        widths = [len(r.prompt_ids) + len(r.completion_ids) for r in mb]
        assert len(cut) == 1 and len(set(widths)) == 4 and 4 * max(widths) == budget

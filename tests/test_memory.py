"""The memory plan's terms (infra/memory.py), each against a hand computation. The plan is what bench/bench_memory.py
prints per model, task and GPU, and what bounds the HF engine's generate() calls on CUDA (--gen-max-tokens 0)."""
import types

import pytest
import torch

from infra import memory

GIB = 2 ** 30


def mask_bytes(rows: int, q_length: int, kv_length: int) -> int:
    """The mask of one attention call whose rows differ in length, with its copies: rows x q x kv cells."""
    return rows * q_length * kv_length * memory.mask_cell_bytes(kv_length)


def test_a_mask_cell_costs_5_bytes_when_the_key_length_is_not_a_multiple_of_8():
    """transformers' bool mask (1 byte), SDPA's additive bf16 copy (2), and the memory-efficient kernel's aligned
    copy (2) when kv % 8 != 0. The GPU check's micro-batch: 4 rows of 12,801 tokens, 4 x 12,801^2 x 5 =
    3,277,312,020 bytes; at 12,800 (a multiple of 8) 4 x 12,800^2 x 3 = 1,966,080,000."""
    assert [memory.mask_cell_bytes(n) for n in (8, 12800, 12801, 35839, 35840)] == [3, 3, 5, 5, 3]
    assert mask_bytes(4, 12801, 12801) == 3_277_312_020
    assert mask_bytes(4, 12800, 12800) == 1_966_080_000
    assert mask_bytes(3, 1, 9) == 3 * 9 * 5  # a decode step: one query row per sequence


def test_the_widest_mask_within_a_budget_is_found_by_hand_and_by_brute_force():
    """rows x W <= budget: 262,144 // 35,840 = 7 rows of 35,840 (7 x 35,840^2 = 8,991,539,200 cells, 41.9 GiB at
    5 bytes); at a 71,679 budget two rows of 35,839 (2,568,867,842 cells) beat one of 35,840 (1,284,505,600); a
    row wider than the budget goes alone. Small budgets against every width W <= longest."""
    assert memory.widest_mask_cells(262144, 35840) == 7 * 35840 ** 2 == 8_991_539_200
    assert memory.worst_mask_bytes(262144, 35840) == 44_957_696_000
    assert memory.widest_mask_cells(71679, 35840) == 2 * 35839 ** 2 == 2_568_867_842
    assert memory.widest_mask_cells(1000, 4000) == 4000 ** 2
    for budget in range(1, 120):
        for longest in range(1, budget + 1):
            brute = max((budget // w) * w * w for w in range(1, longest + 1))
            assert memory.widest_mask_cells(budget, longest) == brute, (budget, longest)


def test_with_a_mask_k_and_v_are_repeated_across_heads_and_the_measurement_shows_it():
    """Qwen3-4B: 2 x (32 - 8) heads x 128 x 2 bytes = 12,288 bytes (12 KiB) a token in one layer; 0.6B and 1.7B
    (16 heads, 8 KV heads): 4,096 (4 KiB). The per-layer figures measured on padded micro-batches (QWEN3_LAYER_KIB)
    are the earlier unpadded ones (91.9, 149.9, 223.0 KiB) plus exactly this, within the 0.1 KiB of rounding."""
    assert memory.repeated_kv_bytes_per_token(32, 8, 128) == 12_288
    assert memory.repeated_kv_bytes_per_token(16, 8, 128) == 4_096
    unpadded = {"0.6B": 91.9, "1.7B": 149.9, "4B": 223.0}
    heads = {"0.6B": 16, "1.7B": 16, "4B": 32}
    for name, (_, full) in memory.QWEN3_LAYER_KIB.items():
        added = memory.repeated_kv_bytes_per_token(heads[name], 8, 128) / 1024
        assert full - unpadded[name] == pytest.approx(added, abs=0.1), name


def test_transformers_sdpa_path_repeats_k_and_v_only_when_rows_are_padded(monkeypatch):
    """What the plan's repeated-K/V term rests on, with the installed transformers: tiny-qwen3 (4 query heads, 2
    KV heads). Rows of equal length: no mask, SDPA gets 2 KV heads (GQA in the kernel). One row padded: a
    [2, 1, 6, 6] mask, and K arrives with 4 heads."""
    import policies
    torch.manual_seed(0)
    model, _ = policies.load_model("tiny-qwen3")
    seen, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((k.shape[1], None if attn_mask is None else tuple(attn_mask.shape)))
        return real(q, k, v, attn_mask=attn_mask, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = torch.randint(0, 200, (2, 6))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        assert set(seen) == {(2, None)}
        seen.clear()
        model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6]))
    assert set(seen) == {(4, (2, 1, 6, 6))}


def test_sp_snapshots_and_the_shared_prompt_cache_at_4b():
    """Qwen3-4B's rank-64 LoRA: 36 layers x 64 x 57,344 (q, k, v, o, gate, up, down in + out) = 132,120,576
    parameters, an fp32 snapshot 528,482,304 bytes (0.49 GiB) per SP role; Orch-Workers SP (3 roles) holds 3.
    The no-grad passes' shared-prompt KV cache at the cells' 51,200-token budget: 36 x 8 x 128 x 2 x 2 = 147,456
    bytes (144 KiB) a token, 7,549,747,200 bytes (7.03 GiB)."""
    lora = 36 * 64 * 57344
    assert lora == 132_120_576
    assert memory.snapshot_bytes(lora, 1) == 0  # one role: no diagnostics
    assert memory.snapshot_bytes(lora, 3) == 3 * 528_482_304
    kv = memory.kv_bytes_per_token(36, 8, 128)
    assert kv == 147_456 and memory.shared_kv_bytes(51200, kv) == 7_549_747_200


def test_every_peak_of_a_step_by_hand():
    """Round numbers: 1e9 parameters (bf16: 2e9 bytes), 1e7 LoRA parameters, 10 layers at 2 bytes per checkpointed
    layer-token and 50 for one layer's recompute, a 100-byte KV cache a token, a 1e6-byte head chunk, a 1,000-token
    budget of 100-token rows: 10 rows, 100,000 mask cells, 500,000 bytes at 5 a cell.
      static, SP (1 adapter)   2e9 + 16 x 1e7 + 3 GiB = 5,381,225,472;  IP (3 adapters): 5,701,225,472
      SP snapshots, 3 roles    4 x 1e7 x 3 = 120,000,000
      update, SP               static + snapshots + 1000 x (10 x 2 + 50) + 500,000 + 1e6 = 5,502,795,472
      no-grad pass, SP         static + 1000 x 50 + 1000 x 100 (KV) + 500,000 + 1e6 = 5,382,875,472
      KL pass, SP              no-grad + snapshots + 1000 x 10 x 2 + 100,000 (the forward's bool mask)
                               = 5,502,995,472
      allocated                the update's, or with --kl-coef the KL pass's
      reserved                 + max(100,000 x 2, 1e6 / 5) = 5,502,995,472 or 5,503,195,472
      update, IP               5,701,225,472 + 70,000 + 500,000 + 1e6 = 5,702,795,472"""
    m = memory.Footprint(params=1e9, lora_params=1e7, layers=10, ckpt_layer_token=2.0, full_layer_token=50.0,
                         kv_token=100.0, head=1e6)
    assert memory.static_bytes(1e9, 1e7, 1) == 5_381_225_472
    peaks = {"update": 5_502_795_472, "nograd": 5_382_875_472, "kl": 5_502_995_472}
    assert memory.plan_bytes(m, adapters=1, roles=3, budget=1000, longest_row=100) == \
        {**peaks, "allocated": 5_502_795_472, "reserved": 5_502_995_472}
    assert memory.plan_bytes(m, adapters=1, roles=3, budget=1000, longest_row=100, kl=True) == \
        {**peaks, "allocated": 5_502_995_472, "reserved": 5_503_195_472}
    assert memory.update_bytes(m, 3, 1, 1000, 100) == 5_702_795_472
    # the static decode's K and V kept through the update (infra/decoding.CacheStore): beside every peak
    kept = memory.kept_store_bytes(tokens=20, kv_token=100)
    assert kept == 2000 and memory.plan_bytes(m, 1, 3, 1000, 100, kept=kept) == \
        {**{k: v + 2000 for k, v in peaks.items()}, "allocated": 5_502_797_472, "reserved": 5_502_997_472}


# ---------------------------------------------------------------- the HF engine's generate() calls

QWEN3_1_7B = dict(layers=28, kv_heads=8, heads=16, head_dim=128, hidden=2048, intermediate=6144, vocab=151936)
AGGREGATOR_WIDTH = 25600 + 8192  # Voting-1.7B-Math evaluation: a 25.6k-token prompt and 8,192 new tokens


def worked_example():
    """Voting-1.7B-Math evaluated on an 80 GB card: 80e9 bytes less the bf16 weights (2 x 1,720.6e6), the two
    trained adapters in fp32 (2 x 28 x 64 x 38,912 x 4 = 557,842,432) and 1 GiB of CUDA context: 74,927,215,744
    bytes free (69.8 GiB)."""
    return int(80e9 - 2 * 1720.6e6 - 2 * 28 * 64 * 38912 * 4 - GIB)


def test_the_worked_example_fits_on_80_gb_and_the_old_budget_did_not():
    """Before: the budget counted the KV cache alone, int(0.8 x 74,927,215,744 / 114,688) = 522,650 tokens, 15
    aggregator rows of 33,792; generate()'s one prefill of 15 rows then holds their prompts' KV cache (15 x 25,600
    x 114,688 = 44.0e9 bytes) and a [15, 1, P, P] mask (P = 25,599, the widest prompt, not a multiple of 8: 15 x
    25,599^2 x 5 = 49.1e9), already more than is free before any activation.
    After, per token: 114,688 (KV) + 4,096 (one layer's copy as it grows) + 4,096 (one layer's K and V repeated) +
    5 (a decode step's mask) + 40 (int64 ids, masks, positions) = 122,925; fixed: a prefill piece's 2^28 mask
    cells x 5 = 1,342,177,280, its 4,096 tokens x 110,592 (2 x (2 x 2,048 + 3 x 6,144) + 8 x (6,144 + 2,048), LoRA)
    = 452,984,832, sampling 64 rows x 151,936 x 24 = 233,373,696: 2,028,535,808. Budget: int((0.8 x free -
    fixed) / 122,925) = 471,126 tokens, 13 rows, holding 13 x 33,792 x 122,925 + fixed = 56,028,996,608 bytes
    (52.2 GiB), within 0.8 of the 69.8 GiB free. Each prefill piece: 315 columns of 13 rows (4,095 tokens),
    13 x 315 x 25,599 = 104,827,905 mask cells."""
    free = worked_example()
    assert free == 74_927_215_744
    c = QWEN3_1_7B
    kv = memory.kv_bytes_per_token(c["layers"], c["kv_heads"], c["head_dim"])
    old = memory.generation_tokens(free, kv)
    assert (kv, old, old // AGGREGATOR_WIDTH) == (114_688, 522_650, 15)
    assert 15 * 25600 * kv + mask_bytes(15, 25599, 25599) > free
    repeated = memory.repeated_kv_bytes_per_token(c["heads"], c["kv_heads"], c["head_dim"])
    per_token = memory.generation_bytes_per_token(kv, c["layers"], repeated)
    act = memory.prefill_activation_bytes_per_token(c["hidden"], c["intermediate"], c["heads"] * c["head_dim"], 2,
                                                    lora=True)
    fixed = memory.generation_fixed_bytes(act, 64, c["vocab"])
    assert (per_token, act, fixed) == (122_925, 110_592, 2_028_535_808)
    new = memory.generation_tokens(free, per_token, fixed)
    rows = new // AGGREGATOR_WIDTH
    assert (new, rows) == (471_126, 13)
    held = rows * AGGREGATOR_WIDTH * per_token + fixed
    assert held == 56_028_996_608 and held <= memory.GENERATION_FRACTION * free
    columns = memory.prefill_columns(rows, 25599)
    assert columns == 315 and rows * columns <= memory.PREFILL_TOKENS
    assert rows * columns * 25599 == 104_827_905 <= memory.PREFILL_CELLS


def qwen3_1_7b_on_cuda():
    """A stand-in CUDA model (the suite hides CUDA) with Qwen3-1.7B's config and a LoRA parameter."""
    c = QWEN3_1_7B
    config = types.SimpleNamespace(num_hidden_layers=c["layers"], num_key_value_heads=c["kv_heads"],
                                   num_attention_heads=c["heads"], head_dim=c["head_dim"], hidden_size=c["hidden"],
                                   intermediate_size=c["intermediate"], vocab_size=c["vocab"])
    param = types.SimpleNamespace(is_cuda=True, device="cuda:0", element_size=lambda: 2)
    return types.SimpleNamespace(config=config, parameters=lambda: iter([param]),
                                 named_parameters=lambda: iter([("q_proj.lora_A.generator.weight", param)]))


def test_the_hf_budget_reads_the_models_shape_and_the_free_memory(monkeypatch):
    """hf_generation_budget on a CUDA model, Qwen3-1.7B with LoRA and the worked example's 74,927,215,744 bytes
    free: fixed is the prefill piece alone, 1,342,177,280 + 452,984,832 = 1,795,162,112 bytes, so int((0.8 x
    free - fixed) / 122,925) = 473,025 tokens, each row counting its sampling buffers, 151,936 x 24 = 3,646,464
    bytes, as ceil(3,646,464 / 122,925) = 30 tokens more: 473,025 // (33,792 + 30) = 13 aggregator rows, as the
    worked example (13 x 33,822 x 122,925 + fixed = 55,843,563,662 bytes, within 0.8 of free). --gen-batch-size
    caps the rows, 0 leaves them to the tokens; --gen-max-tokens is taken as given. On the CPU: no token bound,
    one prefill pass, rows 0 -> 64."""
    import policies
    model, _ = policies.load_model("tiny")
    assert memory.hf_generation_budget(model, 0) == memory.GenerationBudget(64, 1 << 62, None, 0)
    assert memory.hf_generation_budget(model, 5) == memory.GenerationBudget(5, 1 << 62, None, 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (worked_example(), 80_000_000_000))
    budget = memory.hf_generation_budget(qwen3_1_7b_on_cuda(), 64)
    assert budget == memory.GenerationBudget(64, 473_025, memory.prefill_columns, 30)
    assert memory.hf_generation_budget(qwen3_1_7b_on_cuda(), 0).batch_size == 1 << 62
    assert memory.hf_generation_budget(qwen3_1_7b_on_cuda(), 0, 9000) == \
        memory.GenerationBudget(1 << 62, 9000, memory.prefill_columns, 0)  # --gen-max-tokens as given
    held = 13 * (AGGREGATOR_WIDTH + 30) * 122_925 + 1_795_162_112
    assert budget.max_tokens // (AGGREGATOR_WIDTH + 30) == 13 and held == 55_843_563_662
    assert held <= memory.GENERATION_FRACTION * worked_example()
    # the static decode keeps its K and V through the update: its calls take 0.4 of the free memory, not 0.8,
    # int((0.4 x free - fixed) / 122,925) = 229,210 tokens, whose K and V (kept_store_bytes) are 26,287,636,480
    # bytes: what the update's plan counts beside its own peaks
    kept = memory.hf_generation_budget(qwen3_1_7b_on_cuda(), 0, keep=True)
    assert kept.max_tokens == 229_210 and memory.kept_store_bytes(kept.max_tokens, 114_688) == 26_287_636_480


def test_rows_per_generate_call_come_from_the_budget_on_cuda(monkeypatch):
    """Issue 57: a fixed 64 rows a call made a Voting math step ~32 calls in a row. With --gen-batch-size 0 the
    budget above (473,025 tokens) cuts 1,000 rows of a 400-token prompt and 256 new tokens, 400 + 256 + 30 = 686
    tokens each, into calls of 473,025 // 686 = 689 rows (689 x 686 = 472,654; 690 x 686 = 473,340 is over)
    and 311; on the CPU, where nothing is bounded, 64 rows a call as before: 15 calls of 64 and one of 40."""
    import policies
    model, tokenizer = policies.load_model("tiny")

    def calls(engine) -> list[int]:
        sizes = []
        monkeypatch.setattr(engine, "_generate_chunk", lambda p, a, n: sizes.append(len(p)) or [None] * n)
        engine.generate([[1] * 400] * 1000, [None] * 1000)
        return sizes
    cpu = policies.make_engine("hf", model, tokenizer, max_new_tokens=256, temperature=0.7, top_p=1.0, rows=0,
                               max_tokens=0, share_prompts=True, decode="auto", base_folder=None, dtype="float32",
                               seed=0, vllm_memory=0.4)
    assert calls(cpu) == [64] * 15 + [40]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (worked_example(), 80_000_000_000))
    budget = memory.hf_generation_budget(qwen3_1_7b_on_cuda(), 0)
    cuda = policies.HFEngine(model, tokenizer, 256, 0.7, **vars(budget))
    assert calls(cuda) == [689, 311]


# ---------------------------------------------------------------- the CUDA allocator

def test_the_allocator_grows_segments_for_the_hf_engine_on_a_gpu_unless_the_user_chose(monkeypatch):
    """Issue 57: reserved was 77.8 GiB at 13.2 allocated in the GPU check's training, the rollout's growing KV
    cache leaving cached blocks of every size. With the HF engine on a GPU, PYTORCH_CUDA_ALLOC_CONF defaults to
    expandable segments; a value the user set under either of torch's names is kept; vLLM (whose sleep mode
    refuses expandable segments) and the CPU get nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    env: dict = {}
    assert memory.configure_allocator("hf", "auto", env) == "expandable_segments:True"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    for theirs in ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, {"PYTORCH_ALLOC_CONF": "backend:native"}):
        kept = dict(theirs)
        assert memory.configure_allocator("hf", "cuda:1", kept) is None and kept == theirs
    for engine, device in (("vllm", "cuda"), ("hf", "cpu")):
        env = {}
        assert memory.configure_allocator(engine, device, env) is None and env == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert memory.configure_allocator("hf", "auto", env) is None and env == {}


def test_the_hf_engine_returns_its_cached_blocks_after_the_rollout(monkeypatch):
    """The HF engine's hook between rollout and update empties torch's cache on CUDA, so the update does not
    start among the rollout's blocks; on the CPU it calls nothing."""
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    hooks = memory.StepHooks()
    hooks.model = qwen3_1_7b_on_cuda()
    assert hooks.before_update([]) == {} and emptied == [1]
    hooks.model = torch.nn.Linear(2, 2)
    assert hooks.before_update([]) == {} and emptied == [1]


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
            state["llm_arguments"] = kw
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
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: state.get("reserved_peak", 0))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: log.append("reset_peak_memory_stats"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    return state, log


def _engine(make_lora_model):
    from infra.vllm_engine import VLLMEngine
    from policies import to_generation
    return VLLMEngine("unused-folder", make_lora_model(), None, {0}, to_generation, 16, 0.7, dtype="float32")


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


def test_asleep_vllm_backs_up_its_cuda_graphs_and_the_step_logs_the_trainers_reserved_peak(fake_cuda_vllm,
                                                                                         make_lora_model, capsys):
    """vLLM 0.32 and 0.33 keep their CUDA graphs' memory through sleep unless `sleep_mode_offload_cudagraph`:
    the engine asks for it. The step's metrics, read before vLLM wakes: torch's allocated peak 62 GiB and reserved
    peak 70 GiB, less the 50 GiB torch counts as the sleeping vLLM's, are the trainer's 12 and 20 GiB; the device
    has 30 GiB free of 141, 111 used. What the sleeping engine still holds of the device is printed once."""
    import types
    state, log = fake_cuda_vllm
    engine = _engine(make_lora_model)
    assert state["llm_arguments"]["enable_sleep_mode"] and state["llm_arguments"]["sleep_mode_offload_cudagraph"]
    engine.sleep()
    state.update(peak=62 * GIB, reserved_peak=70 * GIB, free=30 * GIB)
    model = types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(is_cuda=True)]))
    assert memory.step_peaks(model, engine) == {"memory/peak_gib": 12.0, "memory/peak_reserved_gib": 20.0,
                                                "memory/device_used_gib": 111.0}
    engine.wake_up()
    engine.sleep()
    assert capsys.readouterr().out.count("vLLM asleep:") == 1


def test_a_training_steps_hooks_sleep_and_check_drift_then_read_peaks_then_wake_with_the_new_adapters(
        fake_cuda_vllm, make_lora_model, monkeypatch):
    """train.train_step calls the engine around the update. vLLM: before it, asleep (the peaks reset) and the drift
    check on the step's calls, 0.5 over 10 tokens = 0.05 per token; after it, the peaks read while still asleep,
    then awake, then the updated adapter saved and registered as its next version. The HF engine samples with the
    trainer's own weights: it only measures ({} on the CPU)."""
    import types

    import policies
    from infra import vllm_engine
    state, log = fake_cuda_vllm
    measured = []

    def drift(prompts, completions, adapters, logprobs):
        measured.append(adapters)
        return {"shared": (0.5, 10)}
    engine = vllm_engine.VLLMEngine("unused-folder", make_lora_model(), None, {0}, policies.to_generation, 16, 0.7,
                                    drift=drift)
    monkeypatch.setattr(vllm_engine, "step_peaks", lambda model, e: log.append("peaks") or {"memory/peak_gib": 1.0})
    log.clear()
    calls = [types.SimpleNamespace(adapter="shared", prompt_ids=[1], completion_ids=[2, 3], sample_logprobs=[0, 0])]
    tallies = engine.before_update(calls)
    assert log == ["sleep 1", "reset_peak_memory_stats"] and measured == [["shared"]]
    assert tallies == {"vllm/logprob_drift/shared": [0.5, 10], "vllm/logprob_drift": [0.5, 10]}
    version = engine.version
    assert engine.after_update(["shared"]) == {"memory/peak_gib": 1.0}
    assert log[2:] == ["peaks", "empty_cache", "wake_up"]
    assert engine.version == version + 1 and engine.requests["shared"].lora_name == f"shared-v{version + 1}"
    hf = policies.HFEngine(make_lora_model(), policies.tiny_tokenizer(), 4, 0.7)
    hf.start_step()
    assert hf.before_update(calls) == {} and hf.after_update(["shared"]) == {}


def test_the_vllm_engine_of_a_model_without_adapters_reserves_no_lora_slots(make_lora_model):
    """eval.py's base mode samples with the plain model: no LoRA slots in vLLM; with adapters, one slot each at
    the smallest rank vLLM supports that holds them (rank 4 -> 8). Sleep mode on: CUDA graphs backed up."""
    import policies
    from infra.vllm_engine import llm_arguments
    model = make_lora_model()
    plain = llm_arguments("folder", policies.load_model("tiny")[0], "bfloat16", 0, 0.4, None, sleep=False, cpu=True)
    assert "enable_lora" not in plain and "sleep_mode_offload_cudagraph" not in plain
    lora = llm_arguments("folder", model, "bfloat16", 0, 0.4, None, sleep=True, cpu=False)
    assert (lora["enable_lora"], lora["max_loras"], lora["max_lora_rank"]) == (True, 1, 8)
    assert lora["sleep_mode_offload_cudagraph"] and not lora["enforce_eager"]

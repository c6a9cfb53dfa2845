"""The static decode mode's parts (infra/decoding.py): attention over the filled columns with each KV head read
once, the cache kept across calls, the compiler's requirements, and what torch.compile did. .ci/run also runs this
file under transformers 5.17, the lent GPU machine's (tests/test_policies.py holds the engine's outputs)."""
import dataclasses
import types

import pytest
import torch
from torch._dynamo.utils import counters

from infra import decoding
from policies import HFEngine, add_adapters, load_model


@pytest.fixture(scope="module")
def gqa_model():
    """tiny-qwen3 (4 query heads, 2 KV heads) with one LoRA adapter whose B is random: LoRA changes the output."""
    torch.manual_seed(0)
    model, tok = load_model("tiny-qwen3")
    model = add_adapters(model, ["x"], rank=4, alpha=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model, tok


def test_a_decode_step_reads_each_kv_head_once_over_the_masks_columns():
    """attend_filled on one query position equals SDPA over K and V repeated to every query head (what
    transformers' SDPA path computes), reading K and V as they are, [B, Hkv, W, d], cut to the mask's W columns;
    query heads 2j and 2j + 1 use KV head j (transformers' repeat_kv order). Tolerance 1e-6: fp32 sums of 16
    products in another order."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 16), torch.randn(3, 2, 256, 16), torch.randn(3, 2, 256, 16)
    mask = torch.rand(3, 1, 1, 128) > 0.3  # a BlockCache's mask: 128 of the 256 columns, holes in it
    mask[:, :, :, 0] = True
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        seen.append((tuple(query.shape), tuple(key.shape)))
        return real(query, key, value, **kwargs)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        out, weights = decoding.attend_filled(module, q, k, v, mask, scaling=0.25)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real
    assert seen == [((3, 2, 2, 16), (3, 2, 128, 16))] and weights is None
    want = real(q, k[:, :, :128].repeat_interleave(2, dim=1), v[:, :, :128].repeat_interleave(2, dim=1),
                attn_mask=mask, scale=0.25)
    assert out.shape == (3, 1, 4, 16)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-6, rtol=0)


def test_the_block_caches_mask_ends_at_the_filled_columns_rounded_to_a_block(gqa_model):
    """get_mask_sizes: the filled columns and this step's queries, rounded up to CACHE_BLOCK, at most the cache's
    columns. The cache of a 300-token call: 384 columns and a spare block, 512 (decoding.cache_columns). By hand:
    0 filled + 5 queries -> 128; 130 + 1 -> 256; 299 + 1 -> 384, the call's last step, a block short of the cache;
    383 + 1 -> 384; 511 + 1 -> 512."""
    model, _ = gqa_model
    cache = decoding.CacheStore().cache(model, 2, 300)
    assert cache.layers[0].max_cache_len == 512 == decoding.cache_columns(300)
    sizes = []
    for filled, queries in ((0, 5), (130, 1), (299, 1), (383, 1), (511, 1)):
        for layer in cache.layers:
            layer.cumulative_length.fill_(filled)
        sizes.append(cache.get_mask_sizes(queries, 0)[0])
    assert sizes == [128, 256, 384, 384, 512]


def test_the_cache_is_kept_across_calls_and_grows_in_blocks(gqa_model):
    """A call of the same rows gets the same cache back, reset in place, at the same addresses (a CUDA graph
    replays); a wider call grows the buffers, a call of fewer rows views the same buffers' first elements; release
    frees them. Every call decodes what a fresh engine decodes, and the engine keeps its store through an update
    (infra/memory.kept_store_bytes counts it there), at the same addresses."""
    model, tok = gqa_model
    store = decoding.CacheStore()
    first = store.cache(model, 4, 100)
    first.layers[0].cumulative_length.fill_(7)
    address = first.layers[0].keys.data_ptr()
    again = store.cache(model, 4, 120)
    assert again is first and int(first.layers[0].cumulative_length) == 0 and first.layers[0].keys.data_ptr() == address
    fewer = store.cache(model, 2, 128)  # 128 tokens: a block and the spare one
    assert fewer.layers[0].keys.data_ptr() == address and tuple(fewer.layers[0].keys.shape) == (2, 2, 256, 16)
    wider = store.cache(model, 4, 200)  # 200 tokens: two blocks and the spare one
    assert wider.layers[0].max_cache_len == 384 and store.buffers[0][0].numel() == 4 * 2 * 384 * 16
    assert set(store.caches) == {4}  # the grown buffers: the old views dropped
    store.release()
    assert store.buffers == [] and store.caches == {}
    engine = HFEngine(model, tok, 10, 0, decode="static")
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    calls = [engine.generate(prompts, ["x"] * 3), engine.generate(prompts[:2], ["x"] * 2),
             engine.generate(prompts, ["x"] * 3)]
    fresh = [HFEngine(model, tok, 10, 0, decode="static").generate(p, ["x"] * len(p))
             for p in (prompts, prompts[:2], prompts)]
    assert [[g.completion_ids for g in c] for c in calls] == [[g.completion_ids for g in c] for c in fresh]
    buffers = [k.data_ptr() for k, _ in engine.store.buffers]
    assert engine.before_update([]) == {} and engine.after_update(["x"]) == {}  # an update between steps
    assert [k.data_ptr() for k, _ in engine.store.buffers] == buffers  # kept through it, where it was


def test_one_inductor_compile_serves_every_adapter_row_count_and_block(monkeypatch):
    """What runs on CUDA, compiled by Inductor itself on the CPU (generate()'s compile forced onto every device, with
    the engine's CompileConfig: dynamic shapes; fullgraph, so a graph break raises; no CUDA graphs on the CPU):
    calls under two adapters and the base, at 3 rows, 2 rows and a lone row, each over three blocks of its cache
    (prompts of 100-110 tokens and 170 new: mask widths 128, 256, 384 in a cache of 512 columns), compile once:
    dynamo's counters read 1 graph and no graph break, and every call's greedy rows equal the dynamic mode's.
    Measured before each part of the design: each adapter compiled again (PEFT's active adapter is a guard; now
    one slot adapter, hot-swapped); the call's last block compiled again (K and V then the whole cache, contiguous;
    now a spare block); a lone row compiled again (dynamo specialises a size of 1; now run beside a copy)."""
    torch.manual_seed(0)
    model, tok = load_model("tiny-qwen3")
    model = add_adapters(model, ["x", "y"], rank=4, alpha=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    config = dataclasses.replace(decoding.COMPILE, backend="inductor", fullgraph=True, mode=None)
    config._compile_all_devices = True
    monkeypatch.setattr(decoding, "COMPILE", config)
    prompts = [[5 + (i * 3 + j) % 50 for j in range(100 + 5 * i)] for i in range(3)]
    calls = [(prompts, ["x"] * 3), (prompts, ["y"] * 3), (prompts[:2], ["x"] * 2), (prompts[:2], [None] * 2),
             (prompts[:1], ["y"])]
    want = [[g.completion_ids for g in HFEngine(model, tok, 170, 0, decode="dynamic").generate(p, a)]
            for p, a in calls]
    torch._dynamo.reset()
    counters.clear()
    try:
        engine = HFEngine(model, tok, 170, 0, decode="static")
        got = [[g.completion_ids for g in engine.generate(p, a)] for p, a in calls]
        stats = decoding.compile_stats()
    finally:
        torch._dynamo.reset()
    assert got == want
    assert engine.store.caches[3].layers[0].max_cache_len == 512
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0 and stats["compile_s"] > 0
    assert stats["cudagraphs_recorded"] == 0  # nothing on the CPU


def test_static_without_a_compiler_falls_back_to_dynamic_with_one_warning(gqa_model, monkeypatch, capsys):
    """On CUDA (a model whose parameters say so) without a C compiler for Triton, static and auto decode dynamic,
    with one warning line each, and the engine counts it in its metrics (decode_fallback); on the CPU nothing is
    compiled, so nothing is checked."""
    model, _ = gqa_model

    class OnCuda:
        config = model.config

        def parameters(self):
            return iter([types.SimpleNamespace(is_cuda=True, dtype=torch.float32, device="cpu")])
    monkeypatch.setattr(decoding, "compiler_problem", lambda: "no C compiler (CC, gcc or clang) for Triton")
    assert decoding.decode_mode("static", OnCuda()) == decoding.decode_mode("auto", OnCuda()) == "dynamic"
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("warning: --decode static: no C compiler")
    assert decoding.decode_mode("static", model) == "static"  # the CPU
    assert decoding.decode_metrics("static", "dynamic", OnCuda()) == {"decode_fallback": 1}
    assert decoding.decode_metrics("dynamic", "dynamic", OnCuda()) == {}  # asked for: no fallback
    assert set(decoding.decode_metrics("auto", "static", OnCuda())) == {
        "decode/compile_s", "decode/graphs", "decode/graph_breaks", "decode/cudagraph_skips",
        "decode/cudagraphs_recorded", "decode/cudagraph_rerecords"}
    assert decoding.decode_metrics("auto", "dynamic", model) == {}  # the CPU's metrics stay as they were


def test_the_compiler_check_reads_cc_and_pythons_headers(monkeypatch, tmp_path):
    """compiler_problem: None with a compiler and Python.h; one line naming what is missing otherwise."""
    include = tmp_path / "include"
    include.mkdir()
    monkeypatch.setattr(decoding.sysconfig, "get_paths", lambda: {"include": str(include)})
    monkeypatch.setenv("CC", "/bin/true")
    assert decoding.compiler_problem() == f"no Python.h in {include} for Triton"
    (include / "Python.h").write_text("")
    assert decoding.compiler_problem() is None
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert decoding.compiler_problem() == "no C compiler (CC, gcc or clang) for Triton"


def peak_tensor_bytes(call) -> int:
    """The peak of the bytes held by tensors allocated within `call` (torch.profiler's memory events, an
    allocation or a free each, summed in order: tensors, not the process's memory)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    live = peak = 0
    for event in prof.profiler.kineto_results.events():
        if event.name() == "[memory]":
            live += event.nbytes()
            peak = max(peak, live)
    return peak


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_a_call_holds_its_prompts_kv_once_within_the_memory_plan(mode):
    """One generate() call's peak against the plan's bytes for it (memory.generation_call_bytes), at the shape where
    the static mode held its prompts' K and V twice (a DynamicCache of the distinct prompts gathered to every row,
    beside the static cache: 1.98x its cache, measured before the shared prompt pass filled the static cache in
    place). An 8-layer bf16 Llama (4 query heads, 2 KV heads of 16), 32 rows (4 prompts of 1,200 tokens x 8
    copies, a GRPO group's), 32 new tokens, the prefill in pieces of 128 columns (as on CUDA). By hand: K and V are
    2 x 8 x 2 x 16 x 2 = 1,024 bytes a token; the plan's per token adds one layer (128), one layer's K and V
    repeated to the 4 heads (128), a mask cell (5) and int64 ids (40): 1,325; static: 32 rows x 1,408 columns
    (1,232 rounded up to 1,280, and the spare block), cache 46,137,344 bytes; dynamic: 32 x 1,232. Beside them the
    call's fixed terms: a prefill piece of 4 x 128 tokens (its mask 4 x 128 x the cache's columns cells, 5 bytes
    each; its activations 2,560 bytes a token) and sampling 32 rows over the vocabulary. Measured after the change:
    static 1.1x its cache, dynamic 1.2x its 1,232 columns' K and V."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from infra import memory
    from infra.models import tiny_tokenizer
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = add_adapters(LlamaForCausalLM(config).to(torch.bfloat16).eval(), ["x"], rank=4, alpha=8)
    prompts = [[5 + (i * 7 + j) % 80 for j in range(1200)] for i in range(4)]
    rows = [p for p in prompts for _ in range(8)]
    engine = HFEngine(model, tok, 32, 1.0, decode=mode, prefill_columns=lambda distinct, width: 128)
    engine.generate(rows[:2], ["x"] * 2)  # the slot adapter and the first allocations of the libraries
    peak = peak_tensor_bytes(lambda: engine.generate(rows, ["x"] * 32))
    kv = memory.kv_bytes_per_token(8, 2, 16, 2)
    per_token = memory.generation_bytes_per_token(kv, 8, memory.repeated_kv_bytes_per_token(4, 2, 16, 2))
    columns = decoding.cache_columns(1232) if mode == "static" else 1232
    assert (kv, per_token, columns) == (1024, 1325, 1408 if mode == "static" else 1232)
    activation = memory.prefill_activation_bytes_per_token(64, 128, 64, 2, lora=True)
    fixed = memory.generation_fixed_bytes(activation, 32, len(tok), 4 * 128, 4 * 128 * columns)
    plan = memory.generation_call_bytes(per_token, 32, columns, fixed)
    cache = 32 * columns * kv
    assert peak <= plan, f"{mode}: {peak:,} bytes at the peak, the plan {plan:,}"
    assert peak <= 1.3 * cache, f"{mode}: {peak / cache:.2f}x its K and V"

"""The static decode mode's parts (infra/decoding.py, infra/decode_shapes.py): attention over the filled columns
with each KV head read once, the calls' few shapes and the CUDA graphs they bound (a paper cell's 500 steps
rehearsed by bench/decode_rehearsal.py), the cache kept across calls, a step's host reads, the compiler's
requirements, and what torch.compile did. .ci/run also runs this file under transformers 5.17, the lent GPU
machine's (tests/test_policies.py holds the engine's outputs)."""
import dataclasses
import types
from collections import Counter

import pytest
import torch
from torch._dynamo.utils import counters

from infra import decode_shapes, decoding
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
    mask = torch.rand(3, 1, 1, 128) > 0.3  # a FilledCache's mask: 128 of the 256 columns, holes in it
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


def test_the_sizes_widths_columns_and_rows_of_static_calls_by_hand():
    """decode_shapes: sizes 1, 2, 3, 4, 6, 8, 12, ... (2^k and 3 x 2^(k-1)); a mask width is CACHE_BLOCK (128) x the
    size at or above the filled blocks; a cache its widest width and a spare block; a call the rows its columns
    allow (each row its columns and 30 sampling tokens), padded up to a size when fewer, never 1."""
    assert [decode_shapes.size_at_least(n) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert [decode_shapes.size_at_least(n) for n in (17, 25, 33, 49, 97)] == [24, 32, 48, 64, 128]
    # 300 filled: 3 blocks -> 384; 600: 5 -> 6 blocks, 768; 1,100: 9 -> 12, 1,536; 5,632: 44 -> 48, 6,144
    assert [decode_shapes.mask_width(n) for n in (1, 128, 129, 300, 600, 1100, 5632)] == [
        128, 128, 256, 384, 768, 1536, 6144]
    assert [decoding.cache_columns(n) for n in (1, 300, 1232, 5632)] == [256, 512, 1664, 6272]
    assert decode_shapes.call_rows(1664, 30, 64, 50_000) == 29  # 50,000 // 1,694
    # five rows of a 10-token prompt and 20 new tokens: 256 columns each
    assert decode_shapes.cut_calls([10] * 5, 20, 0, 2, 1 << 40) == [(0, 2, 2, 256), (2, 4, 2, 256), (4, 5, 2, 256)]
    assert decode_shapes.cut_calls([10] * 5, 20, 0, 8, 1 << 40) == [(0, 5, 6, 256)]
    # within 1,000 tokens: 3 rows of 256 + 30 (1,000 // 286); the fourth 10-token row and the 200-token one at
    # 384 columns, 2 rows (1,000 // 414); the 300-token one at 512 columns, 1 row (1,000 // 542), run as 2
    assert decode_shapes.cut_calls([10, 10, 10, 10, 200, 300], 20, 30, 64, 1000) == [
        (0, 3, 3, 256), (3, 5, 2, 384), (5, 6, 2, 512)]
    # the engine's calls of the same rows out of order: by length, padded with copies of a call's last row
    prompts = [[7] * n for n in (300, 10, 10, 200, 10, 10)]
    assert decode_shapes.static_calls(prompts, 20, 30, 64, 1000) == [([1, 2, 4], 3), ([5, 3], 2), ([0, 0], 1)]


def test_the_mask_ends_at_the_filled_columns_in_a_few_widths(gqa_model):
    """FilledCache.get_mask_sizes, which transformers calls once a forward, before the forward writes: the columns
    filled, counted on the host (no read of the device's count), with this forward's queries, up to a mask width,
    at most the cache's columns. A 300-token call's cache: 512 columns. By hand: 0 filled + 5 queries -> 128; 130
    + 1 -> 256; 299 + 1 -> 384; 383 + 1 -> 384; 511 + 1 -> 512, the cache's last column. A 1,232-token call's
    (1,664 columns): 599 + 1 -> 768; 1,099 + 1 -> 1,536. After a call (a 4-token width: 3 prefilled by the shared
    prompt pass, then 10 new tokens, the last not written) the host's count is the device's: 13."""
    model, tok = gqa_model
    store, widths = decoding.CacheStore(), []
    for tokens, filled, queries in ((300, 0, 5), (300, 130, 1), (300, 299, 1), (300, 383, 1), (300, 511, 1),
                                    (1232, 599, 1), (1232, 1099, 1)):
        cache = store.cache(model, 2, tokens)
        cache.filled = filled
        widths.append(cache.get_mask_sizes(queries, 0)[0])
        assert cache.filled == filled + queries
    assert widths == [128, 256, 384, 384, 512, 768, 1536]
    assert store.cache(model, 2, 300).layers[0].max_cache_len == 512 and store.caches[2, 512].filled == 0
    engine = HFEngine(model, tok, 10, 0, decode="static")
    engine.sampling["min_new_tokens"] = 10
    engine.generate([[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11]], ["x"] * 3)
    [cache] = engine.store.caches.values()
    assert cache.filled == int(cache.layers[0].cumulative_length) == 13


def test_the_cache_is_kept_across_calls_and_never_grows_on_a_gpu(gqa_model):
    """A call of the same rows and columns gets the same cache back, reset in place, at the same addresses (a CUDA
    graph replays); a call of other rows or columns views the same buffers' first elements. On the CPU a wider
    call grows the buffers; on a GPU (a parameter that says so) the store takes its whole token budget at its
    first call, and no call within the budget moves it (a move would record every shape again). release frees
    it. Every call decodes what a fresh engine decodes, and the engine keeps its store through an update
    (infra/memory.kept_store_bytes counts it there), at the same addresses."""
    model, tok = gqa_model
    store = decoding.CacheStore()
    first = store.cache(model, 4, 100)
    first.layers[0].cumulative_length.fill_(7)
    address = first.layers[0].keys.data_ptr()
    again = store.cache(model, 4, 120)  # 120 tokens: 256 columns, as 100
    assert again is first and int(first.layers[0].cumulative_length) == 0 and first.layers[0].keys.data_ptr() == address
    fewer = store.cache(model, 2, 128)  # 128 tokens: a block and the spare one
    assert fewer.layers[0].keys.data_ptr() == address and tuple(fewer.layers[0].keys.shape) == (2, 2, 256, 16)
    wider = store.cache(model, 4, 200)  # 200 tokens: two blocks and the spare one
    assert wider.layers[0].max_cache_len == 384 and store.buffers[0][0].numel() == 4 * 2 * 384 * 16
    assert set(store.caches) == {(4, 384)}  # the grown buffers: the old views dropped
    store.release()
    assert store.buffers == [] and store.caches == {}

    class OnGpu:  # what the store reads of a model: its config, and a parameter on a GPU (its buffers on the CPU)
        config = model.config

        def parameters(self):
            return iter([types.SimpleNamespace(is_cuda=True, dtype=torch.float32, device="cpu")])
    store = decoding.CacheStore(budget=4 * 384)
    small = store.cache(OnGpu(), 2, 100)
    held = store.buffers[0][0]
    assert held.numel() == 4 * 384 * 2 * 16  # the budget's tokens x 2 KV heads of 16, at the first call
    assert store.cache(OnGpu(), 4, 200).layers[0].keys.data_ptr() == small.layers[0].keys.data_ptr()
    assert store.buffers[0][0] is held  # never grown
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
    calls under two adapters and the base, at 3 rows, 2 rows and a lone row (padded to 2), each over three mask
    widths (prompts of 100-110 tokens and 170 new: 128, 256, 384 in a cache of 512 columns), compile once:
    dynamo's counters read 1 graph and no graph break, and every call's greedy rows equal the dynamic mode's.
    Measured before each part of the design: each adapter compiled again (PEFT's active adapter is a guard; now
    one slot adapter, hot-swapped); the call's last block compiled again (K and V then the whole cache, contiguous;
    now a spare block); a lone row compiled again (dynamo specialises a size of 1; now padded to 2 rows)."""
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
    assert engine.store.caches[3, 512].layers[0].max_cache_len == 512
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


def test_a_run_past_the_graph_bound_warns_once(gqa_model, monkeypatch, capsys):
    """decode_metrics on CUDA (a model whose parameters say so): CUDA graphs recorded within GRAPH_LIMIT say
    nothing; past it, one warning line, the first time only (a run reads the metrics at every step), and the
    metrics go on counting."""
    model, _ = gqa_model

    class OnCuda:
        def parameters(self):
            return iter([types.SimpleNamespace(is_cuda=True)])
    recorded = [decoding.GRAPH_LIMIT]
    monkeypatch.setattr(decoding, "compile_stats", lambda: {"cudagraphs_recorded": recorded[0]})
    monkeypatch.setattr(decoding, "WARNED", set())
    assert decoding.decode_metrics("auto", "static", OnCuda()) == {"decode/cudagraphs_recorded": 128}
    assert capsys.readouterr().out == ""
    for recorded[0] in (129, 300):
        assert decoding.decode_metrics("auto", "static", OnCuda()) == {"decode/cudagraphs_recorded": recorded[0]}
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["warning: the static decode recorded 129 CUDA graphs, past its bound of 128 "
                     "(infra/decoding.py): shapes outside its design"]


def test_a_padded_calls_rows_are_sampled_as_beside_copies_and_never_returned(gqa_model, monkeypatch):
    """Five rows of one adapter make a static call of 6 (the sizes have no 5): the sixth a copy of the fifth's
    prompt, ended at its first token (PaddingRows: a padding row never makes a call run longer), and not
    returned. Under sampling, the five rows are what the dynamic mode samples for the same six rows, row for row:
    rows never read each other, so a padding row moves the random stream only (the same distribution, other
    draws than a call of five)."""
    model, tok = gqa_model
    prompts = [[5 + (i * 3 + j) % 50 for j in range(20 + 5 * i)] for i in range(5)]

    def sample(mode, rows):
        torch.manual_seed(3)
        engine = HFEngine(model, tok, 12, 0.7, top_p=0.9, decode=mode)
        calls, real = [], engine._generate_chunk
        monkeypatch.setattr(engine, "_generate_chunk", lambda p, a, n: calls.append((len(p), n)) or real(p, a, n))
        return [g.completion_ids for g in engine.generate(rows, ["x"] * len(rows))], calls
    static, calls = sample("static", prompts)
    beside, _ = sample("dynamic", prompts + prompts[-1:])
    assert calls == [(6, 5)] and len(static) == 5
    assert static == beside[:5]
    done = decode_shapes.PaddingRows(5)(torch.zeros(6, 3, dtype=torch.long), None)
    assert done.tolist() == [False] * 5 + [True]
    assert decode_shapes.padding_stop(5, 5) == {}


def load_rehearsal():
    """bench/decode_rehearsal.py, as a module."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "decode_rehearsal.py")
    spec = importlib.util.spec_from_file_location("decode_rehearsal", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# one cell of each workflow, the one whose rehearsal meets the most shapes (bench/README.md's table), on an H200
REHEARSED = ["Single-IP-4B-Code", "Voting-IP-1.7B-Code", "EvalOpt-IP-1.7B-Math", "OrchWorkers-IP-0.6B-Math"]


@pytest.mark.parametrize("cell", REHEARSED)
def test_a_paper_cells_500_steps_record_at_most_the_graph_bound(cell):
    """bench/decode_rehearsal.py's schedule of a paper cell, 500 steps on an H200 (its larger budget holds more
    rows a call, and so meets more row counts): the CUDA graphs it would record are within GRAPH_LIMIT, and the K
    and V store is sized once (no growth: its addresses never move). On the code before the shapes were bounded,
    the same rehearsal met thousands of shapes and grew its store several times (bench/README.md)."""
    result = load_rehearsal().rehearse(cell, "H200", 500)
    assert len(result["shapes"]) <= decoding.GRAPH_LIMIT and result["growths"] == 0, (
        len(result["shapes"]), result["growths"])


def test_the_rehearsal_cuts_calls_as_the_engine_does(gqa_model, monkeypatch):
    """The rehearsal's schedule is the engine's: the rows and cache columns of every static call the HF engine
    makes, at a budget of 1,500 tokens, equal what the rehearsal takes of decode_shapes.cut_calls for the same
    prompt lengths, sorted; and the mask widths a call's decode steps read (a spy on the first layer's attention,
    one query a row; no prompt repeats, so generate() prefills each call itself, every prompt token at once) are
    the rehearsal's `walk` of its compiled steps, step for step."""
    model, tok = gqa_model
    walk = load_rehearsal().walk
    lengths = [40, 40, 250, 100, 40, 380, 100, 100, 40]
    prompts = [[5 + (i + j) % 50 for j in range(n)] for i, n in enumerate(lengths)]
    engine = HFEngine(model, tok, 60, 0, decode="static", max_tokens=1500)
    engine.sampling["min_new_tokens"] = 60  # every row runs every step
    made, widths, real_cache, real_attend = [], [], engine.store.cache, decoding.attend_filled
    monkeypatch.setattr(engine.store, "cache", lambda m, rows, tokens: made.append(
        (rows, decoding.cache_columns(tokens))) or real_cache(m, rows, tokens))

    def attend(module, query, key, value, mask, **kwargs):
        if module.layer_idx == 0 and query.shape[2] == 1:
            widths.append(mask.shape[-1])
        return real_attend(module, query, key, value, mask, **kwargs)
    decoding.AttentionInterface.register(decoding.ATTENTION, attend)
    try:
        engine.generate(prompts, ["x"] * len(prompts))
    finally:
        decoding.AttentionInterface.register(decoding.ATTENTION, real_attend)
    calls = decode_shapes.cut_calls(sorted(lengths), 60, 0, engine.batch_size, 1500)
    assert made == [(rows, columns) for _, _, rows, columns in calls] and len(calls) > 2
    want = []
    for _, stop, _, columns in calls:
        prompt = sorted(lengths)[stop - 1]
        want += [width for width, first, last in walk(prompt, 60, columns) for _ in range(last - first + 1)]
    assert widths == want and set(want) == {128, 256, 384, 512}


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
    repeated to the 4 heads (128), a mask cell (5) and int64 ids (40): 1,325; static: 32 rows x 1,664 columns
    (1,232 within a mask width of 1,536, and the spare block), cache 54,525,952 bytes; dynamic: 32 x 1,232.
    Beside them the
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
    assert (kv, per_token, columns) == (1024, 1325, 1664 if mode == "static" else 1232)
    activation = memory.prefill_activation_bytes_per_token(64, 128, 64, 2, lora=True)
    fixed = memory.generation_fixed_bytes(activation, 32, len(tok), 4 * 128, 4 * 128 * columns)
    plan = memory.generation_call_bytes(per_token, 32, columns, fixed)
    cache = 32 * columns * kv
    assert peak <= plan, f"{mode}: {peak:,} bytes at the peak, the plan {plan:,}"
    assert peak <= 1.3 * cache, f"{mode}: {peak / cache:.2f}x its K and V"


class HostReads:
    """Within `with`: the reads that make the host wait for the device on a GPU, counted on any device. Two counts:
    the Python calls that read a tensor's values on the host (`item`, `tolist`, `bool` ... : torch's function
    hooks) and the aten ops that copy a scalar or a data-dependent size to the host (`_local_scalar_dense`, what
    `item`, `bool` and `int` run; `equal`, `nonzero`)."""
    CALLS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}
    OPS = {"_local_scalar_dense", "equal", "nonzero", "masked_select"}

    def __enter__(self):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode
        self.calls, self.ops = Counter(), Counter()
        outer = self

        class Calls(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in outer.CALLS:
                    outer.calls[func.__name__] += 1
                return func(*args, **(kwargs or {}))

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket.__name__ in outer.OPS:
                    outer.ops[func.overloadpacket.__name__] += 1
                return func(*args, **(kwargs or {}))
        self.modes = [Calls(), Ops()]
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)


def test_a_static_decode_step_reads_the_device_once(gqa_model):
    """The host reads of one static decode step, counted on the CPU as the difference between calls of 8 and 24
    new tokens (every row runs every step: the prefill, the shared prompt pass and the call's own reads cancel),
    divided by the 16 steps between: 1 read a step, generate's stopping check (`unfinished_sequences.max() == 0`
    read as a bool, which transformers defers only on Apple's GPUs). The mask's width no longer reads the
    cache's filled count from the device (decoding.FilledCache counts it on the host): before, 2 a
    step. A GPU step is one graph replay, so each read stops the host until the GPU has caught up."""
    model, tok = gqa_model
    prompts = [[5 + (i * 3 + j) % 50 for j in range(20 + 5 * i)] for i in range(3)]
    counts = []
    for new in (8, 24):
        torch.manual_seed(0)
        engine = HFEngine(model, tok, new, 1.0, decode="static")
        engine.sampling["min_new_tokens"] = new
        engine.generate(prompts, ["x"] * 3)  # the slot adapter and the store, once
        with HostReads() as reads:
            engine.generate(prompts, ["x"] * 3)
        counts.append((sum(reads.calls.values()), sum(reads.ops.values())))
    per_step = [(b - a) / 16 for a, b in zip(*counts)]
    assert per_step == [1, 1], counts

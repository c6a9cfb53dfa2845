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
    columns. By hand: 0 filled + 5 queries -> 128; 130 + 1 -> 256; 300 + 1 -> 384; a 384-column cache: 383 + 1 ->
    384 (not 512)."""
    model, _ = gqa_model
    cache = decoding.CacheStore().cache(model, 2, 300)
    assert cache.layers[0].max_cache_len == 384
    sizes = []
    for filled, queries in ((0, 5), (130, 1), (300, 1), (383, 1)):
        for layer in cache.layers:
            layer.cumulative_length.fill_(filled)
        sizes.append(cache.get_mask_sizes(queries, 0)[0])
    assert sizes == [128, 256, 384, 384]


def test_the_cache_is_kept_across_calls_and_grows_in_blocks(gqa_model):
    """A call of the same rows gets the same cache back, reset in place, at the same addresses (a CUDA graph
    replays); a wider call grows the buffers, a call of fewer rows views the same buffers' first elements; release
    frees them. Every call decodes what a fresh engine decodes."""
    model, tok = gqa_model
    store = decoding.CacheStore()
    first = store.cache(model, 4, 100)
    first.layers[0].cumulative_length.fill_(7)
    address = first.layers[0].keys.data_ptr()
    again = store.cache(model, 4, 120)
    assert again is first and int(first.layers[0].cumulative_length) == 0 and first.layers[0].keys.data_ptr() == address
    fewer = store.cache(model, 2, 128)
    assert fewer.layers[0].keys.data_ptr() == address and tuple(fewer.layers[0].keys.shape) == (2, 2, 128, 16)
    wider = store.cache(model, 4, 200)
    assert wider.layers[0].max_cache_len == 256 and store.buffers[0][0].numel() == 4 * 2 * 256 * 16
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
    assert engine.before_update([]) == {} and engine.store.buffers == []  # released before the update


def test_the_compiled_step_is_traced_once_across_calls_and_blocks(gqa_model, monkeypatch):
    """generate() compiles the decode step (forced onto the CPU, dynamo's eager backend) with the engine's
    CompileConfig: dynamic shapes, so the mask's width growing block by block and a second call on the kept
    cache trace nothing new, with no graph break; compile_stats reads the counts."""
    model, tok = gqa_model
    config = dataclasses.replace(decoding.COMPILE, backend="eager", fullgraph=True, mode=None)
    config._compile_all_devices = True
    monkeypatch.setattr(decoding, "COMPILE", config)
    want = HFEngine(model, tok, 140, 0, decode="dynamic").generate([[5, 6, 7]], ["x"])
    torch._dynamo.reset()
    counters.clear()
    try:
        engine = HFEngine(model, tok, 140, 0, decode="static")  # 3 + 140 columns: two blocks
        first = engine.generate([[5, 6, 7]], ["x"])
        after_first = decoding.compile_stats()
        second = engine.generate([[5, 6, 7]], ["x"])
        after_second = decoding.compile_stats()
    finally:
        torch._dynamo.reset()
    assert [g.completion_ids for g in first] == [g.completion_ids for g in second] == [g.completion_ids for g in want]
    assert after_first["graphs"] == 1 and after_first["graph_breaks"] == 0  # no recompile at the second block
    assert after_second["graphs"] == 1 and after_second["compile_s"] == after_first["compile_s"]
    assert after_second["cudagraphs_recorded"] == 0  # nothing on the CPU


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

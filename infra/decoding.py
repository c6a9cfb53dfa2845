"""How the HF engine runs its decode loop: the `--decode` setting (dynamic or static), and the
static mode's preallocated KV cache.

What it is for. `model.generate` with a `DynamicCache` is bound by the host on a GPU: each decode
step launches a few thousand small kernels from Python, and the cache concatenates every layer's
K and V once more each step. The static mode hands `generate` a `StaticCache`, preallocated for
the call's widest prompt plus its new tokens. transformers then compiles the model's forward for
the decode steps on CUDA by itself (`generate` checks for a compileable cache; its default
`CompileConfig` is inductor with CUDA graphs, `mode="reduce-overhead"`; here with dynamic
shapes, COMPILE), so a step is one graph replay instead of thousands of launches. This is what
transformers ships, in 5.17 as in 5.24. LoRA stays unmerged: the compiled forward runs PEFT's
layers with the one active adapter (a changed adapter is a guard that fails once, then a second
compiled graph). A PEFT mixed-adapter batch (`adapter_names`) runs hooks per adapter's rows
that the compiler would break on, so in the static mode the engine cuts its rows by adapter
first (`call_groups`): every call has one.

What it is not for. It does not change what is sampled: greedy rows equal the dynamic mode's,
and sampled rows equal them call by call (a mixed batch's rows are drawn in other calls: the same
distribution, other draws; tests/test_policies.py). On the CPU nothing is compiled. It is not
continuous batching (a call still runs until its longest row ends), it does not merge the
adapter into the weights, and its memory is the dynamic mode's plan (infra/memory.py) plus fewer
than CACHE_BLOCK columns a row and the compiled graphs' pools. On a GPU its speed, compile time
and peaks are still unmeasured (bench/README.md).
"""
from __future__ import annotations

import torch
from transformers import CompileConfig, StaticCache

DECODE_MODES = ("auto", "dynamic", "static")
# the static cache's length is rounded up to a multiple of this: calls whose widest prompts differ
# by a few tokens then share one compiled shape (CUDA graphs are recorded once per shape)
CACHE_BLOCK = 128
# torch.compile's recompiles per function before it falls back to eager (torch's default: 8):
# each adapter and the base is one
RECOMPILE_LIMIT = 64
# CUDA graph re-recordings per function before it runs without graphs (inductor's default: 128;
# torch 2.13 no longer counts a static input's new address, older versions may): every call's
# StaticCache is new, at new addresses, so a training run re-records at every call
RERECORD_LIMIT = 1 << 30
# how generate() compiles the decode step on CUDA: transformers' defaults (inductor, CUDA graphs),
# but shapes dynamic from the first compile. Calls differ in rows and cache length; with torch's
# default (static first, dynamic at the first new shape) each adapter would compile twice or more
COMPILE = CompileConfig(dynamic=True)


def decode_mode(decode: str, model) -> str:
    """`--decode` resolved for `model`: auto is static on CUDA (where a compiled step pays) and
    dynamic elsewhere, so the CPU's runs stay as they were. Example: auto on a CPU -> dynamic."""
    if decode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {decode!r} (expected one of {DECODE_MODES})")
    if decode != "auto":
        return decode
    return "static" if next(model.parameters()).is_cuda else "dynamic"


def call_groups(adapters: list, mode: str) -> list[list[int]]:
    """The row indices the engine cuts into calls, group by group. Dynamic: one group of every row
    (a call may mix adapters). Static: rows grouped by adapter, adapters in order of first
    appearance, rows in order within each. Example: [x, y, None, x] -> dynamic [[0, 1, 2, 3]],
    static [[0, 3], [1], [2]]."""
    if mode == "dynamic":
        return [list(range(len(adapters)))]
    groups: dict = {}
    for i, a in enumerate(adapters):
        groups.setdefault(a, []).append(i)
    return list(groups.values())


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that ends a completion: the generation config's EOS ids (Qwen3 has two) and the
    tokenizer's."""
    eos = model.generation_config.eos_token_id
    eos = tokenizer.eos_token_id if eos is None else eos
    return set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids and attention mask, padded on the left so every row's next token is at the
    end."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def cache_kwargs(mode: str, model, prefix, tokens: int, keyword: str) -> dict:
    """generate()'s keywords for its cache (`keyword`: its name, by transformers version). Dynamic:
    `prefix` as it is, or none (generate makes its own DynamicCache). Static: the cache of
    `static_cache(model, tokens, prefix)`, and COMPILE where generate() compiles."""
    if mode == "dynamic":
        return {} if prefix is None else {keyword: prefix}
    # where generate() compiles: CUDA (or a config forced onto every device, as a test does)
    compiles = next(model.parameters()).is_cuda or COMPILE._compile_all_devices
    compile_config = {"compile_config": COMPILE} if compiles else {}
    return {keyword: static_cache(model, tokens, prefix), **compile_config}


def static_cache(model, tokens: int, prefix=None) -> StaticCache:
    """A `StaticCache` for `tokens` columns a row (prompt + new tokens), rounded up to CACHE_BLOCK,
    holding `prefix` (a filled DynamicCache, e.g. the shared prompt pass's) if given; `generate`
    then runs only the columns after it. The prefix's layers are copied one at a time and freed
    (it is emptied), so the copy costs one layer's prompt K and V beyond the static cache. On CUDA
    it also raises torch.compile's limits to RECOMPILE_LIMIT and RERECORD_LIMIT."""
    if next(model.parameters()).is_cuda:
        import torch._inductor.config as inductor
        dynamo = torch._dynamo.config
        dynamo.cache_size_limit = max(dynamo.cache_size_limit, RECOMPILE_LIMIT)
        inductor.triton.cudagraph_unexpected_rerecord_limit = RERECORD_LIMIT
    length = -(-tokens // CACHE_BLOCK) * CACHE_BLOCK
    cache = StaticCache(config=model.config, max_cache_len=length)
    if prefix is not None:
        for i, layer in enumerate(prefix.layers):
            cache.update(layer.keys, layer.values, i)  # [B, heads, P - 1, d] into columns 0..P-2
            layer.keys = layer.values = None
    return cache

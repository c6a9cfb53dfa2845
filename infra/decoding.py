"""How the HF engine runs its decode loop: the `--decode` setting (dynamic or static), and the
static mode's preallocated KV cache, compiled once for every adapter, its CUDA graphs bounded.

What it is for. `model.generate` with a `DynamicCache` is bound by the host on a GPU: each decode
step launches a few thousand small kernels from Python, and the cache concatenates every layer's
K and V once more each step. The static mode hands `generate` a preallocated cache (a
`FilledCache` over `CacheStore`'s buffers, kept across calls and training steps) whose attention
(`attend_filled`) reads each KV head once and only the columns filled so far, to within a mask
width. transformers then compiles the model's forward for the decode steps on CUDA by itself
(`generate` checks for a compileable cache; its default `CompileConfig` is inductor with CUDA
graphs, `mode="reduce-overhead"`; here with dynamic shapes, COMPILE), so a step is one graph
replay instead of thousands of launches. What keeps it to one compile:
  - one adapter for every call: PEFT's active adapter is a guard of the compiled step, so each
    call's adapter is copied into one slot adapter first (`slot_adapter`, PEFT's hotswap), kept in
    the weights' dtype (no cast of LoRA's fp32 weights at each step); a mixed-adapter batch runs
    hooks the compiler would break on, so the engine cuts its rows by adapter first (`call_groups`);
  - every size its own symbol (`attention`: no duck sizing), a spare block past the mask's widest
    (`cache_columns`), and no call of one row (the compiler specialises a size of 1).
What keeps its CUDA graphs bounded (GRAPH_LIMIT a run): a graph is recorded for each (rows, cache
columns, mask width), and the three come from a few sizes (infra/decode_shapes.py: rows padded up,
columns and widths growing geometrically), over a store that never moves on a GPU (`CacheStore`).
The shared prompt pass fills the call's cache in place (`first_rows`, `spread_rows`), so a call
holds its prompts' K and V once (infra/memory.py's plan: tests/test_decoding.py measures it).

What it is not for. It does not change what is sampled: greedy rows equal the dynamic mode's,
and sampled rows equal them call by call (a mixed batch's rows are drawn in other calls, a call
padded with copies of its last prompt, which are never returned: the same distribution, other
draws; tests/test_policies.py). On the CPU nothing is compiled. It is not continuous batching (a
call still runs until its longest real row ends), and it does not merge the adapter into the
weights. Its memory is the token budget the engine cuts its calls by (each row counted at its
cache's columns), the compiled graphs (GRAPH_BYTES each), and the store kept through the update
(infra/memory.py). On a GPU its speed, compile time and peaks are still unmeasured
(bench/README.md).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sysconfig

import torch
import torch.fx.experimental._config
from peft.utils.hotswap import hotswap_adapter_from_state_dict
from transformers import AttentionInterface, CompileConfig, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from infra.decode_shapes import cache_columns, mask_width  # the calls' few shapes

DECODE_MODES = ("auto", "dynamic", "static")
# torch.compile's recompiles per function before it falls back to eager (torch's default: 8):
# each adapter and the base is one
RECOMPILE_LIMIT = 64
# CUDA graph re-recordings per function before it runs without graphs (inductor's default: 128;
# torch 2.13 no longer counts a static input's new address, older versions may). CacheStore keeps
# its addresses through the update and on a GPU never moves them: GRAPH_LIMIT bounds the graphs
RERECORD_LIMIT = 1 << 30
# The CUDA graphs a run records at most, by design: one per (rows, cache columns, mask width) its
# calls step with, each from a few sizes (infra/decode_shapes.py). A paper cell's 500 steps,
# rehearsed on the CPU, meet at most 99 (bench/decode_rehearsal.py: each cell on an H100 and an
# H200, the lengths from a stated model of them, hence the margin). A run past it warns once.
GRAPH_LIMIT = 128
# What a graph holds outside torch's allocator: the driver's copy of a step of about 1,000 kernels,
# 1-15 MB as read from torch's and vLLM's sources and logs (not measured here). The bound's memory:
# GRAPH_LIMIT x GRAPH_BYTES = 2 GiB (bench/decode_rehearsal.py adds a cell's graphs to its peak)
GRAPH_BYTES = 16 * 2 ** 20
WARNED: set[str] = set()  # the warnings this process has printed (`decode_metrics`)
# how generate() compiles the decode step on CUDA: transformers' defaults (inductor, CUDA graphs),
# but shapes dynamic from the first compile. Calls differ in rows and cache length; with torch's
# default (static first, dynamic at the first new shape) each adapter would compile twice or more
COMPILE = CompileConfig(dynamic=True)


def decode_mode(decode: str, model, quiet: bool = False) -> str:
    """`--decode` resolved for `model`: auto is static on CUDA (where a compiled step pays) and
    dynamic elsewhere, so the CPU's runs stay as they were; static on CUDA without what the
    compiler needs (`compiler_problem`) is dynamic, with one warning line (none if `quiet`).
    Example: auto on a CPU -> dynamic."""
    if decode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {decode!r} (expected one of {DECODE_MODES})")
    on_cuda = next(model.parameters()).is_cuda
    mode = decode if decode != "auto" else "static" if on_cuda else "dynamic"
    if mode == "static" and on_cuda and (problem := compiler_problem()):
        if not quiet:
            print(f"warning: --decode {decode}: {problem}; the HF engine decodes dynamic "
                  "(uncompiled), counted as decode_fallback in the metrics")
        return "dynamic"
    return mode


# The adapter every static call decodes with (`slot_adapter`): the call's own adapter's weights are
# copied into it first, so the compiled step sees one adapter, at the same addresses, whichever role
# it samples (PEFT's active adapter is a guard of the compiled step: a new one would recompile)
SLOT = "decode_slot"


def slot_adapter(model, adapter: str | None) -> str:
    """SLOT holding `adapter`'s LoRA weights (None or `__base__`: zeros, so the slot adds exactly
    nothing to the base's outputs), copied in place with PEFT's hotswap (the library's way to change
    a compiled model's adapter without recompiling). The slot is added at the first call, with the
    trained adapters' config, in the base weights' dtype: the copy casts once a call what the
    training adapters (fp32 master weights) would cast at every decode step. Returns SLOT."""
    config = next(c for name, c in model.peft_config.items() if name != SLOT)
    if SLOT not in model.peft_config:
        devices = [model.device] if model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # its init draws, which sampling must not see
            model.add_adapter(SLOT, config)
        dtype = model.get_base_model().get_input_embeddings().weight.dtype
        for name, p in model.named_parameters():
            if f".{SLOT}." in name:
                p.data = p.data.to(dtype)
    state = {} if adapter in (None, "__base__") else {
        name.replace(f".{adapter}.", f".{SLOT}."): p.detach()
        for name, p in model.named_parameters() if f".{adapter}." in name and "lora_" in name}
    hotswap_adapter_from_state_dict(model, state, SLOT, config)  # missing keys: zeroed
    return SLOT


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


def cache_kwargs(mode: str, model, rows: int, tokens: int, keyword: str,
                 store: "CacheStore") -> dict:
    """generate()'s keywords for its cache (`keyword`: its name, by transformers version). Dynamic:
    none (generate makes its own DynamicCache, or the caller passes the shared prompt pass's).
    Static: `store`'s cache for `rows` rows of `tokens` columns, empty (the shared prompt pass fills
    it in place: policies.shared_prompt_cache's `into`), and COMPILE where generate() compiles. On
    CUDA it also raises torch.compile's limits to RECOMPILE_LIMIT and RERECORD_LIMIT."""
    if mode == "dynamic":
        return {}
    # where generate() compiles: CUDA (or a config forced onto every device, as a test does)
    compiles = next(model.parameters()).is_cuda or COMPILE._compile_all_devices
    if compiles:
        import torch._inductor.config as inductor
        dynamo = torch._dynamo.config
        # recompile_limit: torch's name since 2.6 (cache_size_limit is its older alias)
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        inductor.triton.cudagraph_unexpected_rerecord_limit = RERECORD_LIMIT
    return {keyword: store.cache(model, rows, tokens),
            **({"compile_config": COMPILE} if compiles else {})}


def first_rows(model, cache: "FilledCache", rows: int) -> "FilledCache":
    """An empty FilledCache of `cache`'s first `rows` rows: views of its K and V, so what a forward
    writes, `cache` holds (the shared prompt pass fills the distinct prompts in here)."""
    view = FilledCache(config=model.config, max_cache_len=cache.layers[0].max_cache_len)
    for layer, full in zip(view.layers, cache.layers):
        fill_layer(layer, full.keys[:rows], full.values[:rows])
    return view


def spread_rows(cache: "FilledCache", index: torch.Tensor, filled: int) -> "FilledCache":
    """Every row of `cache` given its prompt's first `filled` columns, in place: row i becomes row
    index[i] of those the shared prompt pass filled (`first_rows`), one layer's K, then its V, at a
    time (the gather is a copy: the call holds the prompts' K and V once, plus half a layer of
    them), and every layer counted as filled up to there. Returns `cache`."""
    same = torch.equal(index, torch.arange(len(index), device=index.device))
    for layer in cache.layers:
        if not same:  # a prompt several rows repeat
            for kv in (layer.keys, layer.values):
                kv[:, :, :filled] = kv[index, :, :filled]
        layer.cumulative_length.fill_(filled)
    cache.filled = filled
    return cache


# ---------------------------------------------------------------- reading only what a step needs

class FilledCache(StaticCache):
    """A StaticCache whose attention masks end at the columns filled so far, in a few widths
    (`mask_width`), not at the cache's last column: `attend_filled` (this mode's attention) reads K
    and V that far, so a step's attention grows with what is filled. transformers asks a cache for
    its mask's sizes once a forward, before the forward writes (generate() makes the mask outside
    the compiled step), so the filled count is kept here, on the host: no step reads it from the
    device (`spread_rows` sets it after the shared prompt pass; a reset zeroes it)."""
    filled = 0  # columns filled, counted on the host

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        length, offset = super().get_mask_sizes(query_length, layer_idx)
        self.filled += query_length  # this forward's queries, which it writes
        return min(length, mask_width(self.filled)), offset

    def reset(self) -> None:
        super().reset()
        self.filled = 0


def attend_filled(module, query, key, value, attention_mask, dropout: float = 0.0,
                  scaling: float | None = None, **kwargs):
    """The static mode's attention function (transformers' attention registry, ATTENTION): K and V
    up to the mask's end (FilledCache's filled columns), and in a one-token decode step each KV head
    read once. query [B, H, q, d], key and value [B, Hkv, L, d], mask [B, 1, q, W <= L].

    A decode step folds each KV head's H / Hkv query heads into the query length ([B, Hkv, H/Hkv,
    d]) and hands SDPA the mask as it is, broadcast over heads: K and V are read once, on the
    fused kernels. (transformers' SDPA path repeats K and V to every query head when there is a
    mask, and `enable_gqa` with a mask falls back to torch's math kernel, which materialises the
    repeat.) Every other call, prefill included, is transformers' SDPA path on the sliced K and
    V. Returns (output [B, q, H, d], None), as transformers' attention functions do."""
    if attention_mask is not None:  # always cut (a no-op at full width): no branch to guard on
        # narrow, not a slice: a slice clamps its end (min(W, L)), which the compiler guards on
        # (W < L, then W == L at the cache's last block: a recompile); narrow only asserts W <= L
        width = attention_mask.shape[-1]
        key, value = key.narrow(2, 0, width), value.narrow(2, 0, width)
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    rows, heads, _, dim = query.shape
    folded = query.reshape(rows, key.shape[1], groups, dim)  # head h = KV head h // groups
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value,
                                                           attn_mask=attention_mask, scale=scaling)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


def filled_mask(*args, **kwargs):
    """transformers' SDPA mask (boolean), always a tensor of its own: sdpa_mask gives a view for
    some batches and not for others (rows padded or all of one length), and the compiled step
    guards on whether its mask is a view, so it would compile again when that changed."""
    mask = sdpa_mask(*args, **kwargs)
    return mask if mask is None or mask._base is None else mask.clone()


ATTENTION = "marl_attend_filled"  # its name in transformers' registries
AttentionInterface.register(ATTENTION, attend_filled)
AttentionMaskInterface.register(ATTENTION, filled_mask)  # masks as SDPA takes them


@contextlib.contextmanager
def attention(mode: str, model):
    """The body's forwards (a generate() call) with `attend_filled` as the model's attention in
    the static mode; the dynamic mode and the update keep SDPA. A compiled step guards on this
    name: every static call sets it, so the guard holds. Static: every size the compiler meets
    gets a symbol of its own (no "duck sizing", which gives sizes equal in the first trace one
    symbol: a mask as wide as the cache, or rows as many as the mask's columns, would then compile
    again when they part)."""
    if mode != "static":
        yield
        return
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            yield
    finally:
        config._attn_implementation = before


class CacheStore:
    """The static mode's K and V memory, kept across generate() calls and training steps, so a
    compiled step's CUDA graph is recorded once per shape (rows, cache columns, mask width), not
    once per call or step.

    One flat buffer per layer for K and one for V. On a GPU they hold `budget` tokens (the HF
    engine's token budget: rows x columns, every call's within it) from the first call on, so they
    never move: grown buffers would have new addresses, and every shape recorded before would be
    recorded again. On the CPU (nothing is recorded) or without a token bound they grow to the
    largest call so far. A call of `rows` rows and `columns` columns gets a FilledCache of views of
    the buffers' first elements, at the same addresses for every call, reset in place for each call
    of that shape. It stays through the update, whose memory plan counts it
    (infra/memory.kept_store_bytes); `release()` frees it all."""

    def __init__(self, budget: int | None = None):
        self.budget = budget if budget and budget < 1 << 62 else None  # 1 << 62: no token bound
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.caches: dict[tuple[int, int], FilledCache] = {}

    def cache(self, model, rows: int, tokens: int) -> FilledCache:
        """A reset FilledCache of `rows` rows for a call of `tokens` (`cache_columns` columns)."""
        columns = cache_columns(tokens)
        if (cache := self.caches.get((rows, columns))) is not None:
            cache.reset()
            return cache
        config = model.config.get_text_config(decoder=True)
        heads = config.num_key_value_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        size = rows * heads * columns * dim
        if not self.buffers or self.buffers[0][0].numel() < size:
            self.release()  # the old buffers go before the new ones come
            weight = next(model.parameters())
            whole = (self.budget or 0) * heads * dim if weight.is_cuda else 0
            held = max(size, whole)  # a GPU's: the whole budget at once
            self.buffers = [(torch.zeros(held, dtype=weight.dtype, device=weight.device),
                             torch.zeros(held, dtype=weight.dtype, device=weight.device))
                            for _ in range(config.num_hidden_layers)]
        cache = FilledCache(config=model.config, max_cache_len=columns)
        for layer, (keys, values) in zip(cache.layers, self.buffers):
            shape = (rows, heads, columns, dim)
            fill_layer(layer, keys[:size].view(shape), values[:size].view(shape))
        self.caches[rows, columns] = cache
        return cache

    def release(self) -> None:
        self.buffers, self.caches = [], {}


def fill_layer(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """A StaticLayer initialized on `keys` and `values` ([B, Hkv, L, d] views of the store's
    buffers): what its lazy_initialization sets, in transformers 5.17 as in 5.24, with the
    buffers' addresses marked static for the compiler (as that method does)."""
    assert type(layer) is StaticLayer, f"the static mode needs full-attention layers, not {layer}"
    layer.device, (layer.batch_size, layer.num_heads) = keys.device, keys.shape[:2]
    layer.k_head_dim, layer.v_head_dim = keys.shape[-1], values.shape[-1]
    layer.keys, layer.values = keys, values
    layer.cumulative_length = layer.cumulative_length.to(keys.device)
    for tensor in (layer.keys, layer.values, layer.cumulative_length):
        torch._dynamo.mark_static_address(tensor)
    layer.is_initialized = True


# ---------------------------------------------------------------- what the compiler needs and did

def compiler_problem() -> str | None:
    """Why torch.compile's GPU code cannot be built here (one line), or None. Triton builds its
    launchers with a C compiler ($CC, else gcc, else clang, as Triton looks) and Python's headers;
    without them every compile fails, so the static mode falls back to the dynamic one."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not compiler or not shutil.which(compiler):
        return "no C compiler (CC, gcc or clang) for Triton"
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return f"no Python.h in {sysconfig.get_paths()['include']} for Triton"
    return None


def decode_metrics(asked: str, mode: str, model) -> dict[str, float]:
    """A training step's metrics of the decode: on CUDA in the static mode what torch.compile did
    (`compile_stats`, as decode/<name>), with one warning line the first time the CUDA graphs
    recorded pass GRAPH_LIMIT; or decode_fallback 1 where `asked` static (or auto) was resolved to
    dynamic (`decode_mode`); nothing on the CPU, whose runs keep their metrics."""
    if not next(model.parameters()).is_cuda:
        return {}
    if mode != "static":
        return {"decode_fallback": 1} if asked != "dynamic" else {}
    stats = compile_stats()
    if stats["cudagraphs_recorded"] > GRAPH_LIMIT and "graphs" not in WARNED:
        WARNED.add("graphs")  # once a process: a long run would say it at every step
        print(f"warning: the static decode recorded {stats['cudagraphs_recorded']} CUDA graphs, "
              f"past its bound of {GRAPH_LIMIT} (infra/decoding.py): shapes outside its design")
    return {f"decode/{k}": v for k, v in stats.items()}


def compile_stats() -> dict[str, float]:
    """What torch.compile did in this process so far: its seconds, the graphs it compiled (a
    function's first compile and each recompile, where nothing breaks the graph), graph breaks,
    and on CUDA the CUDA graphs recorded, re-recorded and skipped (inductor's counters and the
    CUDA graph trees of device 0; a count torch no longer exposes reads -1)."""
    from torch._dynamo.utils import calculate_time_spent, counters
    stats = {"compile_s": round(calculate_time_spent().get("total_wall_time", 0.0), 2),
             "graphs": counters["stats"]["unique_graphs"],
             "graph_breaks": sum(counters["graph_break"].values()),
             "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
             "cudagraphs_recorded": 0, "cudagraph_rerecords": 0}
    if torch.cuda.is_available():
        try:
            from torch._inductor import cudagraph_trees
            manager = cudagraph_trees.get_manager(0, create_if_none_exists=False)
            stack = [] if manager is None else [n for ns in manager.roots.values() for n in ns]
            while stack:
                node = stack.pop()
                stats["cudagraphs_recorded"] += 1
                stack += [c for cs in node.children.values() for c in cs]
            stats["cudagraph_rerecords"] = 0 if manager is None else sum(
                n for per in manager.num_rerecord.values() for n in per.values())
        except (AttributeError, ImportError):  # torch's internals moved: say so, not a wrong 0
            stats["cudagraphs_recorded"] = stats["cudagraph_rerecords"] = -1
    return stats

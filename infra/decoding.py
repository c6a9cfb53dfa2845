"""How the HF engine runs its decode loop: the `--decode` setting (dynamic or static), and the
static mode's preallocated KV cache.

What it is for. `model.generate` with a `DynamicCache` is bound by the host on a GPU: each decode
step launches a few thousand small kernels from Python, and the cache concatenates every layer's
K and V once more each step. The static mode hands `generate` a preallocated cache
(`BlockCache`, a view of `CacheStore`'s buffers, kept across calls) whose attention
(`attend_filled`) reads each KV head once and only the columns filled so far, to within a block.
transformers then compiles the model's forward for the decode steps on CUDA by itself (`generate`
checks for a compileable cache; its default `CompileConfig` is inductor with CUDA graphs,
`mode="reduce-overhead"`; here with dynamic shapes, COMPILE), so a step is one graph replay
instead of thousands of launches. This is what
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

import contextlib
import os
import shutil
import sysconfig

import torch
from transformers import AttentionInterface, CompileConfig, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

DECODE_MODES = ("auto", "dynamic", "static")
# the static cache's length is rounded up to a multiple of this: calls whose widest prompts differ
# by a few tokens then share one compiled shape (CUDA graphs are recorded once per shape)
CACHE_BLOCK = 128
# torch.compile's recompiles per function before it falls back to eager (torch's default: 8):
# each adapter and the base is one
RECOMPILE_LIMIT = 64
# CUDA graph re-recordings per function before it runs without graphs (inductor's default: 128;
# torch 2.13 no longer counts a static input's new address, older versions may): CacheStore keeps
# a call's addresses, but frees them before each update, so a step's first call of a shape may
# record again
RERECORD_LIMIT = 1 << 30
# how generate() compiles the decode step on CUDA: transformers' defaults (inductor, CUDA graphs),
# but shapes dynamic from the first compile. Calls differ in rows and cache length; with torch's
# default (static first, dynamic at the first new shape) each adapter would compile twice or more
COMPILE = CompileConfig(dynamic=True)


def decode_mode(decode: str, model) -> str:
    """`--decode` resolved for `model`: auto is static on CUDA (where a compiled step pays) and
    dynamic elsewhere, so the CPU's runs stay as they were; static on CUDA without what the
    compiler needs (`compiler_problem`) is dynamic, with one warning line. Example: auto on a CPU
    -> dynamic."""
    if decode not in DECODE_MODES:
        raise ValueError(f"unknown decode mode {decode!r} (expected one of {DECODE_MODES})")
    on_cuda = next(model.parameters()).is_cuda
    mode = decode if decode != "auto" else "static" if on_cuda else "dynamic"
    if mode == "static" and on_cuda and (problem := compiler_problem()):
        print(f"warning: --decode {decode}: {problem}; the HF engine decodes dynamic (uncompiled), "
              "counted as decode_fallback in the metrics")
        return "dynamic"
    return mode


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


def cache_kwargs(mode: str, model, prefix, rows: int, tokens: int, keyword: str,
                 store: "CacheStore") -> dict:
    """generate()'s keywords for its cache (`keyword`: its name, by transformers version). Dynamic:
    `prefix` as it is, or none (generate makes its own DynamicCache). Static: `store`'s cache for
    `rows` rows of `tokens` columns holding `prefix` (a filled DynamicCache, e.g. the shared prompt
    pass's: `generate` then runs only the columns after it), and COMPILE where generate() compiles.
    On CUDA it also raises torch.compile's limits to RECOMPILE_LIMIT and RERECORD_LIMIT."""
    if mode == "dynamic":
        return {} if prefix is None else {keyword: prefix}
    # where generate() compiles: CUDA (or a config forced onto every device, as a test does)
    compiles = next(model.parameters()).is_cuda or COMPILE._compile_all_devices
    if compiles:
        import torch._inductor.config as inductor
        dynamo = torch._dynamo.config
        # recompile_limit: torch's name since 2.6 (cache_size_limit is its older alias)
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        inductor.triton.cudagraph_unexpected_rerecord_limit = RERECORD_LIMIT
    cache = store.cache(model, rows, tokens)
    if prefix is not None:  # its layers copied one at a time and freed: one layer's K and V extra
        for i, layer in enumerate(prefix.layers):
            cache.update(layer.keys, layer.values, i)  # [B, heads, P - 1, d] into columns 0..P-2
            layer.keys = layer.values = None
    return {keyword: cache, **({"compile_config": COMPILE} if compiles else {})}


def blocks(columns: int) -> int:
    """`columns` rounded up to a multiple of CACHE_BLOCK. Example: 1 -> 128, 129 -> 256."""
    return -(-columns // CACHE_BLOCK) * CACHE_BLOCK


# ---------------------------------------------------------------- reading only what a step needs

class BlockCache(StaticCache):
    """A StaticCache whose attention masks end at the columns filled so far, rounded up to
    CACHE_BLOCK, not at the cache's last column. `attend_filled` (this mode's attention) reads K
    and V up to the mask's end, so a decode step's attention work grows with what is filled, in
    steps of a block: one compiled shape per block, where a StaticCache reads every column.

    The mask is built outside the compiled step (generate() prepares it for a compileable cache),
    so the filled count is read on the host: one sync a step, which generate's own stopping check
    already makes."""

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        length, offset = super().get_mask_sizes(query_length, layer_idx)
        filled = int(self.get_seq_length(layer_idx)) + query_length  # this step's queries included
        return min(length, blocks(filled)), offset


def attend_filled(module, query, key, value, attention_mask, dropout: float = 0.0,
                  scaling: float | None = None, **kwargs):
    """The static mode's attention function (transformers' attention registry, ATTENTION): K and V
    up to the mask's end (BlockCache's filled columns), and in a one-token decode step each KV head
    read once. query [B, H, q, d], key and value [B, Hkv, L, d], mask [B, 1, q, W <= L].

    A decode step folds each KV head's H / Hkv query heads into the query length ([B, Hkv, H/Hkv,
    d]) and hands SDPA the mask as it is, broadcast over heads: K and V are read once, on the
    fused kernels. (transformers' SDPA path repeats K and V to every query head when there is a
    mask, and `enable_gqa` with a mask falls back to torch's math kernel, which materialises the
    repeat.) Every other call, prefill included, is transformers' SDPA path on the sliced K and
    V. Returns (output [B, q, H, d], None), as transformers' attention functions do."""
    if attention_mask is not None:  # always cut (a no-op at full width): no branch to guard on
        key, value = key[:, :, :attention_mask.shape[-1]], value[:, :, :attention_mask.shape[-1]]
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    rows, heads, _, dim = query.shape
    folded = query.reshape(rows, key.shape[1], groups, dim)  # head h = KV head h // groups
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value,
                                                           attn_mask=attention_mask, scale=scaling)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


ATTENTION = "marl_attend_filled"  # its name in transformers' registries
AttentionInterface.register(ATTENTION, attend_filled)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # masks as SDPA takes them (boolean)


@contextlib.contextmanager
def attention(mode: str, model):
    """The body's forwards (a generate() call) with `attend_filled` as the model's attention in
    the static mode; the dynamic mode and the update keep SDPA. A compiled step guards on this
    name: every static call sets it, so the guard holds."""
    if mode != "static":
        yield
        return
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


class CacheStore:
    """The static mode's K and V memory, kept across generate() calls, so a compiled step's CUDA
    graph is recorded once per shape (rows, cache columns, mask width), not once per call.

    One flat buffer per layer for K and one for V, as large as the largest call's rows x columns
    (the memory a StaticCache of that call would take: infra/memory.py's plan), grown when a call
    needs more; a call of `rows` rows gets a BlockCache whose layers are views of the buffers'
    first elements, at the same addresses for every call. The cache of a row count is reused
    (reset in place) while its columns suffice. `release()` frees it all (the engine before the
    update, whose memory plan does not count it)."""

    def __init__(self):
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.caches: dict[int, BlockCache] = {}

    def cache(self, model, rows: int, tokens: int) -> BlockCache:
        """A reset BlockCache for `rows` rows and at least `tokens` columns (rounded up to
        CACHE_BLOCK)."""
        cache = self.caches.get(rows)
        if cache is not None and cache.layers[0].max_cache_len >= tokens:
            cache.reset()
            return cache
        config = model.config.get_text_config(decoder=True)
        heads = config.num_key_value_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        columns = blocks(tokens)
        size = rows * heads * columns * dim
        if not self.buffers or self.buffers[0][0].numel() < size:
            self.release()  # the old buffers go before the new ones come
            weight = next(model.parameters())
            self.buffers = [(torch.zeros(size, dtype=weight.dtype, device=weight.device),
                             torch.zeros(size, dtype=weight.dtype, device=weight.device))
                            for _ in range(config.num_hidden_layers)]
        cache = BlockCache(config=model.config, max_cache_len=columns)
        for layer, (keys, values) in zip(cache.layers, self.buffers):
            shape = (rows, heads, columns, dim)
            fill_layer(layer, keys[:size].view(shape), values[:size].view(shape))
        self.caches[rows] = cache
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
    (`compile_stats`, as decode/<name>), or decode_fallback 1 where `asked` static (or auto) was
    resolved to dynamic (`decode_mode`); nothing on the CPU, whose runs keep their metrics."""
    if not next(model.parameters()).is_cuda:
        return {}
    if mode == "static":
        return {f"decode/{k}": v for k, v in compile_stats().items()}
    return {"decode_fallback": 1} if asked != "dynamic" else {}


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

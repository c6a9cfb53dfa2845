"""GPU memory: the plan for one GPU, and what one HF generate() call may hold.

What it is for: the arithmetic behind `bench/bench_memory.py`'s plan (which micro-batch token budget
and vLLM fraction fit a Qwen3 cell on one GPU) and behind `--gen-max-tokens 0` (the HF engine's
tokens per generate() call, with its prefill in pieces). Every term is a formula over a model's
shape and the token budget, so a test checks it by hand (tests/test_memory.py); the bytes a decoder
layer keeps per token are measured on CPU by the benchmark, on padded micro-batches. What it is not:
a measurement. The plan's numbers are estimates until a GPU run logs `memory/peak_gib` and
`memory/peak_reserved_gib` (`bash bench/gpu_check.sh` compares them).

What the libraries allocate, read from their sources (the released transformers 5.17 and 5.24 and
vLLM 0.32 and 0.33; torch's SDPA front end, aten/src/ATen/native/transformers/attention.cpp):
  - rows of different lengths get a [rows, 1, q, kv] bool mask from transformers; torch's SDPA
    converts it to an additive bf16 copy, and its memory-efficient kernel makes one more, aligned
    copy when kv is not a multiple of 8: 1 + 2 (+ 2) bytes a cell (`mask_cell_bytes`);
  - with a mask, transformers' SDPA path repeats K and V across the query heads (GQA is off): one
    layer's repeated K and V per token (`repeated_kv_bytes_per_token`);
  - the no-grad passes (old log-probs, drift, the KL reference) hold the KV cache of the prompts
    they share (without activation checkpointing; under it they run full rows, as the update does:
    policies.completion_logprobs, so `shared_kv_bytes` is then an upper bound);
  - SP's diagnostics keep an fp32 copy of the adapter's gradient per role (infra/update_report.py);
  - PyTorch's caching allocator reserves more than it allocates: a freed block of one size can sit
    unused while a larger one is allocated (`reserved_bytes`);
  - a sleeping vLLM keeps its CUDA graphs' memory unless `sleep_mode_offload_cudagraph`
    (infra/vllm_engine.py sets it), so the plan's SLACK no longer holds them;
  - a rollout of the HF engine grows its KV cache a column a step, so the default allocator leaves
    cached blocks of every older size (the first GPU check: reserved 77.8 GiB at 13.2 allocated).
    `configure_allocator` maps growing segments instead (`expandable_segments`), and the HF engine
    empties torch's cache after its rollout (`StepHooks.before_update`), so the update starts on a
    clean pool.

    python bench/bench_memory.py      # the plan, per model, task and GPU
"""
from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 2 ** 30
# CUDA context, NCCL and vLLM's buffers outside its sleep pool, the allocator's rounding
SLACK = 3 * GIB
LORA_BYTES = 16        # per LoRA parameter: fp32 weight, gradient, Adam m and v
# per LoRA parameter and SP role: the fp32 gradient snapshot of infra/update_report.py
SNAPSHOT_BYTES = 4
# bool mask byte, additive bf16 copy bytes, the kernel's alignment
MASK_BOOL, MASK_COPY, MASK_ALIGN = 1, 2, 8
MASK_CELL_MAX = MASK_BOOL + 2 * MASK_COPY   # a cell with both copies: 5 bytes
# of the free GPU memory, what one generate() call may hold (the rest: reserved > allocated)
GENERATION_FRACTION = 0.8
# The static decode keeps its K and V through the update (infra/decoding.CacheStore: its CUDA graphs
# are recorded once, not at every step), so its calls may hold this much of the free memory at the
# engine's build instead; the rest is the update's, whose plan counts what is kept (`plan_bytes`)
KEPT_FRACTION = 0.4
# The HF engine's prefill runs in pieces of at most PREFILL_TOKENS tokens over all rows and
# PREFILL_CELLS mask cells, so its activations and mask are constants; what grows with a call is its
# KV cache.
PREFILL_TOKENS, PREFILL_CELLS = 4096, 1 << 28
# Per token of a generate() call, besides the KV cache: the int64 ids and 2D mask that generate()
# grows by a column a step (old and new copy each: 32 bytes) and the prefill's int64 positions (8).
GENERATE_INT64_BYTES = 40
# Per row and vocabulary entry while sampling: fp32 logits, processed scores and probabilities,
# top-p's sorted values (4 bytes each) and their int64 indices (8).
SAMPLING_BYTES = 24
# Measured on CPU by bench/bench_memory.py (its README figures), on padded micro-batches of two
# rows: bytes kept for backward per token by one bf16 Qwen3 decoder layer with LoRA rank 64, with
# activation checkpointing and without (KiB); without checkpointing a layer keeps K and V repeated
# across its heads. The mask's cells are counted by `mask_cell_bytes`, not here. HEAD_COPIES: the LM
# head's chunk of LOGPROB_CHUNK completion tokens, in fp32 copies of its logits.
QWEN3_LAYER_KIB = {"0.6B": (2.0, 95.9), "1.7B": (4.0, 153.9), "4B": (5.0, 235.0)}
HEAD_COPIES = 5.0


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """The KV cache of one token: a key and a value vector per layer and KV head."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def repeated_kv_bytes_per_token(heads: int, kv_heads: int, head_dim: int,
                                dtype_bytes: int = 2) -> int:
    """What one layer adds per token when a mask is present: transformers repeats K and V to every
    query head (`repeat_kv`), new tensors beside the KV heads' own. Qwen3-4B: 2 x (32 - 8) x 128 x 2
    = 12,288 bytes."""
    return 2 * (heads - kv_heads) * head_dim * dtype_bytes


def mask_cell_bytes(kv_length: int) -> int:
    """Bytes a cell of a [rows, 1, q, kv] mask costs at its peak inside SDPA: the bool mask, its
    additive bf16 copy, and when kv is not a multiple of 8 the memory-efficient kernel's aligned
    copy (3 or 5)."""
    return MASK_BOOL + MASK_COPY + (MASK_COPY if kv_length % MASK_ALIGN else 0)


def widest_mask_cells(budget: int, longest_row: int) -> int:
    """The most mask cells a padded micro-batch within a token budget can have: rows x W x W with
    rows x W <= budget (policies.micro_batches) and W <= the longest row; a row wider than the
    budget goes alone. For k rows the widest W is budget // k; k beyond 2 x (budget // longest) + 1
    cannot win (budget^2 / k falls below what budget // longest rows of the longest width hold)."""
    if longest_row >= budget:
        return longest_row * longest_row
    fewest = budget // longest_row
    return max(k * min(longest_row, budget // k) ** 2 for k in range(fewest, 2 * fewest + 2))


def worst_mask_bytes(budget: int, longest_row: int) -> int:
    """The plan's mask: the widest micro-batch's cells at 5 bytes, since widths are rarely multiples
    of 8."""
    return widest_mask_cells(budget, longest_row) * MASK_CELL_MAX


def static_bytes(params: float, lora_params: float, adapters: int) -> float:
    """What stays on the GPU through the update: bf16 base weights, each adapter's LoRA with its
    gradient and Adam state (IP holds 2-3 adapters, each with its own optimizer), and the slack."""
    return 2 * params + LORA_BYTES * lora_params * adapters + SLACK


def snapshot_bytes(lora_params: float, roles: int) -> float:
    """SP's per-role gradient diagnostics while a mini-batch's backward runs: the gradient before
    the current role and each finished role's own, fp32, `roles` copies in all; none with one
    role."""
    return SNAPSHOT_BYTES * lora_params * roles if roles > 1 else 0.0


def shared_kv_bytes(budget: int, kv_per_token: float) -> float:
    """The KV cache a no-grad pass holds for the prompts its rows share: gathered back to the rows,
    at most the micro-batch's padded tokens."""
    return budget * kv_per_token


def reserved_bytes(allocated: float, largest_block: float) -> float:
    """What the caching allocator may reserve at an allocated peak: one more block of the largest
    transient size, freed by one micro-batch and too small for the next one's."""
    return allocated + largest_block


@dataclass
class Footprint:
    """What the plan needs of a model, in bytes: sizes, and per token the layer figures
    (QWEN3_LAYER_KIB)."""
    params: float            # base parameters (bf16 on the GPU)
    lora_params: float       # one adapter's LoRA parameters
    layers: int
    ckpt_layer_token: float  # kept per token and layer under checkpointing (its input)
    # kept per token by one layer for backward: the recompute, K and V repeated
    full_layer_token: float
    kv_token: float          # the KV cache of one token, all layers
    head: float              # the LM head's chunk, HEAD_COPIES fp32 copies of LOGPROB_CHUNK x vocab


def update_bytes(m: Footprint, adapters: int, roles: int, budget: int, longest_row: int) -> float:
    """Peak of one update micro-batch (the backward, under checkpointing): `static_bytes`, SP's
    snapshots of `roles` roles, every layer's checkpointed input plus one layer's recompute, the
    mask, the LM head's chunk."""
    activations = budget * (m.layers * m.ckpt_layer_token + m.full_layer_token)
    return static_bytes(m.params, m.lora_params, adapters) + snapshot_bytes(
        m.lora_params, roles) + \
        activations + worst_mask_bytes(budget, longest_row) + m.head


def nograd_bytes(m: Footprint, adapters: int, budget: int, longest_row: int) -> float:
    """Peak of a no-grad pass within the budget (old log-probs, the drift check with vLLM asleep):
    the same weights and optimizer state, one layer's activations, the shared prompts' KV cache, the
    mask, the head."""
    return static_bytes(m.params, m.lora_params, adapters) + budget * m.full_layer_token + \
        shared_kv_bytes(budget, m.kv_token) + worst_mask_bytes(budget, longest_row) + m.head


def kl_bytes(m: Footprint, adapters: int, roles: int, budget: int, longest_row: int) -> float:
    """Peak of --kl-coef's reference pass, which runs between a micro-batch's forward and its
    backward: what the forward keeps (checkpointed inputs, its bool mask, SP's snapshots) beside a
    no-grad pass of its own."""
    kept = budget * m.layers * m.ckpt_layer_token + widest_mask_cells(
        budget, longest_row) * MASK_BOOL
    return nograd_bytes(m, adapters, budget, longest_row) + snapshot_bytes(
        m.lora_params, roles) + kept


def plan_bytes(m: Footprint, adapters: int, roles: int, budget: int, longest_row: int,
               kl: bool = False, kept: float = 0.0) -> dict[str, float]:
    """A step's peaks within one budget: the update, the no-grad passes, the KL pass (counted with
    `kl`: --kl-coef), each beside `kept` (the static decode's K and V: `kept_store_bytes`); the
    allocated peak is the largest counted, the reserved peak adds the largest transient block (the
    mask's bf16 copy, or one fp32 head chunk)."""
    peaks = {"update": update_bytes(m, adapters, roles, budget, longest_row) + kept,
             "nograd": nograd_bytes(m, adapters, budget, longest_row) + kept,
             "kl": kl_bytes(m, adapters, roles, budget, longest_row) + kept}
    block = max(widest_mask_cells(budget, longest_row) * MASK_COPY, m.head / HEAD_COPIES)
    allocated = max(v for k, v in peaks.items() if kl or k != "kl")
    return {**peaks, "allocated": allocated, "reserved": reserved_bytes(allocated, block)}


# ---------------------------------------------------------------- the HF engine's generate() calls

def prefill_activation_bytes_per_token(hidden: int, intermediate: int, q_dim: int, dtype_bytes: int,
                                       lora: bool) -> int:
    """An upper bound of one decoder layer's no-grad activations per token: the residual and its
    normed copy, three tensors of the widest projection (the MLP's gate, up and product); with LoRA
    (fp32) that projection's output and input twice more in fp32. Measured on CPU at Qwen3 shapes
    with LoRA 64 (bench/README.md): 28.5, 72.5, 101.5 KiB for 0.6B, 1.7B, 4B; this gives 54, 108,
    163."""
    wide = max(intermediate, q_dim)
    return dtype_bytes * (2 * hidden + 3 * wide) + (4 * 2 * (wide + hidden) if lora else 0)


def prefill_columns(rows: int, width: int) -> int:
    """Columns per prefill forward for `rows` prompts `width` wide: within PREFILL_TOKENS tokens and
    PREFILL_CELLS mask cells (rows x columns x width), at least one."""
    return max(1, min(PREFILL_TOKENS // rows, PREFILL_CELLS // (rows * width)))


def generation_bytes_per_token(kv_token: int, layers: int, repeated_kv: int) -> int:
    """What a generate() call holds per token of rows x (prompt + new): the KV cache, one layer's
    copy of it while DynamicCache grows that layer, one layer's K and V repeated across heads (the
    prefill's pieces attend with a mask), a decode step's mask cell and GENERATE_INT64_BYTES."""
    return kv_token + kv_token // layers + repeated_kv + MASK_CELL_MAX + GENERATE_INT64_BYTES


def generation_fixed_bytes(activation_token: int, rows: int, vocab: int,
                           piece_tokens: int = PREFILL_TOKENS,
                           piece_cells: int = PREFILL_CELLS) -> int:
    """What a generate() call holds whatever its length: a prefill piece's mask and activations (at
    most PREFILL_CELLS cells and PREFILL_TOKENS tokens; a call's own pieces may be smaller), and
    sampling over the vocabulary for `rows` rows."""
    prefill = piece_cells * MASK_CELL_MAX + piece_tokens * activation_token
    return prefill + rows * vocab * SAMPLING_BYTES


def generation_call_bytes(per_token: int, rows: int, columns: int, fixed: int) -> int:
    """The plan's bytes for one generate() call: `rows` rows of `columns` columns each (prompt and
    new tokens; the static mode's cache rounds them up: decode_shapes.cache_columns) at `per_token`
    (`generation_bytes_per_token`), beside `fixed` (`generation_fixed_bytes`). What the HF engine's
    token budget assumes a call holds; tests/test_decoding.py measures a call against it."""
    return fixed + rows * columns * per_token


def kept_store_bytes(tokens: int, kv_token: int) -> int:
    """The static decode's K and V kept through the update: on CUDA the store takes the engine's
    whole token budget at its first call (decoding.CacheStore), so the budget's KV cache."""
    return tokens * kv_token


def generation_tokens(free_bytes: int, per_token: int, fixed: int = 0,
                      fraction: float = GENERATION_FRACTION) -> int:
    """Tokens (rows x (prompt + new), over one generate() call) that fit in `fraction` of the free
    memory beside `fixed`."""
    return max(1, int((fraction * free_bytes - fixed) / per_token))


def sampling_tokens(per_token: int, vocab: int) -> int:
    """A row's sampling buffers over the vocabulary (vocab x SAMPLING_BYTES) in tokens of
    `per_token` bytes, rounded up: r rows of w tokens then fit where r x (w + this) tokens do, so a
    token budget bounds the rows too. Qwen3 (vocab 151,936, 122,925 bytes a token): 3,646,464 /
    122,925 -> 30 tokens a row."""
    return -(-vocab * SAMPLING_BYTES // per_token)


# rows per generate() call where no memory budget applies (the CPU): --gen-batch-size 0
CPU_GENERATION_ROWS = 64


@dataclass
class GenerationBudget:
    """What one HF generate() call may hold, as policies.HFEngine's keywords: at most `batch_size`
    rows and `max_tokens` tokens, where a row counts its prompt, its new tokens and
    `sampling_tokens` (its sampling buffers); the prefill in pieces (`prefill_columns`, None: one
    pass)."""
    batch_size: int
    max_tokens: int
    prefill_columns: object = None
    sampling_tokens: int = 0


def hf_generation_budget(model, rows: int = 0, tokens: int = 0,
                         keep: bool = False) -> GenerationBudget:
    """`--gen-batch-size` (rows) and `--gen-max-tokens` (tokens), 0 for what fits: on CUDA the
    tokens that fit in the free memory when the engine is built (weights and adapters loaded) beside
    a prefill piece, each row also counting its sampling buffers, so rows 0 leaves the rows to the
    token budget (a call of short rows holds more of them); with `keep` (the static decode, whose K
    and V stay through the update) in KEPT_FRACTION of it; on the CPU no token bound, one prefill
    pass, rows 0 meaning CPU_GENERATION_ROWS. Tokens given are taken as they are (rows x (prompt +
    new))."""
    import torch
    param = next(model.parameters())
    if not param.is_cuda:
        return GenerationBudget(rows or CPU_GENERATION_ROWS, tokens or 1 << 62)
    lora = any("lora_" in name for name, _ in model.named_parameters())
    free = 0 if tokens else torch.cuda.mem_get_info(param.device)[0]
    return gpu_generation_budget(model.config, param.element_size(), lora, free, rows, tokens, keep)


def gpu_generation_budget(c, size: int, lora: bool, free_bytes: int, rows: int = 0,
                          tokens: int = 0, keep: bool = False) -> GenerationBudget:
    """`hf_generation_budget` on a GPU, from a model's config `c`, its weights' bytes an element,
    whether it has LoRA, and the free memory (bench/decode_rehearsal.py gives a device's)."""
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, head_dim, size)
    repeated = repeated_kv_bytes_per_token(c.num_attention_heads, c.num_key_value_heads, head_dim,
                                           size)
    act = prefill_activation_bytes_per_token(c.hidden_size, c.intermediate_size,
                                             c.num_attention_heads * head_dim, size, lora)
    per_token = generation_bytes_per_token(kv, c.num_hidden_layers, repeated)
    if tokens:
        return GenerationBudget(rows or 1 << 62, tokens, prefill_columns)
    tokens = generation_tokens(free_bytes, per_token, generation_fixed_bytes(act, 0, c.vocab_size),
                               KEPT_FRACTION if keep else GENERATION_FRACTION)
    return GenerationBudget(rows or 1 << 62, tokens, prefill_columns, sampling_tokens(
        per_token, c.vocab_size))


# ---------------------------------------------------------------- the CUDA allocator

# torch's names, old and new
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
ALLOCATOR_CONF = "expandable_segments:True"


def configure_allocator(engine: str, device: str, environ: dict | None = None) -> str | None:
    """Before CUDA starts (torch reads the variable once, when it first uses the GPU): with the HF
    engine on a GPU, torch's allocator grows segments in place (`expandable_segments`), so a
    rollout's KV cache, a column larger each decode step, does not leave a cached block of every
    older size, and reserved memory stays near allocated. Not where the user set either variable
    (theirs wins), not with vLLM, whose sleep mode refuses expandable segments in its memory pool,
    and not on the CPU (`device` cpu, or no GPU). Returns what it set, or None."""
    import torch
    environ = os.environ if environ is None else environ
    on_gpu = device != "cpu" and torch.cuda.is_available()
    if engine != "hf" or not on_gpu or any(v in environ for v in ALLOCATOR_VARIABLES):
        return None
    environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_CONF
    return ALLOCATOR_CONF


def release_cached_blocks(model) -> None:
    """CUDA: return torch's cached, unused blocks to the device (after the rollout: its KV caches'
    blocks would otherwise stay reserved through the update, in sizes the update does not ask
    for)."""
    import torch
    if next(model.parameters()).is_cuda:
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- a step's measured peaks

def reset_peaks(model) -> None:
    """CUDA: the step's peaks start here (a sleeping vLLM resets them again: the update's own)."""
    import torch
    if next(model.parameters()).is_cuda:
        torch.cuda.reset_peak_memory_stats()


def step_peaks(model, engine) -> dict[str, float]:
    """On CUDA, read at the end of the update, before vLLM wakes: `memory/peak_gib` and
    `memory/peak_reserved_gib`, the trainer's allocated and reserved peaks (less what torch counts
    as the sleeping vLLM's, `VLLMEngine.trainer_peak_bytes`), and `memory/device_used_gib`, the
    device's use then; {} on the CPU."""
    import torch
    if not next(model.parameters()).is_cuda:
        return {}
    own = getattr(engine, "trainer_peak_bytes", None)
    allocated = own() if own else torch.cuda.max_memory_allocated()
    reserved = own(reserved=True) if own else torch.cuda.max_memory_reserved()
    free, total = torch.cuda.mem_get_info()
    return {"memory/peak_gib": allocated / GIB, "memory/peak_reserved_gib": reserved / GIB,
            "memory/device_used_gib": (total - free) / GIB}


class StepHooks:
    """What a training step asks of its sampling engine around the update (train.py's train_step),
    as the HF engine has it: the step's CUDA memory peaks (nothing on the CPU).
    infra/vllm_engine.VLLMEngine adds its own: asleep and checked for drift before the update, awake
    with the new adapters after. The engine holds `model`."""

    def start_step(self) -> None:
        """Before the rollout: the step's peaks start here."""
        reset_peaks(self.model)

    def before_update(self, calls: list) -> dict[str, list[float]]:
        """After the rollout: its cached blocks go back to the device (`release_cached_blocks`);
        tallies of what the engine checks (the HF engine samples with the trainer's own weights:
        nothing)."""
        release_cached_blocks(self.model)
        return {}

    def after_update(self, adapters: list[str]) -> dict[str, float]:
        """After the update of `adapters`: the step's memory metrics (`step_peaks`; {} on the
        CPU)."""
        return step_peaks(self.model, self)

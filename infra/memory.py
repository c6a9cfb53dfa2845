"""GPU memory: the plan for one GPU, and how many tokens the HF engine may generate at once.

What it is for: the arithmetic behind `bench/bench_memory.py`'s plan (which micro-batch token budget and vLLM
fraction fit a Qwen3 cell on one GPU) and behind `--gen-max-tokens 0` (the HF engine's rows per generate() call,
bounded by the KV cache that the free GPU memory holds). Every term is a formula over a model's shape and the
token budget, so a test can check it by hand; the bytes per token of a decoder layer are measured on CPU by the
benchmark. What it is not: a measurement. The plan's numbers are estimates until a GPU run logs
`memory/peak_gib` (`bash bench/gpu_check.sh` compares the two).

    python bench/bench_memory.py      # the plan, per model, task and GPU
"""
from __future__ import annotations

GIB = 2 ** 30
SLACK = 3 * GIB                # CUDA context, allocator fragmentation, the sleeping vLLM's CUDA graphs
LORA_BYTES = 16                # per LoRA parameter: fp32 weight, gradient, Adam m and v
MASK_BYTES = 3                 # per mask cell: transformers' bool [rows, 1, W, W] mask, and SDPA's bf16 copy of it
GENERATION_FRACTION = 0.8      # of the free GPU memory, what the HF engine's KV cache may take (logits, slack)
# Measured on CPU by bench/bench_memory.py (its README figures): bytes saved for backward per token by one bf16
# Qwen3 decoder layer with LoRA rank 64, with activation checkpointing and without (KiB); and the LM head's chunk
# of LOGPROB_CHUNK completion tokens, in fp32 copies of its logits.
QWEN3_LAYER_KIB = {"0.6B": (2.0, 91.9), "1.7B": (4.0, 149.9), "4B": (5.0, 223.0)}
HEAD_COPIES = 5.0


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """The KV cache of one token: a key and a value vector per layer and KV head."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def mask_bytes(budget: int, longest_row: int) -> int:
    """The attention mask of a padded micro-batch: when its rows differ in length, transformers builds a
    [rows, 1, W, W] boolean mask (W the widest row) and SDPA adds a bf16 copy. Worst case under a token budget:
    budget // W rows of width W."""
    rows = max(1, budget // longest_row)
    return rows * longest_row * longest_row * MASK_BYTES


def static_bytes(params: float, lora_params: float, adapters: int) -> float:
    """What stays on the GPU through the update: bf16 base weights, each adapter's LoRA with its gradient and Adam
    state (IP holds 2-3 adapters, each with its own optimizer), and the slack."""
    return 2 * params + LORA_BYTES * lora_params * adapters + SLACK


def update_bytes(params: float, lora_params: float, adapters: int, budget: int, longest_row: int, layers: int,
                 ckpt_layer_token: float, full_layer_token: float, head: float) -> float:
    """Peak memory of one update micro-batch: `static_bytes`, the checkpointed activations of every layer plus one
    layer's recompute for the budget's tokens, the padded micro-batch's mask, the LM head's chunk."""
    activations = budget * (layers * ckpt_layer_token + full_layer_token)
    return static_bytes(params, lora_params, adapters) + activations + mask_bytes(budget, longest_row) + head


def drift_bytes(params: float, lora_params: float, adapters: int, budget: int, longest_row: int,
                full_layer_token: float, head: float) -> float:
    """Peak memory of the drift check's forward (vLLM asleep, no gradient): the same weights and optimizer state,
    one layer's activations at a time for a micro-batch within the same token budget, its mask, the LM head."""
    activations = budget * full_layer_token
    return static_bytes(params, lora_params, adapters) + activations + mask_bytes(budget, longest_row) + head


def generation_tokens(free_bytes: int, kv_per_token: int) -> int:
    """Tokens (prompt + new, over the rows of one generate() call) whose KV cache fits in GENERATION_FRACTION of
    the free memory."""
    return max(1, int(GENERATION_FRACTION * free_bytes / kv_per_token))


def hf_generation_budget(model) -> int:
    """`--gen-max-tokens 0`: on CUDA, what the free memory holds as KV cache (measured when the trainer is built,
    weights and adapters loaded); on CPU, no bound (the rows per call, --gen-batch-size, bound it)."""
    import torch
    param = next(model.parameters())
    if not param.is_cuda:
        return 1 << 62
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, head_dim, param.element_size())
    return generation_tokens(torch.cuda.mem_get_info(param.device)[0], kv)

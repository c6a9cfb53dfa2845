"""Policies: the model, its LoRA adapters, the adapter each role uses, the engine that samples.

Every role of a workflow is the same base model seen through a LoRA adapter (docs/method.md, "SP and
IP"): one `shared` adapter under Shared-Policy, one per role type under Isolated-Policy
(`route_adapter`). That name, set on each call by the rollout, is all that differs between SP and
IP: the engine samples each row under its adapter and grpo.py updates each adapter on its rows.

This file owns what touches the weights in the method: loading a model, chat formatting, the engine
(`make_engine`: the HF engine, one batched call per workflow stage, each row under its own adapter,
or vLLM's), log-probs under one adapter, and shared prompt passes (the n rows of a GRPO group run
their prompt once). The built-in models and the library-version shims are in infra/models.py, the
vLLM engine is infra/vllm_engine.py, and adapters are saved as PEFT folders by infra/checkpoints.py.

    python -c "import policies; m, t = policies.load_model('smollm2')"   # converts once
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch.utils.checkpoint import checkpoint
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from infra import decode_shapes, decoding, memory, models, vllm_engine
from infra.decoding import eos_token_ids, left_pad  # the engine's stop ids; [B, L] padded
from infra.memory import StepHooks
from infra.models import BUILTIN_MODELS, random_qwen3, smollm2_folder, tiny_model, tiny_tokenizer
from infra.roles import role_type
from toyworld import toy_hooks

BASE = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch
# activation checkpointing in the update (train.py), and whether it is on: infra/models.py
enable_grad_checkpointing = models.enable_grad_checkpointing
grad_checkpointing_on = models.grad_checkpointing_on

# Attention kernels that are exact when a row's attention mask has holes (shared prompt passes leave
# masked columns between a row's prompt and its last token); flash-attention's unpadding is not
# checked for that.
EXACT_WITH_HOLES = ("sdpa", "eager")


def load_model(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0):
    """Return (model, tokenizer) for a built-in model (BUILTIN_MODELS), `smollm2`, the toy model of
    `seed` (toyworld/; train.py builds it), a local folder or a hub id. Loaded models use sdpa
    attention, which is exact with shared prompt passes (EXACT_WITH_HOLES)."""
    if name in BUILTIN_MODELS:
        tokenizer = tiny_tokenizer()
        model = tiny_model(tokenizer, seed) if name == "tiny" else \
            random_qwen3(name, tokenizer, seed, device, dtype)  # on a GPU: built there
        return model.to(device=device, dtype=dtype), tokenizer
    path = toy_hooks.model_folder(seed) if name == "toy" else name  # train.py builds the toy model
    if name == "smollm2":
        path = smollm2_folder()
        print(f"[policies] loading SmolLM2-135M-Instruct from {path}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device)
    if tokenizer.pad_token_id is None:  # generation needs a pad id; masks never rely on it
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def chat_prompt_ids(tokenizer, messages: list[dict], enable_thinking: bool = False) -> list[int]:
    """Token ids of `messages` through the chat template, ending in the assistant header (Qwen3
    templates take `enable_thinking`; the paper runs non-thinking mode, our default)."""
    takes_thinking = "enable_thinking" in (tokenizer.chat_template or "")
    extra = {"enable_thinking": enable_thinking} if takes_thinking else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **extra)
    return tokenizer(text, add_special_tokens=False).input_ids


def chat_encoder(tokenizer, enable_thinking: bool = False,
                 template: str = "model") -> Callable[[list[dict]], list[int]]:
    """The `encode` a workflow's rollout is given: `chat_prompt_ids` (template `model`, the
    tokenizer's own), or `models.rllm_qwen_text` tokenized (template `rllm`, what the reference's
    runs fed Qwen3)."""
    if template == "rllm":
        return lambda messages: tokenizer(models.rllm_qwen_text(messages, enable_thinking),
                                          add_special_tokens=False).input_ids
    return lambda messages: chat_prompt_ids(tokenizer, messages, enable_thinking)


# ---------------------------------------------------------------- adapters

def route_adapter(call_name: str, policy: str) -> str:
    """The adapter a call trains and samples with: `shared` under SP, the role type under IP.

    The rollout stamps this name on every call; from there on nothing branches on SP or IP (grpo.py
    updates each adapter on the rows that name it). Example: generator0, generator1, aggregator ->
    SP: shared, shared, shared; IP: generator, generator, aggregator."""
    if policy == "sp":
        return "shared"
    if policy == "ip":
        return role_type(call_name)  # generator0 -> generator
    raise ValueError(f"unknown policy {policy!r} (expected sp or ip)")


def add_adapters(model, adapter_names: list[str], rank: int, alpha: int) -> PeftModel:
    """Wrap `model` with one LoRA adapter per name, on every linear layer (B = 0, so each starts as
    the base; no dropout, as the paper), computed in the weights' dtype (infra/models.py)."""
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear",
                        task_type="CAUSAL_LM")
    with models.quiet_peft_deprecation():
        peft_model = get_peft_model(model, config, adapter_name=adapter_names[0])
    for name in adapter_names[1:]:
        peft_model.add_adapter(name, config)
    return models.compute_in_weights_dtype(peft_model)  # bf16: LoRA's matmuls in bf16


def adapter_parameters(model: PeftModel, adapter: str) -> list[torch.nn.Parameter]:
    """The LoRA tensors of one adapter (names look like `...lora_A.<adapter>.weight`)."""
    return [p for n, p in model.named_parameters() if f".{adapter}." in n and "lora_" in n]


@contextlib.contextmanager
def use_adapter(model, adapter: str | None):
    """Run the body with one adapter active (and trainable), or with adapters off for `None` or
    `__base__`."""
    if adapter in (None, BASE):
        ctx = model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext()
        with ctx:
            yield
        return
    model.set_adapter(adapter)
    yield


# ---------------------------------------------------------------- generation

def make_engine(engine: str, model, tokenizer, *, max_new_tokens: int, temperature: float,
                top_p: float, rows: int, max_tokens: int, share_prompts: bool, decode: str,
                base_folder: str | None, dtype: str, seed: int, vllm_memory: float,
                drift: Callable | None = None):
    """The sampling engine of train.py and eval.py: HF generate on the model itself (`HFEngine`),
    each call at most `rows` rows and `max_tokens` tokens (0: on CUDA what fits in the free
    memory, the prefill in pieces; rows 0: on CUDA as many as fit, on CPU 64: infra/memory.py),
    its decode loop `decode` (infra/decoding.py); or vLLM (infra/vllm_engine.py: its own copy of
    the base weights from `base_folder`, in `dtype`, `vllm_memory` of the GPU, the adapters synced
    in; `drift`: its log-prob check, training only)."""
    if engine == "vllm":
        eos = eos_token_ids(model, tokenizer)
        return vllm_engine.VLLMEngine(base_folder, model, tokenizer, eos, to_generation,
                                      max_new_tokens, temperature, top_p, vllm_memory, dtype, seed,
                                      drift=drift)
    static = decoding.decode_mode(decode, model, quiet=True) == "static"  # keeps its K and V
    fits = memory.hf_generation_budget(model, rows, max_tokens, keep=static)  # 0s: what fits
    return HFEngine(model, tokenizer, max_new_tokens, temperature, top_p,
                    share_prompts=share_prompts, decode=decode, **vars(fits))


@dataclass
class Generation:
    completion_ids: list[int]  # sampled tokens, up to and including the first EOS
    text: str                  # decoded completion, special tokens skipped
    truncated: bool            # hit max_new_tokens without an EOS
    logprobs: list[float] | None = None  # the engine's log-prob of each sampled token (vLLM only)


def to_generation(ids: list[int], eos_ids: set[int], tokenizer,
                  logprobs: list[float] | None = None) -> Generation:
    """Sampled ids -> a Generation: cut after the first EOS, which is kept (the policy must learn to
    stop)."""
    end = next((j for j, t in enumerate(ids) if t in eos_ids), None)
    completion = ids if end is None else ids[:end + 1]
    return Generation(completion, tokenizer.decode(completion, skip_special_tokens=True),
                      end is None, None if logprobs is None else logprobs[:len(completion)])


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its KV cache under (it differs by transformers version:
    infra/models.py)."""
    forward = (model.get_base_model() if isinstance(model, PeftModel) else model).forward
    return models.cache_keyword(forward)


def shared_prompt_cache(model, prompts: list[list[int]], pad_id: int,
                        adapter_names: list[str] | None = None, columns: Callable | None = None,
                        into=None) -> tuple[DynamicCache, torch.Tensor] | None:
    """The KV cache of every row's prompt but its last token, computed once per distinct prompt.

    A GRPO batch holds each prompt n times, and prompts (instructions, other roles' outputs) are
    usually longer than completions. One pass per distinct (prompt, adapter) fills a cache [U, ...];
    gathering it by row gives every row its prompt's cache [B, ...]. The gather is differentiable:
    backward adds the n rows' gradients into their one prompt pass, so log-probs, loss and
    gradients equal a full pass per row up to float rounding. Prefixes are left-padded like
    `left_pad(prompts)` minus its last column. `columns(U, width)` runs the pass in pieces of that
    many columns (the HF engine on CUDA: its mask [U, 1, C, <=P] and activations stay bounded,
    infra/memory.py), worth it even when no prompt repeats. `into`: the static decode's cache of
    the B rows, filled in place (decoding.first_rows, spread_rows: the prompts' K and V held once).
    Returns (cache, prefix mask [B, P-1]), or None when a prompt is a single token or, without
    `columns`, no prompt repeats.
    """
    keys = [(tuple(p), adapter_names[i] if adapter_names else None) for i, p in enumerate(prompts)]
    distinct: dict[tuple, int] = {}
    row_of = [distinct.setdefault(k, len(distinct)) for k in keys]  # row i -> its distinct prompt
    if (len(distinct) == len(prompts) and not columns) or min(len(p) for p in prompts) < 2:
        return None
    device = next(model.parameters()).device
    ids, mask = left_pad([list(p[:-1]) for p, _ in distinct], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    routing = {"adapter_names": [a for _, a in distinct]} if adapter_names else {}
    cache = DynamicCache() if into is None else decoding.first_rows(model, into, len(distinct))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    step = columns(len(distinct), ids.shape[1]) if columns else ids.shape[1]
    with decoding.attention("dynamic" if into is None else "static", model):
        for s in range(0, ids.shape[1], step):  # each piece attends to the cache and itself
            model(input_ids=ids[:, s:s + step], attention_mask=mask[:, :s + step],
                  position_ids=positions[:, s:s + step], use_cache=True, logits_to_keep=1,
                  **{cache_kwarg(model): cache}, **routing)
    index = torch.tensor(row_of, device=device)
    if into is None:
        cache.batch_select_indices(index)  # [U, heads, P-1, d] -> [B, heads, P-1, d]
    return (cache if into is None else decoding.spread_rows(into, index, ids.shape[1])), mask[index]


class HFEngine(StepHooks):
    """Batched sampling with `model.generate`, each row under its own adapter: rows by prompt (its
    copies adjacent), cut into chunks of at most `batch_size` rows and `max_tokens` tokens (rows x
    (widest prompt + max_new_tokens + `sampling_tokens`, its sampling buffers): on CUDA
    infra/memory's budget), returned in the caller's order; a chunk's repeated prompts are
    prefilled once (`shared_prompt_cache`), in pieces of `prefill_columns` columns where given.
    `decode` static: one adapter a call, copied into the slot adapter, decoded on a preallocated
    cache kept across calls and steps (on CUDA compiled once), its rows counted at the cache's
    columns and padded up to a few counts (infra/decode_shapes.py). It samples with the trainer's
    own weights, so its hooks around an update only measure."""

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, batch_size: int = 64, share_prompts: bool = True,
                 max_tokens: int = 1 << 62, prefill_columns: Callable | None = None,
                 sampling_tokens: int = 0, decode: str = "auto"):
        self.model, self.tokenizer, self.prefill_columns = model, tokenizer, prefill_columns
        self.decode_asked, self.decode = decode, decoding.decode_mode(decode, model)  # auto: static
        self.store = decoding.CacheStore(max_tokens)  # the static mode's K and V, kept across calls
        self.max_new_tokens, self.sampling_tokens = max_new_tokens, sampling_tokens
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.share_prompts, self.eos_ids = share_prompts, eos_token_ids(model, tokenizer)
        if temperature > 0:
            self.sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            self.sampling = dict(do_sample=False)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], adapters: list[str | None],
                 desc: str = "") -> list[Generation]:
        # calls of rows by prompt (its copies adjacent), cut by rows and tokens (static: padded up
        # to a few row counts with copies of a row, which come after the real ones)
        groups = decoding.call_groups(adapters, self.decode)  # static: one adapter's rows each
        chunks = [([g[i] for i in c], real) for g in groups for c, real in
                  decode_shapes.engine_calls(self, [prompts[i] for i in g], micro_batches)]
        out: list[Generation | None] = [None] * len(prompts)
        for chunk, real in tqdm(chunks, desc=desc, leave=False, disable=None):
            generated = self._generate_chunk([prompts[i] for i in chunk],
                                             [adapters[i] for i in chunk], real)
            for i, g in zip(chunk, generated):  # the real rows only
                out[i] = g
        return out  # type: ignore[return-value]

    def _generate_chunk(self, prompts: list[list[int]], adapters: list[str | None],
                        real: int) -> list[Generation]:
        ids, mask = left_pad(prompts, self.tokenizer.pad_token_id)
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        routing, only = {}, None
        if isinstance(self.model, PeftModel):
            names = [BASE if a is None else a for a in adapters]
            if len(set(names)) == 1:  # one adapter for the whole chunk: activate it, no routing
                only = names[0]
                if self.decode == "static":  # every call on one adapter: the compiled step's one
                    only = decoding.slot_adapter(self.model, only)
            else:  # every row names its adapter (PEFT mixed-adapter batch); `__base__`: none
                routing["adapter_names"] = names
        self.model.eval()
        with use_adapter(self.model, only) if only else contextlib.nullcontext():
            # static: the call's preallocated cache, which the shared prompt pass fills in place
            # (infra/decoding.py); with a filled cache generate() runs each row's last prompt token
            keyword = cache_kwarg(self.model)
            cache = decoding.cache_kwargs(self.decode, self.model, len(prompts),
                                          ids.shape[1] + self.max_new_tokens, keyword, self.store)
            shared = (self.share_prompts or self.prefill_columns) and shared_prompt_cache(
                self.model, prompts, self.tokenizer.pad_token_id, routing.get("adapter_names"),
                self.prefill_columns, into=cache.get(keyword))
            cache = {**cache, keyword: shared[0]} if shared else cache
            with decoding.attention(self.decode, self.model):  # static: only the filled columns
                seqs = self.model.generate(input_ids=ids, attention_mask=mask,
                                           max_new_tokens=self.max_new_tokens,
                                           pad_token_id=self.tokenizer.pad_token_id,
                                           eos_token_id=list(self.eos_ids),
                                           **decode_shapes.padding_stop(real, len(prompts)),
                                           **self.sampling, **routing, **cache)
        new_tokens = seqs[:real, ids.shape[1]:].tolist()
        return [to_generation(row, self.eos_ids, self.tokenizer) for row in new_tokens]

    def after_update(self, adapters: list[str]) -> dict[str, float]:
        """The step's memory peaks; on CUDA, what the static decode compiled or its fallback."""
        return {**super().after_update(adapters),
                **decoding.decode_metrics(self.decode_asked, self.decode, self.model)}


# ---------------------------------------------------------------- log-probs

# completion tokens per LM-head chunk: [1024, 151936] fp32 logits = 0.6 GB, the only ones alive
LOGPROB_CHUNK = 1024


def _head_logprobs(lm_head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H], targets [N] -> log p(target) [N] and entropy [N] (zeros unless asked), at
    `temperature`; the entropy with its gradient only with `entropy_grad` (a loss term uses it)."""
    logits = lm_head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [N, V], bf16 -> fp32
    logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None])[:, 0] - lse
    entropy = torch.zeros_like(lse)
    if with_entropy:  # a diagnostic keeps no graph: backward's recompute holds no softmax [N, V]
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]],
                        temperature: float = 1.0, with_entropy: bool = False,
                        share_prompts: bool = True, entropy_grad: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs of each completion token given its prompt, under the active adapter, at the
    sampling temperature (ratios are taken against the distribution that produced the samples, as
    verl and TRL do).

    Rows are prompt + completion, left-padded, so every completion ends at the last column; only
    the real completion tokens go through the LM head, in chunks of LOGPROB_CHUNK recomputed in
    backward: a 151k vocabulary never has fp32 logits for a whole micro-batch. With
    `share_prompts` a prompt several rows share runs once (`shared_prompt_cache`; not under
    activation checkpointing, whose layers drop a passed cache). Returns (logp [B, T], mask [B, T],
    entropy [B, T] or None), right-aligned: row i's completion is in its last len(c_i) columns. The
    entropy carries its gradient only with `entropy_grad` (an entropy bonus: --entropy-coef).
    `mask` comes from lengths, never from pad ids (pad == EOS for SmolLM2).
    """
    device = next(model.parameters()).device
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    decoder, lm_head = base.get_decoder(), base.get_output_embeddings()
    T = max(len(c) for c in completions)
    # checkpointed layers drop a passed cache, so under checkpointing every pass runs full rows, the
    # no-grad ones too (old log-probs, the KL reference): at equal weights they compute what the
    # update computes (a shared prompt pass rounds otherwise in bf16: the ratio would move)
    shared = None
    if share_prompts and not grad_checkpointing_on(model):
        shared = shared_prompt_cache(model, prompts, pad_id=0)
    if shared is None:  # one pass per row over prompt + completion: [B, P + T]
        ids, attn = left_pad([p + c for p, c in zip(prompts, completions)], pad_id=0)
        ids, attn = ids.to(device), attn.to(device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: from each row's first token
        hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=positions,
                         use_cache=False).last_hidden_state
    else:  # [B, 1 + T] after the cache; pads between a row's prompt and last token are masked out
        cache, prefix_mask = shared
        ids, attn = left_pad([p[-1:] + c for p, c in zip(prompts, completions)], pad_id=0)
        ids, attn = ids.to(device), attn.to(device)
        positions = prefix_mask.sum(-1, keepdim=True) + (attn.cumsum(-1) - 1).clamp(min=0)
        hidden = decoder(input_ids=ids, attention_mask=torch.cat([prefix_mask, attn], dim=-1),
                         position_ids=positions, use_cache=True,
                         **{cache_kwarg(decoder): cache}).last_hidden_state
    hidden, targets = hidden[:, -(T + 1):-1], ids[:, -T:]  # [B, T, H] predicts [B, T]
    mask = torch.zeros((len(completions), T), dtype=torch.bool, device=device)
    for i, c in enumerate(completions):
        mask[i, T - len(c):] = True
    rows, cols = mask.nonzero(as_tuple=True)  # the real completion tokens, [N]
    parts = []
    for s in range(0, len(rows), LOGPROB_CHUNK):
        r, c = rows[s:s + LOGPROB_CHUNK], cols[s:s + LOGPROB_CHUNK]
        args = (lm_head, hidden[r, c], targets[r, c], temperature if temperature > 0 else 1.0,
                with_entropy, entropy_grad)
        if torch.is_grad_enabled():
            parts.append(checkpoint(_head_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_head_logprobs(*args))
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logp, entropy = (torch.zeros(mask.shape, dtype=dtype, device=device)
                     .index_put((rows, cols), torch.cat(part)) for part in zip(*parts))
    return logp, mask.to(dtype), entropy if with_entropy else None


def micro_batch_order(prompts: list[list[int]], completions: list[list[int]]) -> list[int]:
    """Row order for cutting micro-batches: by prompt length, prompt, completion length. Rows then
    pad to about the same width, and a prompt's copies share a micro-batch and its prompt pass;
    losses are sums over rows."""
    return sorted(range(len(prompts)),
                  key=lambda i: (len(prompts[i]), prompts[i], len(completions[i])))


def micro_batches(prompts: list[list[int]], completions: list[list[int]], max_rows: int,
                  max_tokens: int) -> list[list[int]]:
    """Row indices of each micro-batch, like verl's dynamic batch size: rows in `micro_batch_order`,
    cut before a batch would exceed `max_rows` rows or `max_tokens` padded tokens (rows x its
    widest prompt + completion; 0: no token limit). A row wider than the budget goes alone. Only
    memory depends on the cut: losses are sums over rows."""
    batches: list[list[int]] = []
    width = 0
    for i in micro_batch_order(prompts, completions):
        row = len(prompts[i]) + len(completions[i])
        has_room = batches and len(batches[-1]) < max_rows
        if has_room and (not max_tokens or (len(batches[-1]) + 1) * max(width, row) <= max_tokens):
            batches[-1].append(i)
            width = max(width, row)
        else:
            batches.append([i])
            width = row
    return batches


@torch.no_grad()
def policy_logprobs(model, adapter: str | None, prompts: list[list[int]],
                    completions: list[list[int]], micro_batch: int = 8, temperature: float = 1.0,
                    share_prompts: bool = True, max_tokens: int = 1 << 62) -> list[torch.Tensor]:
    """Per-row log-prob vectors (no grad) under `adapter`, in micro-batches: old and reference
    log-probs. One copy to the CPU per micro-batch (rows are right-aligned, so a row's last
    len(completion) entries are its own)."""
    out: list[torch.Tensor | None] = [None] * len(prompts)
    with use_adapter(model, adapter):
        for part in micro_batches(prompts, completions, micro_batch, max_tokens):
            logp, _, _ = completion_logprobs(model, [prompts[i] for i in part],
                                             [completions[i] for i in part], temperature,
                                             share_prompts=share_prompts)
            for i, row in zip(part, logp.cpu()):
                out[i] = row[len(row) - len(completions[i]):]
    return out  # type: ignore[return-value]


def logprob_drift(model, prompts: list[list[int]], completions: list[list[int]],
                  adapters: list[str | None], engine_logprobs: list[list[float]],
                  micro_batch: int = 8,
                  max_tokens: int = 1 << 62) -> dict[str | None, tuple[float, int]]:
    """Per adapter, (sum of |engine log-prob - trainer log-prob|, tokens) over the sampled tokens,
    each row under its adapter, both at temperature 1, in micro-batches within the update's token
    budget. Near 0 in fp32; bf16 kernels or a stale adapter make it grow, and the PPO ratio is then
    taken against a distribution nobody sampled from."""
    out = {}
    for adapter in sorted(set(adapters), key=str):
        rows = [i for i, a in enumerate(adapters) if a == adapter]
        trainer = policy_logprobs(model, adapter, [prompts[i] for i in rows],
                                  [completions[i] for i in rows], micro_batch,
                                  max_tokens=max_tokens)
        diffs = torch.cat([(t - torch.tensor(engine_logprobs[i], dtype=t.dtype)).abs()
                           for i, t in zip(rows, trainer)])
        out[adapter] = (diffs.sum().item(), len(diffs))
    return out

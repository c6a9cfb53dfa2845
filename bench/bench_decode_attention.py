"""What a decode step's attention reads: the static mode's K and V per step against the columns filled so far.

What it is for. The static mode (infra/decoding.py) decodes on a preallocated cache. As transformers runs it by
itself (a StaticCache and its SDPA path; compiled on CUDA, as also under transformers 5.17), every step hands SDPA
K and V repeated to every query head, over every column of the cache, filled or not. Ours (a FilledCache and
`attend_filled`) hands SDPA each KV head once, over the filled columns rounded up to a mask width (a block of
128 times 1, 2, 3, 4, 6, 8, ...: infra/decode_shapes.mask_width). This script decodes
the same rows both ways, greedily, records the K and V that every decode step's SDPA calls receive (a spy on
torch's SDPA: their shapes and bytes, summed over the layers), and prints them at a few filled lengths with the
attention's FLOPs, beside what each should be by hand. It checks that both ways decode the same tokens as the
dynamic mode.

What it is not: a timing. On the CPU it measures what the attention is given, which is what a GPU's memory
bandwidth pays for in a decode step; its time on a GPU is bench/gpu_check.py's decode check.

    python bench/bench_decode_attention.py                                  # tiny-qwen3 (seconds)
    python bench/bench_decode_attention.py --model random-qwen3-0.6b --prompt 1000 --new-tokens 300
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import policies  # noqa: E402
from infra import decoding  # noqa: E402
from infra.decode_shapes import CACHE_BLOCK, blocks, cache_columns, mask_width  # noqa: E402


class SDPASpy:
    """Within `with`: per decode step (an SDPA call whose query has one position, or its KV heads' query heads
    folded into the query length), the bytes of K and V handed to SDPA and its FLOPs, summed over the layers:
    {step: [bytes, flops, kv heads, columns]}. A step begins at each first layer's call."""

    def __init__(self, layers: int):
        self.layers, self.steps, self.calls = layers, [], 0

    def __enter__(self):
        self.real = torch.nn.functional.scaled_dot_product_attention

        def spy(query, key, value, *args, **kwargs):
            if self.calls % self.layers == 0:
                self.steps.append([0, 0, key.shape[1], key.shape[2]])
            self.calls += 1
            step = self.steps[-1]
            step[0] += key.numel() * key.element_size() + value.numel() * value.element_size()
            # QK^T and PV: 2 matmuls of 2 FLOPs a multiply-add over every query, column and dim
            step[1] += 4 * query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2] * key.shape[3]
            return self.real(query, key, value, *args, **kwargs)
        torch.nn.functional.scaled_dot_product_attention = spy
        return self

    def __exit__(self, *exc):
        torch.nn.functional.scaled_dot_product_attention = self.real


@contextlib.contextmanager
def transformers_static(model):
    """transformers' own static decode: a StaticCache of the call's columns (rounded up to a block) and its SDPA
    path as it runs compiled (transformers 5.24 folds GQA only outside a compile; 5.17 never): K and V repeated."""
    import transformers.integrations.sdpa_attention as sdpa
    real_cache, real_compiling = decoding.CacheStore.cache, sdpa.is_torchdynamo_compiling
    decoding.CacheStore.cache = lambda store, m, rows, tokens: decoding.StaticCache(
        config=m.config, max_cache_len=blocks(tokens))
    real_attention, decoding.attention = decoding.attention, lambda mode, m: contextlib.nullcontext()
    sdpa.is_torchdynamo_compiling = lambda: True
    try:
        yield
    finally:
        decoding.CacheStore.cache, sdpa.is_torchdynamo_compiling = real_cache, real_compiling
        decoding.attention = real_attention


def decode(model, tokenizer, prompts, new_tokens: int, mode: str, layers: int):
    """(completions, the SDPA spy's steps) of one greedy call of every row, without the shared prompt pass
    (generate() prefills the cache itself): the first step of the spy is the prefill, the rest decode steps."""
    engine = policies.HFEngine(model, tokenizer, new_tokens, 0, share_prompts=False, decode=mode)
    with SDPASpy(layers) as spy:
        out = engine.generate(prompts, ["x"] * len(prompts))
    return [g.completion_ids for g in out], spy.steps[1:]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-qwen3")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--prompt", type=int, default=100, help="prompt tokens a row")
    p.add_argument("--new-tokens", type=int, default=300)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    base, tokenizer = policies.load_model(args.model)
    model = policies.add_adapters(base, ["x"], rank=4, alpha=8)
    config = model.config.get_text_config(decoder=True)
    layers, heads, kv = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, min(1000, config.vocab_size), (args.prompt,), generator=g).tolist()
               for _ in range(args.rows)]
    # min_new_tokens: no row ends early, so every call runs the same steps
    model.generation_config.min_new_tokens = args.new_tokens
    dynamic, _ = decode(model, tokenizer, prompts, args.new_tokens, "dynamic", layers)
    ours, steps = decode(model, tokenizer, prompts, args.new_tokens, "static", layers)
    with transformers_static(model):
        theirs, their_steps = decode(model, tokenizer, prompts, args.new_tokens, "static", layers)
    cache = blocks(args.prompt + args.new_tokens)
    element = next(model.parameters()).element_size()
    print(f"{args.model}: {layers} layers, {heads} query heads, {kv} KV heads of {dim}; {args.rows} rows, prompt "
          f"{args.prompt} + {args.new_tokens} new tokens, a cache of {cache} columns, ours "
          f"{cache_columns(args.prompt + args.new_tokens)} (block {CACHE_BLOCK}); K and V handed to SDPA a decode "
          "step, summed over the layers:")
    print("filled | transformers' static: KiB, heads x columns, MFLOP | ours: KiB, heads x columns, MFLOP | "
          "ours by hand (KiB) | ratio")
    wrong = []
    for s in sorted({0, len(steps) // 3, 2 * len(steps) // 3, len(steps) - 1}):
        filled = args.prompt + s + 1  # the columns after this step's token is written
        by_hand = 2 * layers * args.rows * kv * mask_width(filled) * dim * element
        (b, f, h, c), (tb, tf, th, tc) = steps[s], their_steps[s]
        wrong += [] if (b, h, c) == (by_hand, kv, mask_width(filled)) and (th, tc) == (heads, cache) else [s]
        print(f"{filled:6d} | {tb / 1024:10,.0f}, {th} x {tc}, {tf / 1e6:8.2f} | {b / 1024:10,.0f}, {h} x {c}, "
              f"{f / 1e6:8.2f} | {by_hand / 1024:10,.0f} | {b / tb:.3f}")
    same = ours == dynamic == theirs
    print(f"greedy tokens: ours {'equal' if ours == dynamic else 'DIFFER from'} the dynamic mode's, transformers' "
          f"static {'equal' if theirs == dynamic else 'DIFFER from'} them; steps off the hand count: {wrong or 'none'}")
    if wrong or not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

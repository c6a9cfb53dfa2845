"""What the compiled decode step runs: its graph's dtype casts, matrix products and nodes, with the static mode's
slot adapter in the weights' dtype (now) and in fp32, as the trained adapters are (before).

What it is for. A decode step of a bf16 model with LoRA used to run PEFT's layers on the trained adapters' fp32
master weights under autocast (infra/models.compute_in_weights_dtype), so every LoRA weight was cast to bf16 at
every step: two casts a LoRA layer, 392 at Qwen3-0.6B's 28 layers x 7 projections. The slot adapter
(infra/decoding.slot_adapter) holds a bf16 copy, cast once a call. This script compiles the static decode step on
the CPU through AOT autograd (the graph Inductor lowers), once per slot dtype, and counts the graph's casts, matrix
products and nodes; with `--inductor`, the kernels Inductor generates too (a C++ compile: a minute). LoRA's two
products a projection stay apart: PEFT runs each LoRA layer on its own, with no way to stack the q, k and v
projections' A matrices into one product.

What it is not: a timing (a GPU's is bench/gpu_check.py's decode check).

    python bench/bench_decode_compile.py                 # tiny-qwen3, seconds
    python bench/bench_decode_compile.py --inductor      # and Inductor's kernels
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import policies  # noqa: E402
from infra import decoding  # noqa: E402

CASTS = ("convert_element_type", "_to_copy")
PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")


def graph_counter(graphs: list):
    """A dynamo backend that records each compiled forward graph's ops (after AOT autograd: aten and prims, as
    Inductor receives them) in `graphs` and runs the graph as it is."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def count(gm, inputs):
        graphs.append(collections.Counter(getattr(n.target, "_opname", str(n.target))
                                          for n in gm.graph.nodes if n.op == "call_function"))
        return make_boxed_func(gm.forward)
    return aot_autograd(fw_compiler=count)


def compiled_decode(model, tokenizer, prompts: list, new_tokens: int, slot_dtype: torch.dtype, backend) -> list:
    """Greedy completions of one static call whose decode step `backend` compiles (forced onto the CPU), the slot
    adapter held in `slot_dtype`."""
    decoding.slot_adapter(model, "x")
    for name, p in model.named_parameters():
        if f".{decoding.SLOT}." in name:
            p.data = p.data.to(slot_dtype)
    config = dataclasses.replace(decoding.COMPILE, backend=backend, fullgraph=True, mode=None)
    config._compile_all_devices = True
    real, decoding.COMPILE = decoding.COMPILE, config
    torch._dynamo.reset()
    try:
        engine = policies.HFEngine(model, tokenizer, new_tokens, 0, decode="static")
        return [g.completion_ids for g in engine.generate(prompts, ["x"] * len(prompts))]
    finally:
        decoding.COMPILE = real
        torch._dynamo.reset()


def inductor_kernels(model, tokenizer, prompts, new_tokens: int, slot_dtype: torch.dtype) -> int:
    """The kernels Inductor generates for the decode step."""
    from torch._inductor import metrics
    metrics.reset()
    compiled_decode(model, tokenizer, prompts, new_tokens, slot_dtype, "inductor")
    return metrics.generated_kernel_count


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-qwen3")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--inductor", action="store_true", help="also count Inductor's generated kernels")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    base, tokenizer = policies.load_model(args.model, dtype=torch.bfloat16)
    model = policies.add_adapters(base, ["x"], rank=4, alpha=8)  # fp32 master weights, bf16 products
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    lora_layers = sum(1 for name, _ in model.named_parameters() if "lora_A.x." in name)
    prompts = [[5 + (i * 3 + j) % 50 for j in range(10 + i)] for i in range(args.rows)]
    dynamic = [g.completion_ids for g in policies.HFEngine(model, tokenizer, args.new_tokens, 0).generate(
        prompts, ["x"] * len(prompts))]
    counts, completions = {}, {}
    for label, dtype in (("fp32 slot (before)", torch.float32), ("bf16 slot (now)", torch.bfloat16)):
        graphs = []
        completions[label] = compiled_decode(model, tokenizer, prompts, args.new_tokens, dtype, graph_counter(graphs))
        ops = sum(graphs, collections.Counter())
        counts[label] = [sum(ops[c] for c in CASTS), sum(ops[m] for m in PRODUCTS), sum(ops.values())]
        if args.inductor:
            counts[label].append(inductor_kernels(model, tokenizer, prompts, args.new_tokens, dtype))
    print(f"{args.model} in bf16, {layers} layers, {lora_layers} LoRA layers (rank 4); the compiled decode step:")
    print("slot adapter | casts | matrix products | nodes" + (" | Inductor kernels" if args.inductor else ""))
    for label, row in counts.items():
        print(f"{label} | " + " | ".join(str(n) for n in row))
    before, now = counts["fp32 slot (before)"], counts["bf16 slot (now)"]
    same = all(c == dynamic for c in completions.values())
    print(f"casts removed: {before[0] - now[0]} (2 a LoRA layer: {2 * lora_layers}); greedy tokens "
          f"{'equal' if same else 'DIFFER'} to the dynamic mode's")
    if before[0] - now[0] != 2 * lora_layers or not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""A paper cell's static decode rehearsed on the CPU: the CUDA graphs its 500 steps would record, the
growths of the K and V store it keeps, and that store beside the update's plan, on an H100 and an H200.

What it is for. On CUDA the HF engine's static decode (infra/decoding.py) records a CUDA graph for
each distinct (rows, cache columns, mask width) its compiled step meets, and keeps every one. This
counts them over a cell's steps without a model or a GPU: each step's calls come from a stated
model of the lengths (`draw_stages`), are cut into generate() calls by the engine's own functions
at the cell's token budget on the device (infra/memory.gpu_generation_budget), take their cache
from a CacheStore on torch's meta device (its choices, no memory), and walk their mask widths step
by step (`walk`). A graph is a distinct (rows, columns, width) at one address of the store: a store
that grows moves, and every shape records again. cudagraph trees record a shape at its second
step, so counting every shape met is an upper bound, by the shapes met once.

The lengths, a stated model (the cells' data is not on this machine): 64 problems x 8 samples a
step; a problem's prompt uniform in 150-600 tokens (math) or 300-2,500 (code); a completion at the
response limit with probability 0.3 (cut off), else uniform from a tenth of it to all of it; a
later role's prompt what it reads plus 150 tokens of instructions: the aggregator the problem and
3 solutions; Eval-Opt's evaluator and its refine the conversation so far, the evaluator satisfied
with probability 0.5; the orchestrator's strategies 3 (probability 0.7), 2 (0.2) or 1, a worker the
problem and its strategy, the synthesizer all of it. A prompt over the cell's limit ends its
episode (workflows.end_if_overlong). The lengths are drawn per workflow and task, the same for
every scale, policy and device.

The peak: the update's plan at the cell's micro-batch budget (infra/memory.plan_bytes, reserved,
with bench/bench_memory.py's layer figures), with the store kept through it and the graphs' memory
(their count x GRAPH_BYTES, an estimate), against the device's memory. The cost of the shapes: the
rows computed beyond those returned (padding), and the columns a step reads beyond those filled.

What it is not: a measurement. No kernel runs; the GPU check (bench/gpu_check.sh) measures the
graphs a run records and the kept store beside the update.

    python bench/decode_rehearsal.py                                  # 48 cells x 2 devices
    python bench/decode_rehearsal.py --cells Voting-IP-1.7B-Math --steps 50 --shapes
"""
from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import sys
import time
import types
from collections import Counter

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench_memory import HEAD_ROWS, PARAMS, QWEN3, footprints, lora_parameters  # noqa: E402 (bench/)

import policies  # noqa: E402
from infra import decoding, memory  # noqa: E402
from infra.cells import CELL_SCALES, CELL_TASKS, IP_ADAPTERS, cell_defaults  # noqa: E402
from infra.models import QWEN3_SHAPES  # noqa: E402

DEVICES = {"H100": 81_559 * 2 ** 20, "H200": 143_771 * 2 ** 20}  # the memory nvidia-smi reports
GRAPH_BYTES = 16 * 2 ** 20  # a graph's driver memory, 1-15 MB as read from torch's and vLLM's (an estimate)
PROBLEM_TOKENS = {"math": (150, 600), "code": (300, 2500)}
INSTRUCTIONS = 150   # a later role's instructions, tokens
CUT_OFF = 0.3        # completions at the response limit
SATISFIED = 0.5      # Eval-Opt: the evaluator's verdict is Correct
STRATEGIES = ((3, 2, 1), (0.7, 0.2, 0.1))  # Orch-Workers: strategies (workers) an episode, and how often
WORKFLOWS = ["Single", "Voting", "EvalOpt", "OrchWorkers"]


def draw_stages(workflow: str, kind: str, limit: int, new: int, rng: random.Random,
                problems: int = 64, samples: int = 8) -> list[list[tuple[str, int, int]]]:
    """One step's calls, stage by stage: (role, prompt tokens, completion tokens) each, drawn by the
    module's model of the lengths; `limit` the cell's prompt limit, `new` its response limit."""
    def completion() -> int:
        return new if rng.random() < CUT_OFF else rng.randint(new // 10, new)
    prompts = [p for p in (rng.randint(*PROBLEM_TOKENS[kind]) for _ in range(problems))
               for _ in range(samples)]
    if workflow == "single":
        return [[("generator", p, completion()) for p in prompts]]
    if workflow == "voting":
        solutions = [[completion() for _ in range(3)] for _ in prompts]
        reads = [p + sum(s) + INSTRUCTIONS for p, s in zip(prompts, solutions)]
        return [[("generator", p, c) for p, s in zip(prompts, solutions) for c in s],
                [("aggregator", r, completion()) for r in reads if r <= limit]]
    if workflow == "evalopt":
        return evalopt_stages(prompts, completion, limit, rng, 2 if kind == "code" else 3)
    orchestrators = [(p, completion(), rng.choices(*STRATEGIES)[0]) for p in prompts]
    workers = [(p, o, [completion() for _ in range(k)]) for p, o, k in orchestrators
               if p + o // k + INSTRUCTIONS <= limit]
    synthesizers = [p + o + sum(w) + INSTRUCTIONS for p, o, w in workers]
    return [[("orchestrator", p + INSTRUCTIONS, o) for p, o, _ in orchestrators],
            [("worker", p + o // len(w) + INSTRUCTIONS, c) for p, o, w in workers for c in w],
            [("synthesizer", s, completion()) for s in synthesizers if s <= limit]]


def evalopt_stages(prompts: list[int], completion, limit: int, rng: random.Random,
                   iterations: int) -> list[list[tuple[str, int, int]]]:
    """Eval-Opt's stages: an attempt (the problem, then the conversation and instructions), its
    evaluation (the conversation and instructions), until the evaluator is satisfied or
    `iterations` evaluations; the conversation grows by each completion."""
    stages, running = [], [(p, p) for p in prompts]  # (the next attempt's prompt, the conversation)
    for _ in range(iterations):
        attempts = [(talk, prompt, completion()) for prompt, talk in running if prompt <= limit]
        stages.append([("generator", prompt, c) for _, prompt, c in attempts])
        judged = [(talk + c + INSTRUCTIONS, completion()) for talk, _, c in attempts]
        judged = [(prompt, c) for prompt, c in judged if prompt <= limit]
        stages.append([("evaluator", prompt, c) for prompt, c in judged])
        running = [(prompt + c + INSTRUCTIONS, prompt + c) for prompt, c in judged
                   if rng.random() >= SATISFIED]
    return [s for s in stages if s]


def engine_calls(prompts: list[int], budget: memory.GenerationBudget,
                 new_tokens: int) -> list[tuple[list[int], int]]:
    """The HF engine's static calls of one adapter's rows, as HFEngine.generate cuts them: the
    indices of each call's rows and the rows it computes. A prompt stands in as that many zero bytes:
    the cut reads only its length and orders rows by it."""
    stand_ins = [bytes(n) for n in prompts]
    counted = [bytes(new_tokens + budget.sampling_tokens + decoding.SPARE_COLUMNS)] * len(prompts)
    cut = policies.micro_batches(stand_ins, counted, budget.batch_size, budget.max_tokens)
    return [(rows, max(2, len(rows))) for rows in cut]  # a lone row beside a copy of itself


def walk(prompt: int, steps: int, columns: int) -> list[tuple[int, int, int]]:
    """The mask widths a call's compiled steps take, each as (width, the first and the last filled
    count at it): after the prefill (its first token, not compiled), the step that writes token t
    attends `prompt` + t columns, t = 1 .. `steps` - 1."""
    out, filled, last = [], prompt + 1, prompt + steps - 1
    while filled <= last:
        width = min(columns, decoding.blocks(filled))
        out.append((width, filled, min(width, last)))
        filled = width + 1
    return out


def meta_model(config):
    """What a CacheStore reads of a model, on torch's meta device: its config and a bf16 parameter."""
    weight = torch.empty(0, dtype=torch.bfloat16, device="meta")
    return types.SimpleNamespace(config=config, parameters=lambda: iter([weight]))


def rehearse(cell: str, device: str, steps: int, seed: int = 0) -> dict:
    """A cell's `steps` on `device`: its graphs (shapes), the store's growths and peak, its calls and
    rows, and the columns its steps read against those filled."""
    c = cell_defaults(cell)
    kind, scale = "code" if c["task"] == "deepcoder" else "math", cell.split("-")[2]
    config = transformers.Qwen3Config(**QWEN3_SHAPES[f"random-qwen3-{scale.lower()}"])
    adapters = IP_ADAPTERS[c["workflow"]] if c["policy"] == "ip" else 1
    layers, shape = QWEN3[scale]
    free = DEVICES[device] - 2 * PARAMS[scale] - 4 * lora_parameters(layers, shape) * adapters - memory.SLACK
    budget = memory.gpu_generation_budget(config, 2, True, free, keep=True)
    store, model, new = decoding.CacheStore(), meta_model(config), c["max_new_tokens"]
    rng = random.Random(f"{c['workflow']}-{kind}-{seed}")
    shapes, tally, moved, buffer = set(), Counter(), -1, None
    for _ in range(steps):
        for stage in draw_stages(c["workflow"], kind, c["max_prompt_tokens"], new, rng):
            routes = {role: policies.route_adapter(role, c["policy"]) for role in {s[0] for s in stage}}
            names = [routes[role] for role, _, _ in stage]
            for group in decoding.call_groups(names, "static"):
                for rows, computed in engine_calls([stage[i][1] for i in group], budget, new):
                    widest = max(stage[group[i]][1] for i in rows)
                    longest = max(stage[group[i]][2] for i in rows)
                    cache = store.cache(model, computed, widest + new)
                    moved, buffer = (moved, buffer) if store.buffers[0][0] is buffer else (
                        moved + 1, store.buffers[0][0])
                    columns = cache.layers[0].max_cache_len
                    for width, first, last in walk(widest, longest, columns):
                        shapes.add((moved, computed, columns, width))
                        tally["read"] += len(rows) * width * (last - first + 1)
                        tally["filled"] += len(rows) * (first + last) * (last - first + 1) // 2
                    tally["calls"] += 1
                    tally["rows"] += len(rows)
                    tally["padding"] += (computed - len(rows)) * (longest - 1)
                    tally["row_steps"] += len(rows) * (longest - 1)
    store_bytes = 2 * layers * buffer.numel() * 2
    roles = 1 if c["policy"] == "ip" else IP_ADAPTERS[c["workflow"]]
    plan = memory.plan_bytes(footprint(scale), adapters, roles,
                             c["max_tokens_per_micro_batch"], c["max_prompt_tokens"] + new,
                             kept=store_bytes)["reserved"]
    return dict(cell=cell, device=device, tokens=budget.max_tokens, shapes=shapes, growths=moved,
                calls=tally["calls"] / steps, rows=tally["rows"] / tally["calls"],
                padding=tally["padding"] / tally["row_steps"], read=tally["read"] / tally["filled"] - 1,
                store=store_bytes,
                graphs_bytes=len(shapes) * GRAPH_BYTES, peak=plan + len(shapes) * GRAPH_BYTES,
                memory=DEVICES[device])


@functools.cache
def footprint(scale: str) -> memory.Footprint:
    """What the update's plan needs of a Qwen3 scale (bench/bench_memory.py's figures)."""
    return footprints(HEAD_ROWS, measure=False)[scale]


def cells(names: list[str] | None) -> list[str]:
    """The cells asked for, else the 48 of the grid, workflow by workflow."""
    return names or [f"{w}-{p}-{s}-{t}" for w, s, t, p in itertools.product(
        WORKFLOWS, CELL_SCALES, CELL_TASKS, ["SP", "IP"])]


def table(results: list[dict]) -> str:
    """The rehearsal's table, as bench/README.md quotes it."""
    gib = 2 ** 30
    lines = ["| cell | device | budget (tokens) | calls a step | rows a call | graphs | store growths | "
             "store GiB | graphs GiB | peak GiB (update, store, graphs) / device | padding rows | columns read "
             "beyond filled |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        over = "" if r["peak"] <= 0.9 * r["memory"] else " OVER"
        lines.append(f"| {r['cell']} | {r['device']} | {r['tokens']:,} | {r['calls']:.1f} | {r['rows']:.1f} | "
                     f"{len(r['shapes'])} | {r['growths']} | {r['store'] / gib:.1f} | "
                     f"{r['graphs_bytes'] / gib:.2f} | {r['peak'] / gib:.1f} / {r['memory'] / gib:.1f}{over} | "
                     f"{100 * r['padding']:.1f}% | {100 * r['read']:.1f}% |")
    return "\n".join(lines)


def shapes_text(shapes: set) -> str:
    """A cell's shapes, by cache columns: the rows and widths met at each."""
    by_columns: dict[int, tuple[set, set]] = {}
    for _, rows, columns, width in shapes:
        seen = by_columns.setdefault(columns, (set(), set()))
        seen[0].add(rows)
        seen[1].add(width)
    return "\n".join(f"  columns {c}: rows {sorted(r)}, widths {sorted(w)}"
                     for c, (r, w) in sorted(by_columns.items()))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", nargs="*", help="cells (Workflow-Policy-Scale-Task); default: all 48")
    p.add_argument("--devices", nargs="*", default=list(DEVICES), choices=list(DEVICES))
    p.add_argument("--steps", type=int, default=500, help="training steps a cell (the paper's 500)")
    p.add_argument("--shapes", action="store_true", help="each cell's shapes, by cache columns")
    args = p.parse_args(argv)
    start, results = time.perf_counter(), []
    for cell, device in itertools.product(cells(args.cells), args.devices):
        results.append(rehearse(cell, device, args.steps))
        if args.shapes:
            print(f"{cell} on {device}:\n{shapes_text(results[-1]['shapes'])}")
    print(table(results))
    worst = max(results, key=lambda r: len(r["shapes"]))
    print(f"{len(results)} cell(s) x device(s), {args.steps} steps each, in {time.perf_counter() - start:.0f} s; "
          f"most graphs: {len(worst['shapes'])} ({worst['cell']} on {worst['device']})")


if __name__ == "__main__":
    main()

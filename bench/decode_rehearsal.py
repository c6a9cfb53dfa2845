"""A paper cell's static decode rehearsed on the CPU: the CUDA graphs its 500 steps would record,
the growths of the K and V store it keeps, and that store beside the update's plan, on an H100 and
an H200.

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
(their count x decoding.GRAPH_BYTES, an estimate), against the device's memory. The cost of the
shapes: the rows computed beyond those returned (padding), and the columns a step reads beyond
those filled.

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
import sys
import time
import types
from collections import Counter

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench_memory import HEAD_ROWS, PARAMS, QWEN3, footprints, lora_parameters  # noqa: E402 (bench/)

from infra import decode_shapes, decoding, memory  # noqa: E402
from infra.cells import CELL_SCALES, CELL_TASKS, cell_defaults  # noqa: E402
from infra.decode_shapes import mask_width  # noqa: E402
from infra.models import QWEN3_SHAPES  # noqa: E402
from workflows import ROLES  # noqa: E402 (an IP cell's adapters: its workflow's role types)

DEVICES = {"H100": 81_559 * 2 ** 20, "H200": 143_771 * 2 ** 20}  # the memory nvidia-smi reports
PROBLEM_TOKENS = {"math": (150, 600), "code": (300, 2500)}
INSTRUCTIONS = 150   # a later role's instructions, tokens
CUT_OFF = 0.3        # completions at the response limit
SATISFIED = 0.5      # Eval-Opt: the evaluator's verdict is Correct
STRATEGIES = ((3, 2, 1), (0.7, 0.2, 0.1))  # Orch-Workers: strategies (workers), and how often
WORKFLOWS = ["Single", "Voting", "EvalOpt", "OrchWorkers"]


def draw_stages(workflow: str, kind: str, limit: int, new: int, iterations: int,
                rng: np.random.Generator, problems: int = 64,
                samples: int = 8) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """One step's calls, stage by stage, by the module's model of the lengths: (role, its calls'
    prompt tokens, their completion tokens); `limit` the cell's prompt limit, `new` its response
    limit, `iterations` Eval-Opt's rounds (the cell's --max-iterations). Every stage is one role's:
    one adapter's, under SP as under IP."""
    def completions(n: int) -> np.ndarray:
        drawn = rng.integers(new // 10, new, size=n, endpoint=True)
        return np.where(rng.random(n) < CUT_OFF, new, drawn)
    prompts = np.repeat(rng.integers(*PROBLEM_TOKENS[kind], size=problems, endpoint=True), samples)
    if workflow == "single":
        return [("generator", prompts, completions(len(prompts)))]
    if workflow == "voting":
        solutions = completions(3 * len(prompts)).reshape(-1, 3)
        reads = prompts + solutions.sum(1) + INSTRUCTIONS
        reads = reads[reads <= limit]
        return [("generator", np.repeat(prompts, 3), solutions.ravel()),
                ("aggregator", reads, completions(len(reads)))]
    if workflow == "evalopt":
        return evalopt_stages(prompts, completions, limit, rng, iterations)
    plans = completions(len(prompts))
    strategies = rng.choice(STRATEGIES[0], size=len(prompts), p=STRATEGIES[1])
    keep = prompts + plans // strategies + INSTRUCTIONS <= limit  # each worker's prompt fits
    workers = np.repeat(prompts[keep] + plans[keep] // strategies[keep] + INSTRUCTIONS,
                        strategies[keep])
    solutions = completions(len(workers))
    episode = np.repeat(np.arange(keep.sum()), strategies[keep])
    reads = prompts[keep] + plans[keep] + INSTRUCTIONS + np.bincount(
        episode, weights=solutions, minlength=keep.sum()).astype(int)
    reads = reads[reads <= limit]
    return [("orchestrator", prompts + INSTRUCTIONS, plans), ("worker", workers, solutions),
            ("synthesizer", reads, completions(len(reads)))]


def evalopt_stages(prompts: np.ndarray, completions, limit: int, rng: np.random.Generator,
                   iterations: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Eval-Opt's stages: an attempt (the problem, later the conversation and instructions), then
    its evaluation (the conversation and instructions), until the evaluator is satisfied or after
    `iterations` evaluations; the conversation grows by each completion."""
    stages, attempt, talk = [], prompts, prompts  # each running episode's next prompt, conversation
    for _ in range(iterations):
        attempt, talk = attempt[attempt <= limit], talk[attempt <= limit]
        solutions = completions(len(attempt))
        stages.append(("generator", attempt, solutions))
        talk = talk + solutions
        keep = talk + INSTRUCTIONS <= limit
        talk = talk[keep]
        verdicts = completions(len(talk))
        stages.append(("evaluator", talk + INSTRUCTIONS, verdicts))
        again = rng.random(len(talk)) >= SATISFIED
        talk = (talk + verdicts)[again]
        attempt = talk + INSTRUCTIONS
    return [s for s in stages if len(s[1])]


def walk(prompt: int, steps: int, columns: int) -> list[tuple[int, int, int]]:
    """The mask widths a call's compiled steps take (decoding.FilledCache's: `mask_width` of the
    columns filled, within the cache's), each as (width, the first and the last filled count at
    it): after the prefill (its first token, not compiled), the step that writes token t attends
    `prompt` + t columns, t = 1 .. `steps` - 1."""
    out, filled, last = [], prompt + 1, prompt + steps - 1
    while filled <= last:
        width = min(columns, mask_width(filled))
        out.append((width, filled, min(width, last)))
        filled = width + 1
    return out


def meta_model(shape: dict):
    """What a CacheStore reads of a model of `shape` (infra/models.QWEN3_SHAPES): its config, with
    one layer (the store makes the same choice for every layer: one stands for them all), and a
    bf16 parameter that says it is on a GPU (the store then takes its whole budget) and puts the
    store on torch's meta device (no memory)."""
    weight = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device=torch.device("meta"))
    config = transformers.Qwen3Config(**{**shape, "num_hidden_layers": 1})
    return types.SimpleNamespace(config=config, parameters=lambda: iter([weight]))


def device_budget(scale: str, device: str, adapters: int) -> memory.GenerationBudget:
    """The static decode's token budget for a Qwen3 scale with `adapters` on `device`, as the HF
    engine takes it at its build (infra/memory.gpu_generation_budget): the memory then free is the
    device's less the bf16 weights, the fp32 adapters and memory.SLACK."""
    config = transformers.Qwen3Config(**QWEN3_SHAPES[f"random-qwen3-{scale.lower()}"])
    lora = lora_parameters(*QWEN3[scale])
    free = DEVICES[device] - 2 * PARAMS[scale] - 4 * lora * adapters - memory.SLACK
    return memory.gpu_generation_budget(config, 2, True, free, keep=True)


def rehearse(cell: str, device: str, steps: int, seed: int = 0) -> dict:
    """A cell's `steps` on `device`: its graphs (shapes), the store's growths and size, its calls
    and rows, the padding rows and the columns its steps read beyond those filled, and the peak
    beside the update (`peak_bytes`)."""
    c = cell_defaults(cell)
    kind, scale, new = "code" if c["task"] == "deepcoder" else "math", cell.split("-")[2], \
        c["max_new_tokens"]
    adapters = len(ROLES[c["workflow"]]) if c["policy"] == "ip" else 1
    budget = device_budget(scale, device, adapters)
    shape = QWEN3_SHAPES[f"random-qwen3-{scale.lower()}"]
    store, model = decoding.CacheStore(budget.max_tokens), meta_model(shape)
    workflow = ["evalopt", "orchworkers", "single", "voting"].index(c["workflow"])  # the lengths' seed
    rng = np.random.default_rng([workflow, kind == "code", seed])
    shapes, tally, moved, buffer = set(), Counter(), -1, None
    for _ in range(steps):
        for _, prompts, done in draw_stages(c["workflow"], kind, c["max_prompt_tokens"], new,
                                             c["max_iterations"], rng):
            order = np.argsort(prompts, kind="stable")  # by length, as decode_shapes.static_calls
            widths, done = prompts[order], done[order]
            calls = decode_shapes.cut_calls(widths.tolist(), new, budget.sampling_tokens,
                                            budget.batch_size, budget.max_tokens)
            longest = np.maximum.reduceat(done, [start for start, *_ in calls]).tolist()
            for (start, stop, rows, columns), steps_taken in zip(calls, longest):
                widest, real = int(widths[stop - 1]), stop - start
                cache = store.cache(model, rows, widest + new)
                if store.buffers[0][0] is not buffer:  # (re)allocated: new addresses
                    moved, buffer = moved + 1, store.buffers[0][0]
                assert cache.layers[0].max_cache_len == columns  # the cut's columns are the store's
                for width, first, last in walk(widest, steps_taken, columns):
                    shapes.add((moved, rows, columns, width))
                    tally["read"] += real * width * (last - first + 1)
                    tally["filled"] += real * (first + last) * (last - first + 1) // 2
                tally.update(calls=1, rows=real, padding=(rows - real) * (steps_taken - 1),
                             row_steps=real * (steps_taken - 1))
    store_bytes = 2 * shape["num_hidden_layers"] * buffer.numel() * 2  # K and V, bf16
    return dict(cell=cell, device=device, tokens=budget.max_tokens, shapes=shapes,
                graphs=len(shapes), growths=moved, calls=tally["calls"] / steps,
                rows=tally["rows"] / tally["calls"], padding=tally["padding"] / tally["row_steps"],
                read=tally["read"] / tally["filled"] - 1, store_gib=store_bytes / 2 ** 30,
                peak=peak_bytes(c, scale, adapters, store_bytes, len(shapes)),
                memory=DEVICES[device])


def peak_bytes(c: dict, scale: str, adapters: int, store: int, graphs: int) -> float:
    """The update's reserved peak at the cell's micro-batch budget (infra/memory.plan_bytes; SP's
    per-role snapshots), with the K and V `store` kept through it, and `graphs` CUDA graphs'
    memory (decoding.GRAPH_BYTES each, an estimate)."""
    roles = 1 if c["policy"] == "ip" else len(ROLES[c["workflow"]])
    plan = memory.plan_bytes(footprint(scale), adapters, roles, c["max_tokens_per_micro_batch"],
                             c["max_prompt_tokens"] + c["max_new_tokens"], kept=store)
    return plan["reserved"] + graphs * decoding.GRAPH_BYTES


@functools.cache
def footprint(scale: str) -> memory.Footprint:
    """What the update's plan needs of a Qwen3 scale (bench/bench_memory.py's figures)."""
    return footprints(HEAD_ROWS, measure=False)[scale]


def cells(names: list[str] | None) -> list[str]:
    """The cells asked for, else the 48 of the grid, workflow by workflow."""
    return names or [f"{w}-{p}-{s}-{t}" for w, s, t, p in itertools.product(
        WORKFLOWS, CELL_SCALES, CELL_TASKS, ["SP", "IP"])]


def table(results: list[dict]) -> str:
    """The rehearsal's table, as bench/README.md quotes it: a row a cell, each figure on every
    device rehearsed (H100 / H200); a peak past 90% of its device (the plan's target,
    bench/bench_memory.py) marked `over`."""
    cells: dict[str, list[dict]] = {}
    for r in results:
        cells.setdefault(r["cell"], []).append(r)
    devices = " / ".join(r["device"] for r in next(iter(cells.values())))
    lines = [f"| cell | {devices}: budget (tokens) | calls a step | rows a call | graphs | "
             "store growths | kept store GiB | peak GiB (update, store, graphs) of the device's | "
             "padding rows | columns read beyond filled |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cell, rows in cells.items():
        figures = [" / ".join(format(r[key], spec) for r in rows) for key, spec in FIGURES]
        peaks = " / ".join(f"{r['peak'] / 2 ** 30:.1f} of {r['memory'] / 2 ** 30:.1f}" +
                           (" over" if r["peak"] > 0.9 * r["memory"] else "") for r in rows)
        lines.append(f"| {cell} | " + " | ".join(figures[:6] + [peaks] + figures[6:]) + " |")
    return "\n".join(lines)


# the table's figures but the peak, as (a result's key, its format)
FIGURES = [("tokens", ","), ("calls", ".1f"), ("rows", ".1f"), ("graphs", "d"), ("growths", "d"),
           ("store_gib", ".1f"), ("padding", ".1%"), ("read", ".1%")]


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
    worst = max(results, key=lambda r: r["graphs"])
    seconds = time.perf_counter() - start
    print(f"{len(results)} cell(s) x device(s), {args.steps} steps each, in {seconds:.0f} s; most "
          f"graphs: {worst['graphs']} ({worst['cell']} on {worst['device']}; decoding.GRAPH_LIMIT "
          f"{decoding.GRAPH_LIMIT})")


if __name__ == "__main__":
    main()

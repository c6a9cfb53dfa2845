"""What a cell costs on one GPU: the GPU check's measurements at a Qwen3 shape, and hours a step and a 500-step cell.

What it is for: the cost check of bench/gpu_check.py at each `random-qwen3` shape (0.6B, 1.7B, 4B, built on the
GPU): the update's tokens/s at a cell's token budget with the 4B math cell's widest training row (2 rows of
25,599 tokens in 51,200), the decode step's time at the start and at the end of a long generation (a call of the
rows the HF budget fits at the end's width), and the update's peaks against the plan (infra/memory.plan_bytes),
beside the decode's K and V store, which a run keeps through its update: nothing freed between them.
From those, `cost_rows` extrapolates a Voting math cell's step (64 problems x 8 samples: 1,536 generator rows,
then 512 aggregator rows, every response at its 5,120-token limit: an upper bound) for

  - the HF engine, as measured: each stage in calls of the rows the budget fits, each call 5,120 decode steps of
    a + b x rows x context seconds (a line through the two measured steps: a the weights' and the host's share,
    b the KV cache read per token of context), then the update at its measured tokens/s;
  - vLLM, estimated: its decode at the H200's memory bandwidth (4.8 TB/s, NVIDIA's H200 datasheet): each decode
    step reads the weights once and each row's KV cache, so its time is a floor any engine pays (vLLM's own
    overheads unmeasured here), with its KV pool at the cells' --vllm-gpu-memory 0.4 of 141 GB less the weights;
    the update as measured (vLLM only samples).

What it is not: a measured step. A paper-length step is not run: one 64-row call at 5,120 tokens alone takes
minutes. The random shapes' sampled tokens decode to empty text in the byte tokenizer, so the aggregator's prompt
length is set directly (3 solutions at the limit and its instructions).

    python3 bench/gpu_check.py --only cost-1.7b      # on the GPU machine
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

H200_HBM_BYTES_S = 4.8e12   # NVIDIA H200 datasheet: HBM3e, 4.8 TB/s
H200_BYTES = 141e9          # NVIDIA H200 datasheet: 141 GB
VLLM_FRACTION = 0.4         # the cells' --vllm-gpu-memory (infra/cells.PAPER_HYPERPARAMETERS)
CELL_STEPS = 500            # a cell's training steps (infra/cells.PAPER_HYPERPARAMETERS)
NEW_TOKENS = 5120           # math's response limit (infra/cells.PAPER_LENGTHS)
GENERATOR_PROMPT = 512      # a math problem in the rLLM template, rounded up
AGGREGATOR_PROMPT = 3 * NEW_TOKENS + 512  # 3 solutions at the limit and the aggregator's instructions
SHAPES = {"0.6B": "random-qwen3-0.6b", "1.7B": "random-qwen3-1.7b", "4B": "random-qwen3-4b"}
# the cost check's decode: at most this many rows a call (the fit is linear in rows x context, so a row count
# that fits the lease extrapolates), each pair of calls (--small, GPU) new tokens apart, the fastest of repeats
DECODE_ROWS_CAP = 64
DECODE_STEPS = ((2, 10), (8, 24))
DECODE_REPEATS = (3, 2)  # --small (a noisy CPU), GPU


@dataclass
class Stage:
    """One workflow stage of a training step: `rows` calls of `prompt` tokens, each answered in `new` tokens."""
    rows: int
    prompt: int
    new: int


def voting_math_stages(problems: int = 64, samples: int = 8) -> list[Stage]:
    """A Voting math step: 3 generators per episode, then one aggregator reading their 3 solutions."""
    return [Stage(3 * problems * samples, GENERATOR_PROMPT, NEW_TOKENS),
            Stage(problems * samples, AGGREGATOR_PROMPT, NEW_TOKENS)]


def decode_line(rows: int, context: tuple[int, int], seconds: tuple[float, float]) -> tuple[float, float]:
    """(a, b) of a decode step's time a + b x rows x context through two steps measured at one call's `rows`,
    at contexts context[0] < context[1]: b the time per cached token read, a the rest (weights, host). A pair
    whose end step is the faster (noise where the cache costs nothing yet) reads as no growth: b = 0."""
    b = max(0.0, (seconds[1] - seconds[0]) / (rows * (context[1] - context[0])))
    return seconds[0] - b * rows * context[0], b


def call_rows(budget_tokens: int, sampling_tokens: int, stage: Stage, mode: str = "dynamic") -> int:
    """Rows of `stage` one HF generate() call holds (infra/memory.GenerationBudget): its tokens over each row's
    columns and sampling buffers, a row's columns its prompt and new tokens (static: its cache's,
    infra/decode_shapes.cache_columns, as the engine counts them)."""
    from infra.decode_shapes import cache_columns
    columns = stage.prompt + stage.new
    return max(1, budget_tokens // ((cache_columns(columns) if mode == "static" else columns) + sampling_tokens))


def read_columns(prompt: int, steps: range, mode: str) -> float:
    """The mean columns a decode step's attention reads over `steps` (the step after s new tokens has prompt + s
    filled): dynamic the filled ones, the mean at the middle step; static the filled ones rounded up to a mask
    width (infra/decode_shapes.mask_width: 128 x 1, 2, 3, 4, 6, 8, ...), averaged step by step. Example: prompt
    512, steps 0..5,119: dynamic 512 + 5,120 / 2 = 3,072; static 3,724.8 (513-768 filled read 768, ..., 4,097-5,632
    read 6,144)."""
    if mode == "dynamic":
        return prompt + (steps.start + steps.stop) / 2
    from infra.decode_shapes import mask_width
    return sum(mask_width(prompt + s + 1) for s in steps) / len(steps)


def hf_stage_seconds(stage: Stage, rows_per_call: int, a: float, b: float, mode: str = "dynamic") -> float:
    """A stage in calls of `rows_per_call` rows (the last one partial), each `stage.new` decode steps at the
    line's time, a step's context the columns its attention reads (`read_columns` in the decode `mode`)."""
    full, rest = divmod(stage.rows, rows_per_call)
    mean_context = read_columns(stage.prompt, range(stage.new), mode)
    seconds = full * stage.new * (a + b * rows_per_call * mean_context)
    return seconds + (stage.new * (a + b * rest * mean_context) if rest else 0.0)


def roofline_stage_seconds(stage: Stage, weight_bytes: float, kv_token_bytes: float) -> float:
    """A stage at the memory bandwidth (the vLLM estimate): calls of the rows its KV pool holds, each decode
    step reading the weights once and every row's cache so far."""
    pool = VLLM_FRACTION * H200_BYTES - weight_bytes
    rows_per_call = max(1, int(pool // ((stage.prompt + stage.new) * kv_token_bytes)))
    calls = math.ceil(stage.rows / rows_per_call)
    cache_reads = stage.rows * stage.new * (stage.prompt + stage.new / 2) * kv_token_bytes
    return (calls * stage.new * weight_bytes + cache_reads) / H200_HBM_BYTES_S


def update_tokens(stages: list[Stage]) -> int:
    """Tokens the update runs over: every row's prompt and completion (the old-log-prob pass is in the measured
    rate: the memory and cost checks time whole updates)."""
    return sum(s.rows * (s.prompt + s.new) for s in stages)


def cost_rows(measured: dict[str, dict], stages: list[Stage] | None = None) -> list[dict]:
    """Per measured shape: hours of a step's rollout and update, a step and a 500-step cell, HF as measured and
    vLLM estimated. `measured[scale]` holds update_tok_s, decode_rows, decode_context (start, end),
    decode_step_s (start, end), budget_tokens, sampling_tokens, weight_bytes, kv_token_bytes, and where measured
    decode_mode and decode_read (the columns the measured steps read: `read_columns`)."""
    stages = stages or voting_math_stages()
    out = []
    for scale, m in measured.items():
        if "update_tok_s" not in m:  # a check cut short after its decode: no row yet
            continue
        mode = m.get("decode_mode", "dynamic")
        a, b = decode_line(m["decode_rows"], m.get("decode_read", m["decode_context"]), m["decode_step_s"])
        hf = sum(hf_stage_seconds(s, call_rows(m["budget_tokens"], m["sampling_tokens"], s, mode), a, b, mode)
                 for s in stages)
        vllm = sum(roofline_stage_seconds(s, m["weight_bytes"], m["kv_token_bytes"]) for s in stages)
        update = update_tokens(stages) / m["update_tok_s"]
        out.append(dict(scale=scale, hf_rollout_h=hf / 3600, vllm_rollout_h=vllm / 3600, update_h=update / 3600,
                        hf_step_h=(hf + update) / 3600, vllm_step_h=(vllm + update) / 3600,
                        hf_cell_h=CELL_STEPS * (hf + update) / 3600, vllm_cell_h=CELL_STEPS * (vllm + update) / 3600))
    return out


def cost_table(rows: list[dict]) -> str:
    """The cost rows as the markdown table bench/README.md and docs/cells.md quote."""
    lines = ["| shape | rollout HF (h) | rollout vLLM est. (h) | update (h) | step HF (h) | step vLLM est. (h) | "
             f"{CELL_STEPS} steps HF (h) | {CELL_STEPS} steps vLLM est. (h) |", "|---|" + "---:|" * 7]
    for r in rows:
        lines.append(f"| {r['scale']} | " + " | ".join(f"{r[k]:.2f}" for k in (
            "hf_rollout_h", "vllm_rollout_h", "update_h", "hf_step_h", "vllm_step_h", "hf_cell_h", "vllm_cell_h"))
            + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the measurement (GPU; --small on the CPU)

def decode_step_seconds(engine, prompt: list[int], rows: int, steps: tuple[int, int],
                        repeats: int = 3) -> float:
    """One decode step's time for `rows` rows of `prompt`: two calls of steps[0] and steps[1] new tokens, the
    difference over the extra steps, so the (shared, one-row) prefill and the call's setup cancel. Each call's
    time is the fastest of `repeats`: a difference of two noisy times can come out negative (the CPU rehearsal,
    beside another job, once read -18.6 ms a step)."""
    import torch
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for new in steps:
        engine.max_new_tokens = new
        engine.sampling["min_new_tokens"] = new  # every row runs every step (no early EOS)
        fastest = math.inf
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            engine.generate([prompt] * rows, ["generator"] * rows)
            sync()
            fastest = min(fastest, time.perf_counter() - start)
        times.append(fastest)
    return (times[1] - times[0]) / (steps[1] - steps[0])


def measure_decode(lm, tokenizer, small: bool) -> tuple[dict, object]:
    """The decode step at the start (a generator's prompt) and at the end (that prompt + the response limit) of a
    long generation, for the rows the HF budget of a run's engine fits at the end's width (the static decode's,
    its store kept through the update), at most DECODE_ROWS_CAP (the cost is linear in rows x context:
    `decode_line`); a warm-up call first (static mode on CUDA: the compile, then a CUDA graph per shape), whose
    compile statistics are kept (infra/decoding.compile_stats). Returns the figures and the engine, whose K and V
    store (on a GPU its whole budget) the update then runs beside."""
    import policies
    from infra import decoding, memory
    start, end = (16, 80) if small else (GENERATOR_PROMPT, GENERATOR_PROMPT + NEW_TOKENS)
    steps = DECODE_STEPS[not small]
    mode = decoding.decode_mode("auto", lm, quiet=True)  # the engine's, as policies.make_engine
    budget = memory.hf_generation_budget(lm, 0, keep=mode == "static")
    fits = call_rows(budget.max_tokens, budget.sampling_tokens, Stage(0, end, steps[1]), mode)
    rows = 8 if small else min(fits, DECODE_ROWS_CAP)
    budget.batch_size = rows
    engine = policies.HFEngine(lm, tokenizer, steps[0], 0.7, **vars(budget))
    vocab = min(1000, lm.config.vocab_size)
    prompt = [(7 * i) % vocab for i in range(end)]
    for n in (start, end):  # warm-up: kernels, the allocator's blocks, and (static mode) the compile
        decode_step_seconds(engine, prompt[:n], rows, (1, 2), repeats=1)
    repeats = DECODE_REPEATS[not small]
    seconds = tuple(decode_step_seconds(engine, prompt[:n], rows, steps, repeats) for n in (start, end))
    read = tuple(read_columns(n, range(*steps), engine.decode) for n in (start, end))
    return dict(decode_rows=rows, decode_context=(start, end), decode_read=read, decode_step_s=seconds,
                decode_mode=engine.decode, budget_tokens=budget.max_tokens, sampling_tokens=budget.sampling_tokens,
                compile=compiled_here(engine)), engine


def update_rows(small: bool, vocab: int):
    """The 4B math cell's widest training row twice in one micro-batch at the cells' budget: a shared prompt at
    the prompt limit less one (20,479) and responses of 5,120 and 5,119 tokens, 25,599 + 25,598 = 51,197 <=
    51,200 (--small: 200 + 55 and 54 in 512); both rows of one mini-batch (ratio 1: no old-log-prob pass)."""
    import torch

    from grpo import Row
    prompt, new, budget = (200, 55, 512) if small else (20479, NEW_TOKENS, 51200)
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, vocab, (prompt,), generator=g).tolist()
    rows = [Row(shared, torch.randint(0, vocab, (n,), generator=g).tolist(), sign, "generator", "generator")
            for n, sign in ((new, 1.0), (new - 1, -1.0))]
    return rows, budget, prompt + new


def measure_update(lm, small: bool) -> dict:
    """The update's tokens/s on `update_rows` after a warm-up update of short rows, and its CUDA peaks, beside
    what the decode before it keeps (its K and V store, its compiled graphs' pools): nothing is freed between
    them, as in a run."""
    import torch

    from grpo import Row, UpdateSettings, make_optimizers, update_policy
    rows, budget, longest = update_rows(small, min(1000, lm.config.vocab_size))
    opts = make_optimizers(lm, ["aggregator", "generator"], UpdateSettings(lr=1e-6, weight_decay=0.0), 10)
    cfg = UpdateSettings(mini_batch_size=2, micro_batch_size=512, max_tokens_per_micro_batch=budget,
                         temperature=0.7)
    short = [Row(r.prompt_ids[:64], r.completion_ids[:32], r.advantage, r.role, r.adapter) for r in rows]
    update_policy(lm, short, opts, cfg)  # warm-up
    cuda = next(lm.parameters()).is_cuda
    if cuda:  # the peaks from here: the update's, beside what the decode keeps
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics = update_policy(lm, rows, opts, cfg)
    if cuda:
        torch.cuda.synchronize()
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    out = dict(update_tok_s=tokens / (time.perf_counter() - start), update_budget=budget, update_longest=longest,
               update_finite=not metrics["nonfinite_steps"])
    if cuda:
        out.update(peak_bytes=torch.cuda.max_memory_allocated(), reserved_bytes=torch.cuda.max_memory_reserved())
    return out


def scale_of(config) -> str | None:
    """The Qwen3 scale ("0.6B", "1.7B", "4B") whose published shape `config` has, else None."""
    from infra.models import QWEN3_SHAPES
    for scale, name in SHAPES.items():
        shape = QWEN3_SHAPES[name]
        if all(getattr(config, k, None) == v for k, v in shape.items() if k != "vocab_size"):
            return scale
    return None


def plan_terms(lm, params: int, lora: int, adapters: int, budget: int, longest: int,
               kl: bool = False, kept: float = 0.0) -> dict[str, float]:
    """The plan's peaks of an update of this model (infra/memory.plan_bytes), in bytes, with the layer figures
    of its own scale (QWEN3_LAYER_KIB; the shape and vocabulary from its config), beside `kept` (the static
    decode's K and V store)."""
    from infra import memory
    from policies import LOGPROB_CHUNK
    c = lm.config
    ckpt, full = (k * 1024 for k in memory.QWEN3_LAYER_KIB[scale_of(c) or "4B"])  # unknown: the largest
    m = memory.Footprint(params, lora, c.num_hidden_layers, ckpt, full,
                         memory.kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim),
                         memory.HEAD_COPIES * LOGPROB_CHUNK * c.vocab_size * 4)
    return memory.plan_bytes(m, adapters, 1, budget, longest, kl=kl, kept=kept)


def cell_model(model: str, small: bool):
    """`model` (fp32 on the CPU at --small, bf16 on CUDA) with a cell's two rank-64 LoRA adapters and
    checkpointing, seeded: (the PEFT model, its tokenizer, the base's parameters, one adapter's)."""
    import torch

    import policies
    device, dtype = ("cpu", torch.float32) if small else ("cuda", torch.bfloat16)
    torch.manual_seed(0)
    base, tokenizer = policies.load_model(model, dtype, device)
    params = sum(p.numel() for p in base.parameters())
    lm = policies.add_adapters(base, ["aggregator", "generator"], rank=64, alpha=32)
    policies.enable_grad_checkpointing(lm)
    lora = sum(p.numel() for p in policies.adapter_parameters(lm, "generator"))
    return lm, tokenizer, params, lora


def check_cost(small: bool, scale: str, summary: dict, save=lambda: None) -> tuple[str, str]:
    """One shape's cost figures (`measure_decode`, `measure_update`) into summary["cost"], and the cost table of
    every shape measured so far into summary["cost_table"]; on CUDA the update's peaks, beside the decode's kept
    K and V store (`kept_bytes`), within the plan with that store (infra/memory.plan_bytes' `kept`). The
    decode's figures are saved (`save`) before the update starts: a check cut short keeps them."""
    from infra import memory
    model = "tiny-qwen3" if small else SHAPES[scale]
    lm, tokenizer, params, lora = cell_model(model, small)
    c = lm.config
    m = summary.setdefault("cost", {})[scale] = {
        "weight_bytes": 2 * params,
        "kv_token_bytes": memory.kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)}
    figures, engine = measure_decode(lm, tokenizer, small)
    m.update(figures, kept_bytes=sum(2 * k.numel() * k.element_size() for k, _ in engine.store.buffers))
    save()
    m.update(measure_update(lm, small))  # beside the engine's store, still held
    summary["cost_table"] = cost_table(cost_rows(summary["cost"]))
    start, end = m["decode_step_s"]
    detail = (f"{model}: update {m['update_tok_s']:,.0f} tok/s (2 rows, widest {m['update_longest']}, budget "
              f"{m['update_budget']}); decode step {1e3 * start:.1f} ms at {m['decode_context'][0]} tokens, "
              f"{1e3 * end:.1f} ms at {m['decode_context'][1]} ({m['decode_rows'] / end:,.0f} tok/s), "
              f"{m['decode_rows']} rows a call, "
              f"{m['decode_mode']} decode{compiled(m['compile'])}")
    ok = m["update_finite"] and all(math.isfinite(t) and t > 0 for t in (m["update_tok_s"], start, end))
    if "peak_bytes" not in m:
        return ("pass" if ok else "FAIL"), detail + "; the plan's bounds need CUDA (skipped)"
    plan = plan_terms(lm, params, lora, 2, m["update_budget"], m["update_longest"], kept=m["kept_bytes"])
    m["plan_allocated_bytes"], m["plan_reserved_bytes"] = plan["allocated"], plan["reserved"]
    detail += (f"; beside the decode's kept K and V ({m['kept_bytes'] / memory.GIB:.1f} GiB), peak allocated "
               f"{m['peak_bytes'] / memory.GIB:.1f} GiB against a plan of "
               f"{plan['allocated'] / memory.GIB:.1f}, reserved {m['reserved_bytes'] / memory.GIB:.1f} against "
               f"{plan['reserved'] / memory.GIB:.1f}")
    ok = ok and m["peak_bytes"] <= plan["allocated"] and m["reserved_bytes"] <= plan["reserved"]
    return ("pass" if ok else "FAIL"), detail


def compiled_here(engine) -> dict | None:
    """What torch.compile did in this process (infra/decoding.compile_stats) where `engine` compiles its decode
    step (static on CUDA), else None."""
    from infra import decoding
    return decoding.compile_stats() if engine.decode == "static" and engine.model.device.type == "cuda" else None


def compiled(stats: dict | None) -> str:
    """What torch.compile did (infra/decoding.compile_stats), as a detail's tail ('' where nothing compiled)."""
    if not stats:
        return ""
    return (f"; compiled {stats['compile_s']:.0f} s, {stats['graphs']} graph(s), {stats['graph_breaks']} "
            f"break(s), CUDA graphs recorded {stats['cudagraphs_recorded']}, re-recorded "
            f"{stats['cudagraph_rerecords']}, skipped {stats['cudagraph_skips']}")


# ---------------------------------------------------------------- the decode modes, A/B (infra/decoding.py)
DECODE_ROWS, DECODE_PROMPT, DECODE_NEW = 256, 200, 128  # the training check's rows a call; a generator's prompt


def check_decode(small: bool, model: str, summary: dict, save=lambda: None) -> tuple[str, str]:
    """The HF engine's decode modes on the same rows: 32 prompts x 8 samples (a GRPO group's copies), each row
    all DECODE_NEW steps, under one LoRA adapter: each mode's first call (static: generate() compiles its decode
    step there) and a second call's tokens/s, into summary["decode"] (saved after each mode), with what the
    static mode compiled. On CUDA it fails when the static mode, which `--decode auto` picks there, is the
    slower; --small (CPU, nothing compiles) has no bound."""
    import torch

    import policies
    device, dtype = ("cpu", torch.float32) if small else ("cuda", torch.bfloat16)
    rows, new = (16, 8) if small else (DECODE_ROWS, DECODE_NEW)
    torch.manual_seed(0)
    base, tokenizer = policies.load_model(model, dtype, device)
    lm = policies.add_adapters(base, ["generator"], rank=64, alpha=32)
    vocab = min(1000, lm.config.vocab_size)
    prompts = [[(7 * i + 13 * k) % vocab for i in range(DECODE_PROMPT)] for k in range(rows // 8)] * 8
    rates, firsts = {}, {}
    for decode in ("dynamic", "static"):
        engine = policies.HFEngine(lm, tokenizer, new, 0.7, decode=decode, batch_size=rows)
        engine.sampling["min_new_tokens"] = new  # every row runs every step (no early EOS)
        seconds = []
        for _ in range(2):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            engine.generate(prompts, ["generator"] * rows)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        firsts[decode], rates[decode] = seconds[0], rows * new / seconds[1]
        stats = compiled_here(engine)
        summary.setdefault("decode", {})[decode] = dict(tok_s=rates[decode], first_call_s=firsts[decode],
                                                        compile=stats)
        save()
    detail = f"{model}, {rows} rows x {new} new tokens a call: " + ", ".join(
        f"{d} {rates[d]:,.0f} tok/s (first call {firsts[d]:.1f} s)" for d in rates) + \
        f"; static / dynamic {rates['static'] / rates['dynamic']:.2f}" + compiled(stats)
    if small:
        return "pass", detail + " (CPU: nothing compiles, no bound)"
    return ("pass" if rates["static"] >= rates["dynamic"] else "FAIL"), detail

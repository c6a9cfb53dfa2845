"""Peak memory of one update micro-batch on CPU, how it scales, and what that means for Qwen3 cells on one GPU.

Measured: one forward + backward of the update's loss on one micro-batch (`grpo.update_policy` on one mini-batch of
one micro-batch, plain SGD at lr 0: LoRA rank 64 on every linear layer, fp32 LoRA, the chunked LM head) of
`tiny-qwen3` in fp32, in a fresh process each (peak resident memory only grows): the peak growth during the
micro-batch, and the bytes autograd saved for backward (each storage once).
  A. one row of 2k to 16k tokens, with and without activation checkpointing: the scaling per token;
  B. 8,192 tokens as 1, 2, 4 or 8 rows (checkpointing on): memory follows the token budget, not the rows;
  C. 1,024 completion tokens with Qwen3's 151,936-token vocabulary: the LM head's chunk peak, in fp32 vocab rows.
Computed for the published Qwen3 shapes (bf16 weights, LoRA 64): the bytes saved per token by one decoder layer
(a 1- and a 2-layer model of each shape, forward only), with and without checkpointing, on a padded micro-batch of
two rows, so that transformers builds the mask and repeats K and V across heads as a cell's micro-batches make it
(the mask's own cells are counted by infra/memory.py, not here); and the live peak per token of one layer's
no-grad forward (the HF engine's prefill). From those and C, the plan (infra/memory.py's terms): the largest
micro-batch token budget and the vLLM memory fraction that fit one 80 GB and one 141 GB GPU, per model and task,
with an estimated step time. The plan's numbers are estimates until `bench/gpu_check.sh` measures them.

    python bench/bench_memory.py            # about 5 minutes on 2 cores
    python bench/bench_memory.py --plan     # the plan only, from infra/memory.py's figures (seconds)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

RUNS = {  # series -> [(rows, prompt, completion, checkpointing, vocab)]
    "A": [(1, t - 64, 64, c, 0) for c in (False, True) for t in (2048, 4096, 8192, 16384)],
    "B": [(r, 8192 // r - 64, 64, True, 0) for r in (1, 2, 4, 8)],
    "C": [(1, 64, 1024, True, 151936)],
}
QWEN3 = {  # the published shapes: layers, then one layer's (hidden, intermediate, query heads, kv heads); head_dim 128
    "0.6B": (28, dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8)),
    "1.7B": (28, dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8)),
    "4B": (36, dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8)),
}
PARAMS = {"0.6B": 596.0e6, "1.7B": 1720.6e6, "4B": 4022.5e6}
VOCAB, RANK, GIB = 151936, 64, 2 ** 30
BUDGETS = (32768, 40960, 51200, 65536, 98304, 131072, 196608, 262144)  # micro-batch token budgets the plan tries
HEAD_ROWS = 5.0  # C's measurement (fp32 vocab rows per completion token of the LM head's chunk): HEAD_COPIES


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class SavedBytes:
    """Counts the activation bytes autograd saves for backward inside the `with` block: each storage once, the
    model's own weights (saved too, to compute input gradients) left out."""

    def __init__(self, model):
        import torch
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t):
        if t.untyped_storage().data_ptr() not in self.weights:
            self.storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def measure(rows: int, prompt: int, completion: int, checkpointing: bool, vocab: int) -> dict:
    """In a fresh process: tiny-qwen3 (its own vocabulary, or `vocab`), a warm-up row, then one micro-batch."""
    import torch

    import policies
    from grpo import Row, UpdateSettings, update_policy
    from infra import models
    torch.manual_seed(0)
    tok = models.tiny_tokenizer()
    models.QWEN3_SHAPES["bench"] = {**models.QWEN3_SHAPES["tiny-qwen3"], "vocab_size": vocab or len(tok)}
    model = policies.add_adapters(models.random_qwen3("bench", tok), ["shared"], rank=RANK, alpha=32)
    if checkpointing:
        policies.enable_grad_checkpointing(model)
    cfg = UpdateSettings(temperature=0.7, share_prompts=False, micro_batch_size=rows, mini_batch_size=rows)
    sgd = torch.optim.SGD(policies.adapter_parameters(model, "shared"), lr=0.0)  # no optimizer state
    optimizers = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
    g = torch.Generator().manual_seed(1)

    def micro_batch(n: int, p: int, c: int) -> int:
        batch = [Row(torch.randint(0, 256, (p,), generator=g).tolist(), torch.randint(0, 256, (c,), generator=g)
                        .tolist(), 1.0, "generator", "shared") for _ in range(n)]
        with SavedBytes(model) as saved:  # one mini-batch of one micro-batch: on-policy, no extra forward
            update_policy(model, batch, optimizers, cfg)
        return saved.total

    micro_batch(1, 3, 2)
    before = rss_kb()
    saved = micro_batch(rows, prompt, completion)
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, 0) * 1024  # ru_maxrss: KiB
    return {"peak": peak, "saved": saved}


def decoder_inputs(rows: int, tokens: int) -> dict:
    """`tokens` ids over `rows` rows; with 2 rows the second is one token shorter (left-padded), so the micro-batch
    carries a [2, 1, W, W] mask as a cell's rows of different lengths do."""
    import torch
    ids = torch.randint(0, 256, (rows, tokens // rows))
    mask = torch.ones_like(ids)
    mask[1:, :1] = 0
    return dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))


def qwen3_layers(shape: dict, layers: int, checkpointing: bool = False):
    """A bf16 Qwen3 of `shape` with `layers` layers and a rank-64 LoRA adapter `shared` (fp32)."""
    import torch

    import policies
    from infra import models
    models.QWEN3_SHAPES["bench"] = dict(shape, num_hidden_layers=layers, head_dim=128, vocab_size=512)
    torch.manual_seed(0)
    model = models.random_qwen3("bench", models.tiny_tokenizer()).to(torch.bfloat16)
    model = policies.add_adapters(model, ["shared"], rank=RANK, alpha=32)
    if checkpointing:
        policies.enable_grad_checkpointing(model)
    return model


class LayerSaved(SavedBytes):
    """SavedBytes without the mask's storages ([rows, 1, W, W]: counted per cell by infra/memory.py)."""

    def pack(self, t):
        if t.dim() == 4 and t.shape[1] == 1 and t.shape[-1] == t.shape[-2]:
            return t
        return super().pack(t)


def layer_bytes(shape: dict, checkpointing: bool, tokens: int = 256) -> float:
    """Bytes saved for backward per token by one decoder layer of a Qwen3 shape, bf16 weights, fp32 LoRA rank 64,
    on a padded micro-batch of two rows: the difference between a 2- and a 1-layer model's decoder forward (the
    embedding and final norm cancel)."""
    import policies
    saved = []
    for layers in (1, 2):
        model = qwen3_layers(shape, layers, checkpointing)
        model.train()
        with policies.use_adapter(model, "shared"), LayerSaved(model) as count:
            model.get_base_model().get_decoder()(**decoder_inputs(2, tokens))
        saved.append(count.total)
    return (saved[1] - saved[0]) / tokens


class LiveBytes:
    """Within `with`: the peak of the bytes live in tensors that ops made (each storage once, until it is freed)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                outer.made(out)
                return out
        self.mode, self.live, self.peak, self.refs = Mode(), 0, 0, {}

    def made(self, out) -> None:
        import functools
        import weakref

        import torch
        from torch.utils._pytree import tree_flatten
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.refs:
                storage = t.untyped_storage()  # the same object while the storage lives: its weakref dies with it
                key, size = storage.data_ptr(), storage.nbytes()
                self.live += size
                self.peak = max(self.peak, self.live)
                self.refs[key] = weakref.ref(storage, functools.partial(self.freed, key, size))

    def freed(self, key: int, size: int, _ref=None) -> None:
        self.live -= size
        self.refs.pop(key, None)

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def prefill_bytes(shape: dict) -> float:
    """The live peak per token of one decoder layer's no-grad forward with the LoRA adapter on (the HF engine's
    prefill), from 1-layer models at widths 128, 256, 512 of a padded pair of rows: peak = c + a x tokens + b x
    mask cells, solved for a (c: weight-sized copies CPU kernels make, which a GPU does not)."""
    import numpy as np
    import torch

    import policies
    rows = []
    for width in (128, 256, 512):
        model = qwen3_layers(shape, 1)
        decoder = model.get_base_model().get_decoder()
        with torch.no_grad(), policies.use_adapter(model, "shared"):
            decoder(**decoder_inputs(2, 2 * width))  # warm-up
            with LiveBytes() as live:
                decoder(**decoder_inputs(2, 2 * width))
        rows.append(([1.0, 2 * width, 2 * width * width], live.peak))
    _, per_token, _ = np.linalg.solve(np.array([r for r, _ in rows]), np.array([p for _, p in rows], dtype=float))
    return float(per_token)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def lora_parameters(layers: int, shape: dict) -> int:
    """Rank-64 LoRA on every linear layer: r x (in + out) per projection (q, k, v, o, gate, up, down)."""
    h, i, q, k = (shape["hidden_size"], shape["intermediate_size"], 128 * shape["num_attention_heads"],
                  128 * shape["num_key_value_heads"])
    return layers * RANK * sum(a + b for a, b in [(h, q), (h, k), (h, k), (q, h), (h, i), (h, i), (i, h)])


def step_time(name: str, task: str) -> float:
    """A Voting step of 64 tasks x 8 samples, estimated. Generation is memory-bound: each decode step reads the bf16
    weights and the KV cache of 256 running sequences (half a response each on average) at 4.8 TB/s. The update is
    compute-bound: 8 x parameters x tokens trained (forward, backward, checkpoint recompute) at 40% of 990
    TFLOP/s. Assumed: responses average 1,500 tokens (math) or 800 (code), generator prompts 200, the aggregator's
    prompt three responses long."""
    layers, shape = QWEN3[name]
    response = 1500 if task == "math" else 800
    kv_per_token = 2 * layers * shape["num_key_value_heads"] * 128 * 2
    decode_step = (2 * PARAMS[name] + 256 * (200 + response / 2) * kv_per_token) / 4.8e12
    generation = 512 * 4 * response / 256 * decode_step  # 3 generators + the aggregator per episode
    trained = 512 * (3 * (200 + response) + 4 * response)
    return generation + 8 * PARAMS[name] * trained / (0.4 * 990e12)


def footprints(head_rows: float, measure: bool) -> dict:
    """Per Qwen3 model, infra/memory.py's Footprint: measured layer bytes (or QWEN3_LAYER_KIB's), its LoRA, its KV
    cache, the LM head's chunk of `head_rows` fp32 vocab rows per completion token; with `measure` also the
    prefill's live bytes, printed."""
    import policies
    from infra import memory
    out = {}
    for name, (layers, shape) in QWEN3.items():
        ckpt, full = (k * 1024 for k in memory.QWEN3_LAYER_KIB[name])
        if measure:
            full, ckpt = layer_bytes(shape, False), layer_bytes(shape, True)
            print(f"[{name}: per token and layer, padded micro-batch: {ckpt / 1024:.1f} KiB with checkpointing, "
                  f"{full / 1024:.1f} without; no-grad forward's live peak {prefill_bytes(shape) / 1024:.1f} KiB]",
                  flush=True)
        kv = memory.kv_bytes_per_token(layers, shape["num_key_value_heads"], 128)
        head = head_rows * policies.LOGPROB_CHUNK * VOCAB * 4
        out[name] = memory.Footprint(PARAMS[name], lora_parameters(layers, shape), layers, ckpt, full, kv, head)
    return out


def cell_peak(m, budget: int, longest: int, kl: bool) -> dict:
    """The larger plan of Orch-Workers under IP (3 adapters) and under SP (1 adapter, 3 roles' snapshots)."""
    from infra.memory import plan_bytes
    return max((plan_bytes(m, adapters, roles, budget, longest, kl) for adapters, roles in ((3, 1), (1, 3))),
               key=lambda peaks: peaks["reserved"])


def plan(head_rows: float, measure: bool = True) -> None:
    """Per model, task and GPU: the largest budget (BUDGETS, at least the longest row) whose step fits in 90% of the
    GPU as reserved memory (infra/memory.plan_bytes: the update, the no-grad passes with their shared prompts' KV
    cache, the mask at 5 bytes a cell, SP's snapshots, the allocator's largest transient block), without and with
    --kl-coef's reference pass; the cells' own budget against the same bound; and the vLLM fraction that would be
    left during rollout. The cells keep --vllm-gpu-memory 0.4 until a GPU measures more."""
    from infra.cells import PAPER_LENGTHS, cell_defaults
    from infra.memory import GIB, worst_mask_bytes
    print("\nmodel task | GPU GB | longest row | budget: reserved (allocated) GiB, mask GiB | with --kl-coef | "
          "cell's budget: reserved GiB | vLLM fraction | Voting step, est.")
    for name, m in footprints(head_rows, measure).items():
        for task in ("math", "code"):
            longest = max(p + r for (kind, _), (p, r, _, _) in PAPER_LENGTHS.items() if kind == task)
            cell = cell_defaults(f"Voting-IP-{name}-{task.title()}")["max_tokens_per_micro_batch"]
            for gpu in (80, 141):
                def fits(kl: bool, m=m, longest=longest, gpu=gpu) -> int | None:
                    ok = [b for b in BUDGETS if b >= longest and
                          cell_peak(m, b, longest, kl)["reserved"] <= 0.9 * gpu * 1e9]
                    return max(ok) if ok else None
                best, with_kl = fits(False), fits(True)
                static = 2 * m.params + 16 * 3 * m.lora_params + GIB  # what stays on the GPU while vLLM samples
                fraction = int((0.9 - static / (gpu * 1e9)) * 20) / 20
                peaks = cell_peak(m, best, longest, False) if best else None
                text = f"{best}: {peaks['reserved'] / GIB:.0f} ({peaks['allocated'] / GIB:.0f}), " \
                    f"{worst_mask_bytes(best, longest) / GIB:.0f}" if best else "does not fit"
                own = cell_peak(m, cell, longest, True)["reserved"]
                print(f"{name:<5} {task:<4} | {gpu:>6} | {longest:>11} | {text:<22} | {with_kl or '-':>14} | "
                      f"{cell}: {own / GIB:.0f}{'' if own <= 0.9 * gpu * 1e9 else ' OVER'} | {fraction:>13.2f} | "
                      f"{step_time(name, task):.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one", nargs=5, type=int, help=argparse.SUPPRESS)
    p.add_argument("--plan", action="store_true", help="the plan only, from infra/memory.py's figures")
    args = p.parse_args()
    if args.plan:
        plan(HEAD_ROWS, measure=False)
        return
    if args.one:
        rows, prompt, completion, ckpt, vocab = args.one
        print(json.dumps(measure(rows, prompt, completion, bool(ckpt), vocab)))
        return
    results: dict[str, list] = {}
    for series, runs in RUNS.items():
        for rows, prompt, completion, ckpt, vocab in runs:
            out = subprocess.run([sys.executable, __file__, "--one", str(rows), str(prompt), str(completion),
                                  str(int(ckpt)), str(vocab)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.setdefault(series, []).append((rows * (prompt + completion), ckpt, r))
            print(f"{series}  checkpointing {'on ' if ckpt else 'off'}  {rows} x ({prompt} + {completion}) tokens"
                  f"{' (vocab 151,936)' if vocab else ''}: peak +{r['peak'] / 2 ** 20:7.1f} MiB, saved for backward "
                  f"{r['saved'] / 2 ** 20:7.1f} MiB", flush=True)
    for ckpt in (False, True):
        a = [(t, r) for t, c, r in results["A"] if c == ckpt]
        peak, _ = fit([t for t, _ in a], [r["peak"] for _, r in a])
        saved, _ = fit([t for t, _ in a], [r["saved"] for _, r in a])
        print(f"A: checkpointing {'on ' if ckpt else 'off'}: peak {peak / 1024:5.1f} KiB per token, saved for "
              f"backward {saved / 1024:5.1f} KiB per token")
    print("B: 8,192 tokens as 1, 2, 4, 8 rows: peak " + ", ".join(f"{r['peak'] / 2 ** 20:.0f}" for _, _, r in
                                                                results["B"]) + " MiB")
    head_rows = results["C"][0][2]["peak"] / (1024 * VOCAB * 4)
    print(f"C: the LM head's chunk of 1,024 completion tokens: {results['C'][0][2]['peak'] / GIB:.2f} GiB, "
          f"{head_rows:.1f} fp32 copies of its logits")
    plan(head_rows)


if __name__ == "__main__":
    main()

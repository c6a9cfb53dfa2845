"""The GPU check: what a lent GPU must show before a paper cell runs on it, as checks that can fail.

Each check prints what it measured and holds it to a bound; a table at the end says pass, FAIL or skip (and why),
and the exit status is 0 only when no check failed. A missing requirement is one line and exit 1, before any check.
  1. training: 3 steps of the Voting-IP cell configuration with a learnable stand-in reward (even-length outputs
     win; a random or untrained model earns no math reward, so advantages and gradients would be 0): every step
     finite, both adapters with a non-zero gradient; step time, peak trainer memory, vLLM drift where it ran.
  2. memory: one update micro-batch at a cell's full row length (math Eval-Opt, 30,720 + 5,120 tokens) on the
     Qwen3-0.6B shape; `torch.cuda.max_memory_allocated` must stay under the plan's number (infra/memory.py).
  3. bf16: the same rows' log-probs in bf16 and fp32; mean difference under 0.05 nats a token.
  4. vLLM: its engine against HF (tests/test_vllm.py: same greedy tokens, drift under 1e-3), where vLLM imports.
  5. GPU tests: `MARL_GPU_TESTS=1 pytest -m gpu` (tests/test_gpu.py).
Nothing is downloaded: Qwen/Qwen3-0.6B where it is in the local hub cache, else `random-qwen3-0.6b` (its shape,
random weights). `--small` rehearses it on the CPU with tiny-qwen3 and small sizes; the memory bound, vLLM and
the GPU tests are skipped there, and the table says so.

    bash bench/gpu_check.sh            # on the GPU machine, under 8 minutes
    bash bench/gpu_check.sh --small    # CPU rehearsal, about 2 minutes
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
REQUIRED = {"torch": "pip install torch==2.13.0 (a CUDA build on a GPU machine; README, 'Two commands')",
            "transformers": "pip install -r requirements.txt", "peft": "pip install -r requirements.txt",
            "datasets": "pip install -r requirements.txt", "math_verify": "pip install -r requirements.txt",
            "safetensors": "pip install -r requirements.txt", "numpy": "pip install -r requirements.txt"}
PARITY_TRAIN = f"""
import sys
sys.path.insert(0, {ROOT!r})
import tasks, train, workflows
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs]
train.main(sys.argv[1:])
"""


def missing_requirements(small: bool) -> list[str]:
    """One line per missing package, and the GPU (unless --small)."""
    lines = [f"error: {m} is not installed: {fix}" for m, fix in REQUIRED.items()
             if importlib.util.find_spec(m) is None]
    if not lines and not small:
        import torch
        if not torch.cuda.is_available():
            lines.append(f"error: torch {torch.__version__} (built for CUDA {torch.version.cuda or 'none'}) sees no "
                         "GPU: check nvidia-smi and that the driver supports that CUDA version")
    return lines


def model_name(small: bool) -> str:
    if small:
        return "tiny-qwen3"
    from huggingface_hub import try_to_load_from_cache
    return "Qwen/Qwen3-0.6B" if isinstance(try_to_load_from_cache("Qwen/Qwen3-0.6B", "config.json"), str) \
        else "random-qwen3-0.6b"


def check_training(small: bool, model: str, out: str) -> tuple[str, str]:
    """3 steps of the Voting-IP cell configuration with the stand-in reward, in a process of its own."""
    import tasks
    data, val, run = (os.path.join(out, name) for name in ("dapo.jsonl", "aime.jsonl", "run"))
    for path, problems in ((data, tasks.synthetic_math(200, difficulty=1, seed=1)),
                           (val, tasks.synthetic_math(30, difficulty=1, seed=2))):  # nothing from the hub
        with open(path, "w") as f:
            f.writelines(json.dumps({"problem": t.question, "answer": t.answer}) + "\n" for t in problems)
    engine = "vllm" if not small and importlib.util.find_spec("vllm") else "hf"
    size = ["--device", "cpu", "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "16"] if small else \
        ["--tasks-per-step", "8", "--max-new-tokens", "512", "--gen-batch-size", "256"]
    command = [sys.executable, "-c", PARITY_TRAIN, "--cell", "Voting-IP-0.6B-Math", "--model", model, "--data", data,
               "--val-data", val, "--steps", "3", "--val-every", "0", "--engine", engine, "--overwrite", "--run-dir",
               run, *size]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return "FAIL", f"train.py exited {done.returncode}: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    steps = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    grads = {r: max(m[f"{r}/grad_norm"] for m in steps) for r in ("generator", "aggregator")}
    ok = [m["step"] for m in steps] == [1, 2, 3] and not any(m["nonfinite_steps"] for m in steps) and \
        min(grads.values()) > 0
    seconds = sum(m["time_rollout"] + m["time_update"] for m in steps) / len(steps)
    detail = (f"{engine}, {seconds:.1f} s a step, gradient norms generator {grads['generator']:.3g} aggregator "
              f"{grads['aggregator']:.3g}, peak trainer memory {steps[-1].get('memory/peak_gib', 0):.1f} GiB")
    if "vllm/logprob_drift" in steps[-1]:
        detail += f", vllm/logprob_drift {max(m['vllm/logprob_drift'] for m in steps):.2g}"
    return ("pass" if ok else "FAIL"), detail


def check_memory(small: bool, model: str) -> tuple[str, str]:
    """One micro-batch of one full-length row; on CUDA its peak against the plan's number."""
    from collections import defaultdict

    import torch

    import policies
    from grpo import Sample, UpdateSettings, _micro_step
    from infra import memory
    prompt, new = (2048, 256) if small else (30720, 5120)
    device, dtype = ("cpu", torch.float32) if small else ("cuda", torch.bfloat16)
    torch.manual_seed(0)
    base, _ = policies.load_model(model, dtype, device)
    params = sum(p.numel() for p in base.parameters())
    lm = policies.add_adapters(base, ["shared"], rank=64)
    policies.enable_grad_checkpointing(lm)
    lora = sum(p.numel() for p in policies.adapter_parameters(lm, "shared"))
    vocab = min(1000, lm.config.vocab_size)
    row = Sample(torch.randint(0, vocab, (prompt,)).tolist(), torch.randint(0, vocab, (new,)).tolist(), 1.0,
                 "generator", "shared")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with policies.use_adapter(lm, "shared"):
        lm.train()
        _micro_step(lm, [row], [None], [1.0 / new], UpdateSettings(temperature=0.7, share_prompts=False),
                    defaultdict(lambda: [0.0, 0.0]))
    grad = torch.stack([p.grad.float().norm() for p in policies.adapter_parameters(lm, "shared")]).norm().item()
    if not grad > 0 or grad != grad:
        return "FAIL", f"one {prompt + new}-token row: gradient norm {grad}"
    if device == "cpu":
        return "pass", f"one {prompt + new}-token row, gradient norm {grad:.3g}; the plan's bound needs CUDA (skipped)"
    ckpt, full = (k * 1024 for k in memory.QWEN3_LAYER_KIB["0.6B"])
    head = memory.HEAD_COPIES * policies.LOGPROB_CHUNK * lm.config.vocab_size * 4
    plan = memory.update_bytes(params, lora, 1, prompt + new, prompt + new, lm.config.num_hidden_layers, ckpt, full,
                               head)
    peak = torch.cuda.max_memory_allocated()
    return ("pass" if peak <= plan else "FAIL"), (f"one {prompt + new}-token row: peak {peak / 2 ** 30:.1f} GiB, "
                                                  f"plan {plan / 2 ** 30:.1f} GiB (ratio {peak / plan:.2f})")


def check_bf16(small: bool, model: str) -> tuple[str, str]:
    """The same 8 rows' log-probs in fp32 and bf16 on one device: mean |difference| per token."""
    import torch

    import policies
    device = "cpu" if small else "cuda"
    got, g = {}, torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        lm, _ = policies.load_model(model, dtype, device)
        if dtype == torch.float32:  # the rows: token ids the vocabulary has
            vocab = min(1000, lm.config.vocab_size)
            prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in torch.randint(16, 200, (8,))]
            completions = [torch.randint(0, vocab, (int(n),), generator=g).tolist()
                           for n in torch.randint(8, 128, (8,))]
        got[dtype] = torch.cat(policies.policy_logprobs(lm, None, prompts, completions)).float()
        del lm
    diff = (got[torch.float32] - got[torch.bfloat16]).abs()
    return ("pass" if diff.mean() < 0.05 else "FAIL"), (f"{len(diff)} tokens: mean |fp32 - bf16| "
                                                        f"{diff.mean():.4f}, max {diff.max():.3f} nats")


def check_pytest(marker: str, path: str, needs: str | None, timeout: int) -> tuple[str, str]:
    """pytest on the GPU-visible machine (MARL_GPU_TESTS=1 keeps the GPU visible to the tests)."""
    if needs:
        return "skip", needs
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", marker, path, "-p", "no:randomly"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "MARL_GPU_TESTS": "1"})
    last = (done.stdout.strip().splitlines() or ["?"])[-1]
    return ("pass" if done.returncode == 0 and "passed" in last else "FAIL"), last


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU rehearsal: tiny-qwen3, small sizes")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/gpu_check", help="folder for the run and data")
    args = p.parse_args()
    missing = missing_requirements(args.small)
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 1
    import torch
    os.makedirs(args.out, exist_ok=True)
    model = model_name(args.small)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}; model {model}", flush=True)
    vllm = None if importlib.util.find_spec("vllm") else "vLLM does not import here"
    no_gpu = "--small: no GPU" if args.small else None
    checks = {"training": lambda: check_training(args.small, model, args.out),
              "memory": lambda: check_memory(args.small, model),
              "bf16": lambda: check_bf16(args.small, model),
              "vLLM vs HF": lambda: check_pytest("vllm", "tests/test_vllm.py", no_gpu or vllm, 240),
              "GPU tests": lambda: check_pytest("gpu", "tests/test_gpu.py", no_gpu, 180)}
    results = []
    for name, check in checks.items():
        start = time.time()
        try:
            status, detail = check()
        except Exception as e:  # a check that breaks is a failed check, in one line
            status, detail = "FAIL", f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        results.append((name, status, detail, time.time() - start))
        print(f"== {name}: {status} ({time.time() - start:.0f} s) {detail}", flush=True)
    print("\n| check | result | seconds | detail |\n|---|---|---|---|")
    for name, status, detail, seconds in results:
        print(f"| {name} | {status} | {seconds:.0f} | {detail} |")
    return 1 if any(status == "FAIL" for _, status, _, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())

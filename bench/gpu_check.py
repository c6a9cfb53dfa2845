"""The GPU check: what a lent GPU must show before a paper cell runs on it, as checks that can fail.

Each check prints what it measured and holds it to a bound; a table at the end says pass, FAIL or skip (and why),
and the exit status is 0 only when no check failed. A missing requirement is one line and exit 1, before any check.
A lease is 15 minutes of device time, the machine's start included, so the checks come in two parts, each one
command (`gpu_check.sh 1`, at most 5 minutes; `gpu_check.sh 2`, at most 7), in order of value; each check has its
own time bound (CHECKS: past it, it fails), and one whose bound no longer fits in what is left of its part is
skipped, said so. `gpu_check.json` is rewritten after every check, so a run killed part-way leaves every finished
result (and the check it was in).
  part 1
  1. training: one step of the Voting-IP cell configuration with a learnable stand-in reward, validated before
     and after (bench/gpu_check_runs.py), the rows per generate() call from the memory budget, the HF engine's
     static decode (`--decode static`, infra/decoding.py: a compiled decode step reading only the filled
     columns): finite, both adapters with a gradient; rollout and update tokens/s; allocated and reserved peaks,
     reserved within 1.5x allocated; what torch.compile did (seconds, graphs, CUDA graphs recorded or skipped).
  2. ratio: bf16's importance ratio at identical weights with LoRA active (lora_B random): a zero-learning-rate
     update in three mini-batches, the clip fraction and approximate KL of mini-batches 2-3 (old log-probs from
     the no-grad pass, new ones from the update's), rows sampled in the dynamic decode (nothing to compile), the
     random LM head scaled until the sampled tokens' entropy is a trained model's (~0.75 nat).
  part 2 (its time holds 3-5, so none of those figures is skipped; the rest run as time allows)
  3. decode: the HF engine's decode modes (infra/decoding.py) on the same 256 rows x 128 new tokens, one LoRA
     adapter: tokens/s and the first call's seconds (static: the compile) of each, each saved as it ends; fails
     where static, which `--decode auto` picks on CUDA, is the slower (bench/gpu_cost.check_decode).
  4-5. cost-1.7b, cost-4b (cost-0.6b later): at the random Qwen3 shape, built on the GPU, the decode step at the
     start and end of a long generation (at most 64 rows a call; saved before the update runs), then the update
     at a cell's budget with the 4B math cell's widest row, the peaks against the plan; the cost table of a
     Voting math step and a 500-step cell in the static mode's terms (bench/gpu_cost.py).
  6. memory: an IP generator update of three mini-batches (the later two need the no-grad old-log-prob pass),
     each one padded micro-batch at a cell's token budget (51,200) of rows that share one prompt and differ in
     length, the widest 12,799 tokens (not a multiple of 8: the alignment copy of the mask), with --kl-coef's
     reference pass in every micro-batch; on the Qwen3-0.6B shape in bf16 with checkpointing and LoRA 64: the
     SDPA kernels that ran, the allocated and reserved peaks, each against the plan (infra/memory.plan_bytes),
     and update tokens/s after a warm-up update.
  7. eval: eval.py on the training check's run, prompts near Voting-math's evaluation limit (25,600 tokens), the
     HF engine: no episode cut short, and on CUDA the allocated peak within the HF budget's own bound.
  8. GPU tests: `MARL_GPU_TESTS=1 pytest -m gpu` (tests/test_gpu.py).
  9. training-sp: one step of the Voting-SP cell configuration with --kl-coef on both roles: SP's per-role
     gradients and the KL reference pass, finite.
  10. vLLM: its engine against HF (tests/test_vllm.py: same greedy tokens, drift under 1e-3), where vLLM imports.
Nothing is downloaded: Qwen/Qwen3-0.6B where it is in the local hub cache, else `random-qwen3-0.6b` (its shape,
random weights). Runs and data go under --work (/tmp/gpu_check); only `gpu_check.json` (the summary: versions,
results, the runs' metrics, the cost table) goes to --out ($OUT), next to the log gpu_check.sh writes there.
Wheels in .whl/ (gpu_check.sh --fetch-wheels) are installed into /tmp/gpu-check-site where the machine lacks their
package. The header says whether the static decode can compile here (a C compiler and Python's headers for Triton;
without them it decodes dynamic, counted in the training run's metrics). `--small` rehearses every check on the CPU
with tiny-qwen3 and small sizes, with no time bounds (the memory bounds, vLLM and the GPU tests skip); `--preflight`
(this CPU machine) installs .whl/ into a fresh folder for the lent machine's Python and imports what the checks need
from it, before any device time is spent. No part has been timed on a GPU yet (bench/README.md).

    bash bench/gpu_check.sh 1                  # on the GPU machine: part 1, at most 5 minutes
    bash bench/gpu_check.sh 2                  # then part 2, at most 7 minutes
    bash bench/gpu_check.sh --only memory      # one check again (comma-separated names: training,memory,...)
    bash bench/gpu_check.sh --small            # CPU rehearsal of every check
    python3 bench/gpu_check.py --preflight     # CPU: the wheels install and import; versions
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpu_check_runs import check_eval, check_training, check_training_sp, write_data  # noqa: E402 (bench/)
from gpu_cost import cell_model, check_cost, check_decode, plan_terms  # noqa: E402 (bench/)
from gpu_ratio import check_ratio  # noqa: E402 (bench/)
from gpu_wheels import SITE, VERSIONS, install_wheels, preflight, versions  # noqa: E402 (bench/, beside this file)

REQUIRED = {"torch": "pip install torch==2.13.0 (a CUDA build on a GPU machine; README, 'Two commands')",
            "transformers": "pip install -r requirements.txt", "peft": "pip install -r requirements.txt",
            "datasets": "pip install -r requirements.txt", "math_verify": "pip install -r requirements.txt",
            "safetensors": "pip install -r requirements.txt", "numpy": "pip install -r requirements.txt"}
BUDGET = 51200          # the cells' micro-batch token budget (cells.PAPER_HYPERPARAMETERS)
KL = {"generator": 0.01}  # the memory check's --kl-coef: a reference pass in every micro-batch
# Each check: (its part, its time bound in seconds), in order of value within a part. The bounds are estimates
# (none measured yet), each with one cold torch.compile of the static decode per model shape the check compiles
# (40-110 s by a reading of the lent machine's sources; one serves every adapter, infra/decoding.py): the first
# GPU run's 2 training steps took 233 s, eagerly. Part 2 measures the decode first, then the costs, and its time
# holds all three, so none of these figures is skipped for time; the checks after them run as time allows.
CHECKS = {"training": (1, 180), "ratio": (1, 40),
          "decode": (2, 120), "cost-1.7b": (2, 110), "cost-4b": (2, 140), "memory": (2, 60), "eval": (2, 120),
          "gpu-tests": (2, 60), "cost-0.6b": (2, 90), "training-sp": (2, 150), "vllm": (2, 120)}
# a part's checks, in seconds; gpu_check.sh kills part 1 at 300 s and part 2 at 420 s, imports and wheels
# included: 12 minutes of a 15-minute lease, the machine's start in the rest
PART_SECONDS = {1: 270, 2: 390}


def missing_requirements(small: bool) -> list[str]:
    """One line per missing package, and the GPU (unless --small)."""
    lines = [f"error: {m} is not installed: {fix}" for m, fix in REQUIRED.items()
             if importlib.util.find_spec(m) is None]
    if not lines and not small:
        import torch
        if not torch.cuda.is_available():
            lines.append(f"error: torch {torch.__version__} (built for CUDA {torch.version.cuda or 'none'}) sees no "
                         "GPU: check nvidia-smi and that the driver supports that CUDA version (CUDA 13: a driver "
                         ">= 580; docs/vllm.md, 'Versions')")
    return lines


def model_name(small: bool) -> str:
    if small:
        return "tiny-qwen3"
    from huggingface_hub import try_to_load_from_cache
    return "Qwen/Qwen3-0.6B" if isinstance(try_to_load_from_cache("Qwen/Qwen3-0.6B", "config.json"), str) \
        else "random-qwen3-0.6b"


def generator_rows(small: bool, vocab: int):
    """12 generator rows, 3 mini-batches of 4: each mini-batch's rows share one prompt (a GRPO group's copies)
    and differ in completion length, one padded micro-batch within the token budget whose widest row is not a
    multiple of 8: 4 x 12,799 = 51,196 <= 51,200 (--small: 4 x 255 = 1,020 <= 1,024)."""
    import torch

    from grpo import Row
    prompt, completions, budget = (157, (98, 82, 66, 50), 1024) if small else (8191, (4608, 4096, 3584, 3072),
                                                                              BUDGET)
    g = torch.Generator().manual_seed(0)
    rows = []
    for group in range(3):
        shared = torch.randint(0, vocab, (prompt,), generator=g).tolist()
        rows += [Row(shared, torch.randint(0, vocab, (n,), generator=g).tolist(), (-1.0) ** k * (1 + k / 12),
                        "generator", "generator") for k, n in enumerate(completions, start=4 * group)]
    return rows, budget, prompt + completions[0]


class SDPACalls:
    """Within `with`: the attention masks transformers passes to SDPA and the aten attention kernels that ran
    (torch.profiler, CPU op names such as aten::_scaled_dot_product_efficient_attention)."""

    def __enter__(self):
        import torch
        self.masks, self.real = set(), torch.nn.functional.scaled_dot_product_attention

        def spy(*a, attn_mask=None, **k):
            self.masks.add(None if attn_mask is None else tuple(attn_mask.shape))
            return self.real(*a, attn_mask=attn_mask, **k)
        torch.nn.functional.scaled_dot_product_attention = spy
        self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.profile.__enter__()
        return self

    def __exit__(self, *exc):
        import torch
        self.profile.__exit__(*exc)
        torch.nn.functional.scaled_dot_product_attention = self.real
        self.kernels = sorted({e.name for e in self.profile.events() if e.name.startswith(
            ("aten::_scaled_dot_product_", "aten::_efficient_attention", "aten::_flash_attention"))})


def check_memory(small: bool, model: str) -> tuple[str, str]:
    """An IP generator update of 3 padded mini-batches at the token budget with --kl-coef: a warm-up update
    (profiled: the SDPA kernel), then a timed one (peaks, tokens/s); on CUDA the allocated and reserved peaks
    against the plan."""
    import torch

    from grpo import UpdateSettings, make_optimizers, update_policy
    device = "cpu" if small else "cuda"
    lm, _, params, lora = cell_model(model, small)
    rows, budget, longest = generator_rows(small, min(1000, lm.config.vocab_size))
    opts = make_optimizers(lm, ["aggregator", "generator"],
                           UpdateSettings(lr=1e-6, weight_decay=0.0, warmup_steps=0), 10)
    cfg = UpdateSettings(mini_batch_size=4, micro_batch_size=512, max_tokens_per_micro_batch=budget,
                         temperature=0.7, kl_coef=KL)
    with SDPACalls() as sdpa:
        warm = update_policy(lm, rows, opts, cfg)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.time()
    m = update_policy(lm, rows, opts, cfg)
    if device == "cuda":
        torch.cuda.synchronize()
    tok_s = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows) / (time.time() - start)
    masks = sorted({str(s) for s in sdpa.masks if s is not None and s[-2] == s[-1]})  # the update's own
    detail = (f"3 mini-batches x 4 rows sharing a prompt, {longest - len(rows[-1].completion_ids)}-{longest} "
              f"tokens, budget {budget}, --kl-coef: SDPA masks {', '.join(masks)}, kernels "
              f"{', '.join(sdpa.kernels) or 'none seen'}; update {tok_s:,.0f} tok/s after a warm-up")
    ok = warm["generator/opt_steps"] == m["generator/opt_steps"] == 3 and not m["nonfinite_steps"] and \
        f"(4, 1, {longest}, {longest})" in masks and m.get("generator/kl_base") is not None
    if device == "cpu":
        return ("pass" if ok else "FAIL"), detail + "; the plan's bounds need CUDA (skipped)"
    plan = plan_terms(lm, params, lora, 2, budget, longest, kl=True)
    peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    detail += (f"; peak allocated {peak / 2 ** 30:.1f} GiB, reserved {reserved / 2 ** 30:.1f} GiB; plan "
               + ", ".join(f"{k} {v / 2 ** 30:.1f}" for k, v in plan.items()) + f" GiB (allocated / plan "
               f"{peak / plan['allocated']:.2f}, reserved / plan {reserved / plan['reserved']:.2f})")
    return ("pass" if ok and peak <= plan["allocated"] and reserved <= plan["reserved"] else "FAIL"), detail


def check_pytest(marker: str, path: str, needs: str | None, timeout: int) -> tuple[str, str]:
    """pytest on the GPU-visible machine (MARL_GPU_TESTS=1 keeps the GPU visible to the tests)."""
    if needs:
        return "skip", needs
    env = {**os.environ, "MARL_GPU_TESTS": "1"}
    if marker == "vllm" and env.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True":
        del env["PYTORCH_CUDA_ALLOC_CONF"]  # ours (main): vLLM's sleep mode refuses it
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", marker, path, "-p", "no:randomly"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)
    last = (done.stdout.strip().splitlines() or ["?"])[-1]
    return ("pass" if done.returncode == 0 and "passed" in last else "FAIL"), last


def header(small: bool, site: str) -> dict:
    """Versions (torch, transformers, peft, datasets first), the device, the model; printed and summarized."""
    import torch

    from infra.decoding import compiler_problem
    info = {**versions(site), "cuda": torch.version.cuda, "model": model_name(small),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
            "compiler": compiler_problem() or "gcc or clang and Python.h: the static decode compiles"}
    print(", ".join(f"{k} {info[k]}" for k in ("torch", "transformers", "peft", "datasets", "python", "cuda", "gpu",
                                                "model")), flush=True)
    print(f"other versions: {', '.join(f'{k} {v}' for k, v in info.items() if k in VERSIONS[4:])}; from .whl: "
          f"{', '.join(info['from .whl']) or 'none'}; unmet requirements: "
          f"{'; '.join(info['unmet requirements']) or 'none'}; compiler: {info['compiler']}", flush=True)
    return info


def checks(args, model: str, summary: dict) -> dict:
    """Each check's name and how to run it: () -> (status, detail)."""
    vllm = None if importlib.util.find_spec("vllm") else "vLLM does not import here"
    no_gpu = "--small: no GPU" if args.small else None
    data: dict = {}

    def save():  # a check's figures so far, before its next measurement
        write_summary(args.out, summary)

    def runs(check):  # the runs' files are written once, by the first of them
        def run():
            if not data:
                data.update(write_data(args.work, args.small, tokenizer(model)))
            return check(args.small, model, args.work, data, summary)
        return run
    return {"training": runs(check_training), "ratio": lambda: check_ratio(args.small, model),
            "decode": lambda: check_decode(args.small, model, summary, save),
            **{f"cost-{scale.lower()}": (lambda scale=scale: check_cost(args.small, scale, summary, save))
               for scale in ("1.7B", "4B")},
            "memory": lambda: check_memory(args.small, model),
            "eval": runs(check_eval),
            "gpu-tests": lambda: check_pytest("gpu", "tests/test_gpu.py", no_gpu, CHECKS["gpu-tests"][1]),
            "cost-0.6b": lambda: check_cost(args.small, "0.6B", summary, save),
            "training-sp": runs(check_training_sp),
            "vllm": lambda: check_pytest("vllm", "tests/test_vllm.py", no_gpu or vllm, CHECKS["vllm"][1])}


def tokenizer(model: str):
    """The model's tokenizer, without its weights (the built-in shapes use the byte-level test tokenizer)."""
    from transformers import AutoTokenizer

    from infra.models import BUILTIN_MODELS, tiny_tokenizer
    return tiny_tokenizer() if model in BUILTIN_MODELS else AutoTokenizer.from_pretrained(model)


def release_gpu_memory() -> None:
    """What a finished in-process check left: its objects (PEFT models hold reference cycles) and torch's cached
    blocks."""
    import gc
    gc.collect()
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.empty_cache()


def write_summary(out: str, summary: dict) -> None:
    """gpu_check.json, replaced whole (written aside, then renamed): a kill never leaves half a file."""
    path = os.path.join(out, "gpu_check.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)


def bounded(check, seconds: int | None):
    """check() within `seconds` (None: unbounded): past them, a TimeoutError in this process (a subprocess it
    waits on is killed as the exception passes)."""
    if seconds is None:
        return check()

    def ran_past(signum, frame):
        raise TimeoutError(f"ran past its {seconds} s bound")
    previous = signal.signal(signal.SIGALRM, ran_past)
    signal.alarm(seconds)
    try:
        return check()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def chosen(args, todo: dict) -> list[str]:
    """The checks this command runs, in order: --only's, a part's, or (--small, or no part named) all."""
    if args.only:
        return [name for name in todo if name in args.only]
    return [name for name in todo if not args.part or CHECKS.get(name, (1, 0))[0] == args.part]


def run_checks(args, summary: dict, todo: dict) -> list[tuple[str, str, str, float]]:
    """(name, status, detail, seconds) of every check this command runs, each printed as it ends, each within
    its time bound (not in --small); one whose bound no longer fits in its part's PART_SECONDS is skipped. The
    summary is written before each check (naming it `running`) and after it (with its result)."""
    results, began = [], time.time()
    summary["results"] = []
    for name in chosen(args, todo):
        bound = None if args.small else CHECKS.get(name, (1, None))[1]
        start = time.time()
        summary["running"] = name
        write_summary(args.out, summary)
        part_seconds = PART_SECONDS.get(args.part)
        if bound and part_seconds and start - began + bound > part_seconds:
            status, detail = "skip", f"its {bound} s bound no longer fits in the part's {part_seconds} s"
        else:
            try:
                status, detail = bounded(todo[name], bound)
            except Exception as e:  # a check that breaks is a failed check, in one line
                status, detail = "FAIL", f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        release_gpu_memory()  # the next check (a subprocess among them) finds the GPU as free as it can be
        results.append((name, status, detail, time.time() - start))
        summary["results"].append(dict(check=name, result=status, seconds=round(time.time() - start, 1),
                                       detail=detail))
        print(f"== {name}: {status} ({time.time() - start:.0f} s) {detail}", flush=True)
    summary["running"] = None
    write_summary(args.out, summary)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU rehearsal: tiny-qwen3, small sizes")
    p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/gpu_check", help="where gpu_check.json goes")
    p.add_argument("--work", default="/tmp/gpu_check/work", help="the training run and its data (not --out)")
    p.add_argument("part", nargs="?", type=int, choices=(1, 2), help="the part to run (default: both, 10 minutes)")
    p.add_argument("--only", type=lambda s: s.split(","), default=None,
                   help="comma-separated checks: " + ",".join(CHECKS))
    p.add_argument("--preflight", action="store_true", help="CPU: install .whl/ as the lent machine would, import")
    p.add_argument("--wheels", default=os.path.join(ROOT, ".whl"), help="wheels for the lent machine")
    args = p.parse_args()
    if args.preflight:
        return preflight(args.wheels)
    if bad := sorted(set(args.only or []) - set(CHECKS)):
        p.error(f"--only: unknown check {', '.join(bad)}")
    if glob.glob(os.path.join(args.wheels, "*.whl")):  # what this machine lacks, before anything imports it
        subprocess.run(["rm", "-rf", SITE], check=True)
        if install_wheels(args.wheels, SITE, every=False):
            sys.path.insert(0, SITE)
            os.environ["PYTHONPATH"] = SITE + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    missing = missing_requirements(args.small)
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    if not args.small:  # before CUDA starts; vLLM's check (a pytest of its own) is given torch's default back
        from infra import memory
        memory.configure_allocator("hf", "cuda")
    summary = {"header": header(args.small, SITE)}
    results = run_checks(args, summary, checks(args, summary["header"]["model"], summary))
    print("\n| check | result | seconds | detail |\n|---|---|---|---|")
    for name, status, detail, seconds in results:
        print(f"| {name} | {status} | {seconds:.0f} | {detail} |")
    if summary.get("cost_table"):
        print(f"\nA Voting math step and a 500-step cell on this GPU (bench/gpu_cost.py):\n{summary['cost_table']}")
    return 1 if any(status == "FAIL" for _, status, _, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())

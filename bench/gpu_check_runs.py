"""The GPU check's runs of train.py and eval.py (bench/gpu_check.py runs them as checks): what a paper cell runs,
at a cell's configuration, in a process of their own, on local files.

What it is for: the checks that go through the programs a researcher runs, not through functions: 2 IP steps with
a validation pass before and after, an SP step paying --kl-coef, and eval.py on prompts near the cell's evaluation
length, each with a learnable stand-in reward (even-length outputs win: a random or untrained model earns no math
reward, so advantages and gradients would be 0). Each returns (status, detail) and puts what it measured into the
summary. What it is not: the memory bound of one update against the plan, the dtype check or pytest (gpu_check.py).

    python3 bench/gpu_check.py --only training,training-sp,eval --small    # these, on CPU
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from gpu_cost import compiled  # noqa: E402 (bench/, beside this file)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARITY = """
import sys
sys.path.insert(0, {root!r})
import tasks, workflows, {program}
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs]
{program}.main(sys.argv[1:])
"""
# the training check's reserved peak against its allocated one: the first GPU run had 77.8 / 13.2 = 5.9 with the
# default allocator (issue 57); growing segments and an emptied cache after the rollout should hold it near 1
RESERVED_OVER_ALLOCATED = 1.5
EVAL_NEW_TOKENS = (8, 32)  # --small, GPU: eval.py's response length (the prompts are what is checked)


def write_data(work: str, small: bool, tokenizer) -> dict[str, str]:
    """Local files in the cells' DAPO format (nothing from the hub): 200 training and 30 validation problems of
    synthetic math, and 4 problems (2 with --small) whose text makes the aggregator's prompt about `eval_prompt`
    tokens, just under Voting-math's evaluation limit (`eval_lengths`)."""
    import tasks
    paths = {name: os.path.join(work, f"{name}.jsonl") for name in ("data", "val", "long")}
    try:
        import datasets  # noqa: F401 (the cells' split of a data file)
    except Exception as e:  # an ImportError, or a broken dependency's own error
        paths["note"] = f"; datasets does not import ({type(e).__name__}): synthetic math instead of the cell's files"
    prompt, new = eval_lengths(small)
    # room for the template and instructions (about 430 tokens) and 3 solutions (a decoded random token can
    # come back as up to 3)
    filler = long_text(tokenizer, prompt - 700 - 9 * new)
    rows = {"data": [(t.question, t.answer) for t in tasks.synthetic_math(200, difficulty=1, seed=1)],
            "val": [(t.question, t.answer) for t in tasks.synthetic_math(30, difficulty=1, seed=2)],
            "long": [(f"{t.question} Context: {filler}", t.answer)
                     for t in tasks.synthetic_math(2 if small else 4, difficulty=1, seed=3)]}
    for name, problems in rows.items():
        with open(paths[name], "w") as f:
            f.writelines(json.dumps({"problem": q, "answer": a}) + "\n" for q, a in problems)
    return paths


def eval_lengths(small: bool) -> tuple[int, int]:
    """(prompt limit, new tokens) of the eval check: Voting-math's evaluation prompt limit, 25,600 tokens, on the
    GPU; 2,048 with --small."""
    from infra.cells import PAPER_LENGTHS
    return (2048 if small else PAPER_LENGTHS["math", "voting"][2]), EVAL_NEW_TOKENS[not small]


def long_text(tokenizer, tokens: int) -> str:
    """Words that `tokenizer` makes about `tokens` tokens of (within one word)."""
    words = "the sum of the squares of the first terms of a sequence is given as follows".split()
    text = " ".join(words)
    per_word = len(tokenizer(text, add_special_tokens=False).input_ids) / len(words)
    return " ".join(words[i % len(words)] for i in range(int(tokens / per_word)))


def run_program(program: str, argv: list[str], timeout: int) -> tuple[int, str]:
    """`program`.main(argv) (train or eval) with the stand-in reward, in a process of its own: (exit status, the
    last line of its stderr)."""
    done = subprocess.run([sys.executable, "-c", PARITY.format(root=ROOT, program=program), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, (done.stderr.strip().splitlines() or ["?"])[-1]


def training_flags(small: bool, data: dict) -> list[str]:
    """The runs' sizes, and their data: the cell's format from local files, or where `datasets` does not import
    (the cells' split needs it) the synthetic math task, said in `data["note"]`."""
    sizes = ["--device", "cpu", "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "16"] if small else \
        ["--tasks-per-step", "8", "--max-new-tokens", "256"]  # rows per generate() call: the memory budget
    sizes += ["--decode", "static"]  # the HF engine's compiled decode on CUDA (--small: its code path, uncompiled)
    if data.get("note"):
        return [*sizes, "--task", "math", "--data", "", "--val-data", ""]
    return [*sizes, "--data", data["data"], "--val-data", data["val"]]


def check_training(small: bool, model: str, work: str, data: dict, summary: dict) -> tuple[str, str]:
    """One step of the Voting-IP cell configuration, validated before and after it (30 problems; the first
    validation warms the engine, so the step's rollout rate is a warm one): the step finite, both adapters with a
    non-zero gradient, the validation counted; the step time, rollout and update tokens/s, the trainer's
    allocated and reserved peaks, vLLM's drift where it ran. Its run folder is the eval check's."""
    import importlib.util
    engine = "vllm" if not small and importlib.util.find_spec("vllm") else "hf"
    run = os.path.join(work, "run-ip")
    status, last = run_program("train", ["--cell", "Voting-IP-0.6B-Math", "--model", model, "--steps", "1",
                                         "--val-every", "1", "--engine", engine, "--overwrite", "--run-dir", run,
                                         *training_flags(small, data)], 300)
    if status != 0:
        return "FAIL", f"train.py exited {status}: {last}"
    steps = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    summary["training_metrics"] = steps
    trained = [m for m in steps if m["step"] > 0]
    grads = {r: max(m[f"{r}/grad_norm"] for m in trained) for r in ("generator", "aggregator")}
    validated = [m["step"] for m in steps if m.get("val/success") is not None]
    ok = [m["step"] for m in trained] == [1] and validated == [0, 1] and min(grads.values()) > 0 and \
        not any(m["nonfinite_steps"] for m in trained)
    seconds = sum(m["time_rollout"] + m["time_update"] for m in trained) / len(trained)
    rates = ", ".join(f"{k} {' then '.join(f'{m[k]:,.0f}' for m in trained)}" for k in ("rollout_tok_s", "update_tok_s")
                      if k in trained[0])
    detail = (f"{engine}{' (static decode)' if engine == 'hf' else ''}, {seconds:.1f} s a step ({rates}), "
              f"validation at steps {validated}, gradient norms generator {grads['generator']:.3g} "
              f"aggregator {grads['aggregator']:.3g}{peaks(trained[-1])}")
    if "memory/peak_gib" in trained[-1]:  # the allocator grows segments, the cache is emptied after the rollout
        ratio = max(m["memory/peak_reserved_gib"] / m["memory/peak_gib"] for m in trained)
        ok = ok and ratio <= RESERVED_OVER_ALLOCATED
        detail += f", reserved / allocated {ratio:.2f} (bound {RESERVED_OVER_ALLOCATED})"
    stats = {k[len("decode/"):]: v for k, v in trained[-1].items() if k.startswith("decode/")}
    detail += compiled(stats) + (", the static decode FELL BACK to dynamic (no compiler for Triton)"
                                 if trained[-1].get("decode_fallback") else "")
    if "vllm/logprob_drift" in trained[-1]:
        detail += f", vllm/logprob_drift {max(m['vllm/logprob_drift'] for m in trained):.2g}"
    return ("pass" if ok else "FAIL"), detail + data.get("note", "")


def check_training_sp(small: bool, model: str, work: str, data: dict, summary: dict) -> tuple[str, str]:
    """One step of the Voting-SP cell configuration with --kl-coef on both roles: the shared adapter's update
    with SP's per-role gradients, and the base model's reference pass in every micro-batch; finite, each role's
    own gradient and its KL to the base reported."""
    run = os.path.join(work, "run-sp")
    status, last = run_program("train", ["--cell", "Voting-SP-0.6B-Math", "--model", model, "--steps", "1",
                                         "--val-every", "0", "--kl-coef", "generator=0.05,aggregator=0.05",
                                         "--engine", "hf", "--overwrite", "--run-dir", run,
                                         *training_flags(small, data)], 240)
    if status != 0:
        return "FAIL", f"train.py exited {status}: {last}"
    m = json.loads(open(os.path.join(run, "metrics.jsonl")).readlines()[-1])
    summary["training_sp_metrics"] = m
    roles = ("generator", "aggregator")
    # LoRA starts as the base, so the first step's KL to it is rounding (bf16: ~1e-7); a reference pass that
    # lost its shared prompts' cache (transformers < 5.2x in train mode, fixed) gave 0.02
    ok = m["step"] == 1 and not m["nonfinite_steps"] and all(
        m.get(f"{r}/role_grad_norm") and (m.get(f"{r}/kl_base") if m.get(f"{r}/kl_base") is not None else 1) < 1e-3
        for r in roles)
    detail = "SP, --kl-coef generator=0.05,aggregator=0.05: " + ", ".join(
        f"{r} own gradient {m.get(f'{r}/role_grad_norm') or 0:.3g}, KL to base {m.get(f'{r}/kl_base') or 0:.2g}"
        for r in roles) + " (bound 1e-3 at the first step: LoRA starts as the base)" + peaks(m)
    return ("pass" if ok else "FAIL"), detail + data.get("note", "")


def peaks(m: dict) -> str:
    """A record's memory peaks, as the detail's tail ('' on the CPU)."""
    if "memory/peak_gib" not in m:
        return ""
    return f", peak allocated {m['memory/peak_gib']:.1f} GiB, reserved {m['memory/peak_reserved_gib']:.1f} GiB"


def check_eval(small: bool, model: str, work: str, data: dict, summary: dict) -> tuple[str, str]:
    """eval.py on the IP run's adapters, the HF engine, problems whose aggregator prompt is near Voting-math's
    evaluation limit: every episode reaches its aggregator (no prompt over the limit). On CUDA the allocated peak
    must stay within the HF budget's own bound for the largest generate() call (infra/memory.py): the weights,
    the adapters and 12 rows (4 problems x 3 generators) of the limit plus the new tokens."""
    run, out = os.path.join(work, "run-ip"), os.path.join(work, "eval.jsonl")
    if not os.path.exists(os.path.join(run, "args.json")):
        return "skip", "needs the training check's run"
    prompt, new = eval_lengths(small)
    if os.path.exists(out):
        os.remove(out)
    status, last = run_program("eval", ["--run-dir", run, "--data", data["long"], "--max-prompt-tokens",
                                        str(prompt), "--max-new-tokens", str(new), "--engine", "hf", "--out", out],
                               240)
    if status != 0:
        return "FAIL", f"eval.py exited {status}: {last}"
    record = json.loads(open(out).readlines()[-1])
    summary["eval_record"] = record
    overflow = record["metrics"].get("prompt_overflow") or 0.0
    detail = f"{record['tasks']} problems, prompts up to {prompt} tokens, {new} new: prompt_overflow {overflow:.2f}"
    ok = overflow == 0
    if "memory/peak_gib" in record:
        bound = eval_bound(model, rows=3 * record["tasks"], width=prompt + new)
        ok = ok and record["memory/peak_gib"] <= bound
        detail += peaks(record) + f" (bound {bound:.1f} GiB)"
    return ("pass" if ok else "FAIL"), detail


def eval_bound(model: str, rows: int, width: int) -> float:
    """What the HF budget allows the eval check's largest call, with the weights and adapters (GiB)."""
    import torch

    import policies
    from infra import memory
    lm, _ = policies.load_model(model, torch.bfloat16, "cpu")
    c, size = lm.config, 2
    lora = sum(p.numel() for p in policies.add_adapters(lm, ["generator", "aggregator"], 64, 32).parameters()
               if p.requires_grad)
    kv = memory.kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, size)
    repeated = memory.repeated_kv_bytes_per_token(c.num_attention_heads, c.num_key_value_heads, c.head_dim, size)
    act = memory.prefill_activation_bytes_per_token(c.hidden_size, c.intermediate_size,
                                                    c.num_attention_heads * c.head_dim, size, lora=True)
    per_token = memory.generation_bytes_per_token(kv, c.num_hidden_layers, repeated)
    call = rows * (width + memory.sampling_tokens(per_token, c.vocab_size)) * per_token + \
        memory.generation_fixed_bytes(act, 0, c.vocab_size)
    weights = size * sum(p.numel() for p in lm.parameters() if not p.requires_grad) + 4 * lora
    return (weights + call) / memory.GIB

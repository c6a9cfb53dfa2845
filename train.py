"""Train every role of an LLM workflow with outcome-reward GRPO (SP or IP LoRA adapters).

Paper: the whole of ../shared/PAPER.md; this file is the loop that wires it:
tasks -> workflows (rollout, credit) -> grpo (advantages, update) -> logs,
validation and checkpoints in a run folder.

One step = sample `--tasks-per-step` tasks, run `--n` episodes of the workflow on
each (stage-batched), reward the calls, compute group advantages, update every
adapter. Every step appends one line of metrics to RUN/metrics.jsonl.

    python train.py                                  # SmolLM2-135M on synthetic math, CPU, a few minutes
    python train.py --model tiny --steps 2           # the tiny random model: a smoke test in seconds
    python train.py --steps 60 --val-every 10        # the longer CPU run of the README

Defaults are sized for a CPU; the paper's values are given in each flag's help.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import signal
import time

import numpy as np
import torch
from tqdm import tqdm

import tasks as T
from grpo import AGGREGATIONS, Sample, UpdateSettings, group_advantages, make_optimizers, update_policy
from policies import (VLLM_MISSING, HFEngine, VLLMEngine, add_adapters, load_adapters, load_model, logprob_drift,
                      read_adapters, route_adapter, save_adapters, vllm_model_folder)
from workflows import ROLES, WORKFLOWS, WorkflowOptions, assign_rewards, episode_metrics, rollout

# `--cell Workflow-Policy-Scale-Task` (PAPER.md naming) -> the flags it stands for.
CELL_WORKFLOWS = {"single": "single", "sa": "single", "voting": "voting", "evalopt": "evalopt",
                  "orchworkers": "orchworkers"}
CELL_MODELS = {"0.6b": "Qwen/Qwen3-0.6B", "1.7b": "Qwen/Qwen3-1.7B", "4b": "Qwen/Qwen3-4B",
               "smollm2": "smollm2", "tiny": "tiny"}
PAPER_HYPERPARAMETERS = dict(lr=2e-5, lora_rank=64, lora_alpha=32, tasks_per_step=64, n=8, warmup_steps=15,
                             mini_batch_size=512, one_shot=False)


def cell_defaults(cell: str) -> dict:
    """Flags for a cell name such as `Voting-IP-1.7B-Math`: workflow, policy, model, task, and for Qwen3
    scales the paper's hyperparameters (DAPO-Math / its response budget). Explicit flags still win."""
    parts = cell.lower().replace("-rl", "").split("-")
    if len(parts) != 4 or parts[0].replace("_", "") not in CELL_WORKFLOWS or parts[1] not in ("sp", "ip") \
            or parts[2] not in CELL_MODELS or parts[3] not in ("math",):
        raise SystemExit(f"error: bad --cell {cell!r}; expected Workflow-Policy-Scale-Task such as Voting-IP-1.7B-Math "
                         f"(workflows {sorted(set(CELL_WORKFLOWS))}, policies SP/IP, scales {sorted(CELL_MODELS)}, task Math)")
    out = dict(workflow=CELL_WORKFLOWS[parts[0].replace("_", "")], policy=parts[1], model=CELL_MODELS[parts[2]])
    if parts[2] in ("0.6b", "1.7b", "4b"):
        out.update(PAPER_HYPERPARAMETERS, task="dapo", data="open-r1/DAPO-Math-17k-Processed", data_config="en",
                   max_new_tokens=5120, n_val=1412, dtype="bfloat16")
    return out


def parse_role_values(spec: str | None, flag: str) -> dict[str, float]:
    """`generator=2,aggregator=1` -> {"generator": 2.0, "aggregator": 1.0}, with a one-line error."""
    if not spec:
        return {}
    out = {}
    for item in spec.split(","):
        role, _, value = item.partition("=")
        try:
            out[role.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"error: {flag} expects role=value[,role=value...], got {spec!r}") from None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # model
    p.add_argument("--model", default="smollm2", help="smollm2 (packaged, offline), tiny (random, tests), a folder or hub id")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights dtype (bf16 on GPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--enable-thinking", action="store_true", help="Qwen3 thinking mode (paper: off)")
    # data
    p.add_argument("--task", default="math", choices=["math", "dapo", "code", "deepcoder"],
                   help="math: built-in synthetic; code: built-in HumanEval; dapo / deepcoder: --data file or hub id")
    p.add_argument("--data", default=None, help="DAPO- or DeepCoder-format jsonl/parquet, or a hub id")
    p.add_argument("--data-config", default=None, help="hub dataset config (DAPO-Math-17k-Processed: en)")
    p.add_argument("--difficulty", type=int, default=0, help="synthetic math: 0 one op on 1-digit numbers, 1 on 2-digit, 2 two-three ops, 3 word problems")
    p.add_argument("--n-train", type=int, default=170, help="synthetic math: training problems (difficulty 0 has 243 in all)")
    p.add_argument("--n-val", type=int, default=64, help="validation problems (paper: 10%% held out)")
    # workflow
    p.add_argument("--workflow", default="single", choices=sorted(WORKFLOWS), help="which workflow to train")
    p.add_argument("--credit", default="outcome", choices=["outcome", "role"], help="outcome: final result to every call (paper)")
    p.add_argument("--no-one-shot", dest="one_shot", action="store_false", help="drop the solved example from prompts")
    p.add_argument("--n-votes", type=int, default=3, help="Voting: parallel generators (paper: 3)")
    p.add_argument("--max-iterations", type=int, default=None, help="Eval-Opt: evaluator calls at most (paper: math 3, code 2)")
    p.add_argument("--max-subtasks", type=int, default=3, help="Orch-Workers: strategies / workers at most (paper: 3)")
    p.add_argument("--cell", default=None, help="paper cell such as Voting-IP-1.7B-Math: sets workflow, policy, model, task "
                   "and (Qwen3 scales) the paper's hyperparameters; explicit flags still win")
    # policy
    p.add_argument("--policy", default="sp", choices=["sp", "ip"], help="sp: one shared adapter; ip: one per role type")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (paper: 64)")
    p.add_argument("--lora-alpha", type=int, default=32, help="LoRA alpha (paper: 32)")
    p.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout (paper: 0)")
    # GRPO
    p.add_argument("--tasks-per-step", type=int, default=8, help="tasks per training step (paper: 64)")
    p.add_argument("--n", type=int, default=4, help="episodes per task, the GRPO group size (paper: 8)")
    p.add_argument("--agg", default="seq-mean-token-mean", choices=AGGREGATIONS, help="loss aggregation (paper: seq-mean-token-mean)")
    p.add_argument("--clip-low", type=float, default=0.2, help="PPO clip below 1 (paper: 0.2)")
    p.add_argument("--clip-high", type=float, default=0.28, help="PPO clip above 1, clip-higher (paper: 0.28)")
    p.add_argument("--dual-clip", type=float, default=3.0, help="dual-clip constant for negative advantages (paper: 3)")
    p.add_argument("--no-std-scale", dest="std_scale", action="store_false", help="advantage = r - mean (Dr. GRPO)")
    p.add_argument("--mini-batch-size", type=int, default=0, help="samples per optimizer step; 0 = episodes per step (paper: 512)")
    p.add_argument("--micro-batch-size", type=int, default=8, help="rows per forward/backward (memory only)")
    p.add_argument("--no-share-prompts", dest="share_prompts", action="store_false", help="one forward pass per row "
                   "over its whole prompt (default: a prompt that n rows share runs once per batch, in the rollout "
                   "prefill and the update, and they continue from its KV cache: same numbers up to float rounding)")
    # mechanisms and interventions (PAPER.md findings 3-4, I1, I6)
    p.add_argument("--merge-instance-steps", action="store_true",
                   help="one optimizer step per adapter per training step (default: one per mini-batch, so IP "
                        "parallel roles take one step per instance, as in the paper)")
    p.add_argument("--role-weights", default=None, help="SP: target loss share per role, 'equal' or "
                   "generator=2,aggregator=1 (default: the aggregation's implicit shares, as in the paper)")
    p.add_argument("--skip-zero-advantage", action="store_true", help="no forward/backward for calls whose "
                   "advantage is 0 (groups whose rewards are all equal): the same step, less work; logs skipped_rows, "
                   "and entropy / clip_frac then cover the trained calls only")
    p.add_argument("--diagnose-roles", action="store_true", help="log each role's own gradient norm and the "
                   "cosine between roles' gradients (no extra backward: accumulation is ordered by role)")
    p.add_argument("--kl-coef", default=None, help="I1: role=beta,... adds beta*KL(role||base) (k3) for those roles")
    p.add_argument("--coherence", default=None, help="I6 (IP): role=lambda,... scales the role's gradient by "
                   "1 - lambda*clamp(cos(g, EMA g), 0, 1) before clipping (paper: lambda <= 0.3)")
    p.add_argument("--coherence-window", type=int, default=10, help="I6: EMA window, tau = 1 - 1/window")
    # optimisation
    p.add_argument("--steps", type=int, default=10, help="training steps")
    p.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate (paper: 2e-5 at rank 64 on Qwen3)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (paper: 0.01)")
    p.add_argument("--warmup-steps", type=int, default=3, help="linear warmup, in training steps (paper: 15)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping per adapter (paper: 1.0)")
    # rollout
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="hf: transformers generate with PEFT "
                   "mixed-adapter batches (default, CPU); vllm: in-process vLLM, one LoRA request per role (GPU fast "
                   "path; needs vllm installed, see README 'vLLM engine')")
    p.add_argument("--vllm-gpu-memory", type=float, default=0.4, help="vllm: fraction of GPU memory vLLM may take "
                   "(weights + KV cache); the trainer uses the rest")
    p.add_argument("--vllm-drift-rows", type=int, default=32, help="vllm: rows per step whose sampled-token log-probs "
                   "the trainer recomputes for vllm/logprob_drift (0 = off)")
    p.add_argument("--vllm-drift-warn", type=float, default=0.05, help="vllm: warn when vllm/logprob_drift, the mean "
                   "|vLLM - trainer| log-prob per sampled token, exceeds this (fp32: ~1e-7; bf16 kernels: ~1e-2)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (paper: 0.7)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (paper: 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="response length limit (paper: math 5120, code 2048)")
    p.add_argument("--gen-batch-size", type=int, default=64, help="rows per generate() call (memory only)")
    p.add_argument("--max-prompt-tokens", type=int, default=4096, help="longer prompts keep their last N tokens "
                   "(counted as <role>/prompt_truncated) (paper: math 15-30k, code 4-10k)")
    # logging
    p.add_argument("--run-dir", default=None, help="run folder (default runs/<workflow>-<policy>-<time>)")
    p.add_argument("--val-every", type=int, default=5, help="validate every N steps (and before step 1); 0 = never")
    p.add_argument("--val-n", type=int, default=1, help="samples per validation task (accuracy = mean over them)")
    p.add_argument("--save-every", type=int, default=10, help="checkpoint every N steps (and at the end); 0 = end only")
    p.add_argument("--keep-last", type=int, default=0, help="keep only the newest N checkpoints; 0 = keep all")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its latest complete "
                   "checkpoint, with its saved flags (only --steps may be changed, to extend it)")
    p.add_argument("--max-nonfinite-steps", type=int, default=3,
                   help="stop after this many training steps in a row with a non-finite loss or gradient")
    p.add_argument("--seed", type=int, default=0, help="seeds data order, sampling and LoRA init")
    p.add_argument("--wandb", action="store_true", help="also log to Weights & Biases (needs wandb installed)")
    args = p.parse_args(argv)
    if args.resume:  # the run's own flags, so a resumed run is the same run; --steps may extend it
        saved = os.path.join(args.resume, "args.json")
        if not os.path.isfile(saved):
            raise SystemExit(f"error: --resume {args.resume}: no args.json there (not a run folder)")
        run_dir, steps = args.resume, (args.steps if args.steps != p.get_default("steps") else None)
        with open(saved) as f:  # a flag added since the run was saved takes its default
            args = argparse.Namespace(**{**vars(p.parse_args([])), **json.load(f)})
        args.resume = args.run_dir = run_dir
        args.steps = steps or args.steps
        return args
    if args.cell:  # the cell's values become defaults, then the command line is read again on top of them
        p.set_defaults(**cell_defaults(args.cell))
        args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args) -> None:
    """Contradictory or unknown settings stop here, with one line, before any model loads."""
    roles = ROLES[args.workflow]
    if args.max_iterations is None:
        args.max_iterations = 2 if args.task in ("code", "deepcoder") else 3  # the paper's budgets
    if args.role_weights == "equal":
        args.role_weights = ",".join(f"{r}=1" for r in roles)
    for flag in ("role_weights", "kl_coef", "coherence"):
        values = parse_role_values(getattr(args, flag), "--" + flag.replace("_", "-"))
        unknown = sorted(set(values) - set(roles))
        if unknown:
            raise SystemExit(f"error: --{flag.replace('_', '-')} names {unknown}, not roles of {args.workflow} {roles}")
        setattr(args, flag, values)
    if args.role_weights and args.policy == "ip":
        raise SystemExit("error: --role-weights sets shares inside one shared adapter; it needs --policy sp")
    if args.coherence and args.policy == "sp":
        raise SystemExit("error: --coherence acts on a role's own adapter gradient; it needs --policy ip")
    if args.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise SystemExit(VLLM_MISSING)


class NoLogger:
    """Stands in for wandb when it is off, so the loop has no `if wandb:` branches."""
    def log(self, metrics: dict, step: int) -> None:
        pass


def load_tasks(args) -> tuple[list[T.Task], list[T.Task]]:
    """(train, validation) tasks. Loaded data is split by a fixed shuffle (seed 42, as the paper's
    train_test_split), holding out --n-val problems but never more than 10%."""
    if args.task == "math":
        return T.math_splits(args.n_train, args.n_val, args.difficulty, args.seed)
    if args.task == "code":
        rows = T.humaneval_tasks()
    elif not args.data:
        raise SystemExit(f"error: --task {args.task} needs --data PATH_OR_HUB_ID")
    else:
        load = T.load_math if args.task == "dapo" else T.load_code
        try:
            rows = load(args.data, config=args.data_config)
        except T.DataError as e:
            raise SystemExit(f"error: {e}") from None
    random.Random(42).shuffle(rows)
    n_val = min(args.n_val, len(rows) // 10 or 1)
    return rows[n_val:], rows[:n_val]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_trainer(args, device: str = "cpu"):
    """The model with its adapters (SP: `shared`; IP: one per role type), one optimizer per adapter, the
    generation engine and the workflow/update settings, all from the flags."""
    model, tokenizer = load_model(args.model, getattr(torch, args.dtype), device, args.seed)
    if args.engine == "vllm":  # vLLM reads base weights from disk: find (tiny: write) them before adapters wrap them
        base_folder = vllm_model_folder(args.model, model, tokenizer)
    adapters = sorted({route_adapter(r, args.policy) for r in ROLES[args.workflow]})
    model = add_adapters(model, adapters, args.lora_rank, args.lora_alpha, args.lora_dropout)
    optimizers = make_optimizers(model, adapters, args.lr, args.weight_decay, args.warmup_steps)
    if args.engine == "vllm":
        engine = VLLMEngine(base_folder, model, tokenizer, args.max_new_tokens, args.temperature, args.top_p,
                            args.vllm_gpu_memory, args.dtype, args.seed)
    else:
        engine = HFEngine(model, tokenizer, args.max_new_tokens, args.temperature, args.top_p, args.gen_batch_size,
                          args.share_prompts)
    opts = WorkflowOptions(one_shot=args.one_shot, n_votes=args.n_votes, max_iterations=args.max_iterations,
                           max_subtasks=args.max_subtasks)
    settings = UpdateSettings(
        mini_batch_size=args.mini_batch_size or args.tasks_per_step * args.n, micro_batch_size=args.micro_batch_size,
        agg=args.agg, norm_len=args.max_new_tokens, clip_low=args.clip_low, clip_high=args.clip_high,
        dual_clip=args.dual_clip, max_grad_norm=args.max_grad_norm, temperature=args.temperature,
        role_weights=args.role_weights, merge_instance_steps=args.merge_instance_steps,
        diagnose_roles=args.diagnose_roles, kl_coef=args.kl_coef, coherence=args.coherence,
        coherence_window=args.coherence_window, share_prompts=args.share_prompts,
        skip_zero_advantage=args.skip_zero_advantage)
    return model, tokenizer, optimizers, engine, opts, settings


def train_step(batch: list[T.Task], args, model, tokenizer, engine, opts, optimizers, settings,
               grad_ema: dict) -> dict[str, float]:
    """One GRPO step: `args.n` episodes per task (stage-batched rollout), rewards per call, group
    advantages, one update of every adapter. Returns the step's metrics (timings included)."""
    t0 = time.time()
    episodes = rollout(batch, args.n, args.workflow, engine, tokenizer, args.policy, opts, args.enable_thinking,
                       max_prompt_tokens=args.max_prompt_tokens)
    t_rollout = time.time() - t0
    assign_rewards(episodes, args.credit)
    calls = [(e.task.id, c) for e in episodes for c in e.calls]
    advantages = group_advantages([c.reward for _, c in calls], [c.group_key(tid) for tid, c in calls],
                                  args.std_scale)
    samples = []
    for (_, c), a in zip(calls, advantages):
        c.advantage = a
        samples.append(Sample(c.prompt_ids, c.completion_ids, a, c.role, c.adapter))
    drift = {}
    if args.engine == "vllm":  # before the update: the trainer still holds the weights vLLM sampled with
        drift = vllm_drift([c for _, c in calls], model, args)
        engine.sleep()  # frees vLLM's GPU memory for the update (where sleep mode exists)
    t1 = time.time()
    m = update_policy(model, samples, optimizers, settings, grad_ema)
    t_update = time.time() - t1
    if args.engine == "vllm":
        engine.wake_up()
        engine.sync_adapters(model, sorted({s.adapter for s in samples}))  # new versions of the updated adapters
    gen_tokens = sum(len(c.completion_ids) for _, c in calls)
    train_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    m.update(episode_metrics(episodes), **drift)
    m.update(reward=sum(c.reward for _, c in calls) / len(calls), time_rollout=t_rollout, time_update=t_update,
             rollout_tok_s=gen_tokens / t_rollout, update_tok_s=train_tokens / t_update)
    return m


def vllm_drift(calls: list, model, args) -> dict[str, float]:
    """`vllm/logprob_drift`: mean |vLLM - trainer| log-prob of the sampled tokens, on --vllm-drift-rows calls
    spread over the step. Near 0 means the trainer's ratios are taken against what vLLM actually sampled."""
    if args.vllm_drift_rows <= 0:
        return {}
    rows = calls[::max(1, len(calls) // args.vllm_drift_rows)][:args.vllm_drift_rows]
    drift = logprob_drift(model, [c.prompt_ids for c in rows], [c.completion_ids for c in rows],
                          [c.adapter for c in rows], [c.sample_logprobs for c in rows], args.micro_batch_size)
    if drift > args.vllm_drift_warn:
        tqdm.write(f"warning: vllm/logprob_drift {drift:.4f} > --vllm-drift-warn {args.vllm_drift_warn}: vLLM and the "
                   "trainer disagree on the sampled tokens' log-probs (dtype, kernels, or a stale adapter)")
    return {"vllm/logprob_drift": drift}


def validate(val_tasks, args, engine, tokenizer, opts) -> dict[str, float]:
    episodes = rollout(val_tasks, args.val_n, args.workflow, engine, tokenizer, args.policy, opts, args.enable_thinking,
                       desc="validate", max_prompt_tokens=args.max_prompt_tokens)
    return {f"val/{k}": v for k, v in episode_metrics(episodes).items()}


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_folder(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "checkpoints", f"step_{step:06d}")


def save_checkpoint(run_dir: str, step: int, model, optimizers, grad_ema: dict, keep_last: int = 0) -> str:
    """Everything a resumed run needs, written atomically: into step_N.tmp, flushed, then renamed.

    adapters/ (PEFT folders), state.pt (optimizer and schedule of each adapter, I6 state, the random
    states of python, numpy and torch) and state.json (the step). The data order is a function of
    the seed and the step, so nothing more is needed to continue exactly.
    """
    final = checkpoint_folder(run_dir, step)
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_adapters(model, os.path.join(tmp, "adapters"))
    torch.save({"optimizers": {a: (o.state_dict(), s.state_dict()) for a, (o, s) in optimizers.items()},
                "grad_ema": grad_ema, "rng": rng_state()}, os.path.join(tmp, "state.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    for root, _, files in os.walk(tmp):  # on disk before the rename makes the checkpoint visible
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    if keep_last > 0:
        for old in checkpoint_steps(run_dir)[:-keep_last]:
            shutil.rmtree(checkpoint_folder(run_dir, old), ignore_errors=True)
    return final


def checkpoint_steps(run_dir: str) -> list[int]:
    """Steps of the complete checkpoints of a run (renamed into place), ascending; partial ones are reported."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    steps = []
    for d in sorted(os.listdir(folder)):
        if d.endswith(".tmp"):
            print(f"warning: ignoring partial checkpoint {os.path.join(folder, d)} (a save was interrupted)")
        elif d.startswith("step_") and os.path.isfile(os.path.join(folder, d, "state.json")):
            steps.append(int(d[len("step_"):]))
    return steps


def resume_from_checkpoint(run_dir: str, model, optimizers, grad_ema: dict) -> int:
    """Load the newest checkpoint that reads back whole; an unreadable one is skipped with a warning.
    Returns its step (0 if there is none). Everything is read before anything is applied."""
    for step in reversed(checkpoint_steps(run_dir)):
        folder = checkpoint_folder(run_dir, step)
        try:
            weights = read_adapters(os.path.join(folder, "adapters"), list(optimizers))
            state = torch.load(os.path.join(folder, "state.pt"), weights_only=False)  # our own file: it holds rng tuples
        except Exception as e:  # a truncated or corrupted file: fall back to the previous checkpoint
            print(f"warning: checkpoint {folder} is unreadable ({type(e).__name__}: {e}); trying the previous one")
            continue
        load_adapters(model, "", weights)
        for a, (opt, sched) in optimizers.items():
            opt.load_state_dict(state["optimizers"][a][0])
            sched.load_state_dict(state["optimizers"][a][1])
        grad_ema.update(state["grad_ema"])
        set_rng_state(state["rng"])
        print(f"resumed {run_dir} from step {step}")
        return step
    print(f"warning: {run_dir} has no readable checkpoint; starting from step 0")
    return 0


def keep_metrics_until(path: str, step: int) -> None:
    """Drop metric lines of steps after `step` (written after the checkpoint a resume starts from)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and json.loads(ln)["step"] <= step]
    with open(path + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(path + ".tmp", path)


class GracefulStop:
    """First Ctrl-C: finish the current step, save a checkpoint, stop. Second: stop at once
    (the last checkpoint on disk is still complete: saves are atomic)."""

    def __init__(self):
        self.requested = False
        self.previous = signal.signal(signal.SIGINT, self._handle)

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self.previous)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ninterrupt: finishing this step, then saving a checkpoint (Ctrl-C again to stop now)")


def check_run_dir(run_dir: str) -> None:
    try:
        os.makedirs(run_dir, exist_ok=True)
        probe = os.path.join(run_dir, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise SystemExit(f"error: cannot write run folder {run_dir}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    run_dir = args.run_dir or os.path.join("runs", f"{args.workflow}-{args.policy}-{time.strftime('%Y%m%d-%H%M%S')}")
    args.run_dir = run_dir
    check_run_dir(run_dir)
    print("config:", json.dumps(vars(args), sort_keys=True))
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump({**vars(args), "resume": None}, f, indent=1)
    logger = NoLogger()
    if args.wandb:
        import wandb
        logger = wandb.init(project="marl-workflows", config=vars(args))

    seed_everything(args.seed)
    train_tasks, val_tasks = load_tasks(args)
    model, tokenizer, optimizers, engine, opts, settings = build_trainer(args, device)
    grad_ema: dict = {}  # I6 state, carried across steps
    order = list(range(len(train_tasks)))
    random.Random(args.seed).shuffle(order)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    start = 0
    if args.resume:
        start = resume_from_checkpoint(run_dir, model, optimizers, grad_ema)
        if args.engine == "vllm":
            engine.sync_adapters(model)  # vLLM started from the fresh adapters: give it the checkpoint's
        keep_metrics_until(metrics_path, start)
    metrics_file = open(metrics_path, "a")
    stop, bad_steps = GracefulStop(), 0

    if args.val_every and start == 0:
        m = validate(val_tasks, args, engine, tokenizer, opts)
        print(f"step 0 | val acc {m['val/success']:.3f}")
        metrics_file.write(json.dumps({"step": 0, **m}) + "\n")
        metrics_file.flush()
    for step in tqdm(range(start + 1, args.steps + 1), desc="train", disable=None):
        pos = (step - 1) * args.tasks_per_step
        batch = [train_tasks[order[(pos + i) % len(order)]] for i in range(args.tasks_per_step)]
        m = {"step": step, **train_step(batch, args, model, tokenizer, engine, opts, optimizers, settings, grad_ema)}
        if args.val_every and step % args.val_every == 0:
            m.update(validate(val_tasks, args, engine, tokenizer, opts))
        tqdm.write(f"step {step} | reward {m['reward']:.3f} | success {m['success']:.3f}"
                   + (f" | val acc {m['val/success']:.3f}" if "val/success" in m else "")
                   + f" | rollout {m['time_rollout']:.1f}s update {m['time_update']:.1f}s")
        metrics_file.write(json.dumps(m) + "\n")
        metrics_file.flush()
        logger.log(m, step=step)
        if (args.save_every and step % args.save_every == 0) or step == args.steps or stop.requested:
            save_checkpoint(run_dir, step, model, optimizers, grad_ema, args.keep_last)
        bad_steps = bad_steps + 1 if m["nonfinite_steps"] else 0
        if bad_steps >= args.max_nonfinite_steps:
            raise SystemExit(f"error: {bad_steps} training steps in a row had a non-finite loss or gradient (their "
                             f"optimizer steps were skipped); stopping at step {step}. Lower --lr or check the data.")
        if stop.requested:
            print(f"stopped after step {step}; continue with: python train.py --resume {run_dir}")
            break
    metrics_file.close()
    stop.restore()
    print(f"run folder: {run_dir}")
    return run_dir


if __name__ == "__main__":
    main()

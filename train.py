"""Train every role of an LLM workflow with outcome-reward GRPO (SP or IP LoRA adapters).

The method notes, docs/method.md, describe what this file wires together: tasks -> workflows (rollout,
credit) -> grpo (advantages, update) -> logs, validation and checkpoints in a run folder.

One step = sample `--tasks-per-step` tasks, run `--group-size` episodes of the workflow on each
(stage-batched), reward the calls, compute group advantages, update every adapter. Every step appends one
line of metrics to RUN/metrics.jsonl.

    python train.py --model tiny --steps 2           # the tiny random model: a smoke test in seconds
    python train.py                                  # SmolLM2-135M on synthetic math, CPU, about 6 minutes
    python train.py --cell Voting-IP-1.7B-Math       # a paper cell on a GPU (python train.py --list-cells)
    torchrun --standalone --nproc_per_node 2 train.py --cell Voting-IP-1.7B-Math     # on 2 GPUs

Defaults are sized for a CPU; the paper's values are given in each flag's help. Bad input stops before
anything loads or is written: one line, exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

import grpo
import policies
import tasks
import workflows
from eval import play_every_problem
from grpo import UpdateSettings
from infra import cells, checkpoints, distributed, memory, samples, toy, toy_model, vllm_engine
from infra.runfolder import (
    GracefulStop,
    HelpFormatter,
    Parser,
    WriteError,
    check_environment,
    check_run_dir,
    given_flags,
    json_line,
    keep_metrics_until,
    number,
    read_results,
    read_run_args,
    role_values,
    usage_error,
    write_args,
    writing,
)
from infra.tallies import add_tallies, rates
from workflows import ROLES, WORKFLOWS

# Flags a resumed run may change: they change how it runs or reports, not what it trains on or how.
RESUMABLE = ("steps", "val_every", "val_n", "save_every", "keep_last", "wandb", "device", "gen_batch_size",
             "gen_max_tokens", "micro_batch_size", "max_tokens_per_micro_batch", "grad_checkpointing",
             "vllm_gpu_memory", "val_samples")
MAX_NONFINITE_STEPS = 3  # training steps in a row with a non-finite loss or gradient before the run stops
COUNT, COUNT0 = number(int, 1), number(int, 0)                  # >= 1, >= 0
POSITIVE, NONNEGATIVE = number(float, 0, low_open=True), number(float, 0)
FRACTION = number(float, 0, 1, low_open=True)                  # (0, 1]


def build_parser() -> Parser:
    """The flags, in groups; each help ends with its default, and names the paper's value where ours differs."""
    p = Parser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="smollm2", help="smollm2 (packaged), toy (the toy world: built once per "
                   "--seed), tiny or tiny-qwen3 (random, tests), random-qwen3-0.6b, a model folder or a hub id")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights dtype (GPU: bf16)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--enable-thinking", action="store_true", help="Qwen3 thinking mode (paper: off)")
    g.add_argument("--chat-template", default="model", choices=["model", "rllm"], help="model: the tokenizer's "
                   "own; rllm: as the reference's rLLM Qwen parser rendered it (cells)")
    g = p.add_argument_group("data")
    g.add_argument("--task", default="math", choices=["math", "dapo", "code", "deepcoder"], help="math, code: "
                   "built in (synthetic, HumanEval); dapo, deepcoder: --data")
    g.add_argument("--data", default=None, help="DAPO- or DeepCoder-format .jsonl/.json/.parquet, or a hub id")
    g.add_argument("--data-config", default=None, help="hub dataset config (DAPO-Math-17k-Processed: en)")
    g.add_argument("--difficulty", type=int, default=0, choices=[0, 1], help="synthetic math: one op on 1- or "
                   "2-digit numbers")
    g.add_argument("--n-train", type=COUNT, default=170, help="synthetic math: training problems")
    g.add_argument("--n-val", type=COUNT, default=64, help="validation problems (loaded data: of its held-out rows)")
    g.add_argument("--val-data", default=None, help="validate on this file or hub id instead (math cells: "
                   "MathArena/aime_2025); default: --data's held-out rows")
    g = p.add_argument_group("workflow")
    g.add_argument("--workflow", default="single", choices=sorted(WORKFLOWS), help="its roles: "
                   + "; ".join(f"{w} {'/'.join(r)}" for w, r in ROLES.items()))
    g.add_argument("--cell", default=None, help="a paper cell, e.g. Voting-IP-1.7B-Math: sets all its flags")
    g.add_argument("--list-cells", action="store_true", help="print the paper's 48 cells and what each sets")
    g.add_argument("--credit", default="outcome", choices=["outcome", "role"], help="outcome: the final result "
                   "to every call (paper); role: each call its own correctness")
    g.add_argument("--prompts", default="small", choices=["small", "paper"], help="paper: the reference's "
                   "instructions in our words; small: brief ones and a solved example (cells: paper)")
    g.add_argument("--evalopt-context", default="reference", choices=["reference", "clean"], help="Eval-Opt: one "
                   "shared conversation (paper); clean: the problem and the latest attempt only")
    g.add_argument("--n-votes", type=COUNT, default=3, help="Voting: parallel generators (paper: 3)")
    g.add_argument("--max-iterations", type=COUNT, default=None, help="Eval-Opt: evaluator calls at most "
                   "(default: math 3, code 2, as the paper)")
    g.add_argument("--max-subtasks", type=COUNT, default=3, help="Orch-Workers: strategies, workers (paper: 3)")
    g = p.add_argument_group("policy")
    g.add_argument("--policy", default="sp", choices=["sp", "ip"], help="sp: one shared adapter; ip: one per role")
    g.add_argument("--lora-rank", type=COUNT, default=16, help="LoRA rank (paper: 64)")
    g.add_argument("--lora-alpha", type=COUNT, default=32, help="LoRA alpha (paper: 32)")
    add_grpo_flags(p)
    add_run_flags(p)
    return p


def add_grpo_flags(p: Parser) -> None:
    g = p.add_argument_group("GRPO")
    g.add_argument("--tasks-per-step", type=COUNT, default=8, help="tasks per training step (paper: 64)")
    g.add_argument("--group-size", "--n", dest="n", type=COUNT, default=4, help="episodes per task, the GRPO "
                   "group (paper: 8); under torchrun write --group-size")
    g.add_argument("--agg", default="seq-mean-token-mean", choices=grpo.AGGREGATIONS, help="loss aggregation")
    g.add_argument("--clip-low", type=number(float, 0, 1, True, True), default=0.2, help="PPO clip below 1")
    g.add_argument("--clip-high", type=POSITIVE, default=0.28, help="PPO clip above 1 (clip-higher)")
    g.add_argument("--dual-clip", type=number(float, 1, low_open=True), default=3.0, help="dual-clip constant")
    g.add_argument("--no-std-scale", dest="std_scale", action="store_false", help="advantage = r - mean (Dr. GRPO)")
    g.add_argument("--mini-batch-size", type=COUNT0, default=0, help="samples per optimizer step; 0 = a step's "
                   "episodes (paper: 512)")
    g.add_argument("--micro-batch-size", type=COUNT, default=8, help="rows per forward/backward at most")
    g.add_argument("--max-tokens-per-micro-batch", type=COUNT0, default=0, help="padded tokens per forward/backward "
                   "at most; 0 = rows only (cells: 51200)")
    g.add_argument("--grad-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                   help="recompute activations in backward: memory for time (cells: on)")
    g.add_argument("--no-share-prompts", dest="share_prompts", action="store_false", help="run every row's whole "
                   "prompt (default: n rows that share a prompt run it once)")
    g.add_argument("--skip-zero-advantage", action="store_true", help="skip calls with advantage 0: the same "
                   "step, less work (entropy and clip_frac then cover the trained calls)")
    g = p.add_argument_group("findings 3-4 and the interventions I1, I6 (role names: see --workflow)")
    g.add_argument("--merge-instance-steps", action="store_true", help="one optimizer step per adapter per "
                   "training step (default: one per mini-batch, as the paper)")
    g.add_argument("--role-weights", default=None, help="SP: loss share per role, 'equal' or "
                   "generator=2,aggregator=1 (default: the aggregation's own shares, as the paper)")
    g.add_argument("--kl-coef", default=None, help="I1: role=beta,... adds beta * KL(role || base)")
    g.add_argument("--coherence", default=None, help="I6 (IP): role=lambda,... lambda in (0, 1] (paper: <= 0.3)")
    g.add_argument("--coherence-window", type=COUNT, default=128, help="I6: EMA window, tau = 1 - 1/window")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=COUNT0, default=10, help="training steps")
    g.add_argument("--lr", type=POSITIVE, default=5e-4, help="AdamW learning rate (paper: 2e-5 at rank 64)")
    g.add_argument("--weight-decay", type=NONNEGATIVE, default=0.01, help="AdamW weight decay (paper: 0.01)")
    g.add_argument("--warmup-steps", type=COUNT0, default=3, help="linear warm-up steps (paper: 15)")
    g.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine", "verl-constant"], help="after "
                   "warm-up; cosine: to 0 at the last step (the paper's config); verl-constant: what its runs did, "
                   "from lr 0, counting adapter updates (cells)")
    g.add_argument("--max-grad-norm", type=POSITIVE, default=1.0, help="gradient clipping per adapter (paper: 1)")


def add_run_flags(p: Parser) -> None:
    g = p.add_argument_group("rollout")
    g.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"], help="auto: vllm on CUDA when it "
                   "imports, else hf (transformers generate)")
    g.add_argument("--temperature", type=NONNEGATIVE, default=0.7, help="sampling temperature (paper: 0.7)")
    g.add_argument("--top-p", type=FRACTION, default=1.0, help="nucleus sampling (paper: 1.0)")
    g.add_argument("--max-new-tokens", type=COUNT, default=64, help="response limit (paper: math 5120, code 2048)")
    g.add_argument("--max-prompt-tokens", type=COUNT, default=4096, help="a longer prompt ends its episode, as in "
                   "the paper (prompt_overflow)")
    g.add_argument("--gen-batch-size", type=COUNT, default=64, help="rows per generate() call (memory only)")
    g.add_argument("--gen-max-tokens", type=COUNT0, default=0, help="hf: tokens per generate() call, rows x (prompt "
                   "+ new tokens); 0 = on CUDA what the free memory holds as KV cache (infra/memory.py), on CPU none")
    g.add_argument("--vllm-gpu-memory", type=FRACTION, default=0.4, help="vllm: fraction of GPU memory it takes")
    g = p.add_argument_group("run folder and logging")
    g.add_argument("--run-dir", default=None, help="run folder (default: runs/<workflow>-<policy>-<time>)")
    g.add_argument("--overwrite", action="store_true", help="move a run in --run-dir aside to <run-dir>.old-<time>")
    g.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run, with its own flags; only --"
                   + ", --".join(RESUMABLE).replace("_", "-") + " may change")
    g.add_argument("--val-every", type=COUNT0, default=5, help="validate every N steps, first and last; 0 = never")
    g.add_argument("--val-n", type=COUNT, default=1, help="samples per validation task")
    g.add_argument("--val-samples", type=COUNT0, default=4, help="the first N validation tasks: their episodes, every "
                   "call, go to RUN/samples/step_<N>.json at each validation (eval.py report); 0 = none")
    g.add_argument("--save-every", type=COUNT0, default=10, help="checkpoint every N steps and at the end")
    g.add_argument("--keep-last", type=COUNT0, default=0, help="keep only the newest N checkpoints; 0 = all")
    g.add_argument("--seed", type=int, default=0, help="seeds data order, sampling and LoRA init")
    g.add_argument("--wandb", action="store_true", help="also log to Weights & Biases (pip install wandb)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags -> a checked Namespace; nothing is loaded or written here. On --resume, the run's own flags."""
    argv = sys.argv[1:] if argv is None else argv
    p = build_parser()
    args = p.parse_args(argv)
    if args.list_cells:
        print(cells.list_cells())
        raise SystemExit(0)
    given = given_flags(p, argv)  # what the command line names: it wins over a cell, and a resume applies it
    if args.resume:
        args = resume_args(p, args, given)
    else:
        if args.cell:  # the cell's values stand in for defaults; what the command line gives wins
            try:
                cell = cells.cell_defaults(args.cell)
            except ValueError as e:
                usage_error(str(e))
            for key, value in cell.items():
                if key not in given:
                    setattr(args, key, value)
        args.run_dir = args.run_dir or os.path.join("runs", f"{args.workflow}-{args.policy}-"
                                                            f"{time.strftime('%Y%m%d-%H%M%S')}")
        check_args(args)
    check_environment(args)
    return args


def resume_args(p: Parser, args: argparse.Namespace, given: set[str]) -> argparse.Namespace:
    """The saved flags of the run in `args.resume`, with the RESUMABLE flags the command line gives applied
    (each printed); any other flag given is refused, since it would change what the run trains."""
    run = read_run_args(args.resume, f"--resume {args.resume}")
    read_results(os.path.join(args.resume, "metrics.jsonl"), ("step",))  # a bad line stops here, a cut one warns
    refused = sorted(given - set(RESUMABLE) - {"resume"})
    if refused:
        usage_error(f"--resume continues a run with its own settings; --{', --'.join(refused).replace('_', '-')} "
                    f"cannot change mid-run (these can: --{', --'.join(RESUMABLE).replace('_', '-')}); for other "
                    "settings start a new run with a new --run-dir")
    defaults = {a.dest: a.default for a in p._actions if a.dest != "help"}
    out = argparse.Namespace(**{**defaults, **run})  # a flag added since the run was saved: its default
    for key in sorted(given - {"resume"}):
        print(f"resume: --{key.replace('_', '-')} {getattr(args, key)} (the run had {run.get(key)})")
        setattr(out, key, getattr(args, key))
    out.resume = out.run_dir = args.resume
    return out


def check_args(args: argparse.Namespace) -> None:
    """Flags that contradict each other or the workflow stop here, with one line, before anything loads."""
    if args.max_iterations is None:
        args.max_iterations = 2 if args.task in ("code", "deepcoder") else 3  # the paper's budgets
    if args.role_weights == "equal":
        args.role_weights = ",".join(f"{r}=1" for r in ROLES[args.workflow])
    roles = (args.workflow, ROLES[args.workflow])
    args.role_weights = role_values(args.role_weights, "--role-weights", *roles, NONNEGATIVE)
    args.kl_coef = role_values(args.kl_coef, "--kl-coef", *roles, POSITIVE)
    args.coherence = role_values(args.coherence, "--coherence", *roles, FRACTION)
    if args.role_weights and not any(args.role_weights.values()):
        usage_error("--role-weights are all 0: no role would train")
    if args.role_weights and args.policy == "ip":
        usage_error("--role-weights sets shares inside one shared adapter; it needs --policy sp")
    if args.coherence and args.policy == "sp":
        usage_error("--coherence acts on a role's own adapter gradient; it needs --policy ip")
    if args.task in ("dapo", "deepcoder") and not args.data:
        usage_error(f"--task {args.task} needs --data PATH_OR_HUB_ID")
    for flag, value in (("--data", args.data), ("--val-data", args.val_data)):
        if value and args.task in ("math", "code"):
            usage_error(f"{flag} is read by --task dapo or deepcoder; --task {args.task} has built-in data")
    if args.data_config and args.data and os.path.exists(args.data):
        print(f"warning: --data-config {args.data_config} is ignored: it names a hub dataset's config, and --data "
              f"{args.data} is a local file", file=sys.stderr)
    if args.n == 1:
        print("warning: --group-size 1: every GRPO group has one member, so there is no group baseline and the "
              "advantage is the raw reward (use --group-size 2 or more)", file=sys.stderr)


def load_tasks(args) -> tuple[list[tasks.Task], list[tasks.Task]]:
    """(train, validation) tasks (`tasks.load_split`); a bad row or file is one line, exit status 2."""
    try:
        return tasks.load_split(args.task, args.data, args.data_config, args.n_train, args.n_val, args.difficulty,
                                args.seed, args.val_data)
    except (tasks.DataError, ValueError) as e:
        usage_error(str(e))


# ---------------------------------------------------------------- the trainer and one step

@dataclass
class Trainer:
    """What a step works with, built from the flags by `build_trainer`."""
    model: torch.nn.Module                  # the base model wrapped with its adapters (SP: `shared`; IP: per role)
    tokenizer: object
    optimizers: dict                        # adapter -> (AdamW, schedule)
    engine: object                          # HF or vLLM sampling engine
    settings: UpdateSettings                # the GRPO update
    grad_ema: dict                          # I6 state, carried across steps


def build_trainer(args, device: str = "cpu") -> Trainer:
    """The model with its adapters, one optimizer per adapter, the generation engine and the update settings, all
    from the flags."""
    if args.model == "toy" and distributed.world()[0] == 0:
        toy_model.build(args.seed, play_every_problem)  # once per seed, into the cache (infra/toy_model.py)
    distributed.barrier()
    try:
        model, tokenizer = policies.load_model(args.model, getattr(torch, args.dtype), device, args.seed)
    except (OSError, ValueError) as e:  # a hub id that is not cached here, a folder with broken files
        usage_error(f"cannot load --model {args.model}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    if args.engine == "vllm":  # vLLM reads base weights from disk: find (built-in: write) them before adapters wrap
        base_folder = vllm_engine.vllm_model_folder(args.model, model, tokenizer)
    attention = model.config._attn_implementation
    args.share_prompts = args.share_prompts and attention in policies.EXACT_WITH_HOLES  # sharing leaves mask holes
    print(f"attention: {attention}; shared prompt passes {'on' if args.share_prompts else 'off'}")
    adapters = sorted({policies.route_adapter(r, args.policy) for r in ROLES[args.workflow]})
    model = policies.add_adapters(model, adapters, args.lora_rank, args.lora_alpha)
    if args.grad_checkpointing:
        policies.enable_grad_checkpointing(model)
    optimizers = grpo.make_optimizers(model, adapters, args.lr, args.weight_decay, args.warmup_steps,
                                      args.lr_schedule, args.steps)
    engine = vllm_engine.VLLMEngine(base_folder, model, tokenizer, policies.eos_token_ids(model, tokenizer),
                                    policies.to_generation, args.max_new_tokens, args.temperature, args.top_p,
                                    args.vllm_gpu_memory, args.dtype, args.seed) if args.engine == "vllm" else \
        policies.HFEngine(model, tokenizer, args.max_new_tokens, args.temperature, args.top_p, args.gen_batch_size,
                          args.share_prompts, args.gen_max_tokens or memory.hf_generation_budget(model))
    settings = UpdateSettings(
        mini_batch_size=args.mini_batch_size or args.tasks_per_step * args.n, micro_batch_size=args.micro_batch_size,
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch or 1 << 62, agg=args.agg,
        norm_len=args.max_new_tokens, clip_low=args.clip_low, clip_high=args.clip_high, dual_clip=args.dual_clip,
        max_grad_norm=args.max_grad_norm, temperature=args.temperature, role_weights=args.role_weights,
        merge_instance_steps=args.merge_instance_steps, kl_coef=args.kl_coef, coherence=args.coherence,
        coherence_window=args.coherence_window, share_prompts=args.share_prompts,
        skip_zero_advantage=args.skip_zero_advantage, lr_schedule=args.lr_schedule)
    return Trainer(model, tokenizer, optimizers, engine, settings, {})


def run_workflow(tasks_: list[tasks.Task], n: int, args, t: Trainer, desc: str) -> list[workflows.Episode]:
    """`n` episodes per task of this rank's share of `tasks_` (all of them without torchrun), each call on its
    adapter (SP / IP), rewarded with the run's credit (`workflows.run_episodes`, which evaluation runs too)."""
    return workflows.run_episodes(distributed.share(tasks_), n, vars(args), t.engine,
                                  policies.chat_encoder(t.tokenizer, args.enable_thinking, args.chat_template),
                                  lambda name: policies.route_adapter(name, args.policy), args.max_prompt_tokens, desc)


def train_step(batch: list[tasks.Task], args, t: Trainer) -> dict[str, float]:
    """One GRPO step: rollout (under torchrun each rank runs a share of the tasks, whole groups), rewards,
    group advantages, one update of every adapter over the global batch. Returns the step's metrics."""
    if next(t.model.parameters()).is_cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    episodes = run_workflow(batch, args.n, args, t, "rollout")
    t_rollout = time.time() - t0
    samples = grpo.training_samples(episodes, args.std_scale)
    calls = [c for e in episodes for c in e.calls]
    tallies = {**workflows.episode_tallies(episodes), "reward": [sum(c.reward for c in calls), len(calls)]}
    if args.engine == "vllm":  # vLLM asleep (its GPU memory freed, the peak counters reset), then the drift check,
        t.engine.sleep()       # before the update changes the weights vLLM sampled with
        tallies.update(vllm_engine.vllm_drift(calls, lambda *rows: policies.logprob_drift(
            t.model, *rows, args.micro_batch_size, t.settings.max_tokens_per_micro_batch)))
    t1 = time.time()
    m = grpo.update_policy(t.model, samples, t.optimizers, t.settings, t.grad_ema)
    t_update = time.time() - t1
    cuda = next(t.model.parameters()).is_cuda
    if cuda:  # the trainer's own peak: since vLLM fell asleep, less what torch still counts as vLLM's
        peak = t.engine.trainer_peak_bytes() if args.engine == "vllm" else torch.cuda.max_memory_allocated()
    if args.engine == "vllm":
        t.engine.wake_up()
        t.engine.sync_adapters(t.model, sorted({s.adapter for s in samples}))  # new versions of updated adapters
    parts = distributed.gather((tallies, sum(len(s.completion_ids) for s in samples),
                                sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)))
    m.update(rates(add_tallies([p[0] for p in parts])), time_rollout=t_rollout,
             time_update=t_update, rollout_tok_s=sum(p[1] for p in parts) / max(t_rollout, 1e-9),
             update_tok_s=sum(p[2] for p in parts) / max(t_update, 1e-9))
    m["reward"] = m["reward"] or 0.0  # None: no calls, every episode was ended by an over-long prompt
    if cuda:  # the trainer's peak (PyTorch's allocator), the device's use now
        free, total = torch.cuda.mem_get_info()
        m.update({"memory/peak_gib": peak / 2 ** 30,
                  "memory/device_used_gib": (total - free) / 2 ** 30})
    return m


def validate(val_tasks, args, t: Trainer, step: int) -> dict[str, float]:
    """Validation metrics, `val/...`: each rank runs its share of the validation tasks; the counts are added. The
    episodes of the first --val-samples tasks, the same at every step, go to RUN/samples/ (rank 0 writes)."""
    episodes = run_workflow(val_tasks, args.val_n, args, t, "validate")
    samples.keep_samples(args.run_dir, step, episodes, [v.id for v in val_tasks[:args.val_samples]])
    tallies = workflows.episode_tallies(episodes)
    if args.model == "toy":  # each role's habit and format, read by the toy world's parsers (finding 5's content)
        tallies.update(toy.role_tallies(episodes, t.tokenizer.decode))
    return {f"val/{k}": v for k, v in rates(add_tallies(distributed.gather(tallies))).items()}


# ---------------------------------------------------------------- the run

def main(argv: list[str] | None = None) -> str:
    distributed.quiet_other_ranks()  # torchrun: only rank 0 prints
    try:
        return run(argv)
    finally:
        distributed.close_distributed()


def run(argv: list[str] | None) -> str:
    args = parse_args(argv)                      # every flag checked: nothing loaded, nothing written yet
    if args.resume and nothing_to_train(args):  # before args.json is rewritten with this command's --steps
        return args.run_dir
    rank_device = distributed.init_distributed(args.device)  # torchrun: the process group and this rank's device
    train_tasks, val_tasks = load_tasks(args)    # a bad row stops here, naming the file and the row
    if not args.resume:
        check_run_dir(args.run_dir, args.overwrite)
    distributed.barrier()  # every rank has checked the folder before rank 0 writes into it
    device = rank_device or (("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    checkpoints.seed_everything(args.seed)
    t = build_trainer(args, device)
    rank, size = distributed.world()
    if size > 1:
        checkpoints.seed_everything(args.seed + rank)  # the same adapters everywhere, then a sampling stream per rank
    logger = None
    if args.wandb and rank == 0:
        import wandb
        logger = wandb.init(project="marl-workflows", config=vars(args))
    print("config:", json.dumps(vars(args), sort_keys=True))
    try:
        if rank == 0:
            with writing("RUN/args.json", args.run_dir):
                write_args(args, build_parser())  # the first write into the run folder (and the defaults)
        metrics_path, start = os.path.join(args.run_dir, "metrics.jsonl"), 0
        if args.resume:
            start = checkpoints.resume_from_checkpoint(args.run_dir, t.model, t.optimizers, t.grad_ema, args.seed)
            if args.engine == "vllm":
                t.engine.sync_adapters(t.model)  # vLLM started from the fresh adapters: give it the checkpoint's
            if rank == 0:
                with writing("RUN/metrics.jsonl and RUN/samples/", args.run_dir):
                    keep_metrics_until(metrics_path, start)
                    samples.keep_samples_until(args.run_dir, start)  # as metrics: a later step's file would be stale
            if start >= args.steps:
                print(f"nothing to train: {args.run_dir} is at step {start}; extend it with --steps N (N > {start})")
        with writing("RUN/metrics.jsonl", args.run_dir):
            metrics_file = open(metrics_path if rank == 0 else os.devnull, "a")
        with metrics_file:
            train_loop(args, start, train_tasks, val_tasks, t, metrics_file, logger)
    except WriteError as e:
        checkpoints.stop_on_write_error(e, args.run_dir)
    print(f"run folder: {args.run_dir}")
    return args.run_dir


def nothing_to_train(args) -> bool:
    """A resumed run whose newest checkpoint is at or past --steps: say so and keep its args.json as it was, except
    that flags an older train.py did not write are added with today's defaults (what eval.py's message offers)."""
    saved = checkpoints.checkpoint_steps(args.run_dir)
    if not saved or saved[-1] < args.steps:
        return False
    run_flags = read_run_args(args.run_dir)
    missing = {k: v for k, v in vars(args).items() if k not in run_flags}
    if missing and distributed.world()[0] == 0:
        write_args(argparse.Namespace(**{**missing, **run_flags, "resume": args.run_dir, "run_dir": args.run_dir}))
        print(f"resume: added to {args.run_dir}/args.json: " + ", ".join(f"--{k.replace('_', '-')}" for k in missing))
    print(f"nothing to train: {args.run_dir} is at step {saved[-1]}; extend it with --steps N (N > {saved[-1]})")
    return True


def train_loop(args, start: int, train_tasks, val_tasks, t: Trainer, metrics_file, logger) -> None:
    """Steps start+1 .. args.steps: train, validate (every --val-every steps and at the last), log, save."""
    order = list(range(len(train_tasks)))
    random.Random(args.seed).shuffle(order)  # the data order is a function of the seed: resume needs no more
    stop, bad_steps, size = GracefulStop(), 0, distributed.world()[1]
    try:
        if args.val_every and start == 0:
            m = validate(val_tasks, args, t, 0)
            print(f"step 0 | val acc {m['val/success']:.3f}")
            with writing("RUN/metrics.jsonl", args.run_dir):
                metrics_file.write(json_line({"step": 0, **m}))
                metrics_file.flush()
        for step in tqdm(range(start + 1, args.steps + 1), desc="train", disable=None):
            pos = (step - 1) * args.tasks_per_step
            m = {"step": step, **train_step([train_tasks[order[(pos + i) % len(order)]]
                                             for i in range(args.tasks_per_step)], args, t)}
            if args.val_every and (step % args.val_every == 0 or step == args.steps):
                m.update(validate(val_tasks, args, t, step))
            tqdm.write(f"step {step} | reward {m['reward']:.3f} | success {m['success']:.3f}"
                       + (f" | val acc {m['val/success']:.3f}" if "val/success" in m else "")
                       + f" | rollout {m['time_rollout']:.1f}s update {m['time_update']:.1f}s")
            with writing("RUN/metrics.jsonl", args.run_dir):
                metrics_file.write(json_line(m))
                metrics_file.flush()
            if logger:
                logger.log(m, step=step)
            if size > 1:  # a stop request that reached one rank stops them all after the same step
                stop.signum = next((s for s in distributed.gather(stop.signum) if s is not None), None)
            if (args.save_every and step % args.save_every == 0) or step == args.steps or stop.requested:
                checkpoints.save_checkpoint(args.run_dir, step, t.model, t.optimizers, t.grad_ema, args.keep_last)
            bad_steps = bad_steps + 1 if m["nonfinite_steps"] else 0
            if bad_steps >= MAX_NONFINITE_STEPS:
                raise SystemExit(f"error: {bad_steps} training steps in a row had a non-finite loss or gradient "
                                 f"(their optimizer steps were skipped); stopping at step {step}. Lower --lr or "
                                 "check the data.")
            if stop.requested:
                print(f"stopped after step {step}; continue with: python train.py --resume {args.run_dir}")
                if stop.signum != signal.SIGINT:  # a scheduler's stop: non-zero, so that it can requeue the job
                    raise SystemExit(128 + stop.signum)
                break
    finally:
        stop.restore()


if __name__ == "__main__":
    record(main)()  # under torchrun, a failing rank's traceback goes into torchrun's failure summary

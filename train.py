"""Train every role of an LLM workflow with outcome-reward GRPO (SP or IP LoRA adapters).

The method notes, docs/method.md, describe what this file wires together: tasks -> workflows
(rollout, credit) -> grpo (advantages, update) -> logs, validation and checkpoints in a run folder.

One step = sample `--tasks-per-step` tasks, run `--group-size` episodes of the workflow on each
(stage-batched), reward the calls, compute group advantages, update every adapter. Every step
appends one line of metrics to RUN/metrics.jsonl.

    python train.py --model tiny --steps 2      # the tiny random model: a smoke test in seconds
    python train.py                             # SmolLM2-135M on synthetic math, CPU, 6 minutes
    python train.py --cell Voting-IP-1.7B-Math  # a paper cell on a GPU (see --list-cells)
    torchrun --standalone --nproc_per_node 2 train.py --cell Voting-IP-1.7B-Math  # on 2 GPUs

Defaults are sized for a CPU; the paper's values are given in each flag's help. The update's and the
workflows' flags are the fields of grpo.UpdateSettings and workflows.WorkflowOptions (a new knob is
one field); the rest are at the end of this file. Bad input stops before anything loads or is
written: one line, exit status 2.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import time
from dataclasses import dataclass

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

import grpo
import policies
import tasks
import workflows
from eval import make_engine, play_every_problem
from infra import checkpoints, distributed, flags, memory, samples, toy, toy_model, vllm_engine
from infra.flags import COUNT, COUNT0, FRACTION, NONNEGATIVE, POSITIVE, RESUMABLE
from infra.runfolder import (
    GracefulStop,
    WriteError,
    check_run_dir,
    json_line,
    keep_metrics_until,
    usage_error,
    write_args,
    writing,
)
from infra.tallies import add_tallies, rates
from workflows import ROLES

# ---------------------------------------------------------------- one step


def train_step(batch: list[tasks.Task], args, trainer: Trainer) -> dict[str, float]:
    """One GRPO step: rollout (under torchrun each rank runs a share of the tasks, whole groups),
    rewards, group advantages, one update of every adapter over the global batch. Returns the step's
    metrics."""
    memory.reset_peaks(trainer.model)  # CUDA: this step's peaks (vLLM's sleep resets them again)
    t0 = time.time()
    episodes = run_workflow(batch, args.group_size, args, trainer, "rollout")
    t_rollout = time.time() - t0
    samples = grpo.training_samples(episodes, args.std_scale)
    calls = [c for e in episodes for c in e.calls]
    tallies = {**workflows.episode_tallies(episodes),
               "reward": [sum(c.reward for c in calls), len(calls)]}
    if args.engine == "vllm":  # vLLM asleep (its GPU memory freed, the peak counters reset), then
        trainer.engine.sleep()  # the drift check, before the update changes the weights it sampled
        tallies.update(vllm_engine.vllm_drift(calls, lambda *rows: policies.logprob_drift(
            trainer.model, *rows, args.micro_batch_size,
            trainer.settings.max_tokens_per_micro_batch)))
    t1 = time.time()
    m = grpo.update_policy(trainer.model, samples, trainer.optimizers, trainer.settings,
                           trainer.grad_ema)
    t_update = time.time() - t1
    m.update(memory.step_peaks(trainer.model, trainer.engine))  # CUDA: the trainer's, vLLM asleep
    if args.engine == "vllm":  # new versions of the updated adapters
        trainer.engine.wake_up()
        trainer.engine.sync_adapters(trainer.model, sorted({s.adapter for s in samples}))
    parts = distributed.gather((tallies, sum(len(s.completion_ids) for s in samples),
                                sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)))
    m.update(rates(add_tallies([p[0] for p in parts])), time_rollout=t_rollout,
             time_update=t_update, rollout_tok_s=sum(p[1] for p in parts) / max(t_rollout, 1e-9),
             update_tok_s=sum(p[2] for p in parts) / max(t_update, 1e-9))
    m["reward"] = m["reward"] or 0.0  # None: no calls, every episode ended by an over-long prompt
    return m


def validate(val_tasks, args, trainer: Trainer, step: int) -> dict[str, float]:
    """Validation metrics, `val/...`: each rank runs its share of the validation tasks; the counts
    are added. The episodes of the first --val-samples tasks, the same at every step, go to
    RUN/samples/ (rank 0 writes)."""
    episodes = run_workflow(val_tasks, args.val_n, args, trainer, "validate")
    samples.keep_samples(args.run_dir, step, episodes, [v.id for v in val_tasks[:args.val_samples]])
    tallies = workflows.episode_tallies(episodes)
    if args.model == "toy":  # each role's habit and format, read by the toy world's parsers
        tallies.update(toy.role_tallies(episodes, trainer.tokenizer.decode))
    return {f"val/{k}": v for k, v in rates(add_tallies(distributed.gather(tallies))).items()}


def run_workflow(tasks_: list[tasks.Task], n: int, args, trainer: Trainer, desc: str
                 ) -> list[workflows.Episode]:
    """`n` episodes per task of this rank's share of `tasks_` (all of them without torchrun), each
    call on its adapter (SP / IP), rewarded with the run's credit (`workflows.run_episodes`, which
    evaluation runs too)."""
    encode = policies.chat_encoder(trainer.tokenizer, args.enable_thinking, args.chat_template)

    def route(call_name: str) -> str:
        return policies.route_adapter(call_name, args.policy)
    return workflows.run_episodes(distributed.share(tasks_), n, args.workflow, trainer.options,
                                  args.credit, trainer.engine, encode, route,
                                  args.max_prompt_tokens, desc)


# ---------------------------------------------------------------- the run

MAX_NONFINITE_STEPS = 3  # steps in a row with a non-finite loss or gradient before the run stops


def main(argv: list[str] | None = None) -> str:
    distributed.quiet_other_ranks()  # torchrun: only rank 0 prints
    try:
        return run(argv)
    finally:
        distributed.close_distributed()


def run(argv: list[str] | None) -> str:
    parser = build_parser()
    args = flags.parse_args(parser, argv, ROLES)  # every flag checked; nothing loaded or written
    if args.resume and flags.nothing_to_train(args):  # before args.json takes this --steps
        return args.run_dir
    # one device per process, current before any model or engine: torchrun's rank's, or --device
    device = distributed.claim_device(distributed.init_distributed(args.device) or args.device)
    train_tasks, val_tasks = load_tasks(args)  # a bad row stops here, naming the file and the row
    if not args.resume:
        check_run_dir(args.run_dir, args.overwrite)
    distributed.barrier()  # every rank has checked the folder before rank 0 writes into it
    checkpoints.seed_everything(args.seed)
    trainer = build_trainer(args, device)
    rank, size = distributed.world()
    if size > 1:  # the same adapters everywhere, then a sampling stream per rank
        checkpoints.seed_everything(args.seed + rank)
    logger = None
    if args.wandb and rank == 0:
        import wandb
        logger = wandb.init(project="marl-workflows", config=vars(args))
    print(flags.run_header(args, parser, device))
    try:
        if rank == 0:
            with writing("RUN/args.json", args.run_dir):
                write_args(args, parser)  # the first write into the run folder (and the defaults)
        metrics_path, start = os.path.join(args.run_dir, "metrics.jsonl"), 0
        if args.resume:
            start = resume(args, trainer, metrics_path, rank)
        with writing("RUN/metrics.jsonl", args.run_dir):
            metrics_file = open(metrics_path if rank == 0 else os.devnull, "a")
        with metrics_file:
            train_loop(args, start, train_tasks, val_tasks, trainer, metrics_file, logger)
    except WriteError as e:
        checkpoints.stop_on_write_error(e, args.run_dir)
    print(f"run folder: {args.run_dir}")
    return args.run_dir


def resume(args, trainer: Trainer, metrics_path: str, rank: int) -> int:
    """The step the newest readable checkpoint is at, loaded into the trainer; the metrics and
    samples of later steps are dropped (they would be stale)."""
    start = checkpoints.resume_from_checkpoint(args.run_dir, trainer.model, trainer.optimizers,
                                               trainer.grad_ema, args.seed)
    if args.engine == "vllm":  # vLLM started from the fresh adapters: give it the checkpoint's
        trainer.engine.sync_adapters(trainer.model)
    if rank == 0:
        with writing("RUN/metrics.jsonl and RUN/samples/", args.run_dir):
            keep_metrics_until(metrics_path, start)
            samples.keep_samples_until(args.run_dir, start)
    if start >= args.steps:
        print(f"nothing to train: {args.run_dir} is at step {start}; "
              f"extend it with --steps N (N > {start})")
    return start


def train_loop(args, start: int, train_tasks, val_tasks, trainer: Trainer, metrics_file,
               logger) -> None:
    """Steps start+1 .. args.steps: train, validate (every --val-every steps and at the last), log,
    save."""
    order = list(range(len(train_tasks)))
    random.Random(args.seed).shuffle(order)  # the data order is a function of the seed
    stop, bad_steps, size = GracefulStop(), 0, distributed.world()[1]
    try:
        if args.val_every and start == 0:
            m = validate(val_tasks, args, trainer, 0)
            print(f"step 0 | val acc {m['val/success']:.3f}")
            log(args, metrics_file, {"step": 0, **m})
        for step in tqdm(range(start + 1, args.steps + 1), desc="train", disable=None):
            pos = (step - 1) * args.tasks_per_step
            batch = [train_tasks[order[(pos + i) % len(order)]] for i in range(args.tasks_per_step)]
            m = {"step": step, **train_step(batch, args, trainer)}
            if args.val_every and (step % args.val_every == 0 or step == args.steps):
                m.update(validate(val_tasks, args, trainer, step))
            val = f" | val acc {m['val/success']:.3f}" if "val/success" in m else ""
            tqdm.write(f"step {step} | reward {m['reward']:.3f} | success {m['success']:.3f}{val}"
                       f" | rollout {m['time_rollout']:.1f}s update {m['time_update']:.1f}s")
            log(args, metrics_file, m)
            if logger:
                logger.log(m, step=step)
            if size > 1:  # a stop request that reached one rank stops them all after the same step
                stop.signum = next((s for s in distributed.gather(stop.signum) if s is not None),
                                   None)
            saving = args.save_every and step % args.save_every == 0
            if saving or step == args.steps or stop.requested:
                checkpoints.save_checkpoint(args.run_dir, step, trainer.model, trainer.optimizers,
                                            trainer.grad_ema, args.keep_last)
            bad_steps = bad_steps + 1 if m["nonfinite_steps"] else 0
            if bad_steps >= MAX_NONFINITE_STEPS:
                raise SystemExit(f"error: {bad_steps} training steps in a row had a non-finite "
                                 f"loss or gradient (their optimizer steps were skipped); stopping "
                                 f"at step {step}. Lower --lr or check the data.")
            if stop.requested:
                print(f"stopped after step {step}; "
                      f"continue with: python train.py --resume {args.run_dir}")
                if stop.signum != signal.SIGINT:  # a scheduler's stop: non-zero, so it can requeue
                    raise SystemExit(128 + stop.signum)
                break
    finally:
        stop.restore()


def log(args, metrics_file, m: dict) -> None:
    """One line of RUN/metrics.jsonl, flushed: a crash loses at most the step it was in."""
    with writing("RUN/metrics.jsonl", args.run_dir):
        metrics_file.write(json_line(m))
        metrics_file.flush()


# ---------------------------------------------------------------- the trainer


@dataclass
class Trainer:
    """What a step works with, built from the flags by `build_trainer`."""
    model: torch.nn.Module              # the base model and its adapters (SP: shared; IP: a role)
    tokenizer: object
    optimizers: dict                    # adapter -> (AdamW, schedule)
    engine: object                      # HF or vLLM sampling engine
    settings: grpo.UpdateSettings       # the GRPO update
    options: workflows.WorkflowOptions  # the prompts and the workflow's control flow
    grad_ema: dict                      # I6 state, carried across steps


def build_trainer(args, device: str = "cpu") -> Trainer:
    """The model with its adapters, one optimizer per adapter, the generation engine, the update's
    settings and the workflow's options, all from the flags."""
    if args.model == "toy" and distributed.world()[0] == 0:
        toy_model.build(args.seed, play_every_problem)  # once per seed, into the cache
    distributed.barrier()
    try:
        model, tokenizer = policies.load_model(args.model, getattr(torch, args.dtype), device,
                                               args.seed)
    except (OSError, ValueError) as e:  # a hub id not cached here, a folder with broken files
        usage_error(f"cannot load --model {args.model}: "
                    f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    base_folder = None
    if args.engine == "vllm":  # vLLM reads base weights from disk: find (or write) them first
        base_folder = vllm_engine.vllm_model_folder(args.model, model, tokenizer)
    attention = model.config._attn_implementation
    # sharing a prompt's pass leaves holes in the mask: only where the attention is exact with them
    args.share_prompts = args.share_prompts and attention in policies.EXACT_WITH_HOLES
    print(f"attention: {attention}; shared prompt passes {'on' if args.share_prompts else 'off'}")
    adapters = sorted({policies.route_adapter(r, args.policy) for r in ROLES[args.workflow]})
    model = policies.add_adapters(model, adapters, args.lora_rank, args.lora_alpha)
    if args.grad_checkpointing:
        policies.enable_grad_checkpointing(model)
    optimizers = grpo.make_optimizers(model, adapters, args.lr, args.weight_decay,
                                      args.warmup_steps, args.lr_schedule, args.steps)
    engine = make_engine(args.engine, model, tokenizer, base_folder, args.max_new_tokens,
                         args.temperature, args.top_p, args.gen_batch_size, args.dtype, args.seed,
                         args.vllm_gpu_memory, args.share_prompts, args.gen_max_tokens)
    options = flags.settings_from(workflows.WorkflowOptions, vars(args))
    return Trainer(model, tokenizer, optimizers, engine, update_settings(args), options, {})


def update_settings(args) -> grpo.UpdateSettings:
    """The update's settings: each field is the flag of its name, except these, computed here."""
    return flags.settings_from(
        grpo.UpdateSettings, vars(args),
        mini_batch_size=args.mini_batch_size or args.tasks_per_step * args.group_size,  # 0: a step
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch or 1 << 62,  # 0: rows only
        norm_len=args.max_new_tokens,   # Dr. GRPO's constant length: the response budget
        temperature=args.temperature,   # log-probs at the sampling temperature
        share_prompts=args.share_prompts)  # after build_trainer's attention check


def load_tasks(args) -> tuple[list[tasks.Task], list[tasks.Task]]:
    """(train, validation) tasks (`tasks.load_split`); a bad row or file is one line, exit 2."""
    try:
        return tasks.load_split(args.task, args.data, args.data_config, args.n_train, args.n_val,
                                args.difficulty, args.seed, args.val_data)
    except (tasks.DataError, ValueError) as e:
        usage_error(str(e))


# ---------------------------------------------------------------- the flags


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags -> a checked Namespace (infra/flags.py); nothing is loaded or written here. On
    --resume, the run's own flags."""
    return flags.parse_args(build_parser(), argv, ROLES)


def build_parser() -> flags.Parser:
    """Every flag, in groups; each help ends with its default, and names the paper's value where
    ours differs. The update's and the workflows' flags are made from their settings' fields."""
    p = flags.Parser(description=__doc__, formatter_class=flags.HelpFormatter, allow_abbrev=False)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="smollm2", help="smollm2 (packaged), toy (the toy world: "
                   "built once per --seed), tiny or tiny-qwen3 (random, tests), "
                   "random-qwen3-0.6b, a model folder or a hub id")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="weights dtype (GPU: bf16)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--enable-thinking", action="store_true",
                   help="Qwen3 thinking mode (paper: off)")
    g.add_argument("--chat-template", default="model", choices=["model", "rllm"],
                   help="model: the tokenizer's own; rllm: as the reference's rLLM Qwen parser "
                   "rendered it (cells)")
    add_data_flags(p)
    g = p.add_argument_group("workflow (workflows.WorkflowOptions: --prompts and after)")
    g.add_argument("--workflow", default="single", choices=sorted(workflows.WORKFLOWS),
                   help="its roles: " + "; ".join(f"{w} {'/'.join(r)}" for w, r in ROLES.items()))
    g.add_argument("--cell", default=None, help="a paper cell, e.g. Voting-IP-1.7B-Math: sets all "
                   "its flags")
    g.add_argument("--list-cells", action="store_true",
                   help="print the paper's 48 cells and what each sets")
    g.add_argument("--credit", default="outcome", choices=["outcome", "role"],
                   help="outcome: the final result to every call (paper); role: each call its own "
                   "correctness")
    p.add_settings(g, workflows.WorkflowOptions)
    g = p.add_argument_group("policy")
    g.add_argument("--policy", default="sp", choices=["sp", "ip"],
                   help="sp: one shared adapter; ip: one per role")
    g.add_argument("--lora-rank", type=COUNT, default=16, help="LoRA rank (paper: 64)")
    g.add_argument("--lora-alpha", type=COUNT, default=32, help="LoRA alpha (paper: 32)")
    add_grpo_flags(p)
    add_run_flags(p)
    return p


def add_data_flags(p: flags.Parser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--task", default="math", choices=["math", "dapo", "code", "deepcoder"],
                   help="math, code: built in (synthetic, HumanEval); dapo, deepcoder: --data")
    g.add_argument("--data", default=None,
                   help="DAPO- or DeepCoder-format .jsonl/.json/.parquet, or a hub id")
    g.add_argument("--data-config", default=None,
                   help="hub dataset config (DAPO-Math-17k-Processed: en)")
    g.add_argument("--difficulty", type=int, default=0, choices=[0, 1],
                   help="synthetic math: one op on 1- or 2-digit numbers")
    g.add_argument("--n-train", type=COUNT, default=170, help="synthetic math: training problems")
    g.add_argument("--n-val", type=COUNT, default=64,
                   help="validation problems (loaded data: of its held-out rows)")
    g.add_argument("--val-data", default=None, help="validate on this file or hub id instead "
                   "(math cells: MathArena/aime_2025); default: --data's held-out rows")


def add_grpo_flags(p: flags.Parser) -> None:
    g = p.add_argument_group("GRPO")
    g.add_argument("--tasks-per-step", type=COUNT, default=8,
                   help="tasks per training step (paper: 64)")
    g.add_argument("--group-size", "--n", dest="group_size", type=COUNT, default=4,
                   help="episodes per task, the GRPO group (paper: 8); under torchrun write "
                   "--group-size")
    g.add_argument("--no-std-scale", dest="std_scale", action="store_false",
                   help="advantage = r - mean (Dr. GRPO)")
    g.add_argument("--grad-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                   help="recompute activations in backward: memory for time (cells: on)")
    p.add_settings(p.add_argument_group("GRPO update (grpo.UpdateSettings, one field per flag; "
                                        "role names: see --workflow)"), grpo.UpdateSettings)
    g = p.add_argument_group("optimisation (and --lr-schedule, --max-grad-norm above)")
    g.add_argument("--steps", type=COUNT0, default=10, help="training steps")
    g.add_argument("--lr", type=POSITIVE, default=5e-4,
                   help="AdamW learning rate (paper: 2e-5 at rank 64)")
    g.add_argument("--weight-decay", type=NONNEGATIVE, default=0.01,
                   help="AdamW weight decay (paper: 0.01)")
    g.add_argument("--warmup-steps", type=COUNT0, default=3,
                   help="linear warm-up steps (paper: 15)")


def add_run_flags(p: flags.Parser) -> None:
    g = p.add_argument_group("rollout")
    g.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"],
                   help="auto: vllm on CUDA when it imports, else hf (transformers generate)")
    g.add_argument("--temperature", type=NONNEGATIVE, default=0.7,
                   help="sampling temperature (paper: 0.7)")
    g.add_argument("--top-p", type=FRACTION, default=1.0, help="nucleus sampling (paper: 1.0)")
    g.add_argument("--max-new-tokens", type=COUNT, default=64,
                   help="response limit (paper: math 5120, code 2048)")
    g.add_argument("--max-prompt-tokens", type=COUNT, default=4096,
                   help="a longer prompt ends its episode, as in the paper (prompt_overflow)")
    g.add_argument("--gen-batch-size", type=COUNT, default=64,
                   help="rows per generate() call (memory only)")
    g.add_argument("--gen-max-tokens", type=COUNT0, default=0,
                   help="hf: tokens per generate() call, rows x (prompt + new tokens); 0 = on "
                   "CUDA what fits in the free memory (infra/memory.py), on CPU none")
    g.add_argument("--vllm-gpu-memory", type=FRACTION, default=0.4,
                   help="vllm: fraction of GPU memory it takes")
    g = p.add_argument_group("run folder and logging")
    g.add_argument("--run-dir", default=None,
                   help="run folder (default: runs/<workflow>-<policy>-<time>)")
    g.add_argument("--overwrite", action="store_true",
                   help="move a run in --run-dir aside to <run-dir>.old-<time>")
    g.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run, with its own flags; only --"
                   + ", --".join(RESUMABLE).replace("_", "-") + " may change")
    g.add_argument("--val-every", type=COUNT0, default=5,
                   help="validate every N steps, first and last; 0 = never")
    g.add_argument("--val-n", type=COUNT, default=1, help="samples per validation task")
    g.add_argument("--val-samples", type=COUNT0, default=4,
                   help="the first N validation tasks: their episodes, every call, go to "
                   "RUN/samples/step_<N>.json at each validation (eval.py report); 0 = none")
    g.add_argument("--save-every", type=COUNT0, default=10,
                   help="checkpoint every N steps and at the end")
    g.add_argument("--keep-last", type=COUNT0, default=0,
                   help="keep only the newest N checkpoints; 0 = all")
    g.add_argument("--seed", type=int, default=0, help="seeds data order, sampling and LoRA init")
    g.add_argument("--wandb", action="store_true",
                   help="also log to Weights & Biases (pip install wandb)")


if __name__ == "__main__":
    record(main)()  # under torchrun, a failing rank's traceback goes into torchrun's summary

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

Defaults are sized for a CPU; the paper's values are given in each flag's help. Every flag is one
field: of `Settings` at the end of this file, of grpo.UpdateSettings or of workflows.WorkflowOptions
(a new knob is one field); `settings_from_flags` resolves what a 0 or None stands for. Bad input
stops before anything loads or is written: one line, exit status 2.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

import grpo
import policies
import tasks
import workflows
from eval import play_every_problem  # the toy model's transcripts (toy_hooks.build_before_load)
from infra import checkpoints, distributed, flags, memory, samples, vllm_engine
from infra.flags import RESUMABLE
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
from infra.settings import setting
from infra.tallies import add_tallies, rates
from toyworld import toy_hooks
from workflows import ROLES

# ---------------------------------------------------------------- one step


def train_step(batch: list[tasks.Task], cfg: Settings, trainer: Trainer) -> dict[str, float]:
    """One GRPO step, as the paper's algorithm: rollout, rewards, group advantages, one update of
    every adapter, metrics. Under torchrun each rank rolls out a share of the tasks (whole groups)
    and the update adds the ranks' gradients (grpo.update_policy)."""
    engine = trainer.engine
    engine.start_step()  # CUDA: the step's memory peaks start here
    t0 = time.time()
    # what SP and IP change, and all they change: the adapter each call samples with and trains
    route = partial(policies.route_adapter, policy=cfg.policy)
    episodes = workflows.rollout(distributed.share(batch), cfg.group_size, cfg.options, engine,
                                 trainer.encode, route)  # this rank's tasks; calls, rewarded
    t_rollout = time.time() - t0
    rows = grpo.training_rows(episodes, cfg.update.std_scale)  # a row per call: advantage, adapter
    calls = [c for e in episodes for c in e.calls]
    tallies = {**workflows.episode_tallies(episodes),
               "reward": [sum(c.reward for c in calls), len(calls)]}
    tallies.update(engine.before_update(calls))  # vLLM: asleep, its log-probs checked against ours
    t1 = time.time()
    m = grpo.update_policy(trainer.model, rows, trainer.optimizers, cfg.update, trainer.grad_ema)
    t_update = time.time() - t1
    m.update(engine.after_update(sorted({r.adapter for r in rows})))  # peaks; vLLM: new adapters
    return {**m, **step_metrics(tallies, rows, t_rollout, t_update)}


def step_metrics(tallies: dict, rows: list[grpo.Row], t_rollout: float, t_update: float
                 ) -> dict[str, float]:
    """The step's counts added over ranks, as rates, its times and its tokens per second."""
    parts = distributed.gather((tallies, sum(len(r.completion_ids) for r in rows),
                                sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)))
    m = rates(add_tallies([p[0] for p in parts]))
    m.update(time_rollout=t_rollout, time_update=t_update,
             rollout_tok_s=sum(p[1] for p in parts) / max(t_rollout, 1e-9),
             update_tok_s=sum(p[2] for p in parts) / max(t_update, 1e-9))
    m["reward"] = m["reward"] or 0.0  # None: no calls, every episode ended by an over-long prompt
    return m


def validate(val_tasks, cfg: Settings, trainer: Trainer, step: int) -> dict[str, float]:
    """Validation metrics, `val/...`: each rank runs its share of the validation tasks; the counts
    are added. The episodes of the first --val-samples tasks, the same at every step, go to
    RUN/samples/ (rank 0 writes)."""
    route = partial(policies.route_adapter, policy=cfg.policy)
    episodes = workflows.rollout(distributed.share(val_tasks), cfg.val_n, cfg.options,
                                 trainer.engine, trainer.encode, route, "validate")
    samples.keep_samples(cfg.run_dir, step, episodes, [v.id for v in val_tasks[:cfg.val_samples]])
    tallies = {**workflows.episode_tallies(episodes),  # and the toy world's reading of each role
               **toy_hooks.validation_tallies(cfg.model, episodes, trainer.tokenizer.decode)}
    return {f"val/{k}": v for k, v in rates(add_tallies(distributed.gather(tallies))).items()}


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
    cfg = settings_from_flags(args)  # typed, resolved; the method's rules checked
    if cfg.resume and flags.nothing_to_train(args):  # before args.json takes this --steps
        return cfg.run_dir
    memory.configure_allocator(cfg.engine, cfg.device)  # before CUDA starts (infra/memory.py)
    # one device per process, current before any model or engine: torchrun's rank's, or --device
    device = distributed.claim_device(distributed.init_distributed(cfg.device) or cfg.device)
    train_tasks, val_tasks = load_tasks(cfg)  # a bad row stops here, naming the file and the row
    if not cfg.resume:
        check_run_dir(cfg.run_dir, cfg.overwrite)
    distributed.barrier()  # every rank has checked the folder before rank 0 writes into it
    checkpoints.seed_everything(cfg.run_seed)
    trainer = build_trainer(cfg, device)
    args.share_prompts = cfg.update.share_prompts  # RUN/args.json: as build_trainer left it
    rank, size = distributed.world()
    if size > 1:  # the same adapters everywhere, then a sampling stream per rank
        checkpoints.seed_everything(cfg.run_seed + rank)
    logger = None
    if cfg.wandb and rank == 0:
        import wandb
        logger = wandb.init(project="marl-workflows", config=vars(args))
    print(flags.run_header(args, parser, device))
    try:
        if rank == 0:
            with writing("RUN/args.json", cfg.run_dir):
                write_args(args, parser)  # the first write into the run folder (and the defaults)
        metrics_path, start = os.path.join(cfg.run_dir, "metrics.jsonl"), 0
        if cfg.resume:
            start = resume(cfg, trainer, metrics_path, rank)
        with writing("RUN/metrics.jsonl", cfg.run_dir):
            metrics_file = open(metrics_path if rank == 0 else os.devnull, "a")
        with metrics_file:
            train_loop(cfg, start, train_tasks, val_tasks, trainer, metrics_file, logger)
    except WriteError as e:
        checkpoints.stop_on_write_error(e, cfg.run_dir)
    print(f"run folder: {cfg.run_dir}")
    return cfg.run_dir


def resume(cfg: Settings, trainer: Trainer, metrics_path: str, rank: int) -> int:
    """The step the newest readable checkpoint is at, loaded into the trainer; the metrics and
    samples of later steps are dropped (they would be stale)."""
    start = checkpoints.resume_from_checkpoint(cfg.run_dir, trainer.model, trainer.optimizers,
                                               trainer.grad_ema, cfg.run_seed)
    if cfg.engine == "vllm":  # vLLM started from the fresh adapters: give it the checkpoint's
        trainer.engine.sync_adapters(trainer.model)
    if rank == 0:
        with writing("RUN/metrics.jsonl and RUN/samples/", cfg.run_dir):
            keep_metrics_until(metrics_path, start)
            samples.keep_samples_until(cfg.run_dir, start)
    if start >= cfg.steps:
        print(f"nothing to train: {cfg.run_dir} is at step {start}; "
              f"extend it with --steps N (N > {start})")
    return start


def train_loop(cfg: Settings, start: int, train_tasks, val_tasks, trainer: Trainer, metrics_file,
               logger) -> None:
    """Steps start+1 .. --steps: train, validate (every --val-every steps and at the last), log,
    save."""
    order = list(range(len(train_tasks)))
    random.Random(cfg.run_seed).shuffle(order)  # the data order is a function of the run seed
    stop, bad_steps = GracefulStop(), 0
    try:
        if cfg.val_every and start == 0:
            m = validate(val_tasks, cfg, trainer, 0)
            print(f"step 0 | val acc {m['val/success']:.3f}")
            log(cfg, metrics_file, {"step": 0, **m})
        for step in tqdm(range(start + 1, cfg.steps + 1), desc="train", disable=None):
            pos = (step - 1) * cfg.tasks_per_step
            batch = [train_tasks[order[(pos + i) % len(order)]] for i in range(cfg.tasks_per_step)]
            m = {"step": step, **train_step(batch, cfg, trainer)}
            if cfg.val_every and (step % cfg.val_every == 0 or step == cfg.steps):
                m.update(validate(val_tasks, cfg, trainer, step))
            val = f" | val acc {m['val/success']:.3f}" if "val/success" in m else ""
            tqdm.write(f"step {step} | reward {m['reward']:.3f} | success {m['success']:.3f}{val}"
                       f" | rollout {m['time_rollout']:.1f}s update {m['time_update']:.1f}s")
            log(cfg, metrics_file, m)
            if logger:
                logger.log(m, step=step)
            # a stop request that reached one rank stops them all after the same step
            stop_signal = stop.agreed(distributed.gather)
            saving = cfg.save_every and step % cfg.save_every == 0
            if saving or step == cfg.steps or stop_signal:
                checkpoints.save_checkpoint(cfg.run_dir, step, trainer.model, trainer.optimizers,
                                            trainer.grad_ema, cfg.keep_last)
            bad_steps = bad_steps + 1 if m["nonfinite_steps"] else 0
            if bad_steps >= MAX_NONFINITE_STEPS:
                raise SystemExit(f"error: {bad_steps} training steps in a row had a non-finite "
                                 f"loss or gradient (their optimizer steps were skipped); stopping "
                                 f"at step {step}. Lower --lr or check the data.")
            if stop_signal:
                print(f"stopped after step {step}; "
                      f"continue with: python train.py --resume {cfg.run_dir}")
                if stop_signal != signal.SIGINT:  # a scheduler's stop: non-zero, so it can requeue
                    raise SystemExit(128 + stop_signal)
                break
    finally:
        stop.restore()


def log(cfg: Settings, metrics_file, m: dict) -> None:
    """One line of RUN/metrics.jsonl, flushed: a crash loses at most the step it was in."""
    with writing("RUN/metrics.jsonl", cfg.run_dir):
        metrics_file.write(json_line(m))
        metrics_file.flush()


# ---------------------------------------------------------------- the trainer


@dataclass
class Trainer:
    """What a step works with, built from the settings by `build_trainer`."""
    model: torch.nn.Module  # the base model and its adapters (SP: shared; IP: one per role type)
    tokenizer: object
    optimizers: dict        # adapter -> (AdamW, schedule)
    engine: object          # HF or vLLM sampling engine, with its hooks around an update
    encode: Callable        # chat messages -> prompt ids (the tokenizer's chat template)
    grad_ema: dict          # I6 state, carried across steps


def build_trainer(cfg: Settings, device: str = "cpu") -> Trainer:
    """The model with its adapters, one optimizer per adapter and the generation engine, all from
    the settings."""
    toy_hooks.build_before_load(cfg.model, cfg.seed, play_every_problem)  # --model toy: built once
    try:
        model, tokenizer = policies.load_model(cfg.model, getattr(torch, cfg.dtype), device,
                                               cfg.seed)
    except (OSError, ValueError) as e:  # a hub id not cached here, a folder with broken files
        usage_error(f"cannot load --model {cfg.model}: "
                    f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    base_folder = None
    if cfg.engine == "vllm":  # vLLM reads base weights from disk: find (or write) them first
        base_folder = vllm_engine.vllm_model_folder(cfg.model, model, tokenizer)
    attention = model.config._attn_implementation
    # sharing a prompt's pass leaves holes in the mask: only where the attention is exact with them
    update = cfg.update
    update.share_prompts = update.share_prompts and attention in policies.EXACT_WITH_HOLES
    print(f"attention: {attention}; shared prompt passes {'on' if update.share_prompts else 'off'}")
    adapters = sorted({policies.route_adapter(r, cfg.policy) for r in ROLES[cfg.options.workflow]})
    model = policies.add_adapters(model, adapters, cfg.lora_rank, cfg.lora_alpha)
    if cfg.grad_checkpointing:
        policies.enable_grad_checkpointing(model)
    optimizers = grpo.make_optimizers(model, adapters, update, cfg.steps)
    drift = partial(policies.logprob_drift, model, micro_batch=update.micro_batch_size,
                    max_tokens=update.max_tokens_per_micro_batch)  # vLLM's, in the update's budget
    engine = policies.make_engine(
        cfg.engine, model, tokenizer, max_new_tokens=cfg.max_new_tokens,
        temperature=update.temperature, top_p=cfg.top_p, rows=cfg.gen_batch_size,
        max_tokens=cfg.gen_max_tokens, share_prompts=update.share_prompts, decode=cfg.decode,
        base_folder=base_folder, dtype=cfg.dtype, vllm_memory=cfg.vllm_gpu_memory,
        seed=cfg.run_seed, drift=drift)
    encode = policies.chat_encoder(tokenizer, cfg.enable_thinking, cfg.chat_template)
    return Trainer(model, tokenizer, optimizers, engine, encode, {})


def load_tasks(cfg: Settings) -> tuple[list[tasks.Task], list[tasks.Task]]:
    """(train, validation) tasks (`tasks.load_split`); a bad row or file is one line, exit 2."""
    try:
        return tasks.load_split(cfg.task, cfg.data, cfg.data_config, cfg.n_train, cfg.n_val,
                                cfg.difficulty, cfg.seed, cfg.val_data)
    except (tasks.DataError, ValueError) as e:
        usage_error(str(e))


# ---------------------------------------------------------------- the settings


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """The run's settings from its checked flags (`flags.parse_args`). Every value a flag's 0
    stands for, and every field without a flag, is computed here and nowhere else (only
    `build_trainer` may turn shared prompt passes off, for an attention kernel it loads); the
    update's rules for SP and IP (`grpo.policy_problem`) stop a run here, before anything loads."""
    update = flags.settings_from(
        grpo.UpdateSettings, vars(args),
        mini_batch_size=args.mini_batch_size or args.tasks_per_step * args.group_size,  # 0: a step
        norm_len=args.max_new_tokens)  # Dr. GRPO's constant length: the response budget
    if problem := grpo.policy_problem(update, args.policy):
        usage_error(problem)
    options = flags.settings_from(workflows.WorkflowOptions, vars(args))
    return flags.settings_from(Settings, vars(args), update=update, options=options,
                               run_seed=args.seed if args.run_seed is None else args.run_seed)


def build_parser() -> flags.Parser:
    """Every flag, in groups, made from the settings' fields; each help ends with its default and
    names the paper's value where ours differs."""
    p = flags.Parser(description=__doc__, formatter_class=flags.HelpFormatter, allow_abbrev=False,
                     presets=True)  # --help: what --cell and --model toy set beside each default
    p.add_settings(Settings)
    p.add_settings(workflows.WorkflowOptions)
    p.add_settings(grpo.UpdateSettings)
    return p


@dataclass
class Settings:
    """Every setting of a run that is not the update's (grpo.UpdateSettings) or the workflows'
    (workflows.WorkflowOptions): one field each, with its flag, default, help, the paper's value
    and the values it takes, as CleanRL's Args. `update` and `options` are those two, filled by
    `settings_from_flags`."""
    model: str = setting("smollm2", "--model", group="model", help="smollm2 (packaged), toy (the "
                         "toy world: built once per --seed), tiny or tiny-qwen3 (random, tests), "
                         "random-qwen3-0.6b, a model folder or a hub id")
    dtype: str = setting("float32", "--dtype", "weights dtype (GPU: bf16)",
                         choices=["float32", "bfloat16"])
    device: str = setting("auto", "--device", "auto, cpu, cuda or cuda:N")
    enable_thinking: bool = setting(False, "--enable-thinking", "Qwen3 thinking mode (paper: off)",
                                    switch=True)
    chat_template: str = setting("model", "--chat-template", "model: the tokenizer's own; rllm: "
                                 "as the reference's rLLM Qwen parser rendered it (cells)",
                                 choices=["model", "rllm"])
    task: str = setting("math", "--task", "math, code: built in (synthetic, HumanEval); dapo, "
                        "deepcoder: --data", group="data",
                        choices=["math", "dapo", "code", "deepcoder"])
    data: str | None = setting(None, "--data",
                               "DAPO- or DeepCoder-format .jsonl/.json/.parquet, or a hub id")
    data_config: str | None = setting(None, "--data-config",
                                      "hub dataset config (DAPO-Math-17k-Processed: en)")
    difficulty: int = setting(0, "--difficulty",
                              "synthetic math: one op on 1- or 2-digit numbers", choices=[0, 1])
    n_train: int = setting(170, "--n-train", "synthetic math: training problems", within="[1, inf)")
    n_val: int = setting(64, "--n-val", "validation problems (loaded data: of its held-out rows)",
                         within="[1, inf)")
    val_data: str | None = setting(None, "--val-data", "validate on this file or hub id instead "
                                   "(math cells: MathArena/aime_2025); default: --data's held-out "
                                   "rows")
    cell: str | None = setting(None, "--cell", group="the paper's cells",
                               help="a paper cell, e.g. Voting-IP-1.7B-Math: sets all its flags")
    list_cells: bool = setting(False, "--list-cells",
                               "print the paper's 48 cells and what each sets", switch=True)
    policy: str = setting("sp", "--policy", "sp: one shared adapter; ip: one per role",
                          group="policy", choices=["sp", "ip"])
    lora_rank: int = setting(16, "--lora-rank", "LoRA rank", within="[1, inf)", paper=64)
    lora_alpha: int = setting(32, "--lora-alpha", "LoRA alpha", within="[1, inf)", paper=32)
    tasks_per_step: int = setting(8, "--tasks-per-step", "tasks per training step", group="GRPO",
                                  within="[1, inf)", paper=64)
    group_size: int = setting(4, ("--group-size", "--n"), "episodes per task, the GRPO group; "
                              "under torchrun write --group-size", within="[1, inf)", paper=8)
    steps: int = setting(10, "--steps", "training steps", within="[0, inf)")
    grad_checkpointing: bool = setting(False, "--grad-checkpointing", "recompute activations in "
                                       "backward: memory for time (cells: on)")
    engine: str = setting("auto", "--engine", "auto: vllm on CUDA when it imports, else hf "
                          "(transformers generate)", group="rollout",
                          choices=["auto", "hf", "vllm"])
    decode: str = setting("auto", "--decode", "hf: static compiles the decode step (CUDA), "
                          "dynamic does not; auto: static on CUDA",
                          choices=["auto", "dynamic", "static"])
    top_p: float = setting(1.0, "--top-p", "nucleus sampling", within="(0, 1]", paper=1.0)
    max_new_tokens: int = setting(64, "--max-new-tokens", "response limit", within="[1, inf)",
                                  paper="math 5120, code 2048")
    gen_batch_size: int = setting(0, "--gen-batch-size", "rows per generate() call; 0 = on CUDA "
                                  "what fits in the free memory, on CPU 64", within="[0, inf)")
    gen_max_tokens: int = setting(0, "--gen-max-tokens", "hf: tokens per generate() call, rows x "
                                  "(prompt + new tokens); 0 = on CUDA what fits in the free "
                                  "memory (infra/memory.py), on CPU none", within="[0, inf)")
    vllm_gpu_memory: float = setting(0.4, "--vllm-gpu-memory",
                                     "vllm: fraction of GPU memory it takes", within="(0, 1]")
    run_dir: str | None = setting(None, "--run-dir", "run folder (default: "
                                  "runs/<workflow>-<policy>-<time>)",
                                  group="run folder and logging")
    overwrite: bool = setting(False, "--overwrite",
                              "move a run in --run-dir aside to <run-dir>.old-<time>", switch=True)
    resume: str | None = setting(None, "--resume", "continue a run, with its own flags; only --"
                                 + ", --".join(RESUMABLE).replace("_", "-") + " may change",
                                 metavar="RUN_DIR")
    val_every: int = setting(5, "--val-every", "validate every N steps, first and last; 0 = never",
                             within="[0, inf)")
    val_n: int = setting(1, "--val-n", "samples per validation task", within="[1, inf)")
    val_samples: int = setting(4, "--val-samples", "the first N validation tasks: their episodes, "
                               "every call, go to RUN/samples/step_<N>.json at each validation "
                               "(eval.py report); 0 = none", within="[0, inf)")
    save_every: int = setting(10, "--save-every", "checkpoint every N steps and at the end",
                              within="[0, inf)")
    keep_last: int = setting(0, "--keep-last", "keep only the newest N checkpoints; 0 = all",
                             within="[0, inf)")
    seed: int = setting(0, "--seed", "the data's seed and the toy model's; --run-seed's default")
    run_seed: int | None = setting(None, "--run-seed", "seeds sampling, LoRA init and data order")
    wandb: bool = setting(False, "--wandb", "also log to Weights & Biases (pip install wandb)",
                          switch=True)
    update: grpo.UpdateSettings = field(default_factory=grpo.UpdateSettings)
    options: workflows.WorkflowOptions = field(default_factory=workflows.WorkflowOptions)


if __name__ == "__main__":
    record(main)()  # under torchrun, a failing rank's traceback goes into torchrun's summary

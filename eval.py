"""Evaluate a workflow (base model, trained checkpoints, or a single-agent adapter dropped into it).

Evaluation (docs/method.md, "Evaluation" and finding 1) reports accuracy, unbiased pass@k and
per-role statistics per checkpoint, in five modes: `base` (adapters off, recorded as step 0),
`trained` (the run's checkpoint, each role on its own adapter as in training), `sa-transfer` (a
single-agent run's adapter, `--sa-run`, for every role), `sa-generator-transfer` (that adapter
for the solving roles only, generators and workers; the aggregator, evaluator, orchestrator and
synthesizer on the base model) and `swapped` (beside `trained`, an IP run's checkpoint with two
role types' adapters exchanged, `--swap`: has each role learned something of its own?). The
workflow, split and sampling settings come from the run folder's args.json; `--data FILE`
evaluates another set in the run's task format (AIME 2025 for math, DeepCoder's test split for
code). A paper cell's run is evaluated with the paper's evaluation lengths. To drop an SA adapter
into a workflow you have not trained, make an untrained run folder for it first (`python train.py
--workflow voting --steps 0 --val-every 0 --run-dir runs/voting-untrained`). Its flags, their
checks and its other commands (plot, table, report, calibrate, compare) are infra/commands.py.

    python eval.py --run-dir runs/voting-ip --mode base --samples 4  # the base model, 4 per task
    python eval.py --run-dir runs/voting-ip --step 10 --dump         # one checkpoint, and its dumps
    python eval.py --run-dir runs/voting-ip --every-checkpoint       # every saved checkpoint
    python eval.py --run-dir runs/voting-ip --mode sa-transfer --sa-run runs/single-sp --samples 4
    python eval.py --run-dir runs/voting-ip --mode swapped           # generator <-> aggregator
    python eval.py plot runs/voting-ip runs/voting-sp [--out runs/plots]  # PNG curves
    python eval.py table runs/voting-ip runs/voting-sp               # their eval.jsonl, one table
    python eval.py --run-dir runs/toy-voting --split test --samples 2  # held-out synthetic math
    python eval.py calibrate --seed 0                                # the toy model at base
    python eval.py report runs/voting-sp runs/voting-ip --out runs/voting.html  # curves, samples

Each evaluation appends one JSON line to RUN/eval.jsonl (cell, step, dataset, mode, metrics);
`--dump` writes one JSON file per episode (every call's prompt, output, parsed answer, correctness,
reward) under RUN/trajectories/<dataset>/<mode>-step_<N>/.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Callable

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

import policies
import tasks
import workflows
from infra import checkpoints, commands, distributed, memory, vllm_engine
from infra.cells import PAPER_LENGTHS, cell_name
from infra.flags import HelpFormatter, Parser, settings_from
from infra.models import version_note
from infra.runfolder import (
    NAME_KEYS,
    WriteError,
    append_record,
    dataset_name,
    dump_trajectories,
    read_run_args,
    trajectory_folder,
    usage_error,
    writing,
)
from infra.tallies import Tallies, add_mean, add_tallies, rates
from policies import BASE, route_adapter
from workflows import ROLES, Episode, episode_tallies, role_type, task_outcomes

MODES = ("base", "trained", "sa-transfer", "sa-generator-transfer", "swapped")
SA_MODES = ("sa-transfer", "sa-generator-transfer")  # they load a single-agent run's adapter
SA_ADAPTER = "sa"  # the name that adapter takes here (it shows in dumps)
SOLVING_ROLES = ("generator", "worker")  # sa-generator-transfer: the SA adapter; the rest: base


# What evaluation reads of a run's args.json (an older train.py's run may lack some)
EVAL_RUN_KEYS = tuple(dict.fromkeys((
    *NAME_KEYS, "dtype", "data_config", "n_train", "n_val", "seed",
    *(f.name for f in dataclasses.fields(workflows.WorkflowOptions)),
    "lora_rank", "lora_alpha", "temperature", "top_p", "max_new_tokens", "gen_batch_size",
    "enable_thinking")))


def checkpoint_source(run_dir: str, mode: str, sa_run: str | None) -> str:
    """The run whose checkpoints a mode loads: the SA run under the SA modes, else the run
    itself."""
    if mode in SA_MODES and not sa_run:
        usage_error(f"--mode {mode} needs --sa-run RUN (a single-agent run folder)")
    return sa_run if mode in SA_MODES else run_dir


def resolve_steps(run_dir: str, mode: str, step: int | None, every: bool, sa_run: str | None
                  ) -> list[int]:
    """[0] for base; else the requested (or latest, or every) checkpoint of the run whose adapters
    are loaded."""
    if mode == "base":
        return [0]
    source = checkpoint_source(run_dir, mode, sa_run)
    steps = checkpoints.checkpoint_steps(source)
    if not steps:
        usage_error(f"{source} has no checkpoints")
    if step is not None and step not in steps:
        usage_error(f"{source} has no checkpoint for step {step} (have {steps})")
    return steps if every else [steps[-1] if step is None else step]


# ---------------------------------------------------------------- metrics (pure)

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al.
    2021), computed as a product so large n never overflows."""
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def evaluation_tallies(episodes: list[Episode]) -> Tallies:
    """The counts one evaluation reports, as numerators and denominators (so ranks add them): the
    episode tallies, each sample index's accuracy (`sample/<k>`: one full pass over the tasks), and
    pass@k for k = 1, 2, 4... up to the samples per task, per task (a task's samples are all on one
    rank)."""
    t = episode_tallies(episodes)
    for e in episodes:
        add_mean(t, f"sample/{e.sample}", e.correct)
    for outcomes in task_outcomes(episodes).values():
        for k in (2 ** i for i in range(len(outcomes).bit_length())):
            add_mean(t, f"pass@{k}", pass_at_k(len(outcomes), sum(outcomes), k))
    return t


def evaluation_metrics(tallies: Tallies | list[Episode]) -> dict[str, float | None]:
    """Accuracy and its std over the sample indices, pass@k, and the episode metrics (per-role
    accuracy from each role's own answer, format, length, any_correct, Eval-Opt's retry rates,
    fallbacks); None: nothing to count."""
    m = rates(evaluation_tallies(tallies) if isinstance(tallies, list) else tallies)
    per_sample = [m.pop(k) for k in [k for k in m if k.startswith("sample/")]]
    return {"accuracy": statistics.mean(per_sample), "accuracy_std": statistics.pstdev(per_sample),
            **m}


# ---------------------------------------------------------------- model and episodes per mode

def mode_route(mode: str, policy: str, swap: tuple | None = None) -> Callable[[str], str]:
    """Call name -> adapter: adapters off (base), the run's SP/IP routing (trained; swapped: the two
    role types of `swap` on each other's adapter), the SA adapter for every role (sa-transfer) or
    for the solving roles only, the rest on the base model."""
    if mode == "base":
        return lambda name: BASE
    if mode == "trained":
        return lambda name: route_adapter(name, policy)
    if mode == "swapped":
        other = {swap[0]: swap[1], swap[1]: swap[0]}
        return lambda name: other.get(role_type(name), route_adapter(name, policy))
    if mode == "sa-transfer":
        return lambda name: SA_ADAPTER
    return lambda name: SA_ADAPTER if role_type(name) in SOLVING_ROLES else BASE


def build_model(run_args: dict, mode: str, sa_args: dict | None, device: str, engine: str = "hf"):
    """(model, tokenizer, the base weights' folder for vLLM or None) for a mode: the plain base
    model (`base`), the run's adapters (`trained`), or one adapter shaped like the SA run's (SA
    modes). Checkpoint weights are loaded by `load_step`."""
    model, tokenizer = policies.load_model(run_args["model"], getattr(torch, run_args["dtype"]),
                                           device, run_args["seed"])
    folder = vllm_engine.vllm_model_folder(run_args["model"], model, tokenizer) \
        if engine == "vllm" else None  # before adapters wrap the model
    if mode in ("trained", "swapped"):
        roles = ROLES[run_args["workflow"]]
        adapters = sorted({route_adapter(r, run_args["policy"]) for r in roles})
        model = policies.add_adapters(model, adapters, run_args["lora_rank"],
                                      run_args["lora_alpha"])
    elif mode in SA_MODES:
        model = policies.add_adapters(model, [SA_ADAPTER], sa_args["lora_rank"],
                                      sa_args["lora_alpha"])
    return model, tokenizer, folder


def load_step(model, mode: str, run_dir: str, sa_run: str | None, sa_args: dict | None,
              step: int) -> None:
    """Put checkpoint `step` into the model: every adapter of the run, or the SA run's only adapter
    as `sa`. A checkpoint that does not read back whole is one line (evaluations of earlier steps
    are already saved)."""
    source = sa_run if mode in SA_MODES else run_dir
    folder = os.path.join(checkpoints.checkpoint_folder(source, step), "adapters")
    try:
        if mode in ("trained", "swapped"):
            checkpoints.load_adapters(model, folder)
        elif mode in SA_MODES:  # the SA run's one adapter (SP: `shared`, IP: `generator`), as `sa`
            saved = route_adapter("generator", sa_args["policy"])
            weights = checkpoints.read_adapters(folder, [saved], str(model.device))
            checkpoints.load_adapters(model, "", {SA_ADAPTER: weights[saved]})
    except Exception as e:  # a missing, truncated or corrupted adapter file
        usage_error(f"cannot read checkpoint {os.path.dirname(folder)}: {type(e).__name__}: {e}")


def check_sa_run(run_args: dict, sa_run: str) -> dict:
    """The SA run's args, after checking it is a single-agent run on the same model and task."""
    sa_args = read_run_args(sa_run, f"--sa-run {sa_run}", EVAL_RUN_KEYS)
    if sa_args["workflow"] != "single":
        usage_error(f"--sa-run {sa_run} trained workflow {sa_args['workflow']!r}, not 'single'")
    for key in ("model", "task"):
        if sa_args[key] != run_args[key]:
            usage_error(f"--sa-run {sa_run} has {key} {sa_args[key]!r} "
                        f"but --run has {run_args[key]!r}")
    return sa_args


def eval_lengths(run_args: dict) -> tuple[int | None, int]:
    """(prompt, response) token limits: a paper cell's evaluation lengths, else the run's training
    ones."""
    if run_args.get("cell"):
        kind = "code" if run_args["task"] in ("code", "deepcoder") else "math"
        return PAPER_LENGTHS[kind, run_args["workflow"]][2:]
    return run_args.get("max_prompt_tokens"), run_args["max_new_tokens"]


def eval_tasks(run_args: dict, data: str | None, split: str = "val") -> list[tasks.Task]:
    """The run's validation split, its test split (synthetic math: as many problems again, drawn
    after its training ones), or every row of `data` read in the run's task format; bad rows: one
    line."""
    a = run_args
    try:
        if split == "test":
            return tasks.math_test(a["n_train"], a["n_val"], a["difficulty"], a["seed"])
        if data is None:
            return tasks.load_split(a["task"], a["data"], a["data_config"], a["n_train"],
                                    a["n_val"], a["difficulty"], a["seed"], a.get("val_data"))[1]
        return tasks.load_tasks("deepcoder" if a["task"] in ("code", "deepcoder") else "dapo", data)
    except (tasks.DataError, ValueError) as e:
        usage_error(str(e))


# ---------------------------------------------------------------- evaluate

def evaluate_steps(run_dir: str, mode: str, steps: list[int], args: argparse.Namespace
                   ) -> list[dict]:
    """Evaluate each step of one mode (the model loads once), from the command line's settings
    (`args`); each record is appended to the results file as soon as it is done. Under torchrun
    each rank runs a share."""
    run_args = read_run_args(run_dir, keys=EVAL_RUN_KEYS)
    sa_run = args.sa_run if mode in SA_MODES else None
    swap = swap_pair(run_args, args.swap) if mode == "swapped" else None  # before the model loads
    sa_args = None
    if mode in SA_MODES:
        sa_args = check_sa_run(run_args, checkpoint_source(run_dir, mode, sa_run))
    eval_set = eval_tasks(run_args, args.data, args.split)
    on_cpu = args.engine == "vllm"  # then the model only carries the adapters into vLLM
    model, tokenizer, folder = build_model(run_args, mode, sa_args,
                                           "cpu" if on_cpu else args.device, args.engine)
    temp = run_args["temperature"] if args.temperature is None else args.temperature
    cell_prompt, cell_new = eval_lengths(run_args)
    max_prompt, max_new = args.max_prompt_tokens or cell_prompt, args.max_new_tokens or cell_new
    engine = policies.make_engine(
        args.engine, model, tokenizer, max_new_tokens=max_new, temperature=temp,
        top_p=run_args["top_p"], rows=run_args["gen_batch_size"], max_tokens=0, share_prompts=True,
        decode="auto", base_folder=folder, dtype=run_args["dtype"], seed=args.seed,
        vllm_memory=args.vllm_gpu_memory)
    encode = policies.chat_encoder(tokenizer, run_args["enable_thinking"],
                                   run_args.get("chat_template", "model"))
    options = dataclasses.replace(settings_from(workflows.WorkflowOptions, run_args),
                                  max_prompt_tokens=max_prompt)  # the run's workflow
    dataset = dataset_name(run_args, args.data) + ("-test" if args.split == "test" else "")
    shown = ("trained", "swapped") if swap else (mode,)  # swapped: beside trained, paired
    sa = {"sa_run": os.path.normpath(sa_run), "sa_cell": cell_name(sa_args)} if sa_run else {}
    records = []
    for step in tqdm(steps, desc=f"eval {mode}", disable=None if len(steps) > 1 else True):
        load_step(model, mode, run_dir, sa_run, sa_args, step)
        if args.engine == "vllm":  # the step's adapters, as new versions in vLLM
            engine.sync_adapters(model)
        for each in shown:
            checkpoints.seed_everything(args.seed)  # the same every time: differences are weights'
            memory.reset_peaks(model)  # CUDA: the record carries the step's memory/... peaks
            start = time.time()
            episodes = workflows.rollout(distributed.share(eval_set), args.samples, options,
                                         engine, encode, mode_route(each, run_args["policy"], swap),
                                         f"eval {each} step {step}")
            tallies = add_tallies(distributed.gather(evaluation_tallies(episodes)))
            r = {"run": run_dir, "cell": cell_name(run_args), "step": step, "dataset": dataset,
                 "mode": each, "workflow": run_args["workflow"], "policy": run_args["policy"],
                 "n": args.samples, "tasks": len(eval_set), "temperature": temp,
                 "max_new_tokens": max_new, "seed": args.seed,
                 "time_s": round(time.time() - start, 1), "metrics": evaluation_metrics(tallies)}
            r.update(memory.step_peaks(model, engine), **sa)
            if each == "swapped":
                r["swap"] = list(swap)
            save_record(r, episodes, run_dir, args)
            records.append(r)
        if swap:
            tqdm.write(swap_line(records[-2], records[-1], ROLES[run_args["workflow"]]))
    return records


def swap_pair(run_args: dict, swap: str | None) -> tuple[str, str]:
    """The two role types `--mode swapped` exchanges (if a role's adapter is its own, swapping it
    costs accuracy): `--swap A,B`, else the workflow's last two in ROLES (Voting's generator and
    aggregator, Eval-Opt's generator and evaluator, Orch-Workers' worker and synthesizer); or one
    line."""
    workflow, roles = run_args["workflow"], ROLES[run_args["workflow"]]
    if run_args["policy"] != "ip" or len(roles) < 2:
        usage_error(f"--mode swapped needs a multi-agent IP run, not {cell_name(run_args)}")
    pair = tuple(swap.split(",")) if swap else tuple(roles[-2:])
    if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(roles):
        usage_error(f"--swap {swap}: expected two of {workflow}'s role types: {', '.join(roles)}")
    return pair


def swap_line(trained: dict, swapped: dict, roles: list[str]) -> str:
    """One line: accuracy and each role's own format, swapped against trained (n/a: no call)."""
    def own(r: dict, role: str) -> str:
        x = r["metrics"].get(f"{role}/format_ok")
        return "n/a" if x is None else f"{x:.2f}"
    formats = ", ".join(f"{role} {own(swapped, role)} ({own(trained, role)})" for role in roles)
    return (f"{swapped['cell']} swapped {' <-> '.join(swapped['swap'])}, step {swapped['step']}: "
            f"accuracy {swapped['metrics']['accuracy']:.3f} (trained "
            f"{trained['metrics']['accuracy']:.3f}); own format, swapped (trained): {formats}")


def save_record(r: dict, episodes: list[Episode], run_dir: str, args: argparse.Namespace) -> None:
    """The evaluation's trajectories (--dump: each rank its own), its line in RUN/eval.jsonl (or
    --out, which may name a new folder; a line cut off by a crash is dropped first), and its one
    line on the terminal."""
    if args.dump:
        r["trajectories"] = trajectory_folder(run_dir, r["dataset"], r["mode"], r["step"],
                                              r.get("sa_run"))
        with writing(f"the trajectories of step {r['step']}", run_dir):
            dump_trajectories(episodes, r["trajectories"])
    if distributed.world()[0] == 0:
        with writing(args.out or "RUN/eval.jsonl", run_dir):
            append_record(args.out or os.path.join(run_dir, "eval.jsonl"), r)
    m = r["metrics"]
    pass_k = ", ".join(f"{k} {v:.3f}" for k, v in m.items() if k.startswith("pass@"))
    tqdm.write(f"{r['cell']} {r['mode']} step {r['step']}: accuracy {m['accuracy']:.3f} "
               f"(std {m['accuracy_std']:.3f} over {r['n']} samples x {r['tasks']} tasks), "
               f"{pass_k}")


# ---------------------------------------------------------------- the toy world

def play_every_problem(workflow: str, n: int, engine, encode, route=lambda name: name
                       ) -> list[Episode]:
    """`n` episodes of `workflow` on each of the 243 one-digit problems with the default prompts
    and options: the toy model's warm-up transcripts (the oracle answers by call name) and its
    calibration (toyworld/toy_hooks.py)."""
    problems = tasks.synthetic_math(243, difficulty=0, seed=0)
    return workflows.rollout(problems, n, workflows.WorkflowOptions(workflow), engine, encode,
                             route)


def toy_engine(seed: int, max_new_tokens: int, temperature: float):
    """(engine, tokenizer, encode): the toy model of `seed` on the CPU, sampled by the HF engine
    (`eval.py calibrate`, toyworld/toy_hooks.py)."""
    model, tokenizer = policies.load_model("toy", torch.float32, "cpu", seed)
    engine = policies.HFEngine(model, tokenizer, max_new_tokens, temperature)
    return engine, tokenizer, policies.chat_encoder(tokenizer)


# ---------------------------------------------------------------- command line

def build_parser() -> Parser:
    p = Parser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    commands.add_commands(p.add_subparsers(dest="command",
                                           title="commands (default: evaluate --run-dir)"))
    commands.add_evaluate_flags(p, MODES)
    return p


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command:  # plot, table, report, calibrate, compare
        return commands.run(args, ROLES, play_every_problem, toy_engine)
    commands.check_evaluate_flags(args, EVAL_RUN_KEYS, SA_MODES)
    steps = resolve_steps(args.run, args.mode, args.step, args.every_checkpoint, args.sa_run)
    memory.configure_allocator(args.engine, args.device)  # before CUDA starts (infra/memory.py)
    # one device per process (torchrun: a rank's, with its share of the tasks), before the model
    args.device = distributed.claim_device(distributed.init_distributed(args.device) or args.device)
    if note := version_note():
        print(note)
    try:
        return evaluate_steps(args.run, args.mode, steps, args)
    except WriteError as error:  # the records of the steps before it are saved
        print(f"error: {error}; the evaluations finished before it are saved", file=sys.stderr)
        raise SystemExit(1) from None
    finally:
        distributed.close_distributed()


if __name__ == "__main__":
    record(main)()  # under torchrun, a failing rank's traceback goes into torchrun's summary

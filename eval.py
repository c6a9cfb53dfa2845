"""Evaluate a workflow (base model, trained checkpoints, or a single-agent adapter dropped into it) and plot runs.

Evaluation (docs/method.md, "Evaluation" and finding 1) reports accuracy, unbiased pass@k and per-role statistics
per checkpoint, in four modes: `base` (adapters off, recorded as step 0), `trained` (the run's checkpoint, each
role on its own adapter as in training), `sa-transfer` (a single-agent run's adapter, `--sa-run`, for every role)
and `sa-generator-transfer` (that adapter for the solving roles only, generators and workers; the aggregator,
evaluator, orchestrator and synthesizer on the base model). The workflow, split and sampling settings come from
the run folder's args.json; `--data FILE` evaluates another set in the run's task format (AIME 2025 for math,
DeepCoder's test split for code). A paper cell's run is evaluated with the paper's evaluation lengths. To drop an
SA adapter into a workflow you have not trained, make an untrained run folder for it first
(`python train.py --workflow voting --steps 0 --val-every 0 --run-dir runs/voting-untrained`).

    python eval.py --run-dir runs/voting-ip --mode base --samples 4            # the base model, 4 samples per task
    python eval.py --run-dir runs/voting-ip --step 10 --dump                   # one checkpoint, trajectories kept
    python eval.py --run-dir runs/voting-ip --every-checkpoint                 # every saved checkpoint
    python eval.py --run-dir runs/voting-ip --mode sa-transfer --sa-run runs/single-sp --samples 4
    python eval.py plot runs/voting-ip runs/voting-sp [--out runs/plots]       # PNG curves from metrics.jsonl
    python eval.py table runs/voting-ip runs/voting-sp                         # their eval.jsonl as one table

Each evaluation appends one JSON line to RUN/eval.jsonl (cell, step, dataset, mode, metrics); `--dump` writes
one JSON file per episode (every call's prompt, output, parsed answer, correctness, reward) under
RUN/trajectories/<dataset>/<mode>-step_<N>/.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from typing import Callable, NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

import policies
import tasks
import workflows
from grpo import gather, init_distributed, share, world
from policies import BASE, route_adapter
from workflows import PAPER_LENGTHS, ROLES, Episode, Tallies, add_tallies, episode_tallies, rates

MODES = ("base", "trained", "sa-transfer", "sa-generator-transfer")
SA_MODES = ("sa-transfer", "sa-generator-transfer")  # the modes that load a single-agent run's adapter
SA_ADAPTER = "sa"  # the name that adapter takes here (it shows in dumps)
SOLVING_ROLES = ("generator", "worker")  # sa-generator-transfer: these get the SA adapter, the rest the base model
WORKFLOW_NAMES = {"single": "Single", "voting": "Voting", "evalopt": "EvalOpt", "orchworkers": "OrchWorkers"}
SCALE_NAMES = {"smollm2": "SmolLM2", "tiny": "Tiny", "tiny-qwen3": "TinyQwen3", "random-qwen3-0.6b": "Random0.6B"}
TASK_NAMES = {"math": "Math", "dapo": "Math", "code": "Code", "deepcoder": "Code"}


# ---------------------------------------------------------------- bad input and run folders (train.py uses these too)

class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`error: argument --lr: must be > 0, got -1`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


def usage_error(message: str) -> NoReturn:
    """Bad input found before anything was loaded or written: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def number(cast, low: float, high: float | None = None, low_open: bool = False, high_open: bool = False):
    """An argparse `type`: `cast(text)`, finite and inside [low, high] (open ends as asked), else one line."""
    what = (f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}" if high is not None
            else f"{'>' if low_open else '>='} {low}")

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if cast is int else 'a number'}, "
                                             f"got {text!r}") from None
        inside = math.isfinite(value) and (value > low if low_open else value >= low) and \
            (high is None or (value < high if high_open else value <= high))
        if not inside:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


# What evaluation reads of a run's args.json, and what a plot's labels read (an older train.py's run may lack some)
NAME_KEYS = ("model", "task", "data", "difficulty", "workflow", "policy")
EVAL_RUN_KEYS = (*NAME_KEYS, "dtype", "data_config", "n_train", "n_val", "seed", "credit", "prompts", "evalopt_context",
                 "n_votes", "max_iterations", "max_subtasks", "lora_rank", "lora_alpha", "temperature", "top_p",
                 "max_new_tokens", "gen_batch_size", "enable_thinking")


def read_run_args(run_dir: str, named_as: str | None = None, keys: tuple[str, ...] = ()) -> dict:
    """RUN/args.json; a folder that is not a run folder, or whose args.json lacks one of `keys`, is a one-line
    error that names it `named_as` (e.g. the flag that gave it) or its path."""
    try:
        with open(os.path.join(run_dir, "args.json")) as f:
            run_args = json.load(f)
    except FileNotFoundError:
        usage_error(f"{named_as or run_dir}: not a run folder (no args.json; train.py writes one)")
    except (OSError, ValueError) as e:
        usage_error(f"{named_as or run_dir}: unreadable args.json ({e})")
    if not isinstance(run_args, dict):
        usage_error(f"{named_as or run_dir}: unreadable args.json (not a JSON object)")
    if any(k not in run_args for k in keys):
        usage_error(f"{named_as or run_dir}: args.json lacks {', '.join(k for k in keys if k not in run_args)} (an "
                    f"older train.py wrote it: `python train.py --resume {run_dir}` rewrites it with today's defaults)")
    return run_args


def read_results(path: str, keys: tuple[str, ...] = (), warn: bool = True) -> list[dict]:
    """A JSONL file (eval.jsonl, metrics.jsonl) as records; [] if there is none yet. A last line cut off before
    its newline (a run stopped while writing it) is left out, with a warning; any other line that is not a JSON
    object with `keys` is a one-line error."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.readlines()
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if i < len(lines) or line.endswith("\n"):
                usage_error(f"{path} line {i}: not valid JSON")
            if warn:
                print(f"warning: {path} line {i} was cut off while it was written; left out")
            continue
        if not isinstance(record, dict) or not all(k in record for k in keys):
            usage_error(f"{path} line {i}: expected a JSON object" + (f" with {', '.join(keys)}" if keys else ""))
        records.append(record)
    return records


def keep_metrics_until(path: str, step: int) -> None:
    """Drop metric lines of steps after `step` (written after the checkpoint a resume starts from) and a last line
    cut off while it was written (`train.resume_args` has checked the file and reported that line)."""
    if os.path.exists(path):
        records = [r for r in read_results(path, ("step",), warn=False) if r["step"] <= step]
        with open(path + ".tmp", "w") as f:
            f.writelines(json_line(r) for r in records)
        os.replace(path + ".tmp", path)


def json_line(record: dict) -> str:
    """One strict-JSON line: undefined or non-finite numbers (a rate with nothing to count) become null."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(clean, allow_nan=False) + "\n"


def holds_run(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, f)) for f in ("args.json", "metrics.jsonl", "checkpoints"))


def check_writable(path: str, flag: str, folder: bool) -> None:
    """`path` (a folder, or a file with `folder=False`) can be written: if it exists it is of that kind, and its
    nearest existing parent is a writable folder. One line otherwise, before anything loads or is written."""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        usage_error(f"{flag} {path}: expected {'a folder' if folder else 'a file'}, and this is not one")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        usage_error(f"{flag} {path}: cannot write there ({parent} is not a writable folder)")


def check_run_dir(run_dir: str, overwrite: bool) -> None:
    """A new run needs a folder that holds no run (or --overwrite) and that it can create; nothing is written."""
    if holds_run(run_dir) and not overwrite:
        usage_error(f"{run_dir} already holds a run; continue it with --resume {run_dir}, choose a new --run-dir, "
                    "or pass --overwrite to move it aside")
    check_writable(run_dir, "--run-dir", folder=True)


def write_args(args: argparse.Namespace) -> None:
    """RUN/args.json, atomically. A new run with --overwrite first moves an old run aside (never mixes them)."""
    if not args.resume and holds_run(args.run_dir):
        aside = f"{args.run_dir.rstrip(os.sep)}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        os.rename(args.run_dir, aside)
        print(f"--overwrite: moved the run that was in {args.run_dir} to {aside}")
    os.makedirs(args.run_dir, exist_ok=True)
    path = os.path.join(args.run_dir, "args.json")
    with open(path + ".tmp", "w") as f:
        json.dump({**vars(args), "resume": None, "overwrite": False}, f, indent=1)
    os.replace(path + ".tmp", path)


def cell_name(run_args: dict) -> str:
    """The paper's `{Workflow}-{Policy}-{Scale}-{Task}` label of a run, e.g. `Voting-IP-SmolLM2-Math`."""
    model = run_args["model"]
    size = re.search(r"(\d+(?:\.\d+)?)[bB]\b", model)  # Qwen/Qwen3-1.7B -> 1.7B
    scale = SCALE_NAMES.get(model) or (f"{size.group(1)}B" if size else os.path.basename(model.rstrip("/")))
    return "-".join([WORKFLOW_NAMES.get(run_args["workflow"], run_args["workflow"]), run_args["policy"].upper(),
                     scale, TASK_NAMES.get(run_args["task"], run_args["task"])])


def dataset_name(run_args: dict, data: str | None = None) -> str:
    """Short name of the evaluated set: `math-d0`, `humaneval`, or the data file / hub dataset's name (`data`:
    another evaluation set than the run's own)."""
    if not data and run_args["task"] in ("math", "code"):
        return f"math-d{run_args['difficulty']}" if run_args["task"] == "math" else "humaneval"
    return re.sub(r"\.(jsonl|json|parquet)$", "", os.path.basename(str(data or run_args["data"]).rstrip("/")))


def checkpoint_source(run_dir: str, mode: str, sa_run: str | None) -> str:
    """The run whose checkpoints a mode loads: the SA run under the SA modes, else the run itself."""
    if mode in SA_MODES and not sa_run:
        usage_error(f"--mode {mode} needs --sa-run RUN (a single-agent run folder)")
    return sa_run if mode in SA_MODES else run_dir


def resolve_steps(run_dir: str, mode: str, step: int | None, every: bool, sa_run: str | None) -> list[int]:
    """[0] for base; else the requested (or latest, or every) checkpoint of the run whose adapters are loaded."""
    if mode == "base":
        return [0]
    source = checkpoint_source(run_dir, mode, sa_run)
    steps = policies.checkpoint_steps(source)
    if not steps:
        usage_error(f"{source} has no checkpoints")
    if step is not None and step not in steps:
        usage_error(f"{source} has no checkpoint for step {step} (have {steps})")
    return steps if every else [steps[-1] if step is None else step]


# ---------------------------------------------------------------- metrics (pure)

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021),
    computed as a product so large n never overflows."""
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def evaluation_tallies(episodes: list[Episode]) -> Tallies:
    """The counts one evaluation reports, as numerators and denominators (so ranks add them): the episode
    tallies, each sample index's accuracy (`sample/<k>`: one full pass over the tasks), and pass@k for k = 1,
    2, 4... up to the samples per task, per task (a task's samples are all on one rank)."""
    t = episode_tallies(episodes)
    per_task: dict[str, list[bool]] = {}
    for e in episodes:
        per_task.setdefault(e.task.id, []).append(e.correct)
        t.setdefault(f"sample/{e.sample}", [0.0, 0.0])[0] += e.correct
        t[f"sample/{e.sample}"][1] += 1
    for outcomes in per_task.values():
        for k in (2 ** i for i in range(len(outcomes).bit_length())):
            t.setdefault(f"pass@{k}", [0.0, 0.0])[0] += pass_at_k(len(outcomes), sum(outcomes), k)
            t[f"pass@{k}"][1] += 1
    return t


def evaluation_metrics(tallies: Tallies | list[Episode]) -> dict[str, float | None]:
    """Accuracy and its std over the sample indices, pass@k, and the episode metrics (per-role accuracy from each
    role's own answer, format, length, any_correct, Eval-Opt's retry rates, fallbacks); None: nothing to count."""
    m = rates(evaluation_tallies(tallies) if isinstance(tallies, list) else tallies)
    per_sample = [m.pop(k) for k in [k for k in m if k.startswith("sample/")]]
    return {"accuracy": statistics.mean(per_sample), "accuracy_std": statistics.pstdev(per_sample), **m}


# ---------------------------------------------------------------- model and episodes per mode

def mode_route(mode: str, policy: str) -> Callable[[str], str]:
    """Call name -> adapter under each mode: adapters off (base), the run's own SP/IP routing (trained), the SA
    adapter for every role (sa-transfer), or for the solving roles only, the rest on the base model."""
    if mode == "base":
        return lambda name: BASE
    if mode == "trained":
        return lambda name: route_adapter(name, policy)
    if mode == "sa-transfer":
        return lambda name: SA_ADAPTER
    return lambda name: SA_ADAPTER if route_adapter(name, "ip") in SOLVING_ROLES else BASE  # ip: the role type


def build_model(run_args: dict, mode: str, sa_args: dict | None, device: str):
    """(model, tokenizer) for a mode: the plain base model (`base`), the run's adapters (`trained`), or one
    adapter shaped like the SA run's (SA modes). Checkpoint weights are loaded by `load_step`."""
    model, tokenizer = policies.load_model(run_args["model"], getattr(torch, run_args["dtype"]), device,
                                           run_args["seed"])
    if mode == "trained":
        adapters = sorted({route_adapter(r, run_args["policy"]) for r in ROLES[run_args["workflow"]]})
        model = policies.add_adapters(model, adapters, run_args["lora_rank"], run_args["lora_alpha"])
    elif mode in SA_MODES:
        model = policies.add_adapters(model, [SA_ADAPTER], sa_args["lora_rank"], sa_args["lora_alpha"])
    return model, tokenizer


def load_step(model, mode: str, run_dir: str, sa_run: str | None, sa_args: dict | None, step: int) -> None:
    """Put checkpoint `step` into the model: every adapter of the run, or the SA run's only adapter as `sa`. A
    checkpoint that does not read back whole is one line (evaluations of earlier steps are already saved)."""
    folder = os.path.join(policies.checkpoint_folder(sa_run if mode in SA_MODES else run_dir, step), "adapters")
    try:
        if mode == "trained":
            policies.load_adapters(model, folder)
        elif mode in SA_MODES:  # the SA run's one adapter (`shared` under SP, `generator` under IP), renamed `sa`
            saved = route_adapter("generator", sa_args["policy"])
            weights = policies.read_adapters(folder, [saved], str(model.device))
            policies.load_adapters(model, "", {SA_ADAPTER: weights[saved]})
    except Exception as e:  # a missing, truncated or corrupted adapter file
        usage_error(f"cannot read checkpoint {os.path.dirname(folder)}: {type(e).__name__}: {e}")


def check_sa_run(run_args: dict, sa_run: str) -> dict:
    """The SA run's args, after checking it is a single-agent run on the same model and task."""
    sa_args = read_run_args(sa_run, f"--sa-run {sa_run}", EVAL_RUN_KEYS)
    if sa_args["workflow"] != "single":
        usage_error(f"--sa-run {sa_run} trained workflow {sa_args['workflow']!r}, not 'single'")
    for key in ("model", "task"):
        if sa_args[key] != run_args[key]:
            usage_error(f"--sa-run {sa_run} has {key} {sa_args[key]!r} but --run has {run_args[key]!r}")
    return sa_args


def eval_lengths(run_args: dict) -> tuple[int | None, int]:
    """(prompt, response) token limits: a paper cell's evaluation lengths, else the run's training ones."""
    if run_args.get("cell"):
        return PAPER_LENGTHS["code" if run_args["task"] in ("code", "deepcoder") else "math", run_args["workflow"]][2:]
    return run_args.get("max_prompt_tokens"), run_args["max_new_tokens"]


def eval_tasks(run_args: dict, data: str | None) -> list[tasks.Task]:
    """The run's validation split, or every row of `data` read in the run's task format; bad rows: one line."""
    try:
        if data is None:
            return tasks.load_split(run_args["task"], run_args["data"], run_args["data_config"], run_args["n_train"],
                                    run_args["n_val"], run_args["difficulty"], run_args["seed"])[1]
        return (tasks.load_code if run_args["task"] in ("code", "deepcoder") else tasks.load_math)(data)
    except (tasks.DataError, ValueError) as e:
        usage_error(str(e))


def run_episodes(tasks_: list[tasks.Task], n: int, run_args: dict, engine, tokenizer, route: Callable[[str], str],
                 max_prompt_tokens: int | None, desc: str = "eval") -> list[Episode]:
    """n episodes per task, stage-batched, each call on the adapter `route` names, rewarded with the run's credit:
    the same function for training (train.run_workflow), validation and evaluation."""
    opts = workflows.WorkflowOptions(run_args["prompts"], run_args["evalopt_context"], run_args["n_votes"],
                                     run_args["max_iterations"], run_args["max_subtasks"])
    episodes = workflows.rollout(tasks_, n, run_args["workflow"], engine,
                                 lambda messages: policies.chat_prompt_ids(tokenizer, messages,
                                                                           run_args["enable_thinking"]),
                                 route, opts, max_prompt_tokens, desc=desc)
    workflows.assign_rewards(episodes, run_args["credit"])
    return episodes


def dump_trajectories(episodes: list[Episode], folder: str) -> list[str]:
    """One readable JSON file per episode, `episode_<task-id>_<sample>.json`: the task, the outcome, then every
    call in order (name, role, adapter, turn, messages, output, parsed answer, own correctness, reward)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for ep in episodes:
        path = os.path.join(folder, f"episode_{re.sub(r'[^A-Za-z0-9_.-]', '-', ep.task.id)}_{ep.sample}.json")
        calls = [{"name": c.name, "role": c.role, "adapter": c.adapter, "turn": c.turn, "messages": c.messages,
                  "output": c.text, "parsed": c.metrics.get("parsed"), "correct": c.metrics.get("correct"),
                  "reward": c.reward, "truncated": c.truncated, "response_tokens": len(c.completion_ids),
                  "metrics": {k: v for k, v in c.metrics.items() if k not in ("parsed", "correct")}}
                 for c in ep.calls]
        with open(path, "w") as f:
            json.dump({"task": {"id": ep.task.id, "question": ep.task.question, "answer": ep.task.answer},
                       "sample": ep.sample, "final_answer": ep.final_answer, "correct": ep.correct,
                       "metrics": ep.metrics, "calls": calls}, f, indent=1, default=str)
        paths.append(path)
    return paths


def trajectory_folder(run_dir: str, dataset: str, mode: str, step: int, sa_run: str | None = None) -> str:
    """RUN/trajectories/<dataset>/<mode>-step_<N> (SA modes: `<mode>-<SA run folder name>-step_<N>`)."""
    if mode in SA_MODES:
        mode = f"{mode}-{os.path.basename(os.path.normpath(sa_run or 'sa'))}"
    return os.path.join(run_dir, "trajectories", dataset, f"{mode}-step_{step:06d}")


# ---------------------------------------------------------------- evaluate

def evaluate_steps(run_dir: str, mode: str, steps: list[int], args: argparse.Namespace) -> list[dict]:
    """Evaluate each step of one mode (the model loads once), from the command line's settings (`args`); each
    record is appended to the results file as soon as it is done. Under torchrun each rank runs a share."""
    run_args = read_run_args(run_dir, keys=EVAL_RUN_KEYS)
    sa_run = args.sa_run if mode in SA_MODES else None
    sa_args = check_sa_run(run_args, checkpoint_source(run_dir, mode, sa_run)) if mode in SA_MODES else None
    eval_set = eval_tasks(run_args, args.data)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model, tokenizer = build_model(run_args, mode, sa_args, device)
    temp = run_args["temperature"] if args.temperature is None else args.temperature
    cell_prompt, cell_new = eval_lengths(run_args)
    max_prompt, max_new = args.max_prompt_tokens or cell_prompt, args.max_new_tokens or cell_new
    engine = policies.HFEngine(model, tokenizer, max_new, temp, run_args["top_p"], run_args["gen_batch_size"])
    dataset, records = dataset_name(run_args, args.data), []
    for step in tqdm(steps, desc=f"eval {mode}", disable=None if len(steps) > 1 else True):
        load_step(model, mode, run_dir, sa_run, sa_args, step)
        policies.seed_everything(args.seed)  # every checkpoint samples with the same seed: differences are weights'
        start = time.time()
        episodes = run_episodes(share(eval_set), args.n, run_args, engine, tokenizer,
                                mode_route(mode, run_args["policy"]), max_prompt, f"eval {mode} step {step}")
        r = {"run": run_dir, "cell": cell_name(run_args), "step": step, "dataset": dataset, "mode": mode,
             "workflow": run_args["workflow"], "policy": run_args["policy"], "n": args.n, "tasks": len(eval_set),
             "temperature": temp, "max_new_tokens": max_new, "seed": args.seed, "time_s": round(time.time() - start, 1),
             "metrics": evaluation_metrics(add_tallies(gather(evaluation_tallies(episodes))))}
        if sa_run:
            r.update(sa_run=os.path.normpath(sa_run), sa_cell=cell_name(sa_args))
        if args.dump:  # each rank its own episodes
            r["trajectories"] = trajectory_folder(run_dir, dataset, mode, step, sa_run)
            dump_trajectories(episodes, r["trajectories"])
        if world()[0] == 0:
            out = args.out or os.path.join(run_dir, "eval.jsonl")
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # --out may name a new folder
            with open(out, "a") as f:
                f.write(json.dumps(r, allow_nan=False) + "\n")
        m = r["metrics"]
        tqdm.write(f"{r['cell']} {mode} step {step}: accuracy {m['accuracy']:.3f} (std {m['accuracy_std']:.3f} over "
                   f"{args.n} samples x {len(eval_set)} tasks), "
                   + ", ".join(f"{k} {v:.3f}" for k, v in m.items() if k.startswith("pass@")))
        records.append(r)
    return records


# ---------------------------------------------------------------- plots and the results table

EVAL_KEYS = ("cell", "dataset", "mode", "step", "n", "tasks", "metrics")  # what plots and tables read of a record
ROLE_PANELS = [("grad_norm", "gradient norm"), ("entropy", "entropy"), ("response_len", "response length (tokens)"),
               ("loss_share", "loss share")]


def plot_runs(run_dirs: list[str], out_dir: str) -> dict[str, tuple]:
    """Two PNGs: validation accuracy against training step (one line per run, a dashed base-model line per
    distinct workflow / model / data: an eval.jsonl `base` record, else the step-0 validation), and a 2x2 panel
    of per-role training metrics (one line per run and role). Returns {name: (figure, path)}."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    runs = [(read_run_args(r, keys=NAME_KEYS), read_results(os.path.join(r, "metrics.jsonl"), ("step",)),
             read_results(os.path.join(r, "eval.jsonl"), EVAL_KEYS)) for r in run_dirs]  # all read, then drawn
    for r, (_, metrics, _) in zip(run_dirs, runs):
        if not metrics:
            usage_error(f"{r}: no metrics yet (metrics.jsonl is missing or empty)")
    os.makedirs(out_dir, exist_ok=True)
    cells = [cell_name(args) for args, _, _ in runs]  # the folder name tells apart runs of one cell
    labels = [f"{c} ({os.path.basename(os.path.normpath(r))})" if cells.count(c) > 1 else c
              for c, r in zip(cells, run_dirs)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig_acc, ax = plt.subplots(figsize=(7, 4.5))
    bases: dict[tuple, tuple[float, str, str]] = {}
    for i, ((args, metrics, evals), label) in enumerate(zip(runs, labels)):
        val = [(m["step"], m["val/success"]) for m in metrics if "val/success" in m]
        if val:
            ax.plot(*zip(*val), marker="o", color=colors[i % len(colors)], label=label)
        base = [r["metrics"]["accuracy"] for r in evals if r["mode"] == "base"]
        base += [m["val/success"] for m in metrics if m["step"] == 0 and "val/success" in m]
        if base:
            name = "-".join(cells[i].split("-")[:1] + cells[i].split("-")[2:])  # the cell without its policy
            bases.setdefault((args["workflow"], args["model"], dataset_name(args)), (base[0], name, colors[i]))
    for value, name, color in bases.values():  # several: each in the colour of its first run
        ax.axhline(value, color="gray" if len(bases) == 1 else color, linestyle="--",
                   label="base" if len(bases) == 1 else f"base ({name})")
    ax.set(xlabel="training step", ylabel="validation accuracy", ylim=(0, 1.02),
           title="Validation accuracy (step 0: before training)")
    fig_roles, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for i, ((args, metrics, _), label) in enumerate(zip(runs, labels)):
        steps = [m for m in metrics if m["step"] > 0]
        for j, role in enumerate(ROLES[args["workflow"]]):
            for panel, (key, _) in zip(axes.flat, ROLE_PANELS):
                points = [(m["step"], m[f"{role}/{key}"]) for m in steps if m.get(f"{role}/{key}") is not None]
                if points:
                    panel.plot(*zip(*points), color=colors[i % len(colors)], linestyle=["-", "--", ":", "-."][j % 4],
                               label=f"{label} {role}")
    for panel, (_, title) in zip([ax, *axes.flat], [("", ""), *ROLE_PANELS]):
        panel.set(xlabel="training step", **({"title": title} if title else {}))
        panel.xaxis.get_major_locator().set_params(integer=True)
        panel.grid(alpha=0.3)
    axes.flat[3].set_ylim(0, 1.05)  # a role's share of its adapter's loss weight (IP: always 1)
    for panel, size in ((ax, 8), (axes.flat[0], 7)):
        if panel.get_legend_handles_labels()[0]:  # a run without validation has no curve to name
            panel.legend(fontsize=size)
    fig_roles.suptitle("Per-role training metrics (colour: run, line style: role)")
    out = {}
    for name, fig in (("val_accuracy", fig_acc), ("roles", fig_roles)):
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=120)
        out[name] = (fig, os.path.join(out_dir, f"{name}.png"))
    return out


TABLE_METRICS = ["accuracy", "pass@2", "any_correct", "generator/acc", "aggregator/acc", "aggregator/format_ok",
                 "fallback_rate"]


def results_table(records: list[dict]) -> str:
    """A markdown table of evaluation records (one row each, in order: what ran on which set, then the metrics of
    TABLE_METRICS that some record has); accuracy with its std over samples (n > 1); `-`: the metric does not apply."""
    columns = [k for k in TABLE_METRICS if any(r["metrics"].get(k) is not None for r in records)]
    head = ["cell", "dataset", "mode", "step", "samples", *columns]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in records:
        m = r["metrics"]
        mode = f"{r['mode']} ({r['sa_cell']})" if r["mode"] in SA_MODES else r["mode"]
        accuracy = f"{m['accuracy']:.3f}" + (f" ± {m['accuracy_std']:.3f}" if r["n"] > 1 else "")  # std needs n > 1
        row = [r["cell"], r["dataset"], mode, str(r["step"]), f"{r['n']} x {r['tasks']}"]
        row += [accuracy if k == "accuracy" else "-" if m.get(k) is None else f"{m[k]:.3f}" for k in columns]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line

class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default after its help."""


def build_parser() -> Parser:
    p = Parser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    commands = p.add_subparsers(dest="command", title="commands (default: evaluate --run-dir)")
    plot = commands.add_parser("plot", help="PNG curves of runs: validation accuracy, per-role training metrics")
    plot.add_argument("runs", nargs="+", help="run folders written by train.py")
    plot.add_argument("--out", default=None, help="folder for the PNGs (default: plots/ beside the first run)")
    table = commands.add_parser("table", help="the runs' eval.jsonl records as one markdown table")
    table.add_argument("results", nargs="+", help="run folders (reads RUN/eval.jsonl) or results JSONL files")
    g = p.add_argument_group("evaluate")
    g.add_argument("--run-dir", "--run", dest="run", default=None, help="run folder written by train.py; under "
                   "torchrun write --run-dir (torchrun takes --run for its own --run-path)")
    g.add_argument("--mode", default="trained", choices=MODES, help="base: adapters off; trained: the run's adapters "
                   "as in training; sa-transfer: --sa-run's adapter for every role; sa-generator-transfer: for the "
                   "generators and workers only")
    g.add_argument("--sa-run", default=None, help="SA modes: a single-agent run folder (same model and task)")
    g.add_argument("--step", type=int, default=None, help="checkpoint step (SA modes: of --sa-run); default: latest")
    g.add_argument("--every-checkpoint", action="store_true", help="evaluate every saved checkpoint")
    g.add_argument("--data", default=None, help="evaluate on this file instead of the run's validation split, in the "
                   "run's task format (math: AIME 2025; code: DeepCoder's primeintellect test split)")
    count = number(int, 1)
    g.add_argument("--samples", "--n", dest="n", type=count, default=1, help="samples per task: accuracy is their "
                   "mean, pass@k for k = 1, 2, 4... <= n; under torchrun write --samples")
    g.add_argument("--temperature", type=number(float, 0), default=None, help="default: the run's sampling temperature")
    g.add_argument("--max-new-tokens", type=count, default=None, help="default: a paper cell's evaluation length "
                   "(math 8192, code 5120), else the run's")
    g.add_argument("--max-prompt-tokens", type=count, default=None, help="default: a paper cell's evaluation limit, "
                   "else the run's")
    g.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every checkpoint")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--dump", action="store_true", help="one JSON file per episode under RUN/trajectories/")
    g.add_argument("--out", default=None, help="JSONL to append results to (default: RUN/eval.jsonl)")
    return p


def check_eval_args(args: argparse.Namespace) -> None:
    """One line for each bad value, before any model loads."""
    if not args.run:
        usage_error("--run-dir RUN is needed (or a command: plot, table; see --help)")
    read_run_args(args.run, keys=EVAL_RUN_KEYS)  # a folder that is not a run: one line
    if args.out:
        check_writable(args.out, "--out", folder=False)
    if args.mode in SA_MODES and args.sa_run:
        read_run_args(args.sa_run, f"--sa-run {args.sa_run}", EVAL_RUN_KEYS)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device) or (args.device.startswith("cuda")
                                                                  and not torch.cuda.is_available()):
        usage_error(f"--device {args.device}: expected auto, cpu, or cuda with a visible CUDA device")
    if args.every_checkpoint and args.mode == "base":
        usage_error("--every-checkpoint needs a mode with checkpoints (base has none)")


def results_command(paths: list[str]) -> str:
    """`eval.py table`: the records of the given runs' eval.jsonl (or JSONL files), printed as one table."""
    files = [os.path.join(p, "eval.jsonl") if os.path.isdir(p) else p for p in paths]
    for path in files:
        if not os.path.exists(path):
            usage_error(f"no evaluation results at {path} (run `python eval.py --run-dir RUN` first)")
    records = [r for path in files for r in read_results(path, EVAL_KEYS)]
    if not records:
        usage_error(f"no evaluation records in {', '.join(paths)} (run `python eval.py --run-dir RUN` first)")
    print(results_table(records))
    return results_table(records)


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "table":
        return results_command(args.results)
    if args.command == "plot":
        out = args.out or os.path.join(os.path.dirname(os.path.normpath(args.runs[0])), "plots")
        check_writable(out, "--out", folder=True)
        figures = plot_runs(args.runs, out)
        print("\n".join(f"wrote {path}" for _, path in figures.values()))
        return figures
    check_eval_args(args)
    steps = resolve_steps(args.run, args.mode, args.step, args.every_checkpoint, args.sa_run)
    args.device = init_distributed() or args.device  # under torchrun each rank evaluates a share of the tasks
    try:
        return evaluate_steps(args.run, args.mode, steps, args)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    record(main)()  # under torchrun, a failing rank's traceback goes into torchrun's failure summary

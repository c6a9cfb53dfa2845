"""Evaluate a workflow (base model, trained checkpoints, or a single-agent adapter dropped into it) and plot runs.

Method notes: "Evaluation" and findings 1-2 in docs/method.md. Evaluation reports mean accuracy, unbiased pass@k and
per-role statistics, per checkpoint, in four modes:

- `base`: adapters off, the model every run starts from (recorded as step 0: LoRA B = 0 at init);
- `trained`: a run's checkpoint, each role routed to its own adapter as in training (SP: `shared`, IP: per role);
- `sa-transfer`: the adapter of a single-agent run (`--sa-run`) used for *every* role of the `--run`'s workflow:
  finding 1 compares trained workflows against SA-RL dropped into the same structure;
- `sa-generator-transfer`: that adapter for the solving roles only (generators, workers); the supervising roles
  (aggregator, evaluator, orchestrator, synthesizer) run on the base model.

The run folder remembers how it was trained (RUN/args.json: model, workflow, policy, task, workflow options),
so the evaluated workflow, split and sampling settings come from `--run`; `--data FILE` evaluates another set in
the run's task format (AIME 2025 for math, DeepCoder's test split for code). A paper cell's run is evaluated with
the paper's evaluation lengths (longer responses than in training: math 8,192, code 5,120). To transfer an SA
adapter into a workflow you have not trained, make an untrained run folder for it: `python train.py --workflow
voting --steps 0 --val-every 0 --run-dir runs/voting-untrained`.

    python eval.py --run runs/voting-ip --mode base --n 4                       # the base model, 4 samples per task
    python eval.py --run runs/voting-ip --mode trained --step 10 --dump         # one checkpoint, trajectories kept
    python eval.py --run runs/voting-ip --mode trained --every-checkpoint       # all saved steps not yet evaluated
    python eval.py --run runs/voting-ip --mode sa-transfer --sa-run runs/single-sp --n 4
    python eval.py --run runs/voting-ip --data aime2025.jsonl                   # another evaluation set
    python eval.py plot runs/voting-ip runs/voting-sp [--out runs/plots]        # PNG curves from metrics.jsonl
    python eval.py table runs/voting-ip runs/voting-sp                          # their eval.jsonl as one table

Outputs: one JSON line per evaluation appended to RUN/eval.jsonl (step, dataset, workflow, policy, mode, cell,
metrics); with `--dump`, one JSON file per episode (every call's role, adapter, prompt, output, parsed answer,
correctness, reward) as RUN/trajectories/<dataset>/<mode>-step_<N>/episode_<task-id>_<sample>.json.
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
from dataclasses import dataclass
from typing import Callable, NoReturn

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

import policies
import tasks
import workflows
from grpo import gather, init_distributed, share, world
from policies import BASE, route_adapter
from workflows import PAPER_LENGTHS, ROLES, Episode, Tallies, WorkflowOptions, add_tallies, episode_tallies, rates

MODES = ("base", "trained", "sa-transfer", "sa-generator-transfer")
SA_MODES = ("sa-transfer", "sa-generator-transfer")  # the modes that load a single-agent run's adapter
SA_ADAPTER = "sa"  # the name that adapter takes here (it shows in dumps)
SOLVING_ROLES = ("generator", "worker")  # sa-generator-transfer: these get the SA adapter, the rest the base model

# ---------------------------------------------------------------- run folders and their names

WORKFLOW_NAMES = {"single": "Single", "voting": "Voting", "evalopt": "EvalOpt", "orchworkers": "OrchWorkers"}
SCALE_NAMES = {"smollm2": "SmolLM2", "tiny": "Tiny", "tiny-qwen3": "TinyQwen3", "random-qwen3-0.6b": "Random0.6B"}
TASK_NAMES = {"math": "Math", "dapo": "Math", "code": "Code", "deepcoder": "Code"}


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
    if data:
        return re.sub(r"\.(jsonl|json|parquet)$", "", os.path.basename(data.rstrip("/")))
    if run_args["task"] == "math":
        return f"math-d{run_args['difficulty']}"
    if run_args["task"] == "code":
        return "humaneval"
    return re.sub(r"\.(jsonl|json|parquet)$", "", os.path.basename(str(run_args["data"]).rstrip("/")))


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`error: argument --n: ...`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


def usage_error(message: str) -> NoReturn:
    """Bad input found before anything was loaded or written: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_run_args(run_dir: str) -> dict:
    """RUN/args.json; a folder that is not a run folder is a one-line error."""
    try:
        with open(os.path.join(run_dir, "args.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        usage_error(f"{run_dir}: not a run folder (no args.json; train.py writes one)")
    except (OSError, ValueError) as e:
        usage_error(f"{run_dir}: unreadable args.json ({e})")


def adapters_folder(run_dir: str, step: int) -> str:
    return os.path.join(policies.checkpoint_folder(run_dir, step), "adapters")


def checkpoint_source(run_dir: str, mode: str, sa_run: str | None) -> str:
    """The run whose checkpoints a mode loads: the SA run under the SA modes, else the run itself."""
    if mode not in SA_MODES:
        return run_dir
    if not sa_run:
        usage_error(f"--mode {mode} needs --sa-run RUN (a single-agent run folder)")
    return sa_run


def resolve_step(run_dir: str, mode: str, step: int | None, sa_run: str | None) -> int:
    """0 for base; else the requested (or latest) checkpoint of the run whose adapters are loaded."""
    if mode == "base":
        return 0
    source = checkpoint_source(run_dir, mode, sa_run)
    steps = policies.checkpoint_steps(source)
    if not steps:
        usage_error(f"{source} has no checkpoints")
    if step is not None and step not in steps:
        usage_error(f"{source} has no checkpoint for step {step} (have {steps})")
    return steps[-1] if step is None else step


# ---------------------------------------------------------------- metrics (pure)

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021),
    computed as a product so large n never overflows."""
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def evaluation_tallies(episodes: list[Episode]) -> Tallies:
    """The counts one evaluation reports, as numerators and denominators (so ranks add them): the episode
    tallies, each sample index's accuracy (`sample/<k>`: one full pass over the tasks), and pass@k for k = 1,
    2, 4... up to the samples per task, per task (a task's samples are all on one rank)."""
    t = episode_tallies(episodes)
    per_task: dict[str, list[bool]] = {}
    for e in episodes:
        per_task.setdefault(e.task.id, []).append(e.correct)
        t.setdefault(f"sample/{e.sample}", [0.0, 0.0])
        t[f"sample/{e.sample}"][0] += e.correct
        t[f"sample/{e.sample}"][1] += 1
    for outcomes in per_task.values():
        for k in (2 ** i for i in range(len(outcomes).bit_length()) if 2 ** i <= len(outcomes)):
            t.setdefault(f"pass@{k}", [0.0, 0.0])
            t[f"pass@{k}"][0] += pass_at_k(len(outcomes), sum(outcomes), k)
            t[f"pass@{k}"][1] += 1
    return t


def evaluation_metrics(tallies: Tallies | list[Episode]) -> dict[str, float | None]:
    """Everything one evaluation reports: accuracy and its std over the sample indices, pass@k, and the
    episode metrics (per-role accuracy regraded from each role's own answer, format compliance, response length,
    any_correct, Eval-Opt retry/fix/break, fallbacks); None (JSON null) where there was nothing to count."""
    if isinstance(tallies, list):
        tallies = evaluation_tallies(tallies)
    m = rates(tallies)
    per_sample = [m.pop(k) for k in [k for k in m if k.startswith("sample/")]]
    return {"accuracy": statistics.mean(per_sample), "accuracy_std": statistics.pstdev(per_sample), **m}


# ---------------------------------------------------------------- model and engine per mode

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
    model, tokenizer = policies.load_model(run_args["model"], getattr(torch, run_args["dtype"]), device, run_args["seed"])
    if mode == "trained":
        adapters = sorted({route_adapter(r, run_args["policy"]) for r in ROLES[run_args["workflow"]]})
        model = policies.add_adapters(model, adapters, run_args["lora_rank"], run_args["lora_alpha"])
    elif mode in SA_MODES:
        model = policies.add_adapters(model, [SA_ADAPTER], sa_args["lora_rank"], sa_args["lora_alpha"])
    return model, tokenizer


def load_step(model, mode: str, run_dir: str, sa_run: str | None, sa_args: dict | None, step: int) -> None:
    """Put checkpoint `step` into the model: every adapter of the run, or the SA run's only adapter as `sa`."""
    if mode == "trained":
        policies.load_adapters(model, adapters_folder(run_dir, step))
    elif mode in SA_MODES:  # the SA run's one adapter (`shared` under SP, `generator` under IP), renamed `sa`
        saved = route_adapter("generator", sa_args["policy"])
        weights = policies.read_adapters(adapters_folder(sa_run, step), [saved], str(model.device))
        policies.load_adapters(model, "", {SA_ADAPTER: weights[saved]})


def check_sa_run(run_args: dict, sa_run: str) -> dict:
    """The SA run's args, after checking it is a single-agent run on the same model and task."""
    sa_args = read_run_args(sa_run)
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
    """n episodes per task, stage-batched as in training, rewarded with the run's credit (for the dumps)."""
    opts = WorkflowOptions(run_args["prompts"], run_args["evalopt_context"], run_args["n_votes"],
                           run_args["max_iterations"], run_args["max_subtasks"])
    episodes = workflows.rollout(tasks_, n, run_args["workflow"], engine,
                       lambda messages: policies.chat_prompt_ids(tokenizer, messages, run_args["enable_thinking"]), route, opts,
                       max_prompt_tokens, desc=desc)
    workflows.assign_rewards(episodes, run_args["credit"])
    return episodes


# ---------------------------------------------------------------- trajectories

def episode_record(ep: Episode) -> dict:
    """One episode as a reader wants it: the task, the outcome, then every call in order."""
    return {
        "task": {"id": ep.task.id, "question": ep.task.question, "answer": ep.task.answer},
        "sample": ep.sample, "final_answer": ep.final_answer, "correct": ep.correct, "metrics": ep.metrics,
        "calls": [{"name": c.name, "role": c.role, "adapter": c.adapter, "turn": c.turn, "messages": c.messages,
                   "output": c.text, "parsed": c.metrics.get("parsed"), "correct": c.metrics.get("correct"),
                   "reward": c.reward, "truncated": c.truncated, "response_tokens": len(c.completion_ids),
                   "metrics": {k: v for k, v in c.metrics.items() if k not in ("parsed", "correct")}}
                  for c in ep.calls],
    }


def trajectory_folder(run_dir: str, dataset: str, mode: str, step: int, sa_run: str | None = None) -> str:
    """RUN/trajectories/<dataset>/<mode>-step_<N>: one folder per evaluated checkpoint and mode (base: step 0;
    sa-transfer: `sa-transfer-<SA run folder name>-step_<N>`, since several SA runs may go into one workflow)."""
    if mode in SA_MODES:
        mode = f"{mode}-{os.path.basename(os.path.normpath(sa_run or 'sa'))}"
    return os.path.join(run_dir, "trajectories", dataset, f"{mode}-step_{step:06d}")


def dump_trajectories(episodes: list[Episode], folder: str) -> list[str]:
    """One readable JSON file per episode, `episode_<task-id>_<sample>.json`; returns the paths."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for ep in episodes:
        path = os.path.join(folder, f"episode_{re.sub(r'[^A-Za-z0-9_.-]', '-', ep.task.id)}_{ep.sample}.json")
        with open(path, "w") as f:
            json.dump(episode_record(ep), f, indent=1, default=str)
        paths.append(path)
    return paths


# ---------------------------------------------------------------- results file

def read_results(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def result_key(mode: str, step: int, dataset: str, n: int, sa_run: str | None = None) -> tuple:
    """Two evaluations with the same key measured the same thing; `--every-checkpoint` skips done keys."""
    return mode, step, dataset, n, os.path.normpath(sa_run) if sa_run else None


def done_keys(results_path: str) -> set[tuple]:
    return {result_key(r["mode"], r["step"], r["dataset"], r["n"], r.get("sa_run")) for r in read_results(results_path)}


# ---------------------------------------------------------------- evaluate

@dataclass
class EvalSettings:
    """How to evaluate (the command line of `python eval.py`); the workflow itself comes from the run."""
    n: int = 1                           # samples per task: accuracy is their mean, pass@k for k <= n
    temperature: float | None = None     # None: the run's sampling temperature
    seed: int = 0                        # the same sampling seed for every checkpoint
    sa_run: str | None = None            # SA modes: the single-agent run whose adapter is transferred
    dump: bool = False                   # one JSON file per episode
    device: str = "auto"
    results_path: str | None = None      # JSONL the records are appended to
    data: str | None = None              # another evaluation set (None: the run's validation split)
    max_new_tokens: int | None = None    # None: eval_lengths
    max_prompt_tokens: int | None = None


def evaluate_steps(run_dir: str, mode: str, steps: list[int], cfg: EvalSettings) -> list[dict]:
    """Evaluate each step (ignored for `base`) of one mode, loading the model once; one result record each,
    appended to `cfg.results_path` as soon as it is done (so an interrupted --every-checkpoint resumes)."""
    if mode not in MODES:
        usage_error(f"unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if not steps:  # nothing left to evaluate: do not even load the model
        return []
    run_args = read_run_args(run_dir)
    sa_args = check_sa_run(run_args, checkpoint_source(run_dir, mode, cfg.sa_run)) if mode in SA_MODES else None
    tasks = eval_tasks(run_args, cfg.data)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    model, tokenizer = build_model(run_args, mode, sa_args, device)
    temp = run_args["temperature"] if cfg.temperature is None else cfg.temperature
    max_prompt, max_new = eval_lengths(run_args)
    max_prompt, max_new = cfg.max_prompt_tokens or max_prompt, cfg.max_new_tokens or max_new
    engine = policies.HFEngine(model, tokenizer, max_new, temp, run_args["top_p"], run_args["gen_batch_size"])
    dataset = dataset_name(run_args, cfg.data)
    records = []
    for step in tqdm(steps, desc=f"eval {mode}", disable=None if len(steps) > 1 else True):
        load_step(model, mode, run_dir, cfg.sa_run, sa_args, step)
        policies.seed_everything(cfg.seed)  # every checkpoint samples with the same seed: differences are the weights'
        start = time.time()
        episodes = run_episodes(share(tasks), cfg.n, run_args, engine, tokenizer, mode_route(mode, run_args["policy"]),
                                max_prompt, desc=f"eval {mode} step {step}")  # torchrun: this rank's share
        record = {"run": run_dir, "cell": cell_name(run_args), "step": step, "dataset": dataset,
                  "workflow": run_args["workflow"], "policy": run_args["policy"], "mode": mode, "n": cfg.n,
                  "tasks": len(tasks), "temperature": temp, "max_new_tokens": max_new, "seed": cfg.seed,
                  "time_s": round(time.time() - start, 1),
                  "metrics": evaluation_metrics(add_tallies(gather(evaluation_tallies(episodes))))}
        if mode in SA_MODES:
            record.update(sa_run=os.path.normpath(cfg.sa_run), sa_cell=cell_name(sa_args))
        if cfg.dump:
            record["trajectories"] = trajectory_folder(run_dir, dataset, mode, step, cfg.sa_run)
            dump_trajectories(episodes, record["trajectories"])
        if cfg.results_path and world()[0] == 0:
            with open(cfg.results_path, "a") as f:
                f.write(json.dumps(record, allow_nan=False) + "\n")
        m = record["metrics"]
        tqdm.write(f"{record['cell']} {mode} step {step}: accuracy {m['accuracy']:.3f} (std {m['accuracy_std']:.3f} "
                   f"over {cfg.n} samples x {len(tasks)} tasks), "
                   + ", ".join(f"{k} {v:.3f}" for k, v in m.items() if k.startswith("pass@")))
        records.append(record)
    return records


def evaluate(run_dir: str, mode: str = "trained", step: int | None = None, **settings) -> dict:
    """One evaluation record (see `evaluate_steps`); `step` defaults to the latest checkpoint."""
    cfg = EvalSettings(**settings)
    return evaluate_steps(run_dir, mode, [resolve_step(run_dir, mode, step, cfg.sa_run)], cfg)[0]


# ---------------------------------------------------------------- plots

ROLE_PANELS = [("grad_norm", "gradient norm"), ("entropy", "entropy"), ("response_len", "response length (tokens)"),
               ("loss_share", "loss share")]


def read_metrics(run_dir: str) -> list[dict]:
    """RUN/metrics.jsonl as a list of step records (undefined rates are null)."""
    return read_results(os.path.join(run_dir, "metrics.jsonl"))


def run_labels(run_dirs: list[str]) -> list[str]:
    """Cell names; where two runs share one, the folder name is added so the legend tells them apart."""
    cells = [cell_name(read_run_args(r)) for r in run_dirs]
    return [f"{c} ({os.path.basename(os.path.normpath(r))})" if cells.count(c) > 1 else c
            for c, r in zip(cells, run_dirs)]


def base_accuracy(run_dir: str) -> float | None:
    """The base model's accuracy for a run's workflow: an eval.jsonl `base` record, else the step-0 validation."""
    base = [r for r in read_results(os.path.join(run_dir, "eval.jsonl")) if r["mode"] == "base"]
    if base:
        return base[-1]["metrics"]["accuracy"]
    return next((m["val/success"] for m in read_metrics(run_dir) if m["step"] == 0 and "val/success" in m), None)


def plot_runs(run_dirs: list[str], out_dir: str) -> dict[str, tuple]:
    """Two PNGs: validation accuracy against training step (one line per run, a dashed base line per distinct
    workflow/model/task), and a 2x2 per-role panel of training metrics (one line per run and role).
    Returns {"val_accuracy": (figure, path), "roles": (figure, path)}."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    os.makedirs(out_dir, exist_ok=True)
    labels = run_labels(run_dirs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig_acc, ax = plt.subplots(figsize=(7, 4.5))
    bases: dict[tuple, tuple[float, str, str]] = {}  # one base line per (workflow, model, data): they differ
    for i, (run, label) in enumerate(zip(run_dirs, labels)):
        args, metrics = read_run_args(run), read_metrics(run)
        val = [(m["step"], m["val/success"]) for m in metrics if "val/success" in m]
        if val:
            ax.plot(*zip(*val), marker="o", color=colors[i % len(colors)], label=label)
        key = (args["workflow"], args["model"], dataset_name(args))
        if key not in bases and base_accuracy(run) is not None:
            cell = cell_name(args).split("-")
            bases[key] = (base_accuracy(run), "-".join(cell[:1] + cell[2:]), colors[i % len(colors)])  # no policy
    for value, name, color in bases.values():
        if len(bases) == 1:
            ax.axhline(value, color="gray", linestyle="--", label="base")
        else:  # several workflows or models: each base line in the colour of its first run
            ax.axhline(value, color=color, linestyle="--", alpha=0.7, label=f"base ({name})")
    ax.set(xlabel="training step", ylabel="validation accuracy", title="Validation accuracy (step 0: before training)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig_acc.tight_layout()

    fig_roles, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    styles = ["-", "--", ":", "-."]
    for i, (run, label) in enumerate(zip(run_dirs, labels)):
        train_lines = [m for m in read_metrics(run) if m["step"] > 0]
        for j, role in enumerate(ROLES[read_run_args(run)["workflow"]]):
            for panel, (key, _) in zip(axes.flat, ROLE_PANELS):
                points = [(m["step"], m[f"{role}/{key}"]) for m in train_lines if m.get(f"{role}/{key}") is not None]
                if points:
                    panel.plot(*zip(*points), color=colors[i % len(colors)], linestyle=styles[j % len(styles)],
                               label=f"{label} {role}")
    for panel, (_, title) in zip(axes.flat, ROLE_PANELS):
        panel.set(xlabel="training step", title=title)
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        panel.grid(alpha=0.3)
    axes.flat[3].set_ylim(0, 1.05)  # a role's share of its adapter's loss weight (IP: always 1)
    axes.flat[0].legend(fontsize=7)
    fig_roles.suptitle("Per-role training metrics (colour: run, line style: role)")
    fig_roles.tight_layout()

    out = {}
    for name, fig in (("val_accuracy", fig_acc), ("roles", fig_roles)):
        path = os.path.join(out_dir, f"{name}.png")
        fig.savefig(path, dpi=120)
        out[name] = (fig, path)
    return out


# ---------------------------------------------------------------- results table

TABLE_METRICS = ["accuracy", "pass@2", "any_correct", "generator/acc", "aggregator/acc", "aggregator/format_ok",
                 "fallback_rate"]


def results_table(records: list[dict]) -> str:
    """A markdown table of evaluation records (one row each, in order): the columns of TABLE_METRICS that
    some record has; accuracy with its std over the samples (n > 1); `-` where a metric does not apply."""
    columns = [k for k in TABLE_METRICS if any(r["metrics"].get(k) is not None for r in records)]
    lines = ["| cell | mode | step | samples | " + " | ".join(columns) + " |",
             "|---|---|---|---|" + "---|" * len(columns)]
    for r in records:
        m = r["metrics"]
        mode = f"{r['mode']} ({r['sa_cell']})" if r["mode"] in SA_MODES else r["mode"]
        accuracy = f"{m['accuracy']:.3f}" + (f" ± {m['accuracy_std']:.3f}" if r["n"] > 1 else "")  # std needs n > 1
        cells = [accuracy if k == "accuracy"
                 else "-" if m.get(k) is None else f"{m[k]:.3f}" for k in columns]
        lines.append(f"| {r['cell']} | {mode} | {r['step']} | {r['n']} x {r['tasks']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_command(args: argparse.Namespace) -> str:
    """`eval.py table`: the records of the given runs' eval.jsonl (or JSONL files), printed as one table."""
    records = []
    for path in args.results:
        path = os.path.join(path, "eval.jsonl") if os.path.isdir(path) else path
        if not os.path.exists(path):
            usage_error(f"no evaluation results at {path} (run `python eval.py --run RUN` first)")
        records += read_results(path)
    if not records:
        usage_error(f"no evaluation records in {', '.join(args.results)} (run `python eval.py --run RUN` first)")
    table = results_table(records)
    print(table)
    return table


def plot_command(args: argparse.Namespace) -> dict[str, tuple]:
    """`eval.py plot`: every run readable and with metrics before any figure is drawn; then the PNGs."""
    for run in args.runs:
        read_run_args(run)
        if not read_metrics(run):
            usage_error(f"{run}: no metrics yet (metrics.jsonl is missing or empty)")
    out_dir = args.out or os.path.join(os.path.dirname(os.path.normpath(args.runs[0])), "plots")
    figures = plot_runs(args.runs, out_dir)
    for _, path in figures.values():
        print(f"wrote {path}")
    return figures


# ---------------------------------------------------------------- command line

class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default after its help."""


def build_parser() -> Parser:
    p = Parser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    commands = p.add_subparsers(dest="command", title="commands (default: evaluate --run)")
    plot = commands.add_parser("plot", help="PNG curves of runs: validation accuracy, per-role training metrics",
                               formatter_class=HelpFormatter)
    plot.add_argument("runs", nargs="+", help="run folders written by train.py")
    plot.add_argument("--out", default=None, help="folder for the PNGs (default: plots/ beside the first run)")
    table = commands.add_parser("table", help="the runs' eval.jsonl records as one markdown table")
    table.add_argument("results", nargs="+", help="run folders (reads RUN/eval.jsonl) or results JSONL files")
    g = p.add_argument_group("evaluate")
    g.add_argument("--run-dir", "--run", dest="run", default=None, help="run folder written by train.py: the "
                   "workflow, split and sampling settings evaluated (and, for trained, the checkpoints); under torchrun "
                   "write --run-dir (torchrun takes --run for its own --run-path)")
    g.add_argument("--mode", default="trained", choices=MODES, help="base: adapters off; trained: the run's adapters "
                   "as in training; sa-transfer: --sa-run's adapter for every role; sa-generator-transfer: for the "
                   "generators and workers only")
    g.add_argument("--sa-run", default=None, help="SA modes: a single-agent run folder (same model and task)")
    g.add_argument("--step", type=int, default=None, help="checkpoint step (SA modes: of --sa-run); default: the "
                   "latest")
    g.add_argument("--every-checkpoint", action="store_true", help="evaluate every saved step not yet in the "
                   "results file with the same mode, dataset and --n")
    g.add_argument("--data", default=None, help="evaluate on this file instead of the run's validation split, in the "
                   "run's task format (math: AIME 2025; code: DeepCoder's primeintellect test split)")
    g.add_argument("--samples", "--n", dest="n", type=int, default=1, help="samples per task: accuracy is their "
                   "mean, pass@k for k = 1, 2, 4... <= n (under torchrun write --samples)")
    g.add_argument("--temperature", type=float, default=None, help="default: the run's sampling temperature")
    g.add_argument("--max-new-tokens", type=int, default=None, help="default: a paper cell's evaluation length "
                   "(math 8192, code 5120), else the run's")
    g.add_argument("--max-prompt-tokens", type=int, default=None, help="default: a paper cell's evaluation limit, "
                   "else the run's")
    g.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every checkpoint")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--dump", action="store_true", help="write one JSON file per episode under "
                   "RUN/trajectories/<dataset>/<mode>-step_<N>/")
    g.add_argument("--out", default=None, help="JSONL to append results to (default: RUN/eval.jsonl)")
    return p


def check_eval_args(args: argparse.Namespace) -> None:
    """One line for each bad value, before any model loads."""
    if not args.run:
        usage_error("--run-dir RUN is needed (or a command: plot, table; see --help)")
    read_run_args(args.run)  # a folder that is not a run: one line
    if args.mode in SA_MODES and args.sa_run:
        read_run_args(args.sa_run)
    for flag, name in (("n", "--samples/--n"), ("max_new_tokens", "--max-new-tokens"),
                       ("max_prompt_tokens", "--max-prompt-tokens")):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            usage_error(f"argument {name}: must be >= 1, got {getattr(args, flag)}")
    if args.temperature is not None and not 0 <= args.temperature < math.inf:
        usage_error(f"argument --temperature: must be >= 0, got {args.temperature}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device) or (args.device.startswith("cuda")
                                                                  and not torch.cuda.is_available()):
        usage_error(f"--device {args.device}: expected auto, cpu, or cuda with a visible CUDA device")
    if args.every_checkpoint and args.mode == "base":
        usage_error("--every-checkpoint needs a mode with checkpoints (base has none)")


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "plot":
        return plot_command(args)
    if args.command == "table":
        return table_command(args)
    check_eval_args(args)
    rank_device = init_distributed()  # under torchrun each rank evaluates a share of the tasks
    try:
        return evaluate_command(args, rank_device)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def evaluate_command(args: argparse.Namespace, rank_device: str | None) -> list[dict]:
    out = args.out or os.path.join(args.run, "eval.jsonl")
    cfg = EvalSettings(n=args.n, temperature=args.temperature, seed=args.seed,
                       sa_run=args.sa_run if args.mode in SA_MODES else None, dump=args.dump,
                       device=rank_device or args.device,
                       results_path=out, data=args.data, max_new_tokens=args.max_new_tokens,
                       max_prompt_tokens=args.max_prompt_tokens)
    if args.every_checkpoint:
        run_args, done = read_run_args(args.run), done_keys(out)
        dataset = dataset_name(run_args, args.data)
        steps = [s for s in policies.checkpoint_steps(checkpoint_source(args.run, args.mode, cfg.sa_run))
                 if result_key(args.mode, s, dataset, args.n, cfg.sa_run) not in done]
        print(f"{len(steps)} checkpoint(s) to evaluate: {steps}")
    else:
        steps = [resolve_step(args.run, args.mode, args.step, cfg.sa_run)]
    return evaluate_steps(args.run, args.mode, steps, cfg)


if __name__ == "__main__":
    record(main)()  # under torchrun, a failing rank's traceback goes into torchrun's failure summary

"""The study's commands, run side by side: chains of commands, `jobs` at a time, each command's
output in its own log, and a line on the terminal per finished command with the minutes it took, the
minutes since the start and an estimate of those left; the study's runs by name (each
configuration's run seeds: `run_seeds`), and the commits whose code ran them (`record_commit`).

What it is for: toyworld/study.py's builds, calibrations, runs and evaluations, which are ordinary
commands (`python eval.py calibrate`, `python train.py`, `python eval.py`), each run from the
repository as `python SCRIPT` runs it, in a process forked from a server that has imported torch,
transformers and peft once (PRELOAD). What it is not: what to run, or in which order
(toyworld/study.py decides).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import time

from infra.runfolder import read_results
from toyworld import declared

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each command is a script of this repository (train.py, eval.py), run in a new process forked from
# a server that has imported these libraries once (multiprocessing's forkserver): a new interpreter
# spends 4-5 s importing them, and the study runs about 180 commands, 8 of its minutes on 2 cores.
# The project's own modules import afresh in each command, with its environment. The libraries hold
# no state a command could leave to the next: each command is its own process, forked from the
# server, never from another command.
PRELOAD = ["torch", "transformers", "peft", "transformers.models.llama.modeling_llama"]


# ---------------------------------------------------------------- the study's runs, by name

def run_dir(out: str, name: str, seed: int, run_seed: int | None = None) -> str:
    """A run's folder: NAME-sSEED for the study's own run of a configuration on a seed, and
    NAME-sSEED-runR for its run on run seed R."""
    rerun = f"-run{run_seed}" if run_seed is not None else ""
    return os.path.join(out, f"{name}-s{seed}{rerun}")


def run_seeds(name: str, seed: int) -> list[int | None]:
    """A configuration's runs on `seed`, by run seed: None for the study's own (the run seed is the
    seed), then seed + k x RUN_SEED_STEP, as many as declared.runs_a_seed says. Example: voting-ip
    on seed 3 -> None, 1003, 2003, 3003, 4003, 5003."""
    runs = declared.runs_a_seed(name)
    return [None] + [seed + k * declared.RUN_SEED_STEP for k in range(1, runs)]


def every_run(names: list[str], seeds: list[int]) -> list[tuple[str, int, int | None]]:
    """Every run of these configurations as (name, seed, run seed), seed by seed."""
    return [(n, s, r) for s in seeds for n in names for r in run_seeds(n, s)]


def run_name(name: str, seed: int, run_seed: int | None = None) -> str:
    """A run's name, its folder's: voting-ip-s3, voting-ip-s3-run1003."""
    return os.path.basename(run_dir("", name, seed, run_seed))


def finished(out: str, name: str, seed: int, steps: int, run_seed: int | None = None) -> bool:
    path = os.path.join(run_dir(out, name, seed, run_seed), "metrics.jsonl")
    return any(m["step"] == steps for m in read_results(path, ("step",), warn=False))



def run_log(command: list[str]) -> str:
    """RUN.log, next to the run folder a train.py or eval.py command writes."""
    flag = "--resume" if "--resume" in command else "--run-dir"
    return command[command.index(flag) + 1] + ".log"


def kind_of(command: list[str]) -> str:
    """build (eval.py calibrate --build-only), calibrate (eval.py calibrate), train (train.py), eval
    (eval.py) or other."""
    script = os.path.basename(command[1]) if len(command) > 1 else ""  # another checkout's too
    if script == "eval.py" and "calibrate" in command:
        return "build" if "--build-only" in command else "calibrate"
    return {"train.py": "train", "eval.py": "eval"}.get(script, "other")


def label_of(command: list[str], log: str) -> str:
    """What a finished command did, in a few words: `seed 3 built`, `voting-ip-s3 trained`."""
    kind, name = kind_of(command), os.path.basename(log)[:-4]
    if kind in ("build", "calibrate"):
        done = "built" if kind == "build" else "calibrated"
        return f"seed {command[command.index('--seed') + 1]} {done}"
    if kind == "eval":
        return f"{name} evaluated ({command[command.index('--mode') + 1]})"
    return f"{name} trained" if kind == "train" else f"{name} done"


# A command's minutes on one thread of the 2-core machine, another job on the other core (two builds
# side by side took 32.5-35.5 minutes, 2026-12-04, docs/findings.md; in the study from a fresh
# clone, 2026-12-04, a calibration 2.6-2.9, a multi-agent grid run 1.9 on average, an evaluation
# 0.04): the estimate of the time left until the study has timed that kind itself.
MINUTES = {"build": 34.0, "calibrate": 3.0, "train": 1.9, "eval": 0.05, "other": 1.0}


class Clock:
    """The study's progress on the terminal: a line per finished command, with the minutes it took,
    the minutes since the start and an estimate of the minutes left (the commands still planned,
    each at the mean time of its kind so far, shared by the jobs)."""

    def __init__(self, jobs: int):
        self.start, self.jobs = time.time(), jobs
        self.took: dict[str, list[float]] = {kind: [] for kind in MINUTES}
        self.planned: dict[str, int] = {kind: 0 for kind in MINUTES}

    def plan(self, kind: str, count: int) -> None:
        self.planned[kind] = max(0, self.planned[kind] + count)

    def left(self) -> float:
        return sum(n * (sum(self.took[k]) / len(self.took[k]) if self.took[k] else MINUTES[k])
                   for k, n in self.planned.items()) / self.jobs

    def minutes(self) -> float:
        return (time.time() - self.start) / 60

    def finished(self, command: list[str], log: str, minutes: float, note: str = "") -> None:
        kind = kind_of(command)
        self.took[kind].append(minutes)
        self.plan(kind, -1)
        print(f"[{self.minutes():5.1f} min] {label_of(command, log)}{note} ({minutes:.1f} min); "
              f"about {self.left():.0f} min left", flush=True)


def run_all(chains, dry_run: bool, jobs: int = 1, clock: Clock | None = None,
            note=lambda command: "") -> None:
    """Run chains of (command, its log) (one run's or one seed's, each chain in order), `jobs`
    chains at a time, from the repository, each command's output appended to its log. `chains` is a
    list, or a function that gives the next chain or None when there is none to start now (it is
    asked again when one finishes). With more than one job each command gets one thread: two torch
    processes of two threads each on 2 cores slow each other down by 10x or more (the threads spin).
    A calibration that misses a target exits 1: a result, not a failure."""
    if isinstance(chains, list):
        waiting = [list(chain) for chain in chains if chain]
        chains = lambda: waiting.pop(0) if waiting else None  # noqa: E731
    env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if jobs > 1 else {})}
    context = None if dry_run else forkserver()
    running, failed = [], []
    previous = signal.signal(signal.SIGTERM, stop_request)
    try:
        while True:
            while len(running) < jobs and not failed and (chain := chains()) is not None:
                if dry_run:
                    print("\n".join(" ".join(command[1:]) for command, _ in chain), flush=True)
                elif chain:
                    # a stop while a command starts reaches it: it is in `running` first
                    with stops_held():
                        running.append(start(context, chain, env))
            if not running:
                break
            time.sleep(0.5)
            for entry in [e for e in running if e[0].exitcode is not None]:
                process, (command, log), rest, began = entry
                running.remove(entry)
                if process.exitcode not in ((0, 1) if kind_of(command) == "calibrate" else (0,)):
                    failed.append(
                        f"{' '.join(command[1:3])}... failed (exit {process.exitcode}); see {log}")
                    continue
                if clock:
                    clock.finished(command, log, (time.time() - began) / 60, note(command))
                if rest:
                    with stops_held():
                        running.append(start(context, rest, env))
    # Ctrl-C, or SIGTERM (stop_request): each command stops as it would alone
    except KeyboardInterrupt:
        stop_running([process for process, *_ in running])
        print(
            "stopped; the same command goes on from here (finished runs are kept, a stopped run "
            "resumes from its last checkpoint)", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        raise SystemExit("error: " + "; ".join(failed))


def stop_running(processes: list[multiprocessing.Process]) -> None:
    """Each running command gets a SIGINT, as a Ctrl-C of its own (train.py saves a checkpoint after
    its step, and `--resume` continues it), and the study waits for them; a second stop sends a
    second SIGINT, which stops train.py at once (its last checkpoint is complete: saves are
    atomic)."""
    for process in processes:
        os.kill(process.pid, signal.SIGINT)
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        for process in processes:
            if process.exitcode is None:
                os.kill(process.pid, signal.SIGINT)
                process.join()


def stop_request(signum, frame) -> None:
    """SIGTERM (a scheduler's stop) handled as Ctrl-C is."""
    raise KeyboardInterrupt


def forkserver():
    """multiprocessing's context whose processes fork from the server, the server started (PRELOAD
    imported)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
    return context


@contextlib.contextmanager
def stops_held():
    """SIGINT and SIGTERM held back while a command starts, delivered once it has (a new command is
    forked by the server, which keeps its own signal mask)."""
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


def start(context, chain: list[tuple[list[str], str]], env: dict) -> tuple:
    """Start a chain's first command: (process, (command, log), the rest of the chain, its start
    time)."""
    command, log = chain[0]
    os.makedirs(os.path.dirname(log), exist_ok=True)
    process = context.Process(target=run_script, args=(command, log, env))
    process.start()
    return process, chain[0], chain[1:], time.time()


def run_script(command: list[str], log: str, env: dict) -> None:
    """`python SCRIPT ARGS...` as a new interpreter would run it, from the repository (a script of
    another checkout, a folder with its own .git, by a new interpreter there), its output
    appended to its log, in a session of its own (so that a stop reaches it once, from run_all, not
    also from the terminal), with the threads OMP_NUM_THREADS says (the server imported torch before
    a command could say it)."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    if "OMP_NUM_THREADS" in env:
        import torch
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    output = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(output, 1), os.dup2(output, 2)
    folder = os.path.dirname(os.path.join(ROOT, command[1]))
    if folder != ROOT and os.path.exists(os.path.join(folder, ".git")):
        # another checkout's script (toyworld/ablate.py's --baseline-checkout): its own modules,
        # so a new interpreter there (this server's child has imported ours)
        os.chdir(folder)
        os.execv(sys.executable, [sys.executable, *command[1:]])
    os.chdir(ROOT)
    sys.argv = command[1:]
    sys.path.insert(0, ROOT)  # as `python SCRIPT` puts the script's folder first
    runpy.run_path(command[1], run_name="__main__")


def code_commit(root: str = ROOT) -> str:
    """The commit of the code that runs (of the checkout `root`), with "+changes" when its tracked
    files differ from it."""
    def git(*words):
        return subprocess.run(["git", *words], cwd=root, capture_output=True, text=True).stdout
    head = git("rev-parse", "--short=7", "HEAD").strip() or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def record_commit(out: str) -> str:
    """The code's commit, appended to out/commits.txt (an invocation's line) and returned."""
    with open(os.path.join(out, "commits.txt"), "a") as f:
        print(code_commit(), file=f)
    return code_commit()


def commits(out: str) -> list[str]:
    """The commits whose code ran in the study's folder `out` (out/commits.txt), in order: one,
    when the study comes from one commit."""
    path = os.path.join(out, "commits.txt")
    with open(path) if os.path.isfile(path) else contextlib.nullcontext([]) as lines:
        return list(dict.fromkeys(line.strip() for line in lines))

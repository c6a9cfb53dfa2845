"""The study's commands, run side by side: chains of commands, `jobs` at a time, each command's output in its own
log, and a line on the terminal per finished command with the minutes it took, the minutes since the start and
an estimate of those left.

What it is for: infra/study.py's builds, calibrations, runs and evaluations, which are ordinary commands
(`python -m infra.toy --build`, `python eval.py calibrate`, `python train.py`, `python eval.py`), run from the
repository. What it is not: what to run, or in which order (infra/study.py decides).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_log(command: list[str]) -> str:
    """RUN.log, next to the run folder a train.py or eval.py command writes."""
    flag = "--resume" if "--resume" in command else "--run-dir"
    return command[command.index(flag) + 1] + ".log"


def kind_of(command: list[str]) -> str:
    """build (eval.py calibrate --build-only), calibrate (eval.py calibrate), train (train.py), eval (eval.py) or
    other."""
    script = command[1] if len(command) > 1 else ""
    if script == "eval.py" and "calibrate" in command:
        return "build" if "--build-only" in command else "calibrate"
    return {"train.py": "train", "eval.py": "eval"}.get(script, "other")


def label_of(command: list[str], log: str) -> str:
    """What a finished command did, in a few words: `seed 3 built`, `voting-ip-s3 trained`."""
    kind, name = kind_of(command), os.path.basename(log)[:-4]
    if kind in ("build", "calibrate"):
        return f"seed {command[command.index('--seed') + 1]} {'built' if kind == 'build' else 'calibrated'}"
    if kind == "eval":
        return f"{name} evaluated ({command[command.index('--mode') + 1]})"
    return f"{name} trained" if kind == "train" else f"{name} done"


# A command's minutes on one thread of the 2-core machine, another job on the other core (two builds side by
# side took 32.5-35.5 minutes and two calibrations 2.6 each, 2026-12-04, docs/findings.md; a 150-step toy Voting
# run about 2.3, bench/README.md): the estimate of the time left until the study has timed that kind itself.
MINUTES = {"build": 34.0, "calibrate": 3.0, "train": 2.0, "eval": 0.3, "other": 1.0}


class Clock:
    """The study's progress on the terminal: a line per finished command, with the minutes it took, the minutes
    since the start and an estimate of the minutes left (the commands still planned, each at the mean time of
    its kind so far, shared by the jobs)."""

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


def run_all(chains, dry_run: bool, jobs: int = 1, clock: Clock | None = None, note=lambda command: "") -> None:
    """Run chains of (command, its log) (one run's or one seed's, each chain in order), `jobs` chains at a time,
    from the repository, each command's output appended to its log. `chains` is a list, or a function that
    gives the next chain or None when there is none to start now (it is asked again when one finishes). With more
    than one job each command gets one thread: two torch processes of two threads each on 2 cores slow each other
    down by 10x or more (the threads spin). A calibration that misses a target exits 1: a result, not a failure."""
    if isinstance(chains, list):
        waiting = [list(chain) for chain in chains if chain]
        chains = lambda: waiting.pop(0) if waiting else None  # noqa: E731
    env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if jobs > 1 else {})}
    running, failed = [], []
    previous = signal.signal(signal.SIGTERM, stop_request)
    try:
        while True:
            while len(running) < jobs and not failed and (chain := chains()) is not None:
                if dry_run:
                    print("\n".join(" ".join(command[1:]) for command, _ in chain), flush=True)
                elif chain:
                    running.append(start(chain, env))
            if not running:
                break
            time.sleep(0.5)
            for entry in [e for e in running if e[0].poll() is not None]:
                process, (command, log), rest, began = entry
                running.remove(entry)
                if process.returncode not in ((0, 1) if kind_of(command) == "calibrate" else (0,)):
                    failed.append(f"{' '.join(command[1:3])}... failed (exit {process.returncode}); see {log}")
                    continue
                if clock:
                    clock.finished(command, log, (time.time() - began) / 60, note(command))
                if rest:
                    running.append(start(rest, env))
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (stop_request): each command stops as it would alone
        stop_running([process for process, *_ in running])
        print("stopped; the same command goes on from here (finished runs are kept, a stopped run resumes from "
              "its last checkpoint)", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        raise SystemExit("error: " + "; ".join(failed))


def stop_running(processes: list[subprocess.Popen]) -> None:
    """Each running command gets a SIGINT, as a Ctrl-C of its own (train.py saves a checkpoint after its step,
    and `--resume` continues it), and the study waits for them; a second stop sends a second SIGINT, which stops
    train.py at once (its last checkpoint is complete: saves are atomic)."""
    for process in processes:
        process.send_signal(signal.SIGINT)
    try:
        for process in processes:
            process.wait()
    except KeyboardInterrupt:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait()


def stop_request(signum, frame) -> None:
    """SIGTERM (a scheduler's stop) handled as Ctrl-C is."""
    raise KeyboardInterrupt


def start(chain: list[tuple[list[str], str]], env: dict) -> tuple:
    """Start a chain's first command: (process, (command, log), the rest of the chain, its start time), in a
    session of its own, so that a stop reaches it once, from run_all, not also from the terminal."""
    command, log = chain[0]
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as f:
        process = subprocess.Popen(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    return process, chain[0], chain[1:], time.time()

"""The run folder, for train.py and eval.py: its files, one-line usage errors, the graceful stop.

What it is for: the one-line usage error (exit status 2, before anything loads or is written), the
folder's args.json (an older train.py's flag names read as today's), its JSONL files (metrics.jsonl,
eval.jsonl: strict JSON, a line cut off by a crash left out with a warning), trajectory dumps, write
errors, and the graceful stop on Ctrl-C. What it is not: anything of the method; the command line is
flags.py, checkpoints are checkpoints.py.

    RUN/args.json            every flag of the run (train.py --resume reads it back)
    RUN/metrics.jsonl        one line per training step (and step 0: validation before training)
    RUN/eval.jsonl           one line per evaluation (eval.py)
    RUN/checkpoints/step_N/  adapters and optimizer state (checkpoints.py)
    RUN/defaults.json        train.py's defaults when the run was written (eval.py report shows
                             what differs)
    RUN/samples/step_N.json  the episodes of a few fixed validation tasks at each validation
                             (samples.py)
    RUN/trajectories/...     eval.py --dump: one JSON file per episode
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

# ---------------------------------------------------------------- bad input

def usage_error(message: str) -> NoReturn:
    """Bad input found before anything was loaded or written: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ---------------------------------------------------------------- args.json

# what a run's names and labels read
NAME_KEYS = ("model", "task", "data", "difficulty", "workflow", "policy")
# an older train.py's name -> today's (args.json, defaults.json)
RENAMED_FLAGS = {"n": "group_size"}


def today_names(flags: dict) -> dict:
    """A run's flags (args.json, defaults.json) under today's names: an older train.py wrote `n` for
    --group-size."""
    out = dict(flags)
    for old, new in RENAMED_FLAGS.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


def read_run_args(run_dir: str, named_as: str | None = None, keys: tuple[str, ...] = ()) -> dict:
    """RUN/args.json; a folder that is not a run folder, or whose args.json lacks one of `keys`, is
    a one-line error that names it `named_as` (e.g. the flag that gave it) or its path."""
    try:
        with open(os.path.join(run_dir, "args.json")) as f:
            run_args = json.load(f)
    except FileNotFoundError:
        usage_error(f"{named_as or run_dir}: not a run folder (no args.json; train.py writes one)")
    except (OSError, ValueError) as e:
        usage_error(f"{named_as or run_dir}: unreadable args.json ({e})")
    if not isinstance(run_args, dict):
        usage_error(f"{named_as or run_dir}: unreadable args.json (not a JSON object)")
    run_args = today_names(run_args)
    if any(k not in run_args for k in keys):
        usage_error(
            f"{named_as or run_dir}: args.json lacks "
            f"{', '.join(k for k in keys if k not in run_args)} (an older train.py wrote it: "
            f"`python train.py --resume {run_dir}` rewrites it with today's defaults)")
    return run_args


def holds_run(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, f))
               for f in ("args.json", "metrics.jsonl", "checkpoints"))


def check_writable(path: str, flag: str, folder: bool) -> None:
    """`path` (a folder, or a file with `folder=False`) can be written: if it exists it is of that
    kind, and its nearest existing parent is a writable folder. One line otherwise, before anything
    loads or is written."""
    if os.path.exists(path) and os.path.isdir(path) != folder:
        usage_error(
            f"{flag} {path}: expected {'a folder' if folder else 'a file'}, and this is not one")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        usage_error(f"{flag} {path}: cannot write there ({parent} is not a writable folder)")


def check_run_dir(run_dir: str, overwrite: bool) -> None:
    """A new run needs a folder that holds no run (or --overwrite) and that it can create; nothing
    is written."""
    if holds_run(run_dir) and not overwrite:
        usage_error(
            f"{run_dir} already holds a run; continue it with --resume {run_dir}, choose a new "
            "--run-dir, or pass --overwrite to move it aside")
    check_writable(run_dir, "--run-dir", folder=True)


def write_args(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> None:
    """RUN/args.json, atomically; with `parser`, its defaults too, as RUN/defaults.json (what
    eval.py report compares the flags with). A new run with --overwrite first moves an old run aside
    (never mixes them)."""
    if not args.resume and holds_run(args.run_dir):
        aside = f"{args.run_dir.rstrip(os.sep)}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        os.rename(args.run_dir, aside)
        print(f"--overwrite: moved the run that was in {args.run_dir} to {aside}")
    os.makedirs(args.run_dir, exist_ok=True)
    path = os.path.join(args.run_dir, "args.json")
    with open(path + ".tmp", "w") as f:
        json.dump({**vars(args), "resume": None, "overwrite": False}, f, indent=1)
    os.replace(path + ".tmp", path)
    if parser is not None:
        defaults = {a.dest: a.default for a in parser._actions if a.dest != "help"}
        with open(os.path.join(args.run_dir, "defaults.json.tmp"), "w") as f:
            json.dump(defaults, f, indent=1, default=str)
        os.replace(os.path.join(args.run_dir, "defaults.json.tmp"),
                   os.path.join(args.run_dir, "defaults.json"))


def copy_run(source: str, target: str) -> None:
    """A finished run folder and its log, copied; its args.json names the new folder, as training
    there would."""
    shutil.copytree(source, target + ".part")
    with open(os.path.join(target + ".part", "args.json")) as f:
        run_args = json.load(f)
    with open(os.path.join(target + ".part", "args.json"), "w") as f:
        json.dump({**run_args, "run_dir": target}, f, indent=1)
    if os.path.exists(source + ".log"):
        shutil.copy(source + ".log", target + ".log")
    os.rename(target + ".part", target)
    print(f"{os.path.basename(target)}: copied from {os.path.basename(source)}", flush=True)


# ---------------------------------------------------------------- JSONL files

def read_results(path: str, keys: tuple[str, ...] = (), warn: bool = True) -> list[dict]:
    """A JSONL file (eval.jsonl, metrics.jsonl) as records; [] if there is none yet. A last line cut
    off before its newline (a run stopped while writing it) is left out, with a warning; any other
    line that is not a JSON object with `keys` is a one-line error."""
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
            with_keys = f" with {', '.join(keys)}" if keys else ""
            usage_error(f"{path} line {i}: expected a JSON object{with_keys}")
        records.append(record)
    return records


def json_line(record: dict) -> str:
    """One strict-JSON line: undefined or non-finite numbers (a rate with nothing to count) become
    null."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v
             for k, v in record.items()}
    return json.dumps(clean, allow_nan=False) + "\n"


def rewrite_records(path: str, records: list[dict]) -> None:
    """Replace a JSONL file by `records`, atomically (a crash leaves the old file or the new
    one)."""
    with open(path + ".tmp", "w") as f:
        f.writelines(json_line(r) for r in records)
    os.replace(path + ".tmp", path)


def keep_metrics_until(path: str, step: int) -> None:
    """Drop metric lines of steps after `step` (written after the checkpoint a resume starts from)
    and a last line cut off while it was written (`flags.resume_args` has checked the file and
    reported that line)."""
    if os.path.exists(path):
        rewrite_records(path, [r for r in read_results(path, ("step",), warn=False)
                               if r["step"] <= step])


def append_record(path: str, record: dict) -> None:
    """Append one line to a JSONL file; a last line cut off while it was written is dropped first,
    so the new record never continues it. The folder is created if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        if cut:
            rewrite_records(path, read_results(path))  # warns once about the line it leaves out
    with open(path, "a") as f:
        f.write(json_line(record))


# ---------------------------------------------------------------- names and trajectory dumps

def dataset_name(run_args: dict, data: str | None = None) -> str:
    """Short name of the evaluated set: `math-d0`, `humaneval`, or the data file / hub dataset's
    name (`data`: another evaluation set than the run's own)."""
    if not data and run_args["task"] in ("math", "code"):
        return f"math-d{run_args['difficulty']}" if run_args["task"] == "math" else "humaneval"
    # a run that validates on --val-data: that set
    data = data or run_args.get("val_data") or run_args["data"]
    return re.sub(r"\.(jsonl|json|parquet)$", "", os.path.basename(str(data).rstrip("/")))


def trajectory_folder(run_dir: str, dataset: str, mode: str, step: int,
                      sa_run: str | None = None) -> str:
    """RUN/trajectories/<dataset>/<mode>-step_<N> (with an SA run: `<mode>-<SA run folder
    name>-step_<N>`)."""
    if sa_run:
        mode = f"{mode}-{os.path.basename(os.path.normpath(sa_run))}"
    return os.path.join(run_dir, "trajectories", dataset, f"{mode}-step_{step:06d}")


def episode_record(ep) -> dict:
    """An episode as plain JSON: the task, the outcome, then every call in order (name, role,
    adapter, turn, messages, output, parsed answer, own correctness, reward, truncation, length, the
    rest of its metrics)."""
    calls = [{"name": c.name, "role": c.role, "adapter": c.adapter, "turn": c.turn,
              "messages": c.messages, "output": c.text, "parsed": c.metrics.get("parsed"),
              "correct": c.metrics.get("correct"), "reward": c.reward, "truncated": c.truncated,
              "response_tokens": len(c.completion_ids),
              "metrics": {k: v for k, v in c.metrics.items() if k not in ("parsed", "correct")}}
             for c in ep.calls]
    record = {"task": {"id": ep.task.id, "question": ep.task.question, "answer": ep.task.answer},
              "sample": ep.sample, "final_answer": ep.final_answer, "correct": ep.correct,
              "metrics": ep.metrics, "calls": calls}
    # plain types only: it may be gathered over ranks
    return json.loads(json.dumps(record, default=str))


def dump_trajectories(episodes: list, folder: str) -> list[str]:
    """One readable JSON file per episode, `episode_<task-id>_<sample>.json` (`episode_record`)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for ep in episodes:
        task = re.sub(r"[^A-Za-z0-9_.-]", "-", ep.task.id)
        path = os.path.join(folder, f"episode_{task}_{ep.sample}.json")
        with open(path, "w") as f:
            json.dump(episode_record(ep), f, indent=1)
        paths.append(path)
    return paths


# ---------------------------------------------------------------- stopping

WHY = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
       errno.EROFS: "the file system is read-only", errno.ENOENT: "the folder is gone",
       errno.EACCES: "permission denied", errno.EPERM: "permission denied"}


class WriteError(Exception):
    """A write into the run folder failed: `what` could not be written, and `reason` says why (disk
    full, read-only, folder gone...). train.py and eval.py turn it into one line."""

    def __init__(self, what: str, error: BaseException, folder: str):
        self.what = what
        if isinstance(error, OSError) and error.errno in WHY:
            self.reason = WHY[error.errno]
        elif (not isinstance(error, OSError) and os.path.isdir(folder)
              and shutil.disk_usage(folder).free < 2 ** 26):
            # torch's serializer reports a full disk as a RuntimeError
            self.reason = "the disk is full"
        else:
            self.reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        super().__init__(f"could not write {what}: {self.reason}")


@contextlib.contextmanager
def writing(what: str, folder: str):
    """Run a write into the run folder `folder`; an OS error (or torch's serializer failing) becomes
    WriteError."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        raise WriteError(what, e, folder) from e


STOP_SIGNALS = {signal.SIGINT: "interrupt", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1"}


class GracefulStop:
    """A stop request: Ctrl-C, or SIGTERM / SIGUSR1 from a scheduler (Slurm's --signal, Kubernetes,
    torchrun passing a stop on). The first finishes the current step, saves a checkpoint and stops;
    `signum` says which came. A second stops at once, in one line (the last checkpoint on disk is
    still complete: saves are atomic)."""

    def __init__(self):
        self.signum: int | None = None
        self.previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def agreed(self, gather: Callable[[int | None], list]) -> int | None:
        """The stop every rank acts on after this step: the first request any rank had when they met
        in `gather` (`distributed.gather`). A signal that lands during the gather is kept, not
        overwritten: it is in this rank's next gather, so no rank stops alone and none loses its
        request."""
        return next((s for s in gather(self.signum) if s is not None), None)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame):
        name = STOP_SIGNALS[signum]
        if self.requested:
            print(f"\n{name}: stopping now, without saving this step", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        print(
            f"\n{name}: finishing this step, then saving a checkpoint (a second signal stops at "
            "once)", flush=True)

"""The validation samples a run keeps: every call of a few fixed validation episodes, at each
validation step.

What it is for: following the same tasks through training without another pass. At every validation
train.py writes the episodes of the first `--val-samples` validation tasks (all `--val-n` samples of
each; the validation split is fixed by the seed, so they are the same tasks at every step) to
RUN/samples/step_<N>.json, one file per step, as `runfolder.episode_record` writes them (every call:
name, role, adapter, prompt messages, output, parsed answer, own correctness, reward); rank 0
writes, atomically. A resume removes the files after its checkpoint, as it cuts metrics.jsonl there.
`eval.py report` (infra/report.py) reads them back. What it is not: `eval.py --dump`, which writes
every episode of an evaluation (RUN/trajectories/).

    # writes RUN/samples/step_000000.json, step_000005.json...
    python train.py --model toy --workflow voting --val-samples 4
"""
from __future__ import annotations

import glob
import json
import os
import re

from infra import distributed
from infra.runfolder import episode_record, usage_error, writing


def samples_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "samples", f"step_{step:06d}.json")


def sample_records(episodes: list, task_ids: list[str]) -> list[dict]:
    """The records (`episode_record`) of the episodes of `task_ids`, in that order, then by sample
    (plain JSON: under torchrun each rank sends its own to rank 0)."""
    order = {task_id: i for i, task_id in enumerate(task_ids)}
    kept = sorted((e for e in episodes if e.task.id in order),
                  key=lambda e: (order[e.task.id], e.sample))
    return [episode_record(e) for e in kept]


def keep_samples(run_dir: str, step: int, episodes: list, task_ids: list[str]) -> None:
    """Validation at `step`: this rank's episodes of `task_ids` are sent to rank 0, which writes the
    file (no file when `task_ids` is empty: --val-samples 0). A failed write raises
    runfolder.WriteError (train.py: one line)."""
    # the ranks' task shares, in order
    parts = distributed.gather(sample_records(episodes, task_ids))
    if task_ids and distributed.world()[0] == 0:
        with writing(f"RUN/samples/step_{step:06d}.json", run_dir):
            write_samples(run_dir, step, [r for part in parts for r in part])


def write_samples(run_dir: str, step: int, records: list[dict]) -> None:
    """RUN/samples/step_<N>.json: {"step", "episodes"}, atomically (a crash leaves the old file or
    the new one)."""
    path = samples_path(run_dir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"step": step, "episodes": records}, f, indent=1)
    os.replace(path + ".tmp", path)


def keep_samples_until(run_dir: str, step: int) -> None:
    """Resume: remove the sample files of steps after `step` (the resumed run writes its own again),
    and any temporary file a crash left."""
    folder = os.path.join(run_dir, "samples")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        found = re.fullmatch(r"step_(\d+)\.json(\.tmp)?", name)
        if found and (int(found.group(1)) > step or found.group(2)):
            os.remove(os.path.join(folder, name))


def read_samples(run_dir: str) -> dict[int, list[dict]]:
    """RUN/samples/step_<N>.json as {step: episode records}; {} for a run without them; a bad file:
    one line."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "samples", "step_*.json"))):
        try:
            with open(path) as f:
                record = json.load(f)
            out[int(record["step"])] = list(record["episodes"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            usage_error(f"{path}: unreadable validation samples ({type(e).__name__}: {e})")
    return out

"""The study's compact results: one JSON Lines file per study and per replication, and the one
loader that the tables, the figures and the tests read runs through.

What it is for: a clone holds what docs/findings.md quotes in a handful of files, not a folder per
run. A results folder (the page's: docs/findings/results/) holds `study.jsonl` (the sweep and the
grid on the study's seeds, every run of every run seed), `replication.jsonl` (the grid on the
replication's seeds) and `study.json` (the verdicts). Each line of a compact file is one record of
one run's file, as that file holds it (findings.RESULTS: rounded to 4 decimals), so a line diffs
as a line:

    {"run": "voting-sp-s0", "file": "metrics.jsonl", "record": {"step": 0, "val/success": 0.25}}
    {"run": "voting-sp-s0", "file": "eval.jsonl", "record": {"mode": "trained", "metrics": {}}}
    {"run": "voting-sp-s0", "file": "samples/step_000150.json", "record": {"step": 150, ...}}

`records(folder, run, file)` gives a run's file from either kind of folder: one of compact files,
or a study's --out, a folder of run folders. docs/findings/builds.jsonl holds the records of the
toy models' builds that the page quotes (calibration records, toy.json, readings) the same way, by
their old file name (`file_records`). What it is not: the statistics (findings.py) or the runs.

    python -m toyworld.results docs/findings/results voting-sp-s0 samples/step_000150.json
"""
from __future__ import annotations

import argparse
import functools
import json
import os

from infra.runfolder import read_results

# A results folder's compact files: the study's and the replication's
PACKS = ("study.jsonl", "replication.jsonl")


@functools.lru_cache(maxsize=8)
def _read_pack(path: str, mtime: float) -> dict[tuple[str, str], list[dict]]:
    by_file: dict[tuple[str, str], list[dict]] = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            by_file.setdefault((row["run"], row["file"]), []).append(row["record"])
    return by_file


def read_pack(path: str) -> dict[tuple[str, str], list[dict]]:
    """A compact file as {(run, file): [record, ...]}, read once while the file is unchanged."""
    return _read_pack(os.path.abspath(path), os.path.getmtime(path))


def packs_in(folder: str) -> list[str]:
    return [os.path.join(folder, name) for name in PACKS
            if os.path.isfile(os.path.join(folder, name))]


def records(folder: str, run: str, name: str) -> list[dict]:
    """Run `run`'s file `name` (metrics.jsonl, eval.jsonl, samples/step_N.json) as records: from
    the compact files in `folder` when it has any, else from the run folder `folder/run` ([] when
    it has no such file)."""
    packs = packs_in(folder)
    if packs:
        return next((read_pack(p)[run, name] for p in packs if (run, name) in read_pack(p)), [])
    path = os.path.join(folder, run, name)
    if name.endswith(".jsonl"):
        return read_results(path, warn=False)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.load(f)]


def write_pack(path: str, rows: list[tuple[str, str, dict]]) -> None:
    """(run, file, record) rows as a compact file, written aside and renamed (a crash leaves the
    old one)."""
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps({"run": run, "file": name, "record": record}) + "\n"
                     for run, name, record in rows)
    os.replace(path + ".tmp", path)


def file_records(path: str, name: str) -> list[dict]:
    """docs/findings/builds.jsonl: the records (a JSON file's one, a JSONL file's each) of the file
    that was `name` (`avx512/seed0.toy.json`), or its text ({"text": ...}: a reading), in order."""
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [row["record"] if "record" in row else {"text": row["text"]}
            for row in rows if row["file"] == name]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A run's file from a results folder, a record a line.")
    p.add_argument("folder", help="a folder of compact results (docs/findings/results) or of runs")
    p.add_argument("run", help="a run's name: voting-sp-s0")
    p.add_argument("file", help="metrics.jsonl, eval.jsonl or samples/step_000150.json")
    args = p.parse_args(argv)
    found = records(args.folder, args.run, args.file)
    if not found:
        p.exit(2, f"error: {args.folder} has no {args.file} of the run {args.run}\n")
    for record in found:
        print(json.dumps(record, indent=1 if args.file.endswith(".json") else None))


if __name__ == "__main__":
    main()

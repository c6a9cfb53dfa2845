"""What starting one of the study's commands costs, two ways, timed in the same run: a new interpreter for each
(`subprocess`, how toyworld/jobs.py started them before) against toyworld/jobs.py's `run_all`, which forks each command
from a server that imported torch, transformers and peft once.

The command is `python eval.py --help`: everything a study command imports, then nothing else, so the time is
the start alone. The study starts about 180 commands (calibrations, runs, evaluations). One at a time, alone on
the machine; we print each way's median seconds per command and their ratio (the first forked command, which waits
for the server's imports, once a study, is printed apart).

    python bench/bench_jobs.py --commands 8         # about a minute
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from toyworld import jobs  # noqa: E402

COMMAND = [sys.executable, "eval.py", "--help"]


def new_interpreter(log: str) -> float:
    start = time.time()
    with open(log, "a") as f:
        subprocess.run(COMMAND, cwd=jobs.ROOT, stdout=f, stderr=subprocess.STDOUT, check=True)
    return time.time() - start


def forked(log: str) -> float:
    start = time.time()
    jobs.run_all([[(COMMAND, log)]], False, 1)
    return time.time() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commands", type=int, default=8, help="commands started each way")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "command.log")
        fresh = [new_interpreter(log) for _ in range(args.commands)]
        first = forked(log)  # the server starts: its imports, once a study
        fork = [forked(log) for _ in range(args.commands)]
    a, b = statistics.median(fresh), statistics.median(fork)
    print(f"the first forked command, the server's start included (once a study): {first:.2f} s")
    print(f"| start | median s per command ({args.commands}) |\n| --- | --- |")
    print(f"| a new interpreter (subprocess) | {a:.2f} |\n| forked from the server (jobs.run_all) | {b:.2f} |")
    print(f"ratio: {b / a:.3f}; over 180 commands {180 * (a - b) / 60:.1f} minutes of one core saved")


if __name__ == "__main__":
    main()

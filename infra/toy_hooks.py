"""The toy world's hooks into train.py and eval.py: its model built before it loads, what validation reads of each
role, and `eval.py calibrate`.

What it is for: keeping the toy world (docs/toy_world.md) out of the method's files. train.py calls
`build_before_load` and `validation_tallies`, which do nothing for any other model than `toy`; `eval.py calibrate`
runs `calibrate`. What it is not: the toy world itself (infra/toy.py, toy_model.py, calibration.py). infra/ never
imports the concept files, so the rollout that plays the workflows (`play`: eval.play_every_problem) and the
engine that samples the toy model (eval.toy_engine) come from the caller.

    python train.py --model toy --workflow voting    # builds the toy model of --seed once, into the cache
    python eval.py calibrate --seed 0                # the toy model at base against its targets
"""
from __future__ import annotations

import os
from typing import Callable

from infra import calibration, checkpoints, toy, toy_model
from infra.distributed import barrier, world
from infra.runfolder import append_record, check_writable, writing
from infra.tallies import Tallies


def build_before_load(model: str, seed: int, play: Callable) -> None:
    """`--model toy`: the toy model of `seed`, built once into the cache by rank 0 before any rank loads it (the
    others wait); nothing to build for any other model."""
    if model == "toy" and world()[0] == 0:
        toy_model.build(seed, play)  # once per seed, into the cache
        print(calibration.calibration_warning(seed) or f"toy model of seed {seed}: calibrated", flush=True)
    barrier()


def validation_tallies(model: str, episodes: list, decode: Callable) -> Tallies:
    """`--model toy`: each role's habit and format, read by the toy world's parsers (toy.role_tallies); nothing
    for any other model."""
    return toy.role_tallies(episodes, decode) if model == "toy" else {}


def calibrate(seed: int, episodes: int | None, out: str | None, temperature: float | None, play: Callable,
              toy_engine: Callable) -> dict:
    """`eval.py calibrate`: the toy model of `seed` before any RL, against calibration's targets: every workflow
    played by the model alone, by the oracle alone, and with one habit at a time played by an always-careful and
    an always-hurried oracle. `toy_engine(seed, max_new_tokens, temperature)` gives (engine, tokenizer, encode).
    Exits 1 when a target is missed."""
    if out:
        check_writable(out, "--out", folder=False)
    toy_model.build(seed, play)
    temperature = calibration.TEMPERATURE if temperature is None else temperature
    engine, tokenizer, encode = toy_engine(seed, calibration.MAX_NEW_TOKENS, temperature)
    checkpoints.seed_everything(seed)
    text, record = calibration.measure(play, engine, tokenizer, encode, seed, episodes, temperature)
    print(text)
    calibration.keep_beside_model(seed, record)  # what train.py --model toy's warning reads
    if out:
        with writing(f"the calibration record {out}", os.path.dirname(out) or "."):
            append_record(out, record)
    if record["missed"]:
        raise SystemExit(1)
    return record

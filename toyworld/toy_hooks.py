"""The toy world's one hook into the method and its machinery: its model built before it loads,
where it lies, the regime it presets, what validation reads of each role, and `eval.py calibrate`.

What it is for: keeping the toy world (docs/toy_world.md) out of the method's files and out of
infra/: this is the only toyworld module they import (tests/test_layering.py holds it). train.py
calls `build_before_load` and `validation_tallies`, which do nothing for any other model than `toy`;
policies.load_model reads `model_folder`; infra/flags.py presets `PRESET` under `--model toy` and
refuses a role the toy world does not know (`role_problem`); eval.py's `calibrate` command (its
flags: infra/commands.py) runs `calibrate_command`. What it is not: the toy world itself
(toyworld/toy.py, reading.py, toy_model.py, calibration.py). toyworld/ never imports the concept
files at the top level, so the rollout that plays the workflows (`play`: eval.play_every_problem)
and the engine that samples the toy model (eval.toy_engine) come from the caller.

    # the toy model of --seed, once into the cache (copied or built)
    python train.py --model toy --workflow voting
    python eval.py calibrate --seed 0   # the toy model at base against its targets
"""
from __future__ import annotations

import os
from typing import Callable

from infra import checkpoints
from infra.distributed import barrier, world
from infra.roles import role_type
from infra.runfolder import append_record, check_writable, usage_error, writing
from infra.tallies import Tallies, add_mean
from toyworld import calibration, reading, toy, toy_model

# `--model toy`'s first run unless a flag says otherwise: the study's single agent at its sweep's
# rate rises from about 0.5 to above 0.8 by step 20 on every seed (its committed curves); at
# train.py's 5e-4 and 10 steps seed 0 fell from 0.516 to 0.391
FIRST_RUN = {"workflow": "single", "steps": 20, "lr": 1e-3}
# the flags `--model toy` presets (infra/flags.py): the regime it is calibrated at, and the first
# run
PRESET = {**calibration.REGIME, **FIRST_RUN}


def build_before_load(model: str, seed: int, play: Callable) -> None:
    """`--model toy`: the toy model of `seed`, built once into the cache by rank 0 before any rank
    loads it (the others wait); nothing to build for any other model."""
    if model == "toy" and world()[0] == 0:
        toy_model.build(seed, play)  # once per seed, into the cache: copied (seeds 0-5) or built
        print(calibration.calibration_warning(seed) or f"toy model of seed {seed}: calibrated",
              flush=True)
    barrier()


def role_problem(workflow: str, roles: list[str]) -> str | None:
    """`--model toy` with a role type the toy world does not know (a fork's new role): one line that
    says what to do, or None. Its model was warmed up on the six role types, and validation reads
    each role's format (reading.OWN_FORMAT), so a new role would stop the run there."""
    unknown = [r for r in roles if r not in reading.OWN_FORMAT]
    if not unknown:
        return None
    return (f"--model toy: --workflow {workflow} has the role {', '.join(unknown)}, which the toy "
            f"world does not know (it knows {', '.join(reading.OWN_FORMAT)}); run the workflow "
            f"on another --model (smollm2), or teach the toy world the role (its formats in "
            f"toyworld/reading.py's FORMATS and OWN_FORMAT, its oracle in toyworld/toy.py, "
            f"toy.VERSION bumped) and build its model again (18-33 minutes a seed)")


def model_folder(seed: int) -> str:
    """`--model toy`: the folder of the toy model of `seed` (policies.load_model loads it), once
    built."""
    if not toy.ready(seed):
        raise OSError(f"the toy model of seed {seed} is not built yet "
                      f"(python train.py --model toy --seed {seed} builds it)")
    return toy.folder(seed)


def validation_tallies(model: str, episodes: list, decode: Callable) -> Tallies:
    """`--model toy`: each role's habit and format, read by the toy world's parsers
    (`role_tallies`); nothing for any other model."""
    return role_tallies(episodes, decode) if model == "toy" else {}


def role_tallies(episodes: list, decode: Callable) -> Tallies:
    """Per role type, as numerators and denominators (infra/tallies.py): outputs in the role's own
    format, in another role's line (`foreign_format`), with a box of another role's kind
    (`foreign_box`; both are role capture by content, finding 5), and careful."""
    tallies: Tallies = {}
    for ep in episodes:
        for c in ep.calls:
            prompt = decode(c.prompt_ids)
            record = reading.judged(c.name, prompt, c.text)
            # only the aggregator's box is read against its prompt (its candidates)
            role = role_type(c.name)
            seen = reading.read_prompt(prompt) if role == "aggregator" else None
            record["foreign_box"] = foreign_box(role, seen, c.text)
            for key, what in (("own_format", "own"), ("foreign_format", "foreign"),
                              ("foreign_box", "foreign_box"), ("careful", "careful")):
                add_mean(tallies, f"{c.role}/{key}", record[what])
    return tallies


def foreign_box(role: str, seen: reading.Seen | None, text: str) -> bool:
    """Whether the box a role's parser reads (an aggregator's first, any other's last) is of another
    role's kind: a verdict where an answer or a solution's number belongs, a number where a verdict
    belongs, a number that is no solution's where the aggregator's pick belongs (`I trust solution
    3.` then `\\boxed{33}`: the solver's content), any box in the orchestrator's plan. No box is not
    a foreign one (the format counts that)."""
    boxes = reading.BOXED.findall(text)
    if not boxes:
        return False
    box = (boxes[0] if role == "aggregator" else boxes[-1]).strip()
    if role == "orchestrator" or box in ("Correct", "Incorrect"):
        return role != "evaluator"
    number = reading.to_int(box)
    if role == "evaluator":
        return number is not None
    return role == "aggregator" and number is not None and not 1 <= number <= len(seen.candidates)


def calibrate_command(args, play: Callable, toy_engine: Callable):
    """`eval.py calibrate` (its flags: infra/commands.py): build the toy model of `args.seed` into a
    new folder (`--build-into`) or once into the cache (`--build-only`), or calibrate it
    (`calibrate`)."""
    if args.build_into:
        check_writable(args.build_into, "--build-into", folder=True)
        if os.path.exists(args.build_into) and os.listdir(args.build_into):
            usage_error(f"--build-into {args.build_into}: not empty; a build writes a new folder")
        return toy_model.build(args.seed, play, out=args.build_into)
    if args.build_only:
        return toy_model.build(args.seed, play)
    return calibrate(args.seed, args.episodes, args.out, args.temperature, play, toy_engine)


def calibrate(seed: int, episodes: int | None, out: str | None, temperature: float | None,
              play: Callable, toy_engine: Callable) -> dict:
    """`eval.py calibrate`: the toy model of `seed` before any RL, against calibration's targets:
    every workflow played by the model alone, by the oracle alone, and with one habit at a time
    played by an always-careful and an always-hurried oracle. `toy_engine(seed, max_new_tokens,
    temperature)` gives (engine, tokenizer, encode). Exits 1 when a target is missed."""
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

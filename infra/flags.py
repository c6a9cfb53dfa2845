"""train.py's command line: flags made from settings' fields, checks, resume, a run's first lines.

What it is for: everything between a command line and checked flags, before anything loads or is
written; bad input is one line on stderr, exit 2 (`usage_error`). It imports no concept file:
settings and roles are passed in.

One place per setting. train.py's `Settings`, the update's settings (grpo.UpdateSettings) and the
workflows' options (workflows.WorkflowOptions) are dataclasses whose fields describe themselves in
their metadata, each made by infra/settings.py's `setting`; `Parser.add_settings` makes one flag
per field:

    clip_high: float = setting(0.28, "--clip-high", "PPO clip above 1 (clip-higher)",
                               within="(0, inf)", paper=0.28)

becomes `--clip-high CLIP_HIGH` (a float > 0, default 0.28, help "PPO clip above 1 (clip-higher)
(paper: 0.28) (default: 0.28)"), and `settings_from(UpdateSettings, vars(args))` fills the field
from the parsed flag of its name. The field's default is the flag's (0 for a computed value,
resolved by train.py's `settings_from_flags`; `--model toy` and `--cell` preset some, shown in
--help). A field's metadata:

    flag      the flag as it is written (a grep finds the field), then any other spelling of it
    help      the flag's help; a field without it is no flag (its caller computes the value)
    group     the --help group this field and the ones after it are listed in
    paper     the paper's value, shown in the help
    within    the values it takes, an interval: "[1, inf)", "(0, 1]" (role=value: each value)
    choices   the values it takes, a list
    metavar   the flag's value as --help names it
    switch    a bool field's flag is one switch, given or not (default: `--x` and `--no-x`)

A bool field is a pair of switches (`--share-prompts`, `--no-share-prompts`) unless it is one; a
`dict[str, float]` field a role=value list (`--kl-coef generator=0.1`), read against the workflow's
roles. """
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import sys
import textwrap
import time
import types
import typing
from typing import NoReturn

from infra import cells, checkpoints, distributed
from infra.environment import check_environment
from infra.runfolder import read_results, read_run_args, usage_error, write_args
from toyworld import toy_hooks

# Flags a resumed run may change: they change how it runs or reports, not what it trains on or how.
RESUMABLE = ("steps", "val_every", "val_n", "save_every", "keep_last", "wandb", "device",
             "gen_batch_size", "gen_max_tokens", "micro_batch_size", "max_tokens_per_micro_batch",
             "grad_checkpointing", "vllm_gpu_memory", "val_samples", "decode")


# ---------------------------------------------------------------- value types


def number(cast, low: float, high: float | None = None, low_open: bool = False,
           high_open: bool = False):
    """An argparse `type`: `cast(text)`, finite and inside [low, high] (open ends as asked), else
    one line (`must be > 0, got -1`)."""
    if high is None:
        what = f"{'>' if low_open else '>='} {low}"
    else:
        what = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            expected = "an integer" if cast is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        above = value > low if low_open else value >= low
        below = high is None or (value < high if high_open else value <= high)
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


INTERVAL = re.compile(r"([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])")


def interval_type(cast, within: str | None):
    """The argparse `type` of a field's `within`: "[1, inf)" -> `number(int, 1)` (an int field)."""
    if within is None:
        return cast
    match = INTERVAL.fullmatch(within)
    if match is None:
        raise ValueError(f"within={within!r}: expected an interval such as '(0, 1]' or '[1, inf)'")
    low_bracket, low, high, high_bracket = match.groups()

    def bound(text: str):
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
    return number(cast, bound(low), None if high == "inf" else bound(high),
                  low_open=low_bracket == "(", high_open=high_bracket == ")")


# ---------------------------------------------------------------- the parser


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`error: argument --lr: must be > 0, got -1`), exit 2, and
    which makes its flags from settings dataclasses (`add_settings`; `presets`: what --cell and
    --model toy set, in the help)."""

    def __init__(self, *args, presets: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings_classes: list[type] = []  # what `add_settings` made flags from
        self.presets = cells.preset_notes(toy_hooks.PRESET) if presets else {}

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")

    def add_settings(self, settings_class: type, title: str | None = None) -> None:
        """One flag per field of `settings_class` with a `help` (module docstring), in the group
        `title`, or in the group a field opens with its `group`."""
        self.settings_classes.append(settings_class)
        hints = typing.get_type_hints(settings_class)
        group = self.add_argument_group(title) if title else self
        for f in dataclasses.fields(settings_class):
            meta = f.metadata
            if "help" not in meta:
                continue  # not a flag: the caller computes it
            flag = meta.get("flag", ())
            names = (flag,) if isinstance(flag, str) else tuple(flag)
            written = "--" + f.name.replace("_", "-")
            if names[:1] != (written,):
                where = f"{settings_class.__name__}.{f.name}"
                raise ValueError(f"{where}: a field with help is a flag; its metadata names it "
                                 f"first, flag={written!r}")
            if "group" in meta:
                group = self.add_argument_group(meta["group"])
            help_ = meta["help"] + (f" (paper: {meta['paper']})" if "paper" in meta else "")
            if f.name in self.presets:  # the default, then what each preset sets instead
                help_ += f" (default: %(default)s; {'; '.join(self.presets[f.name])})"
            kind = optional_of(hints[f.name])
            more = {"metavar": meta["metavar"]} if "metavar" in meta else {}
            if kind is bool:  # a switch (given or not), or a pair --x / --no-x
                action = "store_true" if meta.get("switch") else argparse.BooleanOptionalAction
                group.add_argument(*names, dest=f.name, action=action, default=f.default,
                                   help=help_)
            elif typing.get_origin(kind) is dict:  # role=value,...: read in check_args
                group.add_argument(*names, dest=f.name, default=None, help=help_, **more)
            else:
                group.add_argument(*names, dest=f.name, default=f.default, help=help_,
                                   type=interval_type(kind, meta.get("within")),
                                   choices=meta.get("choices"), **more)


def optional_of(kind):
    """`str | None` -> str (a flag whose default is None takes values of the other type); any other
    type as is."""
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    if union and type(None) in typing.get_args(kind):
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    return kind


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default after its help."""


def settings_from(settings_class: type, flags: dict, **computed):
    """An instance of the dataclass `settings_class`, each field the flag of its name in `flags`
    (train.py's parsed flags, or a run's args.json), or its value in `computed` where the caller
    computes it (a field without a flag, a flag whose 0 means something)."""
    values = {}
    for f in dataclasses.fields(settings_class):
        values[f.name] = computed[f.name] if f.name in computed else flags[f.name]
    return settings_class(**values)


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The flags (by dest) that `argv` names, after `parser` has accepted it: argparse has no such
    query, but with allow_abbrev off every flag is spelled out (`--lr 1e-4` or `--lr=1e-4`), and
    argparse refuses a value that looks like a flag, so the words of argv that start with `-` are
    exactly the flags given."""
    words = {w.split("=", 1)[0] for w in argv if w.startswith("-")}
    return {a.dest for a in parser._actions if words & set(a.option_strings)}


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> the flag as a user writes it (`group_size` -> `--group-size`)."""
    return {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}


# ---------------------------------------------------------------- parsing a run's flags


def parse_args(parser: Parser, argv: list[str] | None, roles: dict[str, list[str]]
               ) -> argparse.Namespace:
    """Flags -> a checked Namespace; nothing is loaded or written here. `--cell` stands in for the
    defaults (the command line wins); on `--resume`, the run's own flags."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.list_cells:
        print(cells.list_cells(roles))
        raise SystemExit(0)
    given = given_flags(parser, argv)  # what the command line names: it wins over a cell
    if args.resume:
        args = resume_args(parser, args, given)
    else:
        try:
            preset = {key: value for _, values in presets(args) for key, value in values.items()}
        except ValueError as e:  # not a cell
            usage_error(str(e))
        for key, value in preset.items():
            if key not in given:
                setattr(args, key, value)
        if args.run_dir is None:
            folder = f"{args.workflow}-{args.policy}-{time.strftime('%Y%m%d-%H%M%S')}"
            args.run_dir = os.path.join("runs", folder)
        check_args(args, parser, roles)
    check_environment(args)
    return args


def presets(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The values a run's flags take in place of train.py's defaults, each preset named as the
    command line names it, in the order they apply: `--model toy`'s regime and a first run that
    learns (toy_hooks.PRESET), then `--cell`'s (cells.cell_defaults; ValueError: not a cell)."""
    out = [("--model toy", dict(toy_hooks.PRESET))] if args.model == "toy" else []
    if args.cell:
        out.append((f"--cell {args.cell}", cells.cell_defaults(args.cell)))
    return out


def resume_args(parser: Parser, args: argparse.Namespace, given: set[str]) -> argparse.Namespace:
    """The saved flags of the run in `args.resume`, with the RESUMABLE flags the command line gives
    applied (each printed); any other flag given is refused, since it would change what the run
    trains."""
    run = read_run_args(args.resume, f"--resume {args.resume}")
    read_results(os.path.join(args.resume, "metrics.jsonl"), ("step",))  # a bad line stops here
    names = flag_names(parser)
    refused = sorted(given - set(RESUMABLE) - {"resume"})
    if refused:
        usage_error(f"--resume continues a run with its own settings; "
                    f"{', '.join(names[k] for k in refused)} cannot change mid-run "
                    f"(these can: {', '.join(names[k] for k in RESUMABLE)}); "
                    "for other settings start a new run with a new --run-dir")
    defaults = {a.dest: a.default for a in parser._actions if a.dest != "help"}
    out = argparse.Namespace(**{**defaults, **run})  # a flag newer than the run: its default
    for key in sorted(given - {"resume"}):
        print(f"resume: {names[key]} {getattr(args, key)} (the run had {run.get(key)})")
        setattr(out, key, getattr(args, key))
    out.resume = out.run_dir = args.resume
    return out


def nothing_to_train(args: argparse.Namespace) -> bool:
    """A resumed run whose newest checkpoint is at or past --steps: say so and keep its args.json as
    it was, except that flags an older train.py did not write are added with today's defaults (what
    eval.py's message offers)."""
    saved = checkpoints.checkpoint_steps(args.run_dir)
    if not saved or saved[-1] < args.steps:
        return False
    run_flags = read_run_args(args.run_dir)
    missing = {k: v for k, v in vars(args).items() if k not in run_flags}
    if missing and distributed.world()[0] == 0:
        both = {**missing, **run_flags, "resume": args.run_dir, "run_dir": args.run_dir}
        write_args(argparse.Namespace(**both))
        added = ", ".join(f"--{k.replace('_', '-')}" for k in missing)
        print(f"resume: added to {args.run_dir}/args.json: {added}")
    print(f"nothing to train: {args.run_dir} is at step {saved[-1]}; "
          f"extend it with --steps N (N > {saved[-1]})")
    return True


# ---------------------------------------------------------------- the checks


def role_values(spec: str | None, flag: str, workflow: str, roles: list[str], kind
                ) -> dict[str, float]:
    """`generator=2,aggregator=1` -> {"generator": 2.0, "aggregator": 1.0}: `roles` of the workflow,
    values of `kind` (an argparse type from `number`); anything else is a one-line error."""
    out: dict[str, float] = {}
    for item in spec.split(",") if spec else []:
        role, sep, text = (s.strip() for s in item.partition("="))
        if not sep or not role:
            usage_error(f"{flag} expects role=value[,role=value...], got {spec!r}")
        if role not in roles:
            usage_error(f"{flag}: {role!r} is not a role of {workflow} "
                        f"(its roles: {', '.join(roles)})")
        try:
            out[role] = kind(text)
        except argparse.ArgumentTypeError as e:
            usage_error(f"{flag} {role}: {e}")
    return out


def read_role_flags(args: argparse.Namespace, parser: Parser, roles: list[str]) -> None:
    """Every role=value flag made from a settings class (a `dict[str, float]` field), as a dict."""
    for settings_class in parser.settings_classes:
        hints = typing.get_type_hints(settings_class)
        for f in dataclasses.fields(settings_class):
            if "help" in f.metadata and typing.get_origin(hints[f.name]) is dict:
                kind = interval_type(typing.get_args(hints[f.name])[1], f.metadata.get("within"))
                flag = "--" + f.name.replace("_", "-")
                spec = getattr(args, f.name)
                setattr(args, f.name, role_values(spec, flag, args.workflow, roles, kind))


def check_args(args: argparse.Namespace, parser: Parser, roles: dict[str, list[str]]) -> None:
    """Flags that contradict each other or the workflow stop here, with one line, before anything
    loads; the role=value flags are read against the workflow's roles. (The method's own rules, such
    as SP-only and IP-only settings, are train.py's `settings_from_flags`.)"""
    problem = args.model == "toy" and toy_hooks.role_problem(args.workflow, roles[args.workflow])
    if problem:  # before anything loads: validation would stop on the role
        usage_error(problem)
    if args.role_weights == "equal":
        args.role_weights = ",".join(f"{r}=1" for r in roles[args.workflow])
    read_role_flags(args, parser, roles[args.workflow])
    if args.task in ("dapo", "deepcoder") and not args.data:
        usage_error(f"--task {args.task} needs --data PATH_OR_HUB_ID")
    for flag, value in (("--data", args.data), ("--val-data", args.val_data)):
        if value and args.task in ("math", "code"):
            usage_error(f"{flag} is read by --task dapo or deepcoder; "
                        f"--task {args.task} has built-in data")
    if args.data_config and args.data and os.path.exists(args.data):
        print(f"warning: --data-config {args.data_config} is ignored: it names a hub dataset's "
              f"config, and --data {args.data} is a local file", file=sys.stderr)
    if args.group_size == 1:
        print("warning: --group-size 1: every GRPO group has one member, so there is no group "
              "baseline and the advantage is the raw reward (use --group-size 2 or more)",
              file=sys.stderr)


# ---------------------------------------------------------------- the run's first lines


def as_written(action: argparse.Action, value) -> str:
    """A flag and its value as a command line writes them (`--lr 0.001`, `--no-share-prompts`)."""
    flag = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return flag if value else "--no-" + flag[2:]
    if action.nargs == 0:  # a switch: it was given
        return flag
    if isinstance(value, dict):  # role=value flags
        return f"{flag} {','.join(f'{k}={v}' for k, v in value.items())}"
    return f"{flag} {shlex.quote(str(value))}"


def changed_flags(args: argparse.Namespace, parser: Parser) -> list[str]:
    """The flags whose value is not the default, as a command line writes them, in --help's order.
    A preset's values count as defaults (`preset_lines` names them), as does what train.py resolves
    itself (--engine auto); the run folder is not a flag here."""
    defaults = {a.dest: a.default for a in parser._actions}
    for _, values in presets(args):
        defaults.update(values)
    defaults.update(engine=args.engine, run_dir=args.run_dir, resume=args.resume,
                    overwrite=args.overwrite)
    empty = (None, {}, "")
    out = []
    for action in parser._actions:
        value, default = getattr(args, action.dest, None), defaults.get(action.dest)
        if action.dest == "help" or value == default or (value in empty and default in empty):
            continue
        out.append(as_written(action, value))
    return out


NBSP = "\N{NO-BREAK SPACE}"  # inside a flag and its value: the wrap breaks between flags only


def preset_lines(args: argparse.Namespace, parser: Parser) -> list[str]:
    """Per preset, the flags it set in place of a default, with the default, in --help's order
    (`preset by --model toy: --lr 0.001 (default 0.0005), ...`), wrapped at 100 columns. A flag the
    command line set, or one the preset leaves at its default, is not named."""
    found = presets(args)
    setter = {key: (name, value) for name, values in found for key, value in values.items()}
    lines = []
    for name, _ in found:
        named = []
        for a in parser._actions:
            preset_by, value = setter.get(a.dest, (None, None))
            if preset_by == name and getattr(args, a.dest) == value != a.default:
                was = ("on" if a.default else "off") if isinstance(a.default, bool) else a.default
                named.append(f"{as_written(a, value)} (default {was})".replace(" ", NBSP))
        if named:  # wrapped only where something is named
            lines += [line.replace(NBSP, " ") for line in textwrap.wrap(
                f"preset by {name}: {', '.join(named)}", 100, subsequent_indent="  ",
                break_long_words=False, break_on_hyphens=False)]
    return lines


def run_header(args: argparse.Namespace, parser: Parser, device: str) -> str:
    """The lines a run opens with: what it is and where it writes, the flags not at their defaults
    (every setting is in RUN/args.json), and what a preset set in place of a default."""
    changed = " ".join(changed_flags(args, parser)) or "none"
    return "\n".join([
        f"run {cells.cell_name(vars(args))}: workflow {args.workflow}, policy {args.policy}, "
        f"model {args.model}, device {device}, engine {args.engine}, folder {args.run_dir}",
        f"flags not at their defaults: {changed} "
        f"(every setting: {os.path.join(args.run_dir, 'args.json')})", *preset_lines(args, parser)])

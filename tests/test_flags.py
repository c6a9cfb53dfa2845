"""One place per knob: flags made from settings' fields (infra/flags.py), a new update knob in one
edit, the two lines a run opens with, and an older run folder's `n` read as --group-size."""
import dataclasses
import json
import os

import pytest

import eval as E
import grpo
import train
import workflows
from infra import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--model", "tiny", "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "6", "--n-val", "2",
        "--val-every", "0"]


def train_flags(argv: list[str]):
    """train.py's flags, checked, as its `run` parses them (the Namespace `settings_from_flags` reads)."""
    return flags.parse_args(train.build_parser(), argv, workflows.ROLES)


# ---------------------------------------------------------------- flags made from fields

@dataclasses.dataclass
class Knobs:
    """One field of every kind the flag builder knows, and one without help (not a flag)."""
    rows: int = dataclasses.field(default=8, metadata=dict(flag="--rows", help="rows at most", within="[1, inf)",
                                                            paper=512))
    budget: int = dataclasses.field(default=0, metadata=dict(flag="--budget", help="tokens; 0 = none",
                                                              within="[0, inf)", group="limits"))
    clip: float = dataclasses.field(default=0.2, metadata=dict(flag="--clip", help="clip", within="(0, 1)"))
    mode: str = dataclasses.field(default="a", metadata=dict(flag="--mode", help="which", choices=["a", "b"]))
    name: str | None = dataclasses.field(default=None, metadata=dict(flag="--name", help="a name",
                                                                      metavar="NAME_OF_IT"))
    merge: bool = dataclasses.field(default=False, metadata=dict(flag="--merge", help="merge steps"))
    share: bool = dataclasses.field(default=True, metadata=dict(flag="--share", help="share prompts"))
    quiet: bool = dataclasses.field(default=False, metadata=dict(flag="--quiet", help="say less", switch=True))
    weights: dict[str, float] = dataclasses.field(default_factory=dict, metadata=dict(
        flag=("--weights", "--w"), help="role=value", within="(0, 1]"))  # and another spelling
    length: int = 512  # computed by the caller: no flag


def knob_parser() -> flags.Parser:
    p = flags.Parser(allow_abbrev=False, formatter_class=flags.HelpFormatter)
    p.add_settings(Knobs, "knobs")
    return p


def test_each_field_with_help_is_one_flag_of_its_kind():
    p = knob_parser()
    assert flags.flag_names(p) == {"help": "-h", "rows": "--rows", "budget": "--budget", "clip": "--clip",
                                   "mode": "--mode", "name": "--name", "merge": "--merge", "share": "--share",
                                   "quiet": "--quiet", "weights": "--weights"}
    defaults = vars(p.parse_args([]))
    assert defaults == {"rows": 8, "budget": 0, "clip": 0.2, "mode": "a", "name": None, "merge": False,
                        "share": True, "quiet": False, "weights": None}  # the field's default is the flag's
    given = vars(p.parse_args(["--rows", "3", "--budget=7", "--clip", "0.5", "--mode", "b", "--name", "x y",
                               "--merge", "--no-share", "--quiet", "--w", "x=0.5"]))
    assert given == {"rows": 3, "budget": 7, "clip": 0.5, "mode": "b", "name": "x y", "merge": True,
                     "share": False, "quiet": True, "weights": "x=0.5"}  # role=value: read in check_args
    text = " ".join(p.format_help().split())
    assert "--rows ROWS rows at most (paper: 512) (default: 8)" in text
    assert "--weights WEIGHTS, --w WEIGHTS role=value (default: None)" in text
    assert "--share, --no-share share prompts (default: True)" in text
    assert "--name NAME_OF_IT a name (default: None)" in text
    assert "--quiet say less (default: False)" in text and "--no-quiet" not in text  # a switch
    assert text.index("knobs: --rows") < text.index("limits: --budget") < text.index("--weights WEIGHTS,")  # a group


def test_a_field_with_help_names_its_flag_as_it_is_written():
    """A grep for a flag finds its field: a field with help and no `flag`, or another spelling first, is refused
    when the parser is made."""
    @dataclasses.dataclass
    class Unnamed:
        rows: int = dataclasses.field(default=8, metadata=dict(help="rows at most"))

    @dataclasses.dataclass
    class Misnamed:
        rows: int = dataclasses.field(default=8, metadata=dict(flag="--n-rows", help="rows at most"))
    for settings in (Unnamed, Misnamed):
        with pytest.raises(ValueError, match=r"rows: a field with help is a flag; .* flag='--rows'"):
            flags.Parser().add_settings(settings)


def test_every_flag_of_train_py_is_written_where_its_field_is():
    """grep -- --lr finds `lr`'s field: every flag train.py takes is spelled out, quoted, in the file of the field it
    is made from (train.py, grpo.py or workflows.py), on the line that opens the field or the next."""
    sources = {}
    for cls in (train.Settings, grpo.UpdateSettings, workflows.WorkflowOptions):
        with open(os.path.join(ROOT, f"{cls.__module__}.py")) as f:
            lines = f.read().split("\n")
        sources[cls] = lines[lines.index(f"class {cls.__name__}:"):]
    for cls, lines in sources.items():
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                continue
            opened = next(i for i, line in enumerate(lines) if line.startswith(f"    {f.name}:"))
            flag = f'"--{f.name.replace("_", "-")}"'
            assert flag in lines[opened] + lines[opened + 1], f"{cls.__name__}.{f.name}: {flag} not written there"
    parser = train.build_parser()
    made = {a.dest for a in parser._actions if a.option_strings} - {"help"}
    fields = {f.name for cls in sources for f in dataclasses.fields(cls) if "help" in f.metadata}
    assert made == fields  # no flag from anywhere else


@pytest.mark.parametrize("argv,message", [
    (["--rows", "0"], "error: argument --rows: must be >= 1, got 0"),
    (["--rows", "two"], "error: argument --rows: expected an integer, got 'two'"),
    (["--budget", "-1"], "error: argument --budget: must be >= 0, got -1"),
    (["--clip", "1"], "error: argument --clip: must be in (0, 1), got 1"),
    (["--clip", "0"], "error: argument --clip: must be in (0, 1), got 0"),
    (["--mode", "c"], "error: argument --mode: invalid choice: 'c' (choose from "),  # quoting: Python's
])
def test_a_fields_interval_is_its_flags_check(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        knob_parser().parse_args(argv)
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(message)


def test_role_values_take_the_fields_interval(capsys):
    p = knob_parser()
    args = p.parse_args(["--weights", "generator=0.5, aggregator=1"])
    args.workflow = "voting"
    flags.read_role_flags(args, p, ["generator", "aggregator"])
    assert args.weights == {"generator": 0.5, "aggregator": 1.0}
    args = p.parse_args(["--weights", "generator=1.5"])
    args.workflow = "voting"
    with pytest.raises(SystemExit):
        flags.read_role_flags(args, p, ["generator", "aggregator"])
    assert capsys.readouterr().err.strip() == "error: --weights generator: must be in (0, 1], got 1.5"


def test_settings_are_filled_by_name_and_the_computed_fields_are_named():
    args = vars(knob_parser().parse_args(["--rows", "3", "--weights", "x=1"]))
    s = flags.settings_from(Knobs, args, budget=args["budget"] or 1 << 62, length=16)
    assert s == Knobs(rows=3, budget=1 << 62, clip=0.2, mode="a", merge=False, share=True, weights="x=1", length=16)
    with pytest.raises(KeyError, match="length"):  # a field with no flag must be computed by the caller
        flags.settings_from(Knobs, args)


# ---------------------------------------------------------------- a new update knob: one edit

def test_a_new_update_knob_is_one_field(monkeypatch, capsys, tmp_path):
    """The one edit: a field of grpo.UpdateSettings with its help (here a subclass with one more field
    stands in for the edited class). With nothing else changed, train.py lists the flag, checks its value,
    saves it, and the settings the update receives carry it."""
    @dataclasses.dataclass
    class WithKnob(grpo.UpdateSettings):
        entropy_bonus: float = dataclasses.field(default=0.0, metadata=dict(
            flag="--entropy-bonus", help="weight of an entropy bonus in the loss", within="[0, inf)", paper=0))
    monkeypatch.setattr(grpo, "UpdateSettings", WithKnob)

    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--entropy-bonus ENTROPY_BONUS weight of an entropy bonus in the loss (paper: 0) (default: 0.0)" in text

    with pytest.raises(SystemExit) as e:
        train_flags([*TINY, "--entropy-bonus", "-1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == "error: argument --entropy-bonus: must be >= 0, got -1"

    received = []
    update = grpo.update_policy

    def spy(*args, **kwargs):
        received.extend(a for a in (*args, *kwargs.values()) if isinstance(a, WithKnob))
        return update(*args, **kwargs)
    monkeypatch.setattr(grpo, "update_policy", spy)
    run_dir = tmp_path / "run"
    train.main([*TINY, "--steps", "1", "--entropy-bonus", "0.25", "--run-dir", str(run_dir)])
    (settings,) = received
    assert settings.entropy_bonus == 0.25
    assert (settings.mini_batch_size, settings.norm_len, settings.clip_high) == (2 * 2, 6, 0.28)  # as before
    assert json.loads((run_dir / "args.json").read_text())["entropy_bonus"] == 0.25
    assert "--entropy-bonus 0.25" in capsys.readouterr().out  # the run's second line names it


def test_the_settings_resolve_what_a_flags_0_stands_for_in_one_place():
    """settings_from_flags: the fields not taken by name are computed there (a 0 mini-batch size, the response
    budget); every other field is its flag's value; a 0 token budget stays 0 (rows
    only: policies.micro_batches reads it)."""
    cfg = train.settings_from_flags(train_flags([
        "--model", "tiny", "--tasks-per-step", "3", "--n", "5", "--max-new-tokens", "9", "--temperature", "0.9",
        "--kl-coef", "generator=0.1", "--clip-high", "0.3", "--lr", "0.002", "--n-votes", "2"]))
    s = cfg.update
    assert (s.mini_batch_size, s.max_tokens_per_micro_batch, s.norm_len, s.temperature) == (15, 0, 9, 0.9)
    assert (s.kl_coef, s.clip_high, s.share_prompts, s.agg, s.lr) == \
        ({"generator": 0.1}, 0.3, True, "seq-mean-token-mean", 0.002)
    assert (cfg.group_size, cfg.tasks_per_step, cfg.model) == (5, 3, "tiny")
    assert (cfg.options.n_votes, cfg.options.max_iterations) == (2, None)  # None: the paper's, per task
    s = train.settings_from_flags(train_flags(["--model", "tiny", "--mini-batch-size", "6",
                                               "--max-tokens-per-micro-batch", "500"])).update
    assert (s.mini_batch_size, s.max_tokens_per_micro_batch) == (6, 500)


# ---------------------------------------------------------------- the run's first lines

def test_a_run_opens_with_what_it_is_and_the_flags_it_changed(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.main([*TINY, "--workflow", "voting", "--steps", "1", "--run-dir", str(run_dir)])
    out = capsys.readouterr().out.splitlines()
    first = out.index(f"run Voting-SP-Tiny-Math: workflow voting, policy sp, model tiny, device cpu, engine hf, "
                      f"folder {run_dir}")
    assert out[first + 1] == ("flags not at their defaults: --model tiny --n-val 2 --tasks-per-step 2 "
                              "--group-size 2 --steps 1 --max-new-tokens 6 --val-every 0 --workflow voting "
                              f"(every setting: {run_dir / 'args.json'})")
    assert not any(line.startswith("config:") for line in out)
    assert max(map(len, out)) < 300  # no line of every setting


def test_a_library_outside_the_tested_versions_is_one_line_at_start_up(tmp_path, capsys, monkeypatch):
    """torch 2.14 (CUDA 13) and vLLM 0.33 are outside what the tests run (torch 2.13; transformers 5.17, 5.19,
    5.24; vLLM 0.32), compared by major.minor: train.py and eval.py say so in one line before anything loads; a
    patch release (5.24.3) is inside, and a library that is not installed is not named."""
    from infra import models
    installed = {"torch": "2.14.0+cu130", "transformers": "5.24.3", "vllm": "0.33.0"}
    monkeypatch.setattr(models, "installed_version", installed.get)
    note = ("note: torch 2.14.0+cu130 (tested: 2.13); vllm 0.33.0 (tested: 0.32) outside the tested versions "
            "(docs/vllm.md, 'Versions')")
    assert models.version_note() == note
    run_dir = tmp_path / "run"
    train.main([*TINY, "--steps", "0", "--run-dir", str(run_dir)])
    out = capsys.readouterr().out.splitlines()
    assert out.count(note) == 1 and out.index(note) < min(i for i, line in enumerate(out)
                                                          if line.startswith(("attention:", "run ")))
    E.main(["--run-dir", str(run_dir), "--mode", "base"])
    assert capsys.readouterr().out.splitlines()[0] == note
    installed.update(torch="2.13.0+cpu", vllm=None)
    assert models.version_note() is None
    installed.update(transformers="5.20.0")
    assert models.version_note() == ("note: transformers 5.20.0 (tested: 5.17, 5.19, 5.24) outside the tested "
                                     "versions (docs/vllm.md, 'Versions')")


def test_the_toy_model_runs_its_calibrated_regime_unless_a_flag_says_otherwise():
    """`--model toy` takes the regime its model is calibrated at (calibration.REGIME) and a first run that learns
    (the single agent, 20 steps at 1e-3: toy_hooks.FIRST_RUN) as its defaults, and counts them as defaults in the
    run's first lines; a flag given on the command line wins."""
    from toyworld import calibration
    parser = train.build_parser()
    args = train_flags(["--model", "toy", "--workflow", "voting", "--policy", "ip"])
    assert (args.tasks_per_step, args.group_size, args.max_new_tokens, args.temperature) == (2, 8, 32, 1.0)
    assert {k: getattr(args, k) for k in calibration.REGIME} == calibration.REGIME
    assert flags.changed_flags(args, parser) == ["--model toy", "--policy ip", "--workflow voting"]
    args = train_flags(["--model", "toy", "--temperature", "0.7", "--n", "4"])
    assert (args.temperature, args.group_size, args.max_new_tokens) == (0.7, 4, 32)
    assert (args.workflow, args.steps, args.lr) == ("single", 20, 1e-3)  # a first run that learns
    assert flags.changed_flags(train_flags(["--model", "toy", "--steps", "5"]), parser) == ["--model toy", "--steps 5"]
    assert (train_flags(["--model", "tiny"]).steps, train_flags(["--model", "tiny"]).lr) == (10, 5e-4)
    assert train_flags(["--model", "tiny"]).temperature == 0.7  # other models: train.py's defaults


def preset_of(header: str) -> str:
    """The header's preset lines (after its first two), unwrapped."""
    return " ".join(line.strip() for line in header.splitlines()[2:])


def test_a_preset_says_in_the_header_what_it_set_in_place_of_a_default():
    """`--model toy` and `--cell` set flags in place of train.py's defaults; the run's header names each one, with
    the default it replaced, in --help's order: a flag the command line gives is not the preset's (it is among the
    flags not at their defaults), nor is one the preset leaves at the default (toy's workflow, single). Wrapped
    at 100 columns."""
    parser = train.build_parser()
    header = flags.run_header(train_flags(["--model", "toy", "--workflow", "voting"]), parser, "cpu")
    assert preset_of(header) == (
        "preset by --model toy: --tasks-per-step 2 (default 8), --group-size 8 (default 4), --steps 20 (default "
        "10), --max-new-tokens 32 (default 64), --temperature 1.0 (default 0.7), --lr 0.001 (default 0.0005)")
    header = flags.run_header(train_flags(["--model", "toy", "--lr", "5e-4", "--steps", "5"]), parser, "cpu")
    assert header.splitlines()[1].startswith("flags not at their defaults: --model toy --steps 5 --lr 0.0005 ")
    assert preset_of(header) == ("preset by --model toy: --tasks-per-step 2 (default 8), --group-size 8 "
                                 "(default 4), --max-new-tokens 32 (default 64), --temperature 1.0 (default 0.7)")
    args = train_flags(["--cell", "Voting-IP-1.7B-Math", "--device", "cpu", "--engine", "hf", "--steps", "3"])
    header = flags.run_header(args, parser, "cpu")
    assert preset_of(header).startswith(
        "preset by --cell Voting-IP-1.7B-Math: --model Qwen/Qwen3-1.7B (default smollm2), --dtype bfloat16 "
        "(default float32), --chat-template rllm (default model), ")
    assert "--lr 2e-05 (default 0.0005)" in header and "--grad-checkpointing (default off)" in header
    assert "--steps" not in preset_of(header) and "--workflow voting (default single)" in preset_of(header)
    assert max(map(len, header.splitlines()[2:])) <= 100
    assert len(flags.run_header(train_flags(["--model", "tiny"]), parser, "cpu").splitlines()) == 2  # no preset


def test_a_cells_values_count_as_its_defaults():
    """A cell run names the cell and what the command line changed; what train.py resolves itself
    (--engine auto) is not a change, nor is a flag left at None (--max-iterations: the paper's by task)."""
    parser = train.build_parser()
    args = train_flags(["--cell", "EvalOpt-IP-0.6B-Code", "--device", "cpu", "--engine", "hf", "--lr", "1e-4"])
    assert flags.changed_flags(args, parser) == ["--device cpu", "--cell EvalOpt-IP-0.6B-Code", "--lr 0.0001"]
    args = train_flags(["--model", "tiny", "--task", "code", "--workflow", "evalopt", "--role-weights", "equal",
                        "--no-share-prompts", "--run-dir", "my run"])
    assert args.max_iterations is None  # the paper's for the task, when the workflow runs (paper_iterations)
    assert flags.changed_flags(args, parser) == ["--model tiny", "--task code", "--workflow evalopt",
                                                 "--role-weights generator=1.0,evaluator=1.0", "--no-share-prompts"]


# ---------------------------------------------------------------- an older run folder

def test_an_old_run_folders_n_is_read_as_group_size(tmp_path, capsys):
    """train.py once saved --group-size as `n`: such a folder evaluates, resumes with its own group size (not
    today's default, 4), and its args.json is rewritten with today's name."""
    run_dir = tmp_path / "run"
    train.main([*TINY, "--steps", "1", "--run-dir", str(run_dir)])
    saved = json.loads((run_dir / "args.json").read_text())
    saved["n"] = saved.pop("group_size")  # as the older train.py wrote it
    (run_dir / "args.json").write_text(json.dumps(saved))
    (record,) = E.main(["--run-dir", str(run_dir)])
    assert (record["cell"], record["step"]) == ("Single-SP-Tiny-Math", 1)
    assert train_flags(["--resume", str(run_dir)]).group_size == 2
    train.main(["--resume", str(run_dir), "--steps", "2"])
    rewritten = json.loads((run_dir / "args.json").read_text())
    assert rewritten["group_size"] == 2 and "n" not in rewritten
    assert "resumed" in capsys.readouterr().out

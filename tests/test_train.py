"""Runs that survive: exact resume after SIGKILL, atomic checkpoints with fallback, guarded numerics,
and one-line errors for bad flags and bad data (issue: runs that survive)."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from test_flags import train_flags

import grpo
import train
from infra import checkpoints, runfolder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--model", "tiny", "--tasks-per-step", "3", "--n", "2", "--max-new-tokens", "24", "--val-every", "0",
        "--save-every", "1", "--lr", "1e-2", "--warmup-steps", "1", "--difficulty", "1", "--n-train", "40",
        "--n-val", "4"]
TIMING = ("time_rollout", "time_update", "rollout_tok_s", "update_tok_s")


# A random tiny model never boxes a right answer, so every advantage would be 0 and nothing would train:
# the subprocess runs train.py with a learnable stand-in reward (even-length outputs win).
PARITY_TRAIN = f"""
import sys
sys.path.insert(0, {ROOT!r})
import tasks, train, workflows
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs]
train.main(sys.argv[1:])
"""


def run_train(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # same threads in every run: same floats
    return subprocess.Popen([sys.executable, "-c", PARITY_TRAIN, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(ln).items() if k not in TIMING} for ln in f]


def adapter_tensors(run_dir, step):
    return load_file(os.path.join(run_dir, "checkpoints", f"step_{step:06d}", "adapters", "shared",
                                  "adapter_model.safetensors"))


def test_sigkill_during_step_3_then_resume_equals_uninterrupted(tmp_path):
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    p = run_train([*TINY, "--steps", "4", "--run-dir", full])
    assert p.wait(timeout=300) == 0, p.stdout.read()
    p = run_train([*TINY, "--steps", "4", "--run-dir", cut])
    marker = os.path.join(cut, "checkpoints", "step_000002", "state.json")
    deadline = time.time() + 300
    while not os.path.exists(marker) and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)  # mid step 3: step 2's checkpoint is complete, step 3's is not
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(cut, "checkpoints", "step_000004"))
    p = run_train(["--resume", cut])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    assert "resumed" in out and ("from step 2" in out or "from step 3" in out)
    assert metrics(cut) == metrics(full)
    assert [m["step"] for m in metrics(cut)] == [1, 2, 3, 4]
    a, b = adapter_tensors(full, 4), adapter_tensors(cut, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # it did train


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    train.main([*TINY, "--steps", "2", "--run-dir", run_dir])
    newest = os.path.join(run_dir, "checkpoints", "step_000002", "adapters", "shared", "adapter_model.safetensors")
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    os.makedirs(os.path.join(run_dir, "checkpoints", "step_000003.tmp"))  # a save cut short by a crash
    capsys.readouterr()
    train.main(["--resume", run_dir, "--steps", "3"])
    out = capsys.readouterr().out
    assert "warning: ignoring partial checkpoint" in out and "step_000003.tmp" in out
    assert "warning: checkpoint" in out and "step_000002 is unreadable" in out
    assert "resumed" in out and "from step 1" in out
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]  # step 2 was redone from step 1's state


def test_keep_last_prunes_old_checkpoints(tmp_path):
    run_dir = str(tmp_path / "run")
    train.main([*TINY, "--steps", "3", "--keep-last", "2", "--run-dir", run_dir])
    assert checkpoints.checkpoint_steps(run_dir) == [2, 3]


def test_nan_loss_skips_the_step_and_repeated_nans_stop_the_run(tmp_path, monkeypatch, capsys):
    real = grpo.clipped_token_loss
    calls = {"n": 0}

    def nan_first_step(*a, **k):  # the first micro-batches of step 1 produce a NaN loss
        calls["n"] += 1
        loss, clipped = real(*a, **k)
        return (loss * float("nan"), clipped) if calls["n"] <= 1 else (loss, clipped)

    monkeypatch.setattr(grpo, "clipped_token_loss", nan_first_step)
    run_dir = str(tmp_path / "one")
    train.main([*TINY, "--steps", "2", "--micro-batch-size", "64", "--run-dir", run_dir])
    m = metrics(run_dir)
    assert m[0]["nonfinite_steps"] == 1 and m[0]["generator/opt_steps"] == 0  # skipped and counted
    assert m[1]["nonfinite_steps"] == 0 and m[1]["generator/opt_steps"] == 1
    monkeypatch.setattr(grpo, "clipped_token_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    with pytest.raises(SystemExit) as e:
        train.main([*TINY, "--steps", "5", "--run-dir", str(tmp_path / "many")])
    assert "3 training steps in a row had a non-finite loss or gradient" in str(e.value)
    assert "stopping at step 3" in str(e.value)


def test_resume_of_a_run_saved_before_a_flag_existed_takes_its_default(tmp_path):
    """args.json of an older run lacks later flags (here --no-share-prompts): they take their defaults."""
    saved = vars(train_flags([*TINY, "--no-share-prompts", "--lr", "0.123"]))
    del saved["share_prompts"]
    (tmp_path / "args.json").write_text(json.dumps(saved))
    args = train_flags(["--resume", str(tmp_path)])
    assert args.share_prompts is True and args.lr == 0.123 and args.run_dir == str(tmp_path)


def test_a_prompt_over_the_limit_ends_its_episode_and_is_counted(tmp_path):
    """Every single-agent prompt is longer than 40 tokens: every episode ends before its first call (the reference
    never truncates a prompt), the step has nothing to train on and still completes, counted in prompt_overflow."""
    run_dir = str(tmp_path / "run")
    train.main([*TINY, "--steps", "1", "--max-prompt-tokens", "40", "--run-dir", run_dir])
    m = metrics(run_dir)[0]
    assert m["prompt_overflow"] == 1.0 and m["success"] == 0.0 and m["reward"] == 0.0
    assert "generator/opt_steps" not in m and m["nonfinite_steps"] == 0


def test_skip_zero_advantage_flag_counts_skipped_calls(tmp_path):
    """The random tiny model never earns a reward, so every group is all-zero: with the flag every call of the
    step is skipped (and counted), and the optimizer still steps once, as it does without the flag."""
    run_dir = str(tmp_path / "run")
    train.main([*TINY, "--steps", "1", "--skip-zero-advantage", "--run-dir", run_dir])
    m = metrics(run_dir)[0]
    assert m["reward"] == 0.0 and m["generator/opt_steps"] == 1
    assert m["skipped_rows"] == 3 * 2  # --tasks-per-step 3 x --n 2 single-agent calls


def signal_after_first_step(p, run_dir, signum):
    """Send `signum` to the run `p` once its first metrics line is written: during step 2 or later."""
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 300
    while (not os.path.exists(metrics_path) or not open(metrics_path).read().strip()) and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signum)


def test_ctrl_c_finishes_the_step_saves_and_resumes(tmp_path):
    run_dir = str(tmp_path / "run")
    p = run_train([*TINY, "--steps", "50", "--save-every", "0", "--run-dir", run_dir])
    signal_after_first_step(p, run_dir, signal.SIGINT)  # that step is finished, saved, then the run stops
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    done = [m["step"] for m in metrics(run_dir)]
    assert "stopped after step" in out and done[-1] < 50
    assert checkpoints.checkpoint_steps(run_dir) == [done[-1]]  # --save-every 0 saves only on the way out
    p = run_train(["--resume", run_dir, "--steps", str(done[-1] + 1)])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and f"from step {done[-1]}" in out, out
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, done[-1] + 2))


def test_second_ctrl_c_stops_at_once_with_one_line(tmp_path):
    """The first Ctrl-C asks for a clean stop after the step; a second one stops now: one line, exit 130, no
    traceback, and the checkpoints on disk stay complete. Long steps (200 tokens x 16 rows) leave time to send it."""
    run_dir = str(tmp_path / "run")
    p = run_train([*TINY, "--steps", "50", "--save-every", "1", "--tasks-per-step", "8", "--max-new-tokens", "200",
                   "--run-dir", run_dir])
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("step 1 |"):
            break
    saved = os.path.join(run_dir, "checkpoints", "step_000001", "state.json")
    deadline = time.time() + 60
    while not os.path.exists(saved) and time.time() < deadline:  # step 1 saved (atomically): now inside step 2
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    for line in p.stdout:
        lines.append(line)
        if line.startswith("interrupt: finishing this step"):
            break
    p.send_signal(signal.SIGINT)
    rest, _ = p.communicate(timeout=120)
    out = "".join(lines) + rest
    assert p.returncode == 130, out
    assert rest.strip().splitlines()[-1] == "interrupt: stopping now, without saving this step"
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    assert checkpoints.checkpoint_steps(run_dir) == [1]


def test_metrics_are_strict_json_with_undefined_rates_as_null(tmp_path):
    """Eval-Opt has rates that can be undefined (p_retry_first_right when no first attempt was right: always,
    for a random model). They are written as null; Python's parser set to refuse NaN/Infinity reads every line."""
    run_dir = tmp_path / "run"
    train.main(["--model", "tiny", "--workflow", "evalopt", "--tasks-per-step", "2", "--n", "2", "--max-new-tokens",
                "6", "--n-val", "2", "--val-every", "1", "--steps", "1", "--run-dir", str(run_dir)])

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    lines = [json.loads(x, parse_constant=refuse) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    assert lines[1]["p_retry_first_right"] is None and lines[1]["val/p_retry_first_right"] is None
    assert lines[1]["p_retry_first_wrong"] == 1.0  # defined rates stay numbers


# ---------------------------------------------------------------- stops that lose nothing

def test_sigterm_finishes_the_step_saves_and_exits_non_zero_for_a_requeue(tmp_path):
    """SIGTERM (a scheduler's stop) during step 2 or later: the step is finished and saved, the resume command is
    printed, and the exit status is 128 + 15, so that Slurm or Kubernetes sees a job to requeue; --resume then
    continues as after Ctrl-C."""
    run_dir = str(tmp_path / "run")
    p = run_train([*TINY, "--steps", "50", "--save-every", "0", "--run-dir", run_dir])
    signal_after_first_step(p, run_dir, signal.SIGTERM)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGTERM, out
    done = [m["step"] for m in metrics(run_dir)]
    assert "SIGTERM: finishing this step" in out and done[-1] < 50
    assert f"stopped after step {done[-1]}; continue with: python train.py --resume {run_dir}" in out
    assert checkpoints.checkpoint_steps(run_dir) == [done[-1]]
    p = run_train(["--resume", run_dir, "--steps", str(done[-1] + 1)])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and f"from step {done[-1]}" in out, out
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, done[-1] + 2))


@pytest.mark.parametrize("error,reason", [
    (OSError(errno.ENOSPC, "No space left on device"), "the disk is full"),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"), "the disk is full"),
    (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
])
def test_a_checkpoint_that_cannot_be_written_ends_in_one_line(tmp_path, monkeypatch, capsys, error, reason):
    """The step-2 checkpoint's write fails (patched): no traceback but one line that says what and why, names the
    last good checkpoint and the resume command; the partial folder is gone. torch's serializer reports a full
    disk as a RuntimeError, so that case is recognised by the disk's free space (patched to 0 here)."""
    run_dir = str(tmp_path / "run")
    save = checkpoints.torch.save

    def failing_save(obj, path, *a, **k):
        if "step_000002" in str(path):
            raise error
        return save(obj, path, *a, **k)
    monkeypatch.setattr(checkpoints.torch, "save", failing_save)
    monkeypatch.setattr(runfolder.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0))
    with pytest.raises(SystemExit) as stop:
        train.main([*TINY, "--steps", "3", "--run-dir", run_dir])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and err[-1] == (
        f"error: could not write the checkpoint of step 2 ({run_dir}/checkpoints/step_000002): {reason}; the last "
        f"good checkpoint is step 1; once it can be written, continue with: python train.py --resume {run_dir}")
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step_000001"]
    monkeypatch.setattr(checkpoints.torch, "save", save)
    train.main(["--resume", run_dir])  # the room is back: steps 2 and 3 again, the cut run's step-2 line dropped
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]
    assert checkpoints.checkpoint_steps(run_dir) == [1, 2, 3]


def test_the_run_seed_defaults_to_the_seed_and_alone_changes_sampling(tmp_path):
    """--run-seed seeds sampling, LoRA init and the data order; --seed stays the data's and the toy model's. Unset,
    it is --seed, so a run of old (args.json without it) resumes as it ran: the same run with --run-seed equal to
    --seed is the same run, number for number, and another run seed on the same --seed samples other outputs
    (the run-to-run noise of one model: docs/findings.md)."""
    runs = {name: str(tmp_path / name) for name in ("plain", "same", "other")}
    for name, extra in (("plain", []), ("same", ["--run-seed", "3"]), ("other", ["--run-seed", "4"])):
        p = run_train([*TINY, "--steps", "1", "--seed", "3", *extra, "--run-dir", runs[name]])
        assert p.wait(timeout=300) == 0, p.stdout.read()
    assert metrics(runs["plain"]) == metrics(runs["same"])
    assert metrics(runs["plain"]) != metrics(runs["other"])
    cfg = train.settings_from_flags(train_flags([*TINY, "--seed", "3"]))
    assert (cfg.seed, cfg.run_seed) == (3, 3)
    saved = vars(train_flags([*TINY, "--seed", "5"]))
    del saved["run_seed"]  # a run saved before the flag existed
    (tmp_path / "args.json").write_text(json.dumps(saved))
    assert train.settings_from_flags(train_flags(["--resume", str(tmp_path)])).run_seed == 5

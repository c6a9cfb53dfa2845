"""The paper's cells on one GPU, proved on CPU: cells by name, the schedule, the held-out split, and the memory plan
(activation checkpointing, token-budget micro-batches, chunked log-probs, bf16 weights with fp32 LoRA), then a dress
rehearsal of a math and a code cell with the real Qwen3 class at a tiny size."""
import importlib.util
import json
import os

import pytest
import torch
from test_flags import train_flags

import policies
import tasks
import train
from grpo import Row, UpdateSettings, lr_multiplier, make_optimizers, update_policy
from infra import cells
from policies import (
    adapter_parameters,
    add_adapters,
    completion_logprobs,
    enable_grad_checkpointing,
    load_model,
    micro_batches,
    use_adapter,
)

ON_CPU = ["--device", "cpu", "--engine", "hf"]  # a cell on this machine: asked for, so neither is refused

# ---------------------------------------------------------------- cells by name


def test_list_cells_prints_all_48_and_every_name_parses(capsys):
    with pytest.raises(SystemExit) as e:
        train_flags(["--list-cells"])
    assert e.value.code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [line.split()[0] for line in lines[1:]]
    assert len(names) == 48 == len(set(names))  # 4 workflows x 2 policies x 3 scales x 2 tasks
    for name in names + ["SA-IP-4B-Code", "voting-sp-0.6b-math"]:  # SA = Single; case does not matter
        c = cells.cell_defaults(name)
        assert c["model"].startswith("Qwen/Qwen3-") and c["task"] in ("dapo", "deepcoder")
    assert "Voting-IP-1.7B-Math        Qwen/Qwen3-1.7B  open-r1/DAPO-Math-17k-Processed en" in "\n".join(lines)


@pytest.mark.parametrize("cell,lengths,task,budget,iterations", [
    ("Single-SP-0.6B-Math", (15360, 5120), "dapo", 51200, 3),
    ("Voting-IP-1.7B-Math", (20480, 5120), "dapo", 51200, 3),
    ("OrchWorkers-SP-4B-Math", (20480, 5120), "dapo", 51200, 3),
    ("EvalOpt-IP-4B-Math", (30720, 5120), "dapo", 51200, 3),
    ("SA-SP-1.7B-Code", (4096, 2048), "deepcoder", 51200, 2),
    ("EvalOpt-SP-0.6B-Code", (10240, 2048), "deepcoder", 51200, 2),
    ("Voting-IP-4B-Code", (10240, 2048), "deepcoder", 40960, 2),  # the reference's 4B code script: 40,960
])
def test_cell_sets_the_papers_settings(cell, lengths, task, budget, iterations):
    a = train_flags(["--cell", cell, *ON_CPU])
    assert (a.max_prompt_tokens, a.max_new_tokens, a.task, a.max_tokens_per_micro_batch, a.max_iterations) == \
        (*lengths, task, budget, iterations)
    assert (a.tasks_per_step, a.group_size, a.mini_batch_size, a.lora_rank, a.lora_alpha, a.lr, a.weight_decay,
            a.max_grad_norm, a.warmup_steps, a.lr_schedule, a.steps, a.val_every, a.save_every, a.dtype,
            a.grad_checkpointing, a.prompts) == \
        (64, 8, 512, 64, 32, 2e-5, 0.01, 1.0, 15, "verl-constant", 500, 10, 5, "bfloat16", True, "paper")
    assert (a.chat_template, a.vllm_gpu_memory) == ("rllm", 0.4)
    assert a.val_data == ("MathArena/aime_2025" if task == "dapo" else None)  # code: DeepCoder's test split
    assert a.data == ("open-r1/DAPO-Math-17k-Processed" if task == "dapo" else "agentica-org/DeepCoder-Preview-Dataset")


def test_an_ip_cells_warm_up_counts_the_adapters_of_its_workflows_roles(capsys, monkeypatch):
    """verl-constant's 15 warm-up updates count adapter updates: under IP one a role type per training step, so
    Voting-IP's warm-up ends after ceil(15 / 2) = 8 steps, Orch-Workers-IP's after ceil(15 / 3) = 5, an SP cell's
    after 15. infra/cells.py cannot import workflows.py (layering): the roles come from train.py (workflows.ROLES),
    so a role type added there reaches --list-cells with no second list to edit."""
    steps = {name: cells.warmup_training_steps(cells.cell_defaults(name), train.ROLES)
             for name in ("Voting-IP-1.7B-Math", "OrchWorkers-IP-4B-Code", "Voting-SP-1.7B-Math")}
    assert steps == {"Voting-IP-1.7B-Math": 8, "OrchWorkers-IP-4B-Code": 5, "Voting-SP-1.7B-Math": 15}
    monkeypatch.setitem(train.ROLES, "voting", ["generator", "aggregator", "critic"])  # a fork's third role type
    with pytest.raises(SystemExit):
        train_flags(["--list-cells"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Voting-IP-1.7B-Math ")]
    assert "verl-constant from 0, 5 " in line  # ceil(15 / 3)


def test_a_cell_without_cuda_is_one_line_naming_the_cuda_build(capsys, monkeypatch):
    """A driver older than torch's CUDA build: torch sees no GPU, and `--device auto` would start a 500-step cell on
    the CPU. It is refused before anything loads, with torch's CUDA version and the remedy; --device cpu is the
    way to ask for it anyway."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(SystemExit) as e:
        train_flags(["--cell", "Voting-IP-0.6B-Math"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--cell Voting-IP-0.6B-Math needs a CUDA GPU" in err and "CUDA 12.8" in err and "--device cpu" in err
    assert len(err.strip().splitlines()) == 1


def test_a_cell_that_would_sample_with_hf_says_so_before_loading(capsys, monkeypatch):
    """CUDA but no vLLM: `--engine auto` would pick HF, hours per step at a cell's lengths. One line names the
    engine and why, and the two ways on; `--engine hf` given runs it, with a warning."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    with pytest.raises(SystemExit):
        train_flags(["--cell", "Voting-IP-0.6B-Math"])
    out, err = capsys.readouterr()
    assert "engine: hf (vLLM is not installed)" in out
    assert "would sample with the HF engine" in err and "20480-token prompts, 5120 new tokens" in err
    assert "--engine hf" in err and len(err.strip().splitlines()) == 1
    args = train_flags(["--cell", "Voting-IP-0.6B-Math", "--engine", "hf"])
    assert args.engine == "hf" and "warning: --cell Voting-IP-0.6B-Math on the HF engine" in capsys.readouterr().err


def test_explicit_flags_win_over_the_cell_and_the_effective_config_is_saved(tmp_path):
    data = tmp_path / "dapo.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "solution": str(i + 1)}) + "\n"
                            for i in range(10)))
    run_dir = tmp_path / "run"
    train.main(["--cell", "Voting-IP-0.6B-Math", *ON_CPU, "--val-data", str(data), "--model", "tiny-qwen3", "--data",
                str(data), "--steps", "0", "--lr", "1e-4", "--dtype", "float32", "--val-every", "0", "--run-dir",
                str(run_dir)])
    saved = json.loads((run_dir / "args.json").read_text())
    assert (saved["cell"], saved["model"], saved["lr"], saved["steps"], saved["dtype"]) == \
        ("Voting-IP-0.6B-Math", "tiny-qwen3", 1e-4, 0, "float32")               # given flags
    assert (saved["workflow"], saved["policy"], saved["lr_schedule"], saved["max_prompt_tokens"]) == \
        ("voting", "ip", "verl-constant", 20480)                                 # the cell's


def test_a_flag_given_at_its_default_value_still_wins_over_the_cell():
    """Which flags were given is read from the command line, not from values: `--lr 5e-4` (train.py's default) and
    `--prompts=small` (the `=` form) beat the cell's 2e-5 and `paper`; a flag not given takes the cell's value."""
    args = train_flags(["--cell", "Voting-IP-0.6B-Math", *ON_CPU, "--lr", "5e-4", "--prompts=small", "--seed",
                             "-1"])
    assert (args.lr, args.prompts, args.seed) == (5e-4, "small", -1)
    assert (args.lr_schedule, args.lora_rank, args.tasks_per_step) == ("verl-constant", 64, 64)


# ---------------------------------------------------------------- schedule and split

def test_cosine_schedule_hand_computed():
    """warm-up 2 of 6 steps: 1/2, 2/2, then 0.5 (1 + cos(pi (t - 2) / 4)) for t = 3..6: 0.8536, 0.5, 0.1464, 0."""
    expected = [0.5, 1.0, 0.8535534, 0.5, 0.1464466, 0.0]
    assert [lr_multiplier(s, 2, 6, "cosine") for s in range(6)] == pytest.approx(expected, abs=1e-7)
    assert [lr_multiplier(s, 2, 6, "constant") for s in range(6)] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    torch.manual_seed(0)
    model, _ = load_model("tiny")
    model = add_adapters(model, ["shared"], rank=2, alpha=32)
    opts = make_optimizers(model, ["shared"], UpdateSettings(lr=0.1, warmup_steps=2, lr_schedule="cosine"), 6)
    used = [update_policy(model, [], opts, UpdateSettings())["lr"] for _ in range(6)]  # no samples: schedule only
    assert used == pytest.approx([0.1 * x for x in expected], abs=1e-8)


def test_the_verl_constant_schedule_of_an_ip_cell_counts_adapter_updates_from_lr_0():
    """What the reference's runs executed: verl's constant schedule with warm-up, lr x min(k, W) / W at its k-th
    step (from 0: the first update changes no weight), one scheduler that every adapter's update steps. Three IP
    adapters, W = 4, lr 0.1: training step 1 updates a, b, c at 0, 0.025, 0.05, step 2 at 0.075, 0.1, 0.1, so the
    warm-up ends within ceil(4 / 3) = 2 training steps. An adapter without rows takes no update and does not step
    the schedule: with c idle in step 1, step 2 runs a, b, c at 0.05, 0.075, 0.1."""
    assert [lr_multiplier(s, 4, 100, "verl-constant") for s in range(6)] == [0, 0.25, 0.5, 0.75, 1, 1]
    names = ["a", "b", "c"]
    cfg = UpdateSettings(mini_batch_size=512, temperature=0.7, lr_schedule="verl-constant")

    def lrs(schedule_of_rows):
        torch.manual_seed(0)
        model = add_adapters(load_model("tiny")[0], names, rank=2, alpha=32)
        opts = make_optimizers(model, names, UpdateSettings(lr=0.1, warmup_steps=4, lr_schedule="verl-constant"),
                               100)
        metrics = [update_policy(model, [Row([1, 2, 3], [4, 5], 1.0, a, a) for a in rows], opts, cfg)
                   for rows in schedule_of_rows]
        return [m[f"{a}/lr"] for m in metrics for a in names]  # step 1's a, b, c, then step 2's
    assert lrs([names, names]) == pytest.approx([0, 0.025, 0.05, 0.075, 0.1, 0.1])
    assert lrs([["a", "b"], names]) == pytest.approx([0, 0.025, 0.05, 0.05, 0.075, 0.1])


def test_held_out_split_is_the_datasets_call_of_the_paper(tmp_path):
    """`tasks.paper_split` on row numbers holds out the same rows as train_test_split(test_size=0.1, seed=42) on
    the dataset itself (what the paper's data script runs)."""
    import datasets
    path = tmp_path / "dapo.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Problem {i}?", "solution": str(i)}) + "\n" for i in range(57)))
    split = datasets.load_dataset("json", data_files=str(path), split="train").train_test_split(test_size=0.1, seed=42)
    train_tasks, val_tasks = tasks.load_split("dapo", str(path), n_val=1000)
    assert [t.question for t in val_tasks] == list(split["test"]["prompt"])       # 6 rows, in the same order
    assert [t.question for t in train_tasks] == list(split["train"]["prompt"])
    assert len(val_tasks) == 6 and len(tasks.load_split("dapo", str(path), n_val=4)[1]) == 4


# ---------------------------------------------------------------- memory plan: each mechanism equals the plain one

def _rows(seed=0, n=6):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (int(torch.randint(5, 30, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n // 2)]
    return [Row(prompts[i // 2], torch.randint(0, 256, (int(torch.randint(2, 12, (1,), generator=g)),),
                                                  generator=g).tolist(), float(torch.randn(1, generator=g)),
                   "generator", "shared") for i in range(n)]


def _grads(model, samples, **cfg):
    """Gradient of one update's loss (plain SGD with lr 0 keeps the weights; clipping off)."""
    params = adapter_parameters(model, "shared")
    captured = []
    sgd = torch.optim.SGD(params, lr=0.0)
    sgd.register_step_pre_hook(lambda *_: captured.append([p.grad.detach().clone() for p in params]))
    opts = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
    update_policy(model, samples, opts, UpdateSettings(mini_batch_size=512, max_grad_norm=1e9, temperature=0.7, **cfg))
    return captured[0]


def test_grad_checkpointing_gives_the_same_gradients_and_recomputes(monkeypatch, make_lora_model):
    """Equal within 1e-6 (fp32: the recomputed forward runs the same kernels on the same inputs); each decoder
    layer's MLP runs twice as often with checkpointing (the recompute in backward), so the mechanism is really
    on. (Forward hooks do not fire in the recompute, so the MLP's forward itself is counted.)"""
    model = make_lora_model("tiny-qwen3")
    samples = _rows()
    calls = []
    for layer in model.get_base_model().model.layers:
        monkeypatch.setattr(layer.mlp, "forward", lambda *a, f=layer.mlp.forward, **k: calls.append(1) or f(*a, **k))
    plain = _grads(model, samples, share_prompts=False)
    n_plain = len(calls)
    enable_grad_checkpointing(model)
    calls.clear()
    ckpt = _grads(model, samples)  # sharing is asked for, and must turn itself off under checkpointing
    assert n_plain == 2 and len(calls) == 2 * n_plain  # 2 layers x one micro-batch, then x 2 for the recompute
    assert max(float((a - b).abs().max()) for a, b in zip(plain, ckpt)) < 1e-6
    assert max(float(a.abs().max()) for a in plain) > 1e-3


def test_token_budget_cuts_micro_batches_and_gradients_do_not_depend_on_it(make_lora_model):
    samples = _rows(seed=3, n=8)
    prompts, completions = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    widths = {i: len(prompts[i]) + len(completions[i]) for i in range(8)}
    for budget in (1, 60, 10 ** 9):
        cut = micro_batches(prompts, completions, max_rows=8, max_tokens=budget)
        assert sorted(i for part in cut for i in part) == list(range(8))
        assert all(len(part) * max(widths[i] for i in part) <= budget or len(part) == 1 for part in cut)
    assert len(micro_batches(prompts, completions, 8, 1)) == 8
    assert len(micro_batches(prompts, completions, 8, 10 ** 9)) == 1
    assert micro_batches(prompts, completions, 3, 0) == micro_batches(prompts, completions, 3, 10 ** 9)  # 0: rows
    assert [len(part) for part in micro_batches(prompts, completions, 3, 0)] == [3, 3, 2]
    model = make_lora_model("tiny-qwen3")
    ref = _grads(model, samples, micro_batch_size=8)
    for budget in (1, 60):
        got = _grads(model, samples, micro_batch_size=8, max_tokens_per_micro_batch=budget)
        assert max(float((a - b).abs().max()) for a, b in zip(ref, got)) < 1e-6  # fp32 sums in another order


def test_chunked_logprobs_equal_the_full_logits_computation(monkeypatch, make_lora_model):
    """Log-probs, entropies and gradients through the chunked LM head (chunks of 5 completion tokens here) equal
    log_softmax over full [B, T, V] logits, within fp32 rounding (1e-5)."""
    model = make_lora_model("tiny-qwen3")
    samples = _rows(seed=4)
    prompts, completions = [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
    params = adapter_parameters(model, "shared")
    monkeypatch.setattr(policies, "LOGPROB_CHUNK", 5)
    with use_adapter(model, "shared"):
        logp, mask, entropy = completion_logprobs(model, prompts, completions, 0.7, with_entropy=True,
                                                  share_prompts=False)
        (logp * mask).sum().backward()
        chunked = [p.grad.clone() for p in params]
        model.zero_grad()
        full = []
        for p, c in zip(prompts, completions):  # one row at a time, the whole vocabulary at once
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].float() / 0.7
            lp = torch.log_softmax(logits, -1)
            full.append((lp.gather(-1, torch.tensor(c)[:, None])[:, 0], -(lp.exp() * lp).sum(-1)))
        sum(f[0].sum() for f in full).backward()
    T = logp.shape[1]
    for i, (lp, ent) in enumerate(full):
        torch.testing.assert_close(logp[i, T - len(lp):], lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy[i, T - len(lp):], ent.detach(), atol=1e-5, rtol=0)
    assert max(float((p.grad - c).abs().max()) for p, c in zip(params, chunked)) < 1e-5
    assert int(mask.sum()) > 5 * 3  # several chunks really ran


def test_the_kl_reference_pass_of_a_checkpointed_model_keeps_its_shared_prompts():
    """--kl-coef's reference pass runs inside the update: no grad, the model in train mode, checkpointing on.
    Under transformers < 5.2x (the vLLM venv's 5.19, the lent GPU machine's 5.17) checkpointed layers in train
    mode drop a passed KV cache even without grad, and rows that share a prompt got log-probs 0.5 nats off. With
    LoRA B = 0 the adapter is the base, so the KL to the base is 0 up to fp32 rounding (< 1e-6), for three rows
    that share a prompt as for one that does not; the model is back in train mode; and a no-grad pass in train
    mode with prompts shared asked for equals the update's own log-probs (1e-5)."""
    import grpo
    torch.manual_seed(0)
    model, _ = load_model("tiny-qwen3")
    model = add_adapters(model, ["shared"], rank=4, alpha=32)  # B = 0: the base
    enable_grad_checkpointing(model)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 200, (40,), generator=g).tolist()] * 3 + \
        [torch.randint(0, 200, (30,), generator=g).tolist()]
    completions = [torch.randint(0, 200, (n,), generator=g).tolist() for n in (5, 9, 13, 7)]
    micro = [Row(p, c, 1.0, "generator", "shared") for p, c in zip(prompts, completions)]
    cfg = UpdateSettings(temperature=0.7, kl_coef={"generator": 0.1})
    with use_adapter(model, "shared"):
        model.train()
        logp, mask, _ = completion_logprobs(model, prompts, completions, 0.7)
        kl = grpo.kl_to_base(model, micro, logp, mask, cfg)
        assert model.training
        with torch.no_grad():
            again, _, _ = completion_logprobs(model, prompts, completions, 0.7, share_prompts=True)
    assert float(kl.abs().max()) < 1e-6
    torch.testing.assert_close(again, logp.detach(), atol=1e-5, rtol=0)


def test_the_transformers_here_takes_the_code_paths_its_version_has(make_lora_model):
    """.ci/run runs this file under three transformers: requirements.txt's (5.24: `activation_checkpointing_enable`,
    the `cache` argument), the vLLM venv's (< 5.20, as vLLM pins it on a GPU) and 5.17 (the lent GPU machine's):
    gradient_checkpointing_enable and `past_key_values`. Checkpointing is on either way. (Versions between 5.20
    and 5.24 are not pinned anywhere here; which names they have is not asserted.)"""
    import transformers
    from packaging.version import Version
    model = make_lora_model("tiny-qwen3")
    version = Version(transformers.__version__)
    if version < Version("5.20") or version >= Version("5.24"):
        new = version >= Version("5.24")
        assert hasattr(model.get_base_model(), "activation_checkpointing_enable") == new
        assert policies.cache_kwarg(model) == ("cache" if new else "past_key_values")
    enable_grad_checkpointing(model)
    assert policies.grad_checkpointing_on(model)


def test_bf16_weights_with_fp32_lora_and_optimizer_state(make_lora_model):
    model = make_lora_model("tiny-qwen3", torch.bfloat16)
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    lora = adapter_parameters(model, "shared")
    assert {p.dtype for p in base} == {torch.bfloat16} and {p.dtype for p in lora} == {torch.float32}
    opts = make_optimizers(model, ["shared"], UpdateSettings(lr=1e-3, warmup_steps=0), 500)
    update_policy(model, _rows(), opts, UpdateSettings(mini_batch_size=512, temperature=0.7))
    state = opts["shared"][0].state
    assert {v.dtype for p in lora for k, v in state[p].items() if k != "step"} == {torch.float32}


def test_engine_and_attention_choices_are_printed(capsys, monkeypatch, tmp_path):
    args = train_flags(["--model", "tiny"])
    assert args.engine == "hf" and "engine: hf (no CUDA device)" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # as if vllm were installed
    assert train_flags(["--model", "tiny"]).engine == "vllm"
    assert "engine: vllm (CUDA and vLLM found)" in capsys.readouterr().out
    monkeypatch.undo()
    cfg = train.settings_from_flags(train_flags(["--model", "tiny", "--engine", "hf"]))
    train.build_trainer(cfg)
    assert cfg.update.share_prompts and "attention: sdpa; shared prompt passes on" in capsys.readouterr().out
    real = train.policies.load_model

    def flash(*a, **k):  # a kernel not known to be exact with holes in the mask: sharing goes off
        model, tok = real(*a, **k)
        model.config._attn_implementation = "flash_attention_2"
        return model, tok
    monkeypatch.setattr(train.policies, "load_model", flash)
    cfg = train.settings_from_flags(train_flags(["--model", "tiny", "--engine", "hf"]))
    train.build_trainer(cfg)
    assert not cfg.update.share_prompts
    assert "attention: flash_attention_2; shared prompt passes off" in capsys.readouterr().out


# ---------------------------------------------------------------- dress rehearsals: a math and a code cell on CPU

def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("cell", ["Voting-IP-0.6B-Math", "EvalOpt-SP-0.6B-Code"])
def test_dress_rehearsal_of_a_cell_with_tiny_qwen3(tmp_path, cell):
    """The cell's every setting (bf16, verl's schedule, the rLLM chat rendering, activation checkpointing,
    token-budget micro-batches, LoRA 64/32, Eval-Opt budget, lengths, the validation set) with the real Qwen3 class
    at a tiny size and small local data files; only the batch, the response length and the number of steps are
    cut down to CPU size."""
    if cell.endswith("Math"):  # and an AIME-format file for the cell's validation set (AIME 2025 on the hub)
        data = _write(tmp_path / "dapo.jsonl", [{"prompt": f"What is {i} + {i}?", "solution": str(2 * i)}
                                                for i in range(20)])
        local_val = ["--val-data", _write(tmp_path / "aime.jsonl", [{"problem": f"What is {i} x 3?",
                                                                    "answer": str(3 * i)} for i in range(4)])]
    else:
        tests_json = json.dumps([{"input": "1\n", "output": "2\n", "testtype": "stdin_stdout"}])
        data = _write(tmp_path / "deepcoder.jsonl", [{"problem": f"Read n, print n + {i}.", "tests": tests_json}
                                                     for i in range(20)])
        local_val = []  # the held-out rows of DeepCoder's split
    run_dir = tmp_path / "run"
    train.main(["--cell", cell, *ON_CPU, *local_val, "--model", "tiny-qwen3", "--data", data, "--steps", "2",
                "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "8", "--max-tokens-per-micro-batch", "200",
                "--save-every", "2", "--run-dir", str(run_dir)])
    saved = json.loads((run_dir / "args.json").read_text())
    assert (saved["dtype"], saved["lr_schedule"], saved["grad_checkpointing"], saved["lora_rank"]) == \
        ("bfloat16", "verl-constant", True, 64)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2] and "val/success" in lines[0] and "val/success" in lines[2]
    assert lines[0]["val/success"] is not None and (cell.endswith("Code") or "val/generator/acc" in lines[0])
    lr = 2e-5 / 15  # the warm-up from 0, one schedule step per adapter update (IP: aggregator, then generator)
    if saved["policy"] == "ip":
        got = [m[f"{role}/lr"] for m in lines[1:] for role in ("aggregator", "generator")]
        assert got == pytest.approx([0, lr, 2 * lr, 3 * lr])
    else:
        assert [m["lr"] for m in lines[1:]] == pytest.approx([0, lr])
    roles = train.ROLES[saved["workflow"]]
    assert all(lines[2][f"{r}/opt_steps"] >= 1 for r in roles)
    assert os.path.isdir(run_dir / "checkpoints" / "step_000002" / "adapters")

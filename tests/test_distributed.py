"""Data-parallel training under torchrun (gloo on CPU): 2 ranks give the step one process gives, a killed 2-rank run
resumes exactly, a failing rank ends the run with its message, and docs/torchrun.md's commands run as written.

Each test launches `torchrun` (or `python`) on a small wrapper around train.py in a subprocess. To hold two launches
to the same samples, the wrapper can swap the sampler for a deterministic one (each completion a function of its
prompt, its adapter and which copy of the prompt it is within the batch) and the grader for a learnable stand-in
(an even-length output wins), so rewards, advantages and updates are real but no sampling noise enters.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from test_train import signal_after_first_step

from infra import runfolder, samples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
WRAPPER = f"""
import os, sys, zlib
sys.path.insert(0, {ROOT!r})
import torch
import tasks, train, workflows
from infra.memory import StepHooks
from policies import Generation
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs]
rank = int(os.environ.get("RANK", "0"))

class Deterministic(StepHooks):  # the HF engine's hooks around an update
    def __init__(self, model, tokenizer, *a, **k):
        self.model, self.tokenizer = model, tokenizer
    def generate(self, prompts, adapters, desc=""):
        seen, out = {{}}, []
        for p, a in zip(prompts, adapters):
            j = seen[tuple(p), a] = seen.get((tuple(p), a), -1) + 1  # which copy of this prompt
            h = zlib.crc32(bytes(str((p, a, j)), "utf8"))
            ids = [40 + (h >> k) % 60 for k in range(3 + h % 5)] + [self.tokenizer.eos_token_id]
            out.append(Generation(ids, self.tokenizer.decode(ids, skip_special_tokens=True), False))
        return out

if os.environ.get("DETERMINISTIC"):
    train.policies.HFEngine = Deterministic
save = train.checkpoints.save_checkpoint
def save_and_dump(run_dir, step, model, *a, **k):  # every rank's adapters, to compare ranks
    torch.save({{n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}},
               os.path.join(run_dir, f"rank{{rank}}_step{{step}}.pt"))
    return save(run_dir, step, model, *a, **k)
train.checkpoints.save_checkpoint = save_and_dump
fail_at = os.environ.get("FAIL_RANK1_AT_STEP")
if fail_at:
    step_fn = train.train_step
    calls = [0]
    def failing(*a, **k):
        calls[0] += 1
        if rank == 1 and calls[0] == int(fail_at):
            raise RuntimeError(f"rank 1 failed on purpose at step {{fail_at}}")
        return step_fn(*a, **k)
    train.train_step = failing
train.main(sys.argv[1:])
"""
TINY = ["--model", "tiny", "--group-size", "2", "--tasks-per-step", "4", "--max-new-tokens", "8", "--n-val", "4",
        "--lr", "1e-2", "--warmup-steps", "1", "--difficulty", "1", "--n-train", "40"]
TIMING = ("time_rollout", "time_update", "rollout_tok_s", "update_tok_s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(tmp_path, args, ranks=0, env=None, **kw):
    """`python wrapper args` (ranks=0) or `torchrun --standalone --nproc_per_node ranks wrapper args`."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    command = [sys.executable, str(wrapper)] if ranks == 0 else \
        [*TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), str(wrapper)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(command + args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)


def finish(p, timeout=300) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out
    return out


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


@pytest.mark.parametrize("workflow,policy", [("voting", "ip"), ("single", "sp")])
def test_two_ranks_give_the_step_one_process_gives(tmp_path, workflow, policy):
    """Same tasks, same samples: after two steps the adapters of both ranks are equal to each other and, within
    1e-6, to the single process's; the logged metrics (success, rewards, per-role losses, shares, grad norms,
    validation) are equal within 1e-6 relative. Tolerance: the ranks' gradients are summed in another order, so
    they differ from one process's by fp32 rounding (~1e-12 absolute here); Adam divides a gradient by its own
    size plus eps = 1e-8, which turns that into up to lr x 1e-12 / 1e-8 = 1e-8 in the weights at lr 1e-4 (at the
    suite's usual lr 1e-2, 1e-6 would be too tight: 3e-6 was measured)."""
    args = [*TINY, "--workflow", workflow, "--policy", policy, "--steps", "2", "--val-every", "2", "--save-every", "1",
            "--lr", "1e-4"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    finish(launch(tmp_path, [*args, "--run-dir", one], env={"DETERMINISTIC": "1"}))
    finish(launch(tmp_path, [*args, "--run-dir", two], ranks=2, env={"DETERMINISTIC": "1"}))
    single = torch.load(os.path.join(one, "rank0_step2.pt"))
    rank0, rank1 = (torch.load(os.path.join(two, f"rank{r}_step2.pt")) for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)  # the ranks hold the same adapters
    assert max(float((rank0[k] - single[k]).abs().max()) for k in single) < 1e-6
    assert max(float((single[k] - torch.load(os.path.join(one, "rank0_step1.pt"))[k]).abs().max())
               for k in single) > 5e-5  # it trained: Adam moves an entry by about lr a step
    m_one, m_two = metrics(one), metrics(two)
    assert [m["step"] for m in m_two] == [0, 1, 2] and m_one[1]["reward"] not in (0.0, 1.0)
    for a, b in zip(m_one, m_two):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), k
    kept = samples.read_samples(two)  # rank 0 wrote every rank's share of the sampled validation tasks
    assert sorted(kept) == [0, 2] and kept == samples.read_samples(one) and len({e["task"]["id"] for e in kept[2]}) == 4


def test_a_killed_two_rank_run_resumes_to_the_same_metrics(tmp_path):
    """Real sampling (each rank its own random stream): an uninterrupted 2-rank run of 3 steps, and one killed
    (SIGKILL to the whole torchrun group) after its step-2 checkpoint and resumed under torchrun with 2 ranks,
    each rank taking back its own random state, log the same metrics."""
    args = [*TINY, "--workflow", "voting", "--policy", "ip", "--steps", "3", "--val-every", "0", "--save-every", "1",
            "--max-new-tokens", "32"]
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    finish(launch(tmp_path, [*args, "--run-dir", full], ranks=2))
    p = launch(tmp_path, [*args, "--run-dir", cut], ranks=2)
    marker = os.path.join(cut, "checkpoints", "step_000002", "state.json")
    deadline = time.time() + 300
    while not os.path.exists(marker) and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    subprocess.run(["pkill", "-KILL", "-f", cut])  # torchrun and its workers (they run in sessions of their own)
    p.communicate(timeout=60)
    assert not os.path.exists(os.path.join(cut, "checkpoints", "step_000003"))
    out = finish(launch(tmp_path, ["--resume", cut], ranks=2))
    assert "resumed" in out and "sampling is seeded afresh" not in out
    assert metrics(cut) == metrics(full)


def test_a_failing_rank_ends_the_run_with_its_message(tmp_path):
    """Rank 1 raises in step 2 while rank 0 waits for it in a collective: the run ends (torchrun stops every rank)
    with a non-zero status and rank 1's error in its output, well before the process group's timeout."""
    start = time.time()
    p = launch(tmp_path, [*TINY, "--steps", "5", "--val-every", "0", "--run-dir", str(tmp_path / "run")], ranks=2,
               env={"FAIL_RANK1_AT_STEP": "2"})
    out, _ = p.communicate(timeout=300)
    assert p.returncode != 0
    assert "rank 1 failed on purpose at step 2" in out and "ChildFailedError" in out
    assert time.time() - start < 120


def test_the_readme_torchrun_commands_run_as_written(tmp_path):
    """One node (--standalone) and the multi-node form (c10d rendezvous, here with one node), with train.py and
    every flag after it, as docs/torchrun.md gives them; then a sharded evaluation of the run."""
    run_dir = str(tmp_path / "run")
    flags = ["--model", "tiny", "--group-size", "2", "--tasks-per-step", "4", "--max-new-tokens", "8", "--n-val", "4",
             "--steps", "1", "--val-every", "0", "--run-dir", run_dir]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one_node = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "train.py", *flags]
    out = subprocess.run(one_node, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [m["step"] for m in metrics(run_dir)] == [1]
    multi_node = [*TORCHRUN, "--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                  f"localhost:{free_port()}", "train.py", *flags[:-1], run_dir + "2"]
    out = subprocess.run(multi_node, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    evaluate = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "eval.py", "--run-dir", run_dir, "--samples", "2"]
    out = subprocess.run(evaluate, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(run_dir, "eval.jsonl")) as f:
        (record,) = [json.loads(line) for line in f]  # written once, by rank 0
    assert (record["n"], record["tasks"], record["step"]) == (2, 4, 1)


def test_a_signal_landing_during_the_ranks_gather_is_acted_on_at_the_next_step_by_every_rank():
    """The ranks meet once a step to agree on a stop. A SIGTERM that lands while they wait in that gather
    (torchrun signals every rank at once, so it often does) must not be lost: this step goes on everywhere
    (the gather carried no request), and the next gather carries it, so all ranks stop together."""
    stop = runfolder.GracefulStop()
    try:
        def gather_hit_by_signal(value):  # rank 0's view: both ranks had no request when they met
            stop._handle(signal.SIGTERM, None)  # the signal arrives before the gather returns
            return [value, None]

        assert stop.agreed(gather_hit_by_signal) is None  # nobody stops after this step ...
        assert stop.agreed(lambda value: [value, None]) == signal.SIGTERM  # ... and everyone after the next
        assert stop.agreed(lambda value: [value, signal.SIGUSR1]) == signal.SIGTERM  # rank 0 first
    finally:
        stop.restore()


def test_sigterm_to_torchrun_stops_every_rank_after_one_step_and_saves_once(tmp_path):
    """torchrun passes a SIGTERM on to its workers; the ranks agree on the step to stop after, rank 0 saves that
    step once, the run exits non-zero (a scheduler requeues it), and --resume under torchrun continues it."""
    run_dir = str(tmp_path / "run")
    p = launch(tmp_path, [*TINY, "--steps", "50", "--val-every", "0", "--save-every", "0", "--run-dir", run_dir],
               ranks=2)
    signal_after_first_step(p, run_dir, signal.SIGTERM)
    out, _ = p.communicate(timeout=300)
    assert p.returncode != 0
    done = [m["step"] for m in metrics(run_dir)]
    assert done == list(range(1, done[-1] + 1)) and done[-1] < 50, out
    assert f"stopped after step {done[-1]}; continue with: python train.py --resume {run_dir}" in out
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == [f"step_{done[-1]:06d}"]
    finish(launch(tmp_path, ["--resume", run_dir, "--steps", str(done[-1] + 1)], ranks=2))
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, done[-1] + 2))


# ---------------------------------------------------------------- the update's torchrun steps

HELPERS = f"""
import json, os, sys
sys.path.insert(0, {ROOT!r})
import torch
import grpo
from infra import distributed
distributed.init_distributed("cpu")
rank = distributed.world()[0]
roles = ["generator", "generator", "aggregator", "generator", "aggregator", "generator", "generator"]
rows = [grpo.Row([1, 2, k], [7] * (1 + k % 4), 1.0, role, "shared") for k, role in enumerate(roles)]
cfg = grpo.UpdateSettings(mini_batch_size=3, role_weights={{"generator": 1, "aggregator": 1}})
mine = distributed.share(rows)
steps = distributed.mark_mine(grpo.mini_batches(distributed.every_rank_rows(mine, grpo.without_tokens), cfg), mine)
param = torch.nn.Parameter(torch.zeros(3))
param.grad = torch.full((3,), rank + 1.0)
distributed.sum_gradients([param])
with open(os.path.join(sys.argv[1], f"rank{{rank}}.json"), "w") as f:
    json.dump({{"steps": [[[mb.rows[i].prompt_ids[2] for i in mb.mine],
                           [grpo.minibatch_weights(mb.rows, cfg, mb.size)[i] for i in mb.mine], mb.role_shares]
                          for mb in steps],
               "grad": param.grad.tolist()}}, f)
distributed.close_distributed()
"""


def test_each_rank_gets_its_rows_of_the_global_mini_batches_and_the_summed_gradient(tmp_path):
    """2 ranks hold rows 0-3 and 4-6 of 7 (SP, 5 generator and 2 aggregator rows, mini-batches of 3, equal role
    weights). Each rank's part of each mini-batch, in rank order, is the one-process mini-batch: the same rows,
    the same weights (normalised over the whole mini-batch, not the rank's part), the whole mini-batch's role
    shares on both ranks; and sum_gradients gives both ranks 1 + 2 = 3."""
    import grpo
    script = tmp_path / "helpers.py"
    script.write_text(HELPERS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    roles = ["generator", "generator", "aggregator", "generator", "aggregator", "generator", "generator"]
    rows = [grpo.Row([1, 2, k], [7] * (1 + k % 4), 1.0, role, "shared") for k, role in enumerate(roles)]
    cfg = grpo.UpdateSettings(mini_batch_size=3, role_weights={"generator": 1, "aggregator": 1})
    one = grpo.mini_batches(rows, cfg)
    weights = [grpo.minibatch_weights(mb.rows, cfg, mb.size) for mb in one]
    assert [[r.prompt_ids[2] for r in mb.rows] for mb in one] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [[rows for rows, _, _ in r["steps"]] for r in ranks] == [[[0, 1, 2], [3], []], [[], [4, 5], [6]]]
    for k, mb in enumerate(one):
        assert ranks[0]["steps"][k][1] + ranks[1]["steps"][k][1] == weights[k]  # exactly: the same arithmetic
        assert ranks[0]["steps"][k][2] == ranks[1]["steps"][k][2] == mb.role_shares
    # mini-batch 2, rows 3, 4, 5: a generator of 4 tokens, an aggregator of 1, a generator of 2. seq-mean-token-mean
    # gives 1/12, 1/3, 1/6, so shares 4/12 + 2/6 = 2/3 and 1/3; equal role weights scale the generators by
    # (1/2) / (2/3) = 3/4 and the aggregator by (1/2) / (1/3) = 3/2: 1/16, 1/2, 1/8. Mini-batch 3 is row 6 alone
    # (3 tokens): 1/3, counted as 1 row of 3 (a partial last mini-batch): 1/9
    assert weights[1] == pytest.approx([1 / 16, 1 / 2, 1 / 8], abs=1e-15)
    assert weights[2] == pytest.approx([1 / 9], abs=1e-15)
    assert ranks[0]["grad"] == ranks[1]["grad"] == [3.0, 3.0, 3.0]


# ---------------------------------------------------------------- which device a rank uses (no launch)

def test_init_distributed_honours_the_device_flag(monkeypatch):
    """--device cpu under torchrun on a GPU machine is gloo on the CPU, and no rank touches a GPU; auto is nccl with
    each rank on the GPU of its LOCAL_RANK. (torch.cuda and the process group are stand-ins: no launch needed.)"""
    from infra import distributed
    calls: dict = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "0")  # rank 0 keeps its stdout
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.setdefault("set_device", i))
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kw: calls.setdefault("backend",
                                                                                                        backend))
    monkeypatch.setattr(distributed, "_created_group", False)  # restored after: no group was really made here
    assert distributed.init_distributed("cpu") == "cpu" and calls == {"backend": "gloo"}
    calls.clear()
    assert distributed.init_distributed("auto") == "cuda:1" and calls == {"set_device": 1, "backend": "nccl"}


class _Built(Exception):
    """Raised by the stand-in engine: the run has built all it builds before its first step."""


@pytest.mark.parametrize("launch", ["one process, --device cuda:1", "torchrun, LOCAL_RANK 1"])
def test_the_device_is_claimed_before_any_model_or_engine_is_built(tmp_path, monkeypatch, launch):
    """One device per process: torch.cuda.set_device(1) runs before the model loads (onto cuda:1) and before the
    engine is built, in train.py and in eval.py, for --device cuda:1 in one process and for torchrun's LOCAL_RANK 1
    alike (there also before the process group starts). (torch.cuda, the process group, the model loader and the
    engine are stand-ins that log their calls; the model itself loads on the CPU: no GPU needed.)"""
    import eval as E
    import policies
    import train
    from infra import distributed
    run_dir = str(tmp_path / "run")
    train.main(["--model", "tiny", "--steps", "0", "--val-every", "0", "--run-dir", run_dir])  # for eval.py
    log, real_load = [], policies.load_model

    def load(name, dtype=torch.float32, device="cpu", seed=0):
        log.append(f"load_model {device}")
        return real_load(name, dtype, "cpu", seed)

    def engine(*args, **kwargs):
        log.append("engine")
        raise _Built
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: log.append(f"set_device {i}"))
    monkeypatch.setattr(policies, "load_model", load)
    monkeypatch.setattr(policies, "make_engine", engine)  # train.py's and eval.py's
    monkeypatch.setattr(distributed, "_created_group", False)  # restored after: no group is really made here
    device = "cuda:1"
    if launch.startswith("torchrun"):
        for key, value in (("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("RANK", "0")):
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **kw: log.append("process group"))
        device = "cuda"  # torchrun: the rank's GPU, whatever --device names
    with pytest.raises(_Built):
        train.main(["--model", "tiny", "--device", device, "--engine", "hf", "--steps", "1", "--run-dir",
                    str(tmp_path / "train")])
    with pytest.raises(_Built):
        E.main(["--run-dir", run_dir, "--mode", "base", "--device", device, "--engine", "hf"])
    group = ["set_device 1", "process group"] if launch.startswith("torchrun") else []  # NCCL binds to it
    assert log == [*group, "set_device 1", "load_model cuda:1", "engine"] * 2


def test_vllm_on_cuda_n_in_one_process_is_refused_with_the_way_that_works(monkeypatch):
    """vLLM's in-process worker takes cuda:{local rank}, cuda:0 without torchrun: with --device cuda:2 the
    trainer and vLLM would split over two GPUs, so it is one line naming CUDA_VISIBLE_DEVICES=2. cuda, cuda:0,
    the HF engine and torchrun (where vLLM takes LOCAL_RANK, the rank's own GPU) are fine; where vLLM does not
    import, that is the line."""
    import importlib.util

    from infra import vllm_engine
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None)
    problem = vllm_engine.engine_problem("vllm", "cuda:2")
    assert "takes cuda:0" in problem and "CUDA_VISIBLE_DEVICES=2" in problem
    assert [vllm_engine.engine_problem(e, d) for e, d in [("vllm", "cuda"), ("vllm", "cuda:0"), ("hf", "cuda:2"),
                                                         ("vllm", "auto")]] == [None] * 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert vllm_engine.engine_problem("vllm", "cuda:2") is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert vllm_engine.engine_problem("vllm", "cuda") == vllm_engine.VLLM_MISSING


def test_resume_reads_onto_the_cpu_and_moves_the_i6_state_to_the_ranks_device(tmp_path, monkeypatch,
                                                                               make_lora_model):
    """A checkpoint that rank 0 saved from its GPU would load back onto cuda:0 on every rank (torch.load's default),
    and I6 would then mix devices. It is read onto the CPU (where the random states must be); the optimizer state
    follows its parameters and the I6 averages are moved to the model's device."""
    from grpo import UpdateSettings, make_optimizers
    from infra import checkpoints
    model = make_lora_model()
    optimizers = make_optimizers(model, ["shared"], UpdateSettings(lr=1e-3, weight_decay=0.0, warmup_steps=0), 10)
    checkpoints.save_checkpoint(str(tmp_path), 1, model, optimizers, {"shared": torch.arange(4.0)})
    seen, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: seen.append(kw.get("map_location")) or load(*a, **kw))
    grad_ema: dict = {}
    assert checkpoints.resume_from_checkpoint(str(tmp_path), model, optimizers, grad_ema, seed=0) == 1
    assert seen == ["cpu"]
    assert grad_ema["shared"].device == next(model.parameters()).device
    assert torch.equal(grad_ema["shared"], torch.arange(4.0))


def test_a_single_process_run_neither_uses_nor_destroys_a_process_group_it_did_not_create(tmp_path, monkeypatch):
    """In-process vLLM on one GPU creates a world-size-1 process group before train.py's first gather. A plain
    `python train.py` (no torchrun: WORLD_SIZE unset) must call no collective through it and must leave it alive
    for vLLM to destroy: data parallel is torchrun's WORLD_SIZE > 1, not `dist.is_initialized()`. The group here
    is gloo, world size 1, made as vLLM makes it; every collective and destroy_process_group is spied on."""
    import torch.distributed as dist

    import train
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    calls = []
    for name in ("all_gather_object", "all_reduce", "barrier", "broadcast", "destroy_process_group"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        train.main([*TINY, "--steps", "1", "--val-every", "1", "--run-dir", str(tmp_path / "run")])
        assert calls == [] and dist.is_initialized()
        assert [m["step"] for m in metrics(str(tmp_path / "run"))] == [0, 1]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

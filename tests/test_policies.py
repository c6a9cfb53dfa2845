"""Tests for policies.py: adapter routing, mixed-adapter generation, log-probs, adapter files, chat ids, tokenizer.

Run from the repo root: python -m pytest tests/test_policies.py -q
Only the tiny random model (`load_model("tiny")`, built in code) is used: nothing is downloaded.
Adapter names avoid single letters such as "a": PEFT warns that a name contained in the prefix "lora_" may be
re-initialised on loading.
"""

import dataclasses
import json
import os
import sys
import types

import peft
import pytest
import torch
from torch._dynamo.utils import counters

from infra import decode_shapes, decoding
from infra.checkpoints import load_adapters, save_adapters
from infra.models import CHATML, tiny_tokenizer
from infra.vllm_engine import VLLMEngine
from policies import (
    BASE,
    HFEngine,
    adapter_parameters,
    add_adapters,
    chat_encoder,
    chat_prompt_ids,
    completion_logprobs,
    enable_grad_checkpointing,
    load_model,
    micro_batches,
    policy_logprobs,
    route_adapter,
    shared_prompt_cache,
    use_adapter,
)

EOS = 257  # tiny tokenizer: 256 byte tokens (0..255), <|im_start|> = 256, <|im_end|> = 257 (EOS and pad)


def _randomize_lora(model, seed, scale=0.3, names=("lora_A", "lora_B")):
    """Give every LoRA tensor random values (B is 0 after init, so an untouched adapter equals the base)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if any(k in n for k in names):
                p.copy_(scale * torch.randn(p.shape, generator=g))


def _prompt(tok, text):
    return chat_prompt_ids(tok, [{"role": "user", "content": text}])


# ---------------------------------------------------------------- routing

def test_route_adapter_sp_is_shared():
    for name in ("generator0", "generator", "aggregator", "worker", "evaluator3"):
        assert route_adapter(name, "sp") == "shared"


def test_route_adapter_ip_strips_instance_digits():
    assert route_adapter("generator0", "ip") == "generator"
    assert route_adapter("generator12", "ip") == "generator"
    assert route_adapter("worker", "ip") == "worker"
    assert route_adapter("aggregator", "ip") == "aggregator"
    assert route_adapter("gen2x", "ip") == "gen2x"  # only *trailing* digits are stripped


def test_route_adapter_bad_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        route_adapter("generator0", "mixed")
    with pytest.raises(ValueError):
        route_adapter("generator0", "SP")


# ---------------------------------------------------------------- tiny tokenizer / chat ids

@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("text", ["\\boxed{½}", "日本語 🙂 ñ é", "a . b , c 's n't", "  two leading, trailing  ",
                                  "tabs\tand\nnewlines\r\n", "x", "\\frac{1}{2} = 0.5 ≠ ∞"])
def test_tiny_tokenizer_round_trips_unicode(tok, text):
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text.encode("utf-8"))  # byte-level, no merges: one token per UTF-8 byte
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_tiny_tokenizer_boxed_half(tok):
    # "\boxed{½}": \ b o x e d { (7 bytes) + ½ (0xC2 0xBD, 2 bytes) + } = 10 tokens
    ids = tok("\\boxed{½}", add_special_tokens=False).input_ids
    assert len(ids) == 10
    assert tok.decode(ids[7:9]) == "½"


def test_tiny_tokenizer_specials(tok):
    assert len(tok) == 258
    # deliberate, like SmolLM2: pad IS eos, so loss masks must come from lengths, never from pad ids
    assert tok.pad_token_id == tok.eos_token_id == EOS
    assert tok("<|im_start|><|im_end|>", add_special_tokens=False).input_ids == [256, EOS]
    assert tok.decode([65, EOS], skip_special_tokens=True) == "b"  # byte chars '!'..'~' are ids 0..93: 'b' = 98-33


def test_chat_prompt_ids_tiny(tok):
    ids = chat_prompt_ids(tok, [{"role": "user", "content": "What is 2+2?"}])
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    # assistant header: <|im_start|>=256, a=97-33=64, s=82, s=82, i=72, s=82, t=83, a=64, n=77, t=83, '\n'=198
    header = [256, 64, 82, 82, 72, 82, 83, 64, 77, 83, 198]
    assert ids[-len(header):] == header
    assert tok("<|im_start|>assistant\n", add_special_tokens=False).input_ids == header
    assert ids[0] == 256 and ids.count(EOS) == 1  # one message: one <|im_end|>


class _FakeTokenizer:
    """Records the keyword arguments chat_prompt_ids passes to the template."""

    def __init__(self, template):
        self.chat_template = template
        self.kwargs = None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        assert tokenize is False and add_generation_prompt is True
        self.kwargs = kwargs
        return "text"

    def __call__(self, text, add_special_tokens):
        assert text == "text" and add_special_tokens is False

        class Out:
            input_ids = [1, 2, 3]
        return Out()


def test_chat_prompt_ids_enable_thinking_only_when_template_mentions_it():
    msgs = [{"role": "user", "content": "hi"}]
    for template in (CHATML, None):
        fake = _FakeTokenizer(template)
        assert chat_prompt_ids(fake, msgs, enable_thinking=True) == [1, 2, 3]
        assert fake.kwargs == {}
    fake = _FakeTokenizer(CHATML + "{% if enable_thinking %}x{% endif %}")
    chat_prompt_ids(fake, msgs)
    assert fake.kwargs == {"enable_thinking": False}  # non-thinking mode is the default
    chat_prompt_ids(fake, msgs, enable_thinking=True)
    assert fake.kwargs == {"enable_thinking": True}


def test_chat_prompt_ids_real_thinking_template():
    # a Qwen3-style template: non-thinking mode inserts an empty think block after the assistant header
    tok = tiny_tokenizer()
    tok.chat_template = CHATML + "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking " \
                                 "%}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.decode(chat_prompt_ids(tok, msgs)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(chat_prompt_ids(tok, msgs, enable_thinking=True)).endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------- generation

PROMPT_TEXTS = ["What is 2+2?", "hi", "Compute 17 * 23 and box it.", "½ + ½ = ?"]


@pytest.fixture
def two_adapter_model():
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    model = add_adapters(model, ["x", "y"], rank=4, alpha=32)
    _randomize_lora(model, seed=1, names=("lora_B",))  # B of x and y random, different from each other and from 0
    return model, tok


def test_mixed_adapter_generation_equals_per_adapter(two_adapter_model):
    model, tok = two_adapter_model
    engine = HFEngine(model, tok, max_new_tokens=12, temperature=0)
    prompts = [_prompt(tok, t) for t in PROMPT_TEXTS]
    assert len({len(p) for p in prompts}) == 4  # different lengths: left padding is exercised
    adapters = ["x", "y", BASE, "x"]
    batched = engine.generate(prompts, adapters)
    alone = [engine.generate([p], [a])[0] for p, a in zip(prompts, adapters)]
    for b, s in zip(batched, alone):
        assert b.completion_ids == s.completion_ids
        assert b.text == s.text and b.truncated == s.truncated
    # chunks of 2 (rows sorted by prompt length, then put back in the caller's order) give the same rows
    chunked = HFEngine(model, tok, max_new_tokens=12, temperature=0, batch_size=2).generate(prompts, adapters)
    assert [g.completion_ids for g in chunked] == [g.completion_ids for g in batched]
    # the adapters really differ, so a routing mix-up would show: same prompt under x, y, base
    same = engine.generate([prompts[0]] * 3, ["x", "y", BASE])
    outs = [tuple(g.completion_ids) for g in same]
    assert len(set(outs)) == 3, outs
    assert outs[0] == tuple(alone[0].completion_ids)  # x on prompt 0
    assert list(outs[2]) == engine.generate([prompts[0]], [None])[0].completion_ids  # None means base too


def test_generation_is_cut_by_tokens_as_well_as_rows(two_adapter_model, monkeypatch):
    """A cell's stage sends 64 rows of 12-30k-token prompts with 5,120 new tokens: cut only by rows, one generate()
    call would hold the KV cache of 64 x 35k tokens. `max_tokens` bounds each call's rows x (widest prompt + new
    tokens); the rows come back in the caller's order, the same as without the bound."""
    model, tok = two_adapter_model
    prompts, adapters = [_prompt(tok, t) for t in PROMPT_TEXTS], ["x", "y", BASE, "x"]
    widths = sorted(len(p) + 12 for p in prompts)  # 4 different lengths
    budget = 2 * widths[1]  # the two shortest rows fit in one call; any other two, or three, do not
    engine = HFEngine(model, tok, max_new_tokens=12, temperature=0, max_tokens=budget)
    chunks, real = [], engine._generate_chunk
    monkeypatch.setattr(engine, "_generate_chunk",
                        lambda p, a, n: chunks.append([len(x) for x in p]) or real(p, a, n))
    got = engine.generate(prompts, adapters)
    assert [len(c) for c in chunks] == [2, 1, 1]
    assert all(len(c) * (max(c) + 12) <= budget for c in chunks[:1])
    want = HFEngine(model, tok, max_new_tokens=12, temperature=0).generate(prompts, adapters)
    assert [g.completion_ids for g in got] == [g.completion_ids for g in want]


def test_generation_truncation(two_adapter_model):
    model, tok = two_adapter_model
    engine = HFEngine(model, tok, max_new_tokens=5, temperature=0)
    gens = engine.generate([_prompt(tok, t) for t in PROMPT_TEXTS], ["x", "y", BASE, "y"])
    # the random tiny model never emits <|im_end|> in 5 greedy steps on these prompts: all rows hit the limit
    assert [(len(g.completion_ids), g.truncated) for g in gens] == [(5, True)] * 4
    assert all(EOS not in g.completion_ids for g in gens)
    assert gens[2].completion_ids == [198] * 5 and gens[2].text == "\n" * 5  # the base model repeats '\n' (id 198)


def test_generation_stops_at_first_eos_and_keeps_it():
    """Every id of generation_config.eos_token_id stops a row; the stop token is kept, later tokens dropped."""
    torch.manual_seed(0)
    base, tok = load_model("tiny")
    base.generation_config.eos_token_id = [198, EOS]  # '\n' counts as a stop token: the base model emits it first
    model = add_adapters(base, ["x"], rank=4, alpha=32)
    _randomize_lora(model, seed=1, names=("lora_B",))
    engine = HFEngine(model, tok, max_new_tokens=12, temperature=0)
    assert engine.eos_ids == {198, EOS}
    p = _prompt(tok, PROMPT_TEXTS[0])
    stopped, running = engine.generate([p, p], [BASE, "x"])
    assert stopped.completion_ids == [198] and stopped.truncated is False and stopped.text == "\n"
    # the x row does not stop with the base row (its rows are independent): 12 tokens, none a stop id
    assert running.truncated is True and len(running.completion_ids) == 12
    assert not {198, EOS} & set(running.completion_ids)


def test_greedy_tokens_are_argmax(two_adapter_model):
    """Greedy generation (batched, left-padded) picks the argmax of an unpadded forward at every step."""
    model, tok = two_adapter_model
    engine = HFEngine(model, tok, max_new_tokens=8, temperature=0)
    prompts = [_prompt(tok, PROMPT_TEXTS[1]), _prompt(tok, PROMPT_TEXTS[2])]
    gens = engine.generate(prompts, ["y", "y"])
    with torch.no_grad(), use_adapter(model, "y"):
        for p, g in zip(prompts, gens):
            c = g.completion_ids
            logits = model(input_ids=torch.tensor([p + c])).logits[0].float()
            logp_all = torch.log_softmax(logits[len(p) - 1:len(p) - 1 + len(c)], dim=-1)  # predicts c[0..]
            chosen = logp_all.gather(-1, torch.tensor(c)[:, None])[:, 0]
            assert (chosen >= logp_all.max(-1).values - 1e-5).all()  # no other token is more likely
            # completion_logprobs (temperature 1) returns exactly those chosen-token log-probs
            logp, mask, _ = completion_logprobs(model, [p], [c], temperature=1.0)
            torch.testing.assert_close(logp[0], chosen, atol=1e-5, rtol=0)
            assert (logp[0] < 0).all()


# ---------------------------------------------------------------- log-probs

@pytest.fixture
def lp_model():
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    model = add_adapters(model, ["shared"], rank=4, alpha=32)
    _randomize_lora(model, seed=2, scale=0.1, names=("lora_B",))
    return model, tok


def _manual_logp(model, prompt, completion, temperature):
    """Unpadded forward, no position tricks: log p(c_j | prompt, c_<j) at temperature, and the entropies."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / temperature
    lp = torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + len(completion)], dim=-1)
    chosen = lp.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return chosen, -(lp.exp() * lp).sum(-1)


def test_completion_logprobs_padding_invariance(lp_model):
    model, tok = lp_model
    prompts = [[5, 6, 7], [10, 11, 12, 13, 14, 15, 16, 17, 18], [20], [30, 31, 32, 33, 34]]
    # row 1 ends in EOS (== pad id): it must still be counted; row 3 has pad-id-like 0 tokens inside
    completions = [[40, 41, 42, 43, 44, 45], [50, 51, EOS], [60], [0, 0, 70, 71]]
    with use_adapter(model, "shared"):
        logp, mask, ent = completion_logprobs(model, prompts, completions, temperature=0.7, with_entropy=True)
        T = 6  # longest completion
        assert logp.shape == mask.shape == ent.shape == (4, T)
        assert mask.sum(-1).tolist() == [6.0, 3.0, 1.0, 4.0]  # = completion lengths, EOS included
        assert mask[1].tolist() == [0, 0, 0, 1, 1, 1]  # right-aligned; the final EOS column is counted
        for i, (p, c) in enumerate(zip(prompts, completions)):
            L = len(c)
            alone, _, ent_alone = completion_logprobs(model, [p], [c], temperature=0.7, with_entropy=True)
            torch.testing.assert_close(logp[i, T - L:], alone[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(ent[i, T - L:], ent_alone[0], atol=1e-5, rtol=0)
            ref, ref_ent = _manual_logp(model, p, c, 0.7)
            torch.testing.assert_close(alone[0], ref, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent_alone[0], ref_ent, atol=1e-5, rtol=0)
            assert (logp[i, :T - L] == 0).all() and (ent[i, :T - L] == 0).all()  # padding: exactly 0
            assert (logp[i, T - L:] < 0).all() and (ent[i, T - L:] > 0).all()
        eos = float(_manual_logp(model, prompts[1], completions[1], 0.7)[0][-1])
        assert float(logp[1, -1].detach()) == pytest.approx(eos, abs=1e-5)  # log p(EOS | ...) is a real term
    # policy_logprobs: per-row vectors of the completion lengths, identical to the batched values
    rows = policy_logprobs(model, "shared", prompts, completions, micro_batch=3, temperature=0.7)
    assert [len(r) for r in rows] == [6, 3, 1, 4]
    for i, r in enumerate(rows):
        torch.testing.assert_close(r, logp[i, T - len(r):].detach(), atol=1e-5, rtol=0)


def test_completion_logprobs_temperature_and_gradient(lp_model):
    model, _ = lp_model
    p, c = [3, 4, 5, 6], [7, 8, 9]
    with use_adapter(model, "shared"):
        for temp in (1.0, 0.5):
            logp, _, _ = completion_logprobs(model, [p], [c], temperature=temp)
            torch.testing.assert_close(logp[0].detach(), _manual_logp(model, p, c, temp)[0], atol=1e-5, rtol=0)
        # gradients flow to the active adapter only
        logp, _, _ = completion_logprobs(model, [p], [c])
        logp.sum().backward()
    grads = [q.grad for q in adapter_parameters(model, "shared")]
    assert all(g is not None for g in grads) and any(float(g.abs().max()) > 0 for g in grads)
    for q in model.parameters():
        q.grad = None


# ---------------------------------------------------------------- shared prompts

def _count_embedded_tokens(model):
    """A forward hook on the token embedding: a list whose sum is the number of token positions run so far."""
    seen = []
    handle = model.get_input_embeddings().register_forward_hook(lambda _m, inp, _o: seen.append(inp[0].numel()))
    return seen, handle


def test_shared_prompt_logprobs_and_gradients_equal_full_passes(lp_model):
    """Three prompts of different lengths, each continued by 2-3 rows: one pass per distinct prompt plus
    [last prompt token + completion] per row gives the log-probs, entropies and LoRA gradients of a full
    pass per row, and runs exactly the hand-counted number of token positions."""
    model, _ = lp_model
    P = {"a": [5, 6, 7, 8, 9, 10, 11], "b": [20, 21, 22, 23], "c": [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]}
    rows = [("a", [40, 41, 42]), ("b", [50]), ("a", [43, EOS]), ("c", [60, 61, 62, 63, 64]), ("b", [51, 52, 0, 53]),
            ("c", [65, 66]), ("a", [44, 45, 46, 47]), ("c", [67])]
    prompts, completions = [P[k] for k, _ in rows], [c for _, c in rows]
    params = adapter_parameters(model, "shared")
    results = {}
    with use_adapter(model, "shared"):
        for share in (False, True):
            seen, handle = _count_embedded_tokens(model)
            logp, mask, ent = completion_logprobs(model, prompts, completions, 0.7, with_entropy=True,
                                                  share_prompts=share)
            handle.remove()
            (logp * torch.arange(1.0, 1 + logp.shape[0])[:, None]).sum().backward()  # rows weighted differently
            results[share] = (logp.detach(), mask, ent, [q.grad.clone() for q in params], sum(seen))
            for q in params:
                q.grad = None
    (lp0, m0, e0, g0, n0), (lp1, m1, e1, g1, n1) = results[False], results[True]
    assert torch.equal(m0, m1)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=0)
    for a, b in zip(g1, g0):  # float rounding only: within 1e-5 of each tensor's largest entry (up to ~30)
        diff, largest = float((a - b).abs().max()), float(b.abs().max())
        assert diff <= 1e-5 * largest, (diff, largest)
    assert any(float(g.abs().max()) > 1e-3 for g in g0)  # the gradients compared are not all zero
    # full: 8 rows x (longest prompt 10 + longest completion 5); shared: 3 prefixes x 9 + 8 rows x (1 + 5)
    assert (n0, n1) == (8 * 15, 3 * 9 + 8 * 6)


def test_shared_prompt_cache_needs_a_repeat(lp_model):
    model, _ = lp_model
    with torch.no_grad():
        assert shared_prompt_cache(model, [[1, 2, 3], [4, 5, 6]], pad_id=0) is None  # all distinct: nothing to share
        assert shared_prompt_cache(model, [[1], [1]], pad_id=0) is None              # no prefix before the last token
        # the same prompt under two adapters is two distinct prefixes
        assert shared_prompt_cache(model, [[1, 2], [1, 2]], 0, adapter_names=["x", "y"]) is None
        cache, prefix_mask = shared_prompt_cache(model, [[1, 2, 3], [7, 8], [1, 2, 3]], pad_id=0)
    assert prefix_mask.tolist() == [[1, 1], [0, 1], [1, 1]]  # gathered back to the rows, left-padded
    assert cache.get_seq_length() == 2 and cache.layers[0].keys.shape[0] == 3
    torch.testing.assert_close(cache.layers[0].keys[0], cache.layers[0].keys[2], atol=0, rtol=0)


def test_shared_prompt_generation_equals_full_prefill(two_adapter_model):
    """Greedy generation with each repeated (prompt, adapter) prefilled once equals a full prefill per row, in a
    mixed-adapter batch (x, y, base) and in a single-adapter chunk; the prompts run once each."""
    model, tok = two_adapter_model
    prompts = [_prompt(tok, t) for t in PROMPT_TEXTS[:3]]
    rows = [prompts[0], prompts[1], prompts[0], prompts[2], prompts[1], prompts[0]]
    for adapters in (["x", "y", "x", BASE, "y", "y"], ["x"] * 6):
        outs = {}
        for share in (False, True):
            engine = HFEngine(model, tok, max_new_tokens=10, temperature=0, share_prompts=share)
            seen, handle = _count_embedded_tokens(model)
            outs[share] = [g.completion_ids for g in engine.generate(rows, adapters)]
            handle.remove()
            outs[share, "first pass"] = seen[0]
        assert outs[True] == outs[False]
        distinct = {(tuple(p), a) for p, a in zip(rows, adapters)}
        width = max(len(p) for p in rows)
        assert outs[False, "first pass"] == 6 * width                  # prefill: every row's whole prompt
        assert outs[True, "first pass"] == len(distinct) * (width - 1)  # once per distinct (prompt, adapter)
    assert len({tuple(c) for c in outs[True]}) > 1  # the rows do differ (a mix-up between them would show)


def test_a_prefill_in_pieces_generates_what_one_pass_does(two_adapter_model):
    """On CUDA the HF engine prefills in pieces of a few columns (infra/memory.prefill_columns), so that a call's
    mask and activations stay bounded at 25k-token prompts, whether or not prompts repeat. Greedy completions
    equal one full prefill's for distinct prompts under mixed adapters and for a repeated prompt, at pieces of 1,
    3 and 64 columns, and each piece is one forward over every distinct prompt: ceil((P - 1) / columns) of them,
    P the widest prompt."""
    model, tok = two_adapter_model
    prompts = [_prompt(tok, t) for t in PROMPT_TEXTS]
    for rows, adapters in ((prompts, ["x", "y", BASE, "x"]), ([prompts[0], prompts[2], prompts[0]], ["y"] * 3)):
        want = [g.completion_ids for g in HFEngine(model, tok, 10, temperature=0).generate(rows, adapters)]
        width, distinct = max(len(p) for p in rows), len({tuple(p) for p in rows})
        for columns in (1, 3, 64):
            engine = HFEngine(model, tok, 10, temperature=0, prefill_columns=lambda u, w, c=columns: c)
            seen, handle = _count_embedded_tokens(model)
            got = [g.completion_ids for g in engine.generate(rows, adapters)]
            handle.remove()
            assert got == want, columns
            pieces = -(-(width - 1) // columns)
            assert seen[:pieces] == [distinct * min(columns, width - 1 - k * columns) for k in range(pieces)]
            assert seen[pieces] == len(rows)  # then generate() runs each row's last prompt token


def test_use_adapter_base_disables_lora(lp_model):
    model, _ = lp_model
    p, c = [3, 4, 5, 6], [7, 8, 9]
    with use_adapter(model, BASE):
        base = completion_logprobs(model, [p], [c])[0][0].detach()
    with use_adapter(model, None):
        none = completion_logprobs(model, [p], [c])[0][0].detach()
    with use_adapter(model, "shared"):
        shared = completion_logprobs(model, [p], [c])[0][0].detach()
    with model.disable_adapter():
        ref = _manual_logp(model, p, c, 1.0)[0]
    torch.testing.assert_close(base, ref, atol=1e-5, rtol=0)
    assert torch.equal(base, none)
    assert float((base - shared).abs().max()) > 1e-3  # the adapter changes the model


# ---------------------------------------------------------------- save / load

def _lora_state(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # PEFT 0.21
def test_adapter_save_load_is_exact(tmp_path):
    torch.manual_seed(0)
    base, _ = load_model("tiny")
    model = add_adapters(base, ["generator", "aggregator"], rank=4, alpha=32)
    _randomize_lora(model, seed=3)
    save_adapters(model, str(tmp_path))
    for name in ("generator", "aggregator"):
        assert (tmp_path / name / "adapter_model.safetensors").is_file()
        assert (tmp_path / name / "adapter_config.json").is_file()
    saved = _lora_state(model)

    torch.manual_seed(123)  # different LoRA init
    fresh, _ = load_model("tiny")
    fresh = add_adapters(fresh, ["generator", "aggregator"], rank=4, alpha=32)
    before = _lora_state(fresh)
    assert before.keys() == saved.keys() and len(saved) == 2 * 2 * 14  # 2 adapters x (A, B) x 14 linear layers
    assert not any(torch.equal(before[n], saved[n]) for n in saved)  # nothing matches before loading
    load_adapters(fresh, str(tmp_path))
    after = _lora_state(fresh)
    for n in saved:
        assert torch.equal(after[n], saved[n]), n

    # a standard PEFT folder: PeftModel.from_pretrained reads it into the same tensors and the same outputs
    plain, _ = load_model("tiny")
    loaded = peft.PeftModel.from_pretrained(plain, str(tmp_path / "generator"), adapter_name="generator")
    ref = {n: p for n, p in _lora_state(loaded).items()}
    gen = {n: p for n, p in saved.items() if ".generator." in n}
    assert ref.keys() == gen.keys()
    for n in gen:
        assert torch.equal(ref[n], gen[n]), n
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad(), use_adapter(model, "generator"):
        want = model(input_ids=ids).logits
    with torch.no_grad():
        got = loaded(input_ids=ids).logits
    assert torch.equal(want, got)


def test_load_adapters_missing_adapter_raises(tmp_path):
    model, _ = load_model("tiny")
    model = add_adapters(model, ["generator"], rank=4, alpha=32)
    save_adapters(model, str(tmp_path))
    other, _ = load_model("tiny")
    other = add_adapters(other, ["generator", "evaluator"], rank=4, alpha=32)
    with pytest.raises(FileNotFoundError, match="evaluator"):
        load_adapters(other, str(tmp_path))


# ---------------------------------------------------------------- vLLM engine without vLLM

def test_vllm_engine_without_vllm_is_a_one_line_install_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed: `import vllm` fails
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine sets it; keep the test's env unchanged
    with pytest.raises(SystemExit) as e:
        VLLMEngine("unused-folder", None, None, set(), None, 16, 0.7)  # the import is checked before anything else
    assert str(e.value).startswith("error: --engine vllm needs vLLM") and "pip install vllm" in str(e.value)
    assert "docs/vllm.md" in str(e.value) and "\n" not in str(e.value)



# ---------------------------------------------------------------- the toy model (toyworld/toy_model.py)

def test_two_toy_builds_with_one_seed_are_identical_on_one_thread_or_two(tmp_path, monkeypatch, capsys):
    """Transcripts, tokenizer, initial weights and the warm-up's batches all follow the seed, and the thread count
    changes no bit (8 steps and one oracle episode a problem suffice to show it: every step depends on all the
    ones before, fact batches and habit batches both); another seed gives another model. The build says what it
    does, stage by stage."""
    from safetensors.torch import load_file

    import eval
    from toyworld import toy_model
    monkeypatch.setattr(toy_model, "EPISODES", {w: 1 for w in toy_model.EPISODES})
    threads, folders = torch.get_num_threads(), []
    try:
        for i in (1, 2):
            torch.set_num_threads(i)
            folders.append(toy_model.build(3, eval.play_every_problem, steps=8, out=str(tmp_path / f"build{i}")))
    finally:
        torch.set_num_threads(threads)
    a, b = (load_file(os.path.join(f, "model.safetensors")) for f in folders)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with open(os.path.join(folders[0], "tokenizer.json")) as f, open(os.path.join(folders[1], "tokenizer.json")) as g:
        assert f.read() == g.read()
    (one, two) = (json.load(open(os.path.join(f, "toy.json"))) for f in folders)
    assert (one.pop("threads"), two.pop("threads")) == (1, 2) and one.pop("minutes") >= 0 and two.pop("minutes") >= 0
    assert one == two and one["versions"]["torch"] == torch.__version__
    assert one["versions"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # e.g. AVX2, AVX512
    said = [line.split(": ", 1)[1].split(" ")[0] for line in capsys.readouterr().out.splitlines()
            if line.startswith("[toy] seed 3: ")]
    assert said == ["building", "playing", "training", "warming", "built"] * 2
    other = toy_model.build(4, eval.play_every_problem, steps=8, out=str(tmp_path / "seed4"))
    c = load_file(os.path.join(other, "model.safetensors"))
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_the_rllm_template_renders_a_two_turn_conversation_as_the_references_parser():
    """What rLLM's QwenChatTemplateParser.parse(messages, add_generation_prompt=True, is_first_msg=True) returns
    with disable_thinking=True, derived by reading rllm/parser/chat_template_parser.py (its engine passes
    is_first_msg=True on every call): the default Qwen system message before a first message that is not a system
    one; `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n` as the header of every assistant turn and of the
    generation prompt; an assistant turn's text stripped. Qwen3's own template has neither the system message nor
    the earlier turn's think block."""
    from infra.models import rllm_qwen_text
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": " \\boxed{4}\n"},
                {"role": "user", "content": "Check again."}]
    want = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\\boxed{4}"
            "<|im_end|>\n<|im_start|>user\nCheck again.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert rllm_qwen_text(messages) == want
    tok = tiny_tokenizer()  # ChatML specials, bytes otherwise: the ids decode back to the string
    assert tok.decode(chat_encoder(tok, template="rllm")(messages)) == want
    system = [{"role": "system", "content": "Be brief."}, *messages[:1]]
    assert rllm_qwen_text(system).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_the_drift_check_takes_rows_of_every_adapter_that_sampled():
    """Voting's calls come as generator0, generator1, generator2, aggregator per episode: a stride of len // 32
    over 128 calls took every 4th, generator0's only, so the aggregator adapter's copy in vLLM was never checked.
    The rows are shared among the adapters that sampled and spread over the step, and the drift is logged per
    adapter as (sum of differences, tokens) tallies beside the overall one."""
    from types import SimpleNamespace

    from infra.vllm_engine import drift_rows, vllm_drift
    calls = [SimpleNamespace(adapter="generator" if j < 3 else "aggregator", prompt_ids=[episode, j],
                             completion_ids=[1, 2], sample_logprobs=[-1.0, -1.0])
             for episode in range(32) for j in range(4)]
    rows = drift_rows(calls)
    assert sorted(c.adapter for c in rows) == ["aggregator"] * 16 + ["generator"] * 16
    for adapter in ("aggregator", "generator"):  # spread over the step: 16 different episodes of 32
        assert len({c.prompt_ids[0] for c in rows if c.adapter == adapter}) == 16
    seen = []

    def measure(prompts, completions, adapters, engine_logprobs):  # stands in for policies.logprob_drift
        seen.extend(adapters)
        return {a: (0.5 * 2 * adapters.count(a), 2 * adapters.count(a)) for a in set(adapters)}
    out = vllm_drift(calls, measure)
    assert sorted(seen) == sorted(c.adapter for c in rows)
    assert out["vllm/logprob_drift/aggregator"] == [16.0, 32] and out["vllm/logprob_drift/generator"] == [16.0, 32]
    assert out["vllm/logprob_drift"] == [32.0, 64]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_computes_in_the_weights_dtype_on_fp32_master_weights(dtype):
    """Issue 57: PEFT keeps a bf16 model's LoRA weights in fp32 and casts each LoRA input up to fp32, so its
    matmuls miss the GPU's tensor cores. A bf16 model's LoRA matmuls run in bf16 (input and output of lora_A and
    lora_B), while the parameters, their gradients and AdamW's step stay fp32: one AdamW step at lr 1e-6 moves
    every lora_A weight (|w| <= 0.125, kaiming's bound for 64 inputs) by 1e-6 (Adam's first step is lr x
    sign(grad)), which bf16 weights, whose spacing near 0.1 is 2^-11 ~ 5e-4, would round away. An fp32 model
    (the CPU's runs) is untouched: fp32 throughout, as PEFT does it."""
    torch.manual_seed(0)
    model, _ = load_model("tiny-qwen3", dtype)
    lm = add_adapters(model, ["gen", "agg"], rank=4, alpha=8)
    seen = set()
    for name, module in lm.named_modules():
        if name.endswith(("lora_A.gen", "lora_B.gen")):
            module.register_forward_hook(lambda m, i, o: seen.add((i[0].dtype, o.dtype)))
    params = adapter_parameters(lm, "gen")
    _randomize_lora(lm, seed=1, names=("lora_B",))
    opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    lora_a = [p for n, p in lm.named_parameters() if "lora_A.gen" in n]
    before = [p.detach().clone() for p in lora_a]
    with use_adapter(lm, "gen"):
        lm.train()
        logp, mask, _ = completion_logprobs(lm, [[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10]])
        (logp * mask).sum().backward()
        opt.step()
    assert seen == {(dtype, dtype)}  # fp32 model: fp32 as before; bf16 model: bf16 in and out
    assert {p.dtype for p in params} == {p.grad.dtype for p in params} == {torch.float32}
    moved = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(lora_a, before)])
    # every weight moved by lr, within fp32's rounding (spacing near 0.125: 7e-9, 0.7% of 1e-6; bound 3%)
    assert moved.min() > 0.97e-6 and moved.max() < 1.03e-6
    assert torch.get_float32_matmul_precision() == "highest"  # TF32 is for CUDA only


def test_old_logprobs_equal_the_updates_in_bf16_with_lora_active():
    """At identical weights, in bf16, with LoRA active (B random) and activation checkpointing (a GPU cell's
    update): the no-grad pass that gives the old log-probs (policy_logprobs, eval mode, its own micro-batches)
    computes what the update's pass computes (grad on, train mode), token for token, so a PPO ratio moves only
    when the weights do. Rows share prompts, as a GRPO group's do: a no-grad pass that ran each prompt once
    (shared_prompt_cache) would round differently in bf16 than the update's full rows (gpu_check's ratio check
    measured it); under checkpointing both run full rows. Exact: the same rows, the same kernels."""
    torch.manual_seed(0)
    model, _ = load_model("tiny-qwen3", torch.bfloat16)
    model = add_adapters(model, ["x"], rank=8, alpha=16)
    _randomize_lora(model, seed=2, scale=0.05, names=("lora_B",))
    enable_grad_checkpointing(model)
    g = torch.Generator().manual_seed(4)
    prompts = [p for p in [torch.randint(0, 200, (24,), generator=g).tolist() for _ in range(3)] for _ in range(4)]
    completions = [torch.randint(0, 200, (int(n),), generator=g).tolist()
                   for n in torch.randint(5, 20, (12,), generator=g)]
    model.eval()
    old = policy_logprobs(model, "x", prompts, completions, micro_batch=4, temperature=0.7)
    new = [None] * len(prompts)
    with use_adapter(model, "x"):
        model.train()
        for part in micro_batches(prompts, completions, 4, 0):  # the same rows a micro-batch (grpo.store_old_logprobs)
            logp, _, _ = completion_logprobs(model, [prompts[i] for i in part], [completions[i] for i in part],
                                             0.7, with_entropy=True)
            for i, row in zip(part, logp):
                new[i] = row[len(row) - len(completions[i]):].detach()
        model.eval()
    assert all(torch.equal(a, b) for a, b in zip(old, new))


def test_fp32_matmuls_run_as_tf32_on_cuda_only(monkeypatch):
    """fp32 matmuls (a --dtype float32 run's) use the tensor cores as TF32 on CUDA; the CPU's stay fp32, so its
    runs keep their numbers (the device claimed by train.py and eval.py: infra/distributed.claim_device)."""
    from infra import distributed, models
    asked = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", asked.append)
    models.use_tensor_cores("cpu")
    assert asked == []
    models.use_tensor_cores("cuda:1")
    assert asked == ["high"]
    assert distributed.claim_device("cpu") == "cpu" and asked == ["high"]


# ---------------------------------------------------------------- the static decode mode (infra/decoding.py)

def _completions(engine, rows, adapters):
    return [(g.completion_ids, g.text, g.truncated) for g in engine.generate(rows, adapters)]


def test_decode_mode_auto_is_dynamic_on_the_cpu_and_a_bad_mode_is_refused(two_adapter_model):
    """`--decode auto` keeps the CPU's runs on the dynamic path they always took (bench/same_numbers.py); the
    static mode is asked for by name there. The grouping of rows into calls, by hand: dynamic one group of all
    rows, static one group per adapter in order of first appearance."""
    model, tok = two_adapter_model
    assert decoding.decode_mode("auto", model) == "dynamic"
    assert HFEngine(model, tok, 4, 0).decode == "dynamic"
    assert HFEngine(model, tok, 4, 0, decode="static").decode == "static"
    with pytest.raises(ValueError, match="unknown decode mode 'fast'"):
        decoding.decode_mode("fast", model)
    assert decoding.call_groups(["x", "y", None, "x"], "dynamic") == [[0, 1, 2, 3]]
    assert decoding.call_groups(["x", "y", None, "x"], "static") == [[0, 3], [1], [2]]
    # a call's static cache: its columns rounded up to a mask width (CACHE_BLOCK, 128, x 1, 2, 3, 4, 6, ...), one
    # compiled shape for nearby widths, and a spare block (decoding.cache_columns)
    assert [decode_shapes.mask_width(n) for n in (1, 128, 129, 513)] == [128, 128, 256, 768]
    assert [decoding.CacheStore().cache(model, 2, n).layers[0].max_cache_len for n in (1, 129)] == [256, 384]


def test_on_cuda_auto_is_static_compiled_with_torch_limits_raised(two_adapter_model, monkeypatch):
    """What the static mode does on CUDA, read on the CPU through a model whose parameters say they are on CUDA:
    auto resolves to static, generate() is given decoding.COMPILE, and torch's limits are raised (each adapter is
    a recompile), from torch's defaults 8 and 128."""
    import torch._inductor.config as inductor
    model, _ = two_adapter_model

    class OnCuda:  # what the decoding functions read of a model: its parameters' device and its config
        config = model.config

        def parameters(self):
            # says CUDA; its cache buffers go to the CPU
            return iter([types.SimpleNamespace(is_cuda=True, dtype=torch.float32, device="cpu")])
    monkeypatch.setattr(decoding, "compiler_problem", lambda: None)  # a machine with gcc and Python.h
    assert decoding.decode_mode("auto", OnCuda()) == "static"
    # torch's own patch, restored on exit (pytest 9.2's monkeypatch deletes a torch config entry on undo, which
    # hides it from every later test in the process)
    with torch._dynamo.config.patch(recompile_limit=8), \
            inductor.patch({"triton.cudagraph_unexpected_rerecord_limit": 128}):
        kwargs = decoding.cache_kwargs("static", OnCuda(), 3, 200, "cache", decoding.CacheStore())
        assert torch._dynamo.config.recompile_limit == 64
        assert inductor.triton.cudagraph_unexpected_rerecord_limit == 1 << 30
    assert kwargs["compile_config"] is decoding.COMPILE and decoding.COMPILE.dynamic is True
    assert kwargs["cache"].layers[0].max_cache_len == 384 and kwargs["cache"].layers[0].keys.shape[0] == 3
    store = decoding.CacheStore()
    assert set(decoding.cache_kwargs("static", model, 3, 200, "cache", store)) == {"cache"}  # CPU: no compile


def test_static_decode_greedy_equals_dynamic(two_adapter_model):
    """Greedy rows of the static mode equal the dynamic mode's, token for token, under two LoRA adapters and the
    base: with repeated prompts (the shared prompt pass's DynamicCache copied into the static one), without
    sharing (generate() prefills the static cache itself), and with the prefill in pieces of 3 columns (as on
    CUDA). Both modes compute the same logits up to float rounding (the static cache attends over CACHE_BLOCK
    columns, the unused ones masked), and argmax on this random model has no near ties."""
    model, tok = two_adapter_model
    prompts = [_prompt(tok, t) for t in PROMPT_TEXTS]
    rows = prompts + [prompts[0], prompts[2], prompts[0]]
    adapters = ["x", "y", BASE, "x", "y", None, "x"]
    for kwargs in ({}, {"share_prompts": False}, {"prefill_columns": lambda u, w: 3}):
        want = _completions(HFEngine(model, tok, 12, 0, decode="dynamic", **kwargs), rows, adapters)
        got = _completions(HFEngine(model, tok, 12, 0, decode="static", **kwargs), rows, adapters)
        assert got == want, kwargs
    assert len({tuple(c) for c, _, _ in want}) > 2  # the adapters' rows differ: a routing mix-up would show


def test_static_decode_samples_equal_dynamic_call_by_call(two_adapter_model):
    """Under sampling (temperature 0.7, top-p 0.9) and one seed, the static mode samples what the dynamic mode
    samples when the dynamic mode is given the same calls: per adapter, in the same order. On one adapter's rows
    the calls are the same, so the rows are equal as they are. On mixed rows they are not equal row for row, and
    that is expected: the static mode splits the batch by adapter, so torch's random stream falls on other
    batches (the same distribution, other draws); what is asserted there is the call-by-call equality."""
    model, tok = two_adapter_model
    rows = [_prompt(tok, t) for t in PROMPT_TEXTS] * 2
    one, mixed = ["y"] * 8, ["x", "y", BASE, "x", "y", "x", BASE, "y"]

    def sample(decode, rows, adapters):
        torch.manual_seed(3)
        return _completions(HFEngine(model, tok, 12, 0.7, top_p=0.9, decode=decode), rows, adapters)
    assert sample("static", rows, one) == sample("dynamic", rows, one)
    got = sample("static", rows, mixed)
    torch.manual_seed(3)
    dynamic, want = HFEngine(model, tok, 12, 0.7, top_p=0.9, decode="dynamic"), [None] * 8
    for group in ([0, 3, 5], [1, 4, 7], [2, 6]):  # x, y, base: the order the adapters first appear in
        for i, g in zip(group, _completions(dynamic, [rows[i] for i in group], [mixed[i] for i in group])):
            want[i] = g
    assert got == want
    assert got != sample("dynamic", rows, mixed)  # one mixed call draws otherwise (what the docstring says)


def test_static_decode_splits_a_mixed_batch_into_one_adapter_calls(two_adapter_model, monkeypatch):
    """In the static mode no call mixes adapters (PEFT's mixed-adapter batch runs hooks the compiler breaks on):
    rows x, y, base, x, y in one generate() become calls of [x, x], [y, y], [base], each within the row budget
    (the lone base row padded with a copy of itself, never returned: the compiled step's shape for every row
    count but 1), and come back in the caller's order, equal to each row generated alone."""
    model, tok = two_adapter_model
    prompts = [_prompt(tok, t) for t in PROMPT_TEXTS]
    rows, adapters = prompts + prompts[:1], ["x", "y", BASE, "x", "y"]
    engine = HFEngine(model, tok, 8, 0, batch_size=2, decode="static")
    calls, real = [], engine._generate_chunk
    monkeypatch.setattr(engine, "_generate_chunk", lambda p, a, n: calls.append((list(a), n)) or real(p, a, n))
    got = [g.completion_ids for g in engine.generate(rows, adapters)]
    assert calls == [(["x", "x"], 2), (["y", "y"], 2), ([BASE, BASE], 1)]
    alone = [engine.generate([p], [a])[0].completion_ids for p, a in zip(rows, adapters)]
    assert got == alone


def test_static_decode_step_compiles_as_one_graph_with_lora(two_adapter_model, monkeypatch):
    """What runs on CUDA, traced on the CPU: generate() compiles the decode step when its cache is a StaticCache,
    with the engine's CompileConfig (decoding.COMPILE: dynamic shapes). Forced onto the CPU (`_compile_all_devices`)
    with dynamo's eager backend (the trace without inductor, seconds) and fullgraph=True (a graph break raises),
    the PEFT model with its active LoRA adapter traces whole, at least one graph is captured, and the greedy rows
    equal the dynamic mode's."""
    model, tok = two_adapter_model
    rows, adapters = [_prompt(tok, t) for t in PROMPT_TEXTS[:3]], ["x", "y", "x"]
    want = _completions(HFEngine(model, tok, 6, 0, decode="dynamic"), rows, adapters)
    config = dataclasses.replace(decoding.COMPILE, backend="eager", fullgraph=True, mode=None)
    config._compile_all_devices = True
    monkeypatch.setattr(decoding, "COMPILE", config)
    torch._dynamo.reset()
    counters.clear()
    try:
        got = _completions(HFEngine(model, tok, 6, 0, decode="static"), rows, adapters)
        graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    finally:
        torch._dynamo.reset()
    assert got == want
    assert graphs >= 1 and breaks == 0

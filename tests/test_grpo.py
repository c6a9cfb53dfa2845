"""Tests for grpo.py: advantages, aggregation weights, the clipped loss, and the update.

Run from the repo root: python -m pytest tests/test_grpo.py -q
Every expected number is computed by hand in the test (arithmetic in the comments).
The model tests use `policies.load_model("tiny")` (a 2-layer random Llama, built in code).
"""
import dataclasses
import json
import math
import os
import sys

import pytest
import torch

import train
from grpo import (
    AGGREGATIONS,
    Row,
    UpdateSettings,
    clipped_token_loss,
    group_advantages,
    make_optimizers,
    minibatch_weights,
    role_shares,
    token_weights,
    training_rows,
    update_policy,
)
from policies import (
    HFEngine,
    adapter_parameters,
    add_adapters,
    chat_prompt_ids,
    completion_logprobs,
    enable_grad_checkpointing,
    load_model,
    policy_logprobs,
    route_adapter,
    use_adapter,
)
from tasks import Task
from workflows import Call, Episode, assign_rewards

EPS = 1e-6


def aggregate(token_loss: torch.Tensor, mask: torch.Tensor, agg: str, norm_len: int = 1) -> torch.Tensor:
    """The reference form of an aggregation: reduce a [B, T] token-loss matrix to a scalar with its weights."""
    w = torch.tensor(token_weights(mask.sum(-1).long().tolist(), agg, norm_len), dtype=token_loss.dtype)
    return (token_loss * mask * w.to(token_loss.device)[:, None]).sum()


# ---------------------------------------------------------------- group_advantages

def test_group_advantages_mixed_group():
    # mean = 0.5; unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.5773502691896258
    adv = group_advantages([1, 0, 0, 1], ["g"] * 4)
    a = 0.5 / (math.sqrt(1 / 3) + EPS)  # = 0.866024...
    assert a == pytest.approx(0.8660239, abs=1e-6)
    assert adv == pytest.approx([a, -a, -a, a], abs=1e-12)


def test_group_advantages_all_equal_group_is_zero():
    # std = 0 -> (r - mean) / (0 + eps) = 0 / eps = 0
    assert group_advantages([1, 1, 1], ["g"] * 3) == [0.0, 0.0, 0.0]
    assert group_advantages([0, 0], ["g"] * 2) == [0.0, 0.0]
    assert group_advantages([0.3, 0.3], ["g"] * 2, scale_by_std=False) == [0.0, 0.0]


def test_group_advantages_group_of_one_is_raw_reward():
    # verl convention: a singleton group has mean 0, std 1 -> r / (1 + eps) = 0.7 / 1.000001 = 0.6999993
    # (abs 1e-7: grpo builds the singleton's std as a float32 tensor, so 1 + eps is rounded to 1.00000095)
    assert group_advantages([0.7], ["only"]) == pytest.approx([0.7 / (1 + EPS)], abs=1e-7)
    assert group_advantages([0.7], ["only"])[0] == pytest.approx(0.7, abs=1e-6)
    assert group_advantages([1.0], ["only"], scale_by_std=False) == [1.0]  # r - 0
    assert group_advantages([0.0], ["only"]) == [0.0]


def test_group_advantages_interleaved_keys_are_independent():
    rewards = [1, 0, 3, 0, 1, 5]
    keys = [("t1", "gen", 0), ("t2", "gen", 0), ("t1", "gen", 0), ("t2", "gen", 0), ("t1", "gen", 0), ("t1", "gen", 1)]
    adv = group_advantages(rewards, keys)
    # group t1/gen/0 = [1, 3, 1] (positions 0, 2, 4): mean 5/3, deviations -2/3, 4/3, -2/3,
    #   unbiased var = (4/9 + 16/9 + 4/9) / 2 = 4/3, std = 1.1547005383792515
    std = math.sqrt(4 / 3)
    # group t2/gen/0 = [0, 0] -> 0; group t1/gen/1 = [5] (turn differs: its own group) -> 5 / (1 + eps)
    expected = [(-2 / 3) / (std + EPS), 0.0, (4 / 3) / (std + EPS), 0.0, (-2 / 3) / (std + EPS), 5 / (1 + EPS)]
    assert adv[:5] == pytest.approx(expected[:5], abs=1e-12)
    assert adv[5] == pytest.approx(expected[5], abs=1e-6)  # 5 / 1.000001 (float32 eps rounding, see above)
    assert adv[0] == pytest.approx(-0.57735, abs=1e-5) and adv[2] == pytest.approx(1.15470, abs=1e-5)


def test_group_advantages_no_std_scale_is_r_minus_mean():
    # Dr. GRPO: [1, 0, 0, 1] - 0.5; [1, 3, 1] - 5/3
    assert group_advantages([1, 0, 0, 1], ["g"] * 4, scale_by_std=False) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    adv = group_advantages([1, 3, 1, 7], ["a", "a", "a", "b"], scale_by_std=False)
    assert adv == pytest.approx([-2 / 3, 4 / 3, -2 / 3, 7.0], abs=1e-12)


# ---------------------------------------------------------------- the worked example: episodes -> rows

@pytest.mark.parametrize("policy,adapters", [("sp", ["shared"] * 8),
                                             ("ip", ["generator"] * 3 + ["aggregator"] + ["generator"] * 3
                                              + ["aggregator"])])
def test_worked_example_voting_to_advantages(policy, adapters):
    """grpo.training_rows' docstring, kept true. One task (answer 4), n = 2 Voting episodes, outcome credit.
    Episode 0: the generators answer 4, 5, 4 and the aggregator picks solution 2 (the 5): wrong, reward 0 for all
    4 calls. Episode 1: 4, 4, 5, and it picks solution 1 (a 4): right, reward 1 for all 4. Each of the 4 groups
    (an instance's call in episode 0 and its call in episode 1) holds rewards {0, 1}: mean 0.5, unbiased std
    sqrt((0.25 + 0.25) / 1) = 0.70711, advantages (0 - 0.5) / (0.70711 + 1e-6) = -0.70710 and +0.70710. So
    episode 0's generator0, which answered right, is pushed down: -0.7071, for the aggregator's wrong pick."""
    task = Task("t1", "What is 2 + 2?", "4", "math")
    episodes = []
    for sample, (answers, pick) in enumerate([([4, 5, 4], 2), ([4, 4, 5], 1)]):
        calls = [Call(f"generator{i}", 0, [], prompt_ids=[1, 2, 3], completion_ids=[40 + a], text=f"\\boxed{{{a}}}",
                      metrics={"correct": a == 4}) for i, a in enumerate(answers)]
        calls.append(Call("aggregator", 0, [], prompt_ids=[1, 2, 9], completion_ids=[50 + pick],
                          text=f"\\boxed{{{pick}}}", is_answer=True))
        for c in calls:
            c.adapter = route_adapter(c.name, policy)
        final = answers[pick - 1]
        episodes.append(Episode(task, sample, calls, str(final), reward=float(final == 4)))
    assign_rewards(episodes, "outcome")
    assert [c.reward for e in episodes for c in e.calls] == [0.0] * 4 + [1.0] * 4
    rows = training_rows(episodes)
    a = 0.5 / (math.sqrt(0.5) + EPS)  # 0.70710578
    assert [s.adapter for s in rows] == adapters
    assert [s.role for s in rows] == ["generator"] * 3 + ["aggregator"] + ["generator"] * 3 + ["aggregator"]
    assert [s.advantage for s in rows] == pytest.approx([-a] * 4 + [a] * 4, abs=1e-12)
    assert [round(s.advantage, 4) for s in rows] == [-0.7071] * 4 + [0.7071] * 4
    assert episodes[0].calls[0].metrics["correct"] and rows[0].advantage < 0  # right, and still pushed down


# ---------------------------------------------------------------- token_weights / aggregate

# token loss 1..12 as [3, 4]; right-aligned ragged mask with lengths 4, 2, 1 (as completion_logprobs returns)
TOKEN_LOSS = torch.arange(1, 13, dtype=torch.float64).reshape(3, 4)
MASK = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.float64)
# masked-in values: row0 1+2+3+4 = 10 (4 tokens), row1 7+8 = 15 (2 tokens), row2 12 (1 token); total 37 over 7 tokens
NORM_LEN = 8
EXPECTED_AGG = {
    "token-mean": 37 / 7,                               # sum / T
    "seq-mean-token-mean": (10 / 4 + 15 / 2 + 12 / 1) / 3,  # (2.5 + 7.5 + 12) / 3 = 22/3
    "seq-mean-token-sum": (10 + 15 + 12) / 3,           # 37/3
    "seq-mean-token-sum-norm": 37 / (3 * NORM_LEN),     # 37/24
}
EXPECTED_WEIGHTS = {
    "token-mean": [1 / 7] * 3,
    "seq-mean-token-mean": [1 / 12, 1 / 6, 1 / 3],  # 1 / (3 * L_i) for L = 4, 2, 1
    "seq-mean-token-sum": [1 / 3] * 3,
    "seq-mean-token-sum-norm": [1 / 24] * 3,
}


def test_every_aggregation_is_covered():
    assert set(EXPECTED_AGG) == set(AGGREGATIONS) == set(EXPECTED_WEIGHTS)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_token_weights_hand_computed(agg):
    assert token_weights([4, 2, 1], agg, NORM_LEN) == pytest.approx(EXPECTED_WEIGHTS[agg], abs=1e-15)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_aggregate_hand_computed(agg):
    out = aggregate(TOKEN_LOSS, MASK, agg, NORM_LEN)
    assert out.item() == pytest.approx(EXPECTED_AGG[agg], abs=1e-12)
    # the masked-out values (5, 6, 9, 10, 11) do not count: zeroing them changes nothing
    assert aggregate(TOKEN_LOSS * MASK, MASK, agg, NORM_LEN).item() == pytest.approx(EXPECTED_AGG[agg], abs=1e-12)


def test_aggregate_concrete_values():
    assert EXPECTED_AGG["seq-mean-token-mean"] == pytest.approx(22 / 3)
    assert aggregate(TOKEN_LOSS, MASK, "token-mean").item() == pytest.approx(5.285714285714286)
    assert aggregate(TOKEN_LOSS, MASK, "seq-mean-token-sum-norm", norm_len=1).item() == pytest.approx(37 / 3)


def test_unknown_aggregation_raises():
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        token_weights([1, 2], "seq-sum")
    with pytest.raises(ValueError):
        aggregate(TOKEN_LOSS, MASK, "mean")


# ---------------------------------------------------------------- clipped_token_loss

def _clip_case():
    # row 0: A = +2, ratios 1.5, 1.1, 0.5, 10; row 1: A = -2, ratios 0.5, 1.1, 10, 2; row 2: A = 0
    ratios = torch.tensor([[1.5, 1.1, 0.5, 10.0], [0.5, 1.1, 10.0, 2.0], [10.0, 1.0, 0.5, 1.1]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, -1.2, -4.0, -2.5], [-1.0, -1.0, -1.0, -1.0]],
                       dtype=torch.float64)
    logp = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([2.0, -2.0, 0.0], dtype=torch.float64)
    return logp, old, adv


def test_clipped_token_loss_values_flags_and_gradients():
    logp, old, adv = _clip_case()
    loss, clipped = clipped_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    expected_loss = torch.tensor([
        # A=+2: 1.5 > 1.28 -> -2*1.28 = -2.56 (clipped); 1.1 inside -> -2*1.1 = -2.2;
        #       0.5 -> max(-2*0.5, -2*0.8) = -1.0 (unclipped: PPO never clips a worse-than-old ratio for A>0);
        #       10 -> -2*1.28 = -2.56 (clipped; dual clip is for A<0 only)
        [-2.56, -2.2, -1.0, -2.56],
        # A=-2: 0.5 < 0.8 -> max(2*0.5, 2*0.8) = 1.6 = -A*0.8 (clipped); 1.1 inside -> 2.2;
        #       10 -> min(max(20, 2.56), 3*2) = 6 = 3|A| (dual clip); 2 -> min(max(4, 2.56), 6) = 4 (unclipped)
        [1.6, 2.2, 6.0, 4.0],
        # A=0: everything 0, nothing clipped
        [0.0, 0.0, 0.0, 0.0],
    ], dtype=torch.float64)
    torch.testing.assert_close(loss, expected_loss, atol=1e-12, rtol=0)
    assert clipped.tolist() == [[True, False, False, True], [True, False, True, False], [False, False, False, False]]
    # d loss / d logp = -A * ratio where the unclipped branch is active, 0 where clipped
    loss.sum().backward()
    expected_grad = torch.tensor([[0.0, -2.2, -1.0, 0.0], [0.0, 2.2, 0.0, 4.0], [0.0, 0.0, 0.0, 0.0]],
                                 dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected_grad, atol=1e-12, rtol=0)


def test_clipped_token_loss_respects_custom_clip_values():
    # A = 1, ratio 1.5, clip_high 0.6 -> inside (1.5 < 1.6): loss -1.5; A = -1, ratio 5, dual clip 4 -> loss 4
    old = torch.zeros(2, 1, dtype=torch.float64)
    logp = torch.tensor([[math.log(1.5)], [math.log(5.0)]], dtype=torch.float64)
    loss, clipped = clipped_token_loss(logp, old, torch.tensor([1.0, -1.0], dtype=torch.float64),
                                       clip_low=0.2, clip_high=0.6, dual_clip=4.0)
    assert loss[:, 0].tolist() == pytest.approx([-1.5, 4.0], abs=1e-12)
    assert clipped[:, 0].tolist() == [False, True]


def test_masked_tokens_contribute_nothing():
    """The loss as update_policy forms it, (token_loss * mask * w).sum(): masked logp values are irrelevant."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.float64)
    w = torch.tensor([[0.125], [0.25]], dtype=torch.float64)  # seq-mean-token-mean for lengths 4, 2
    old = -torch.rand(2, 4, dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5], dtype=torch.float64)
    base = old + 0.1 * torch.randn(2, 4, dtype=torch.float64)

    def loss_and_grad(logp_values):
        logp = logp_values.clone().requires_grad_(True)
        token_loss, _ = clipped_token_loss(logp, old, adv)
        loss = (token_loss * mask * w).sum()
        loss.backward()
        return loss.item(), logp.grad

    loss_a, grad_a = loss_and_grad(base)
    changed = base.clone()
    changed[1, :2] = torch.tensor([3.0, -7.0], dtype=torch.float64)  # ratios e^(3-old), e^(-7-old) at masked slots
    loss_b, grad_b = loss_and_grad(changed)
    assert loss_a == loss_b
    assert torch.equal(grad_a, grad_b)
    assert grad_a[1, :2].tolist() == [0.0, 0.0]
    assert (grad_a[mask.bool()] != 0).all()  # the unmasked tokens do get a gradient (the test could fail)


# ---------------------------------------------------------------- role_shares / minibatch_weights

def _s(role, n_tokens, adapter="shared", prompt_len=3, adv=1.0):
    return Row(list(range(prompt_len)), [7] * n_tokens, adv, role, adapter)


SHARE_BATCH = [_s("generator", 10), _s("generator", 10), _s("generator", 10), _s("aggregator", 2)]


def test_role_shares_seq_mean_token_mean():
    # weights 1/(4*10) = 1/40 (generators), 1/(4*2) = 1/8 (aggregator);
    # mass: generator 3 * 10 / 40 = 0.75, aggregator 2 / 8 = 0.25 (each sample 1/4)
    cfg = UpdateSettings(agg="seq-mean-token-mean")
    w = minibatch_weights(SHARE_BATCH, cfg)
    assert w == pytest.approx([1 / 40, 1 / 40, 1 / 40, 1 / 8], abs=1e-15)
    shares = role_shares(SHARE_BATCH, w)
    assert shares == pytest.approx({"generator": 0.75, "aggregator": 0.25}, abs=1e-12)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_role_shares_proportional_to_tokens(agg):
    # token-mean: w = 1/32 -> 30/32 = 0.9375 vs 2/32; the token-sum modes: w constant -> same proportions
    cfg = UpdateSettings(agg=agg, norm_len=16)
    shares = role_shares(SHARE_BATCH, minibatch_weights(SHARE_BATCH, cfg))
    assert shares == pytest.approx({"generator": 30 / 32, "aggregator": 2 / 32}, abs=1e-12)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-12)


def test_role_weights_equal_split():
    cfg = UpdateSettings(agg="seq-mean-token-mean", role_weights={"generator": 1, "aggregator": 1})
    w = minibatch_weights(SHARE_BATCH, cfg)
    # generator: (1/40) * 0.5 / 0.75 = 1/60; aggregator: (1/8) * 0.5 / 0.25 = 1/4
    assert w == pytest.approx([1 / 60, 1 / 60, 1 / 60, 1 / 4], abs=1e-15)
    assert role_shares(SHARE_BATCH, w) == pytest.approx({"generator": 0.5, "aggregator": 0.5}, abs=1e-12)
    # total mass is preserved: 3 * 10 / 60 + 2 / 4 = 1 (the seq-mean-token-mean total)
    assert sum(wi * len(s.completion_ids) for wi, s in zip(w, SHARE_BATCH)) == pytest.approx(1.0, abs=1e-12)


def test_role_weights_two_to_one():
    # absent roles in role_weights (evaluator) do not count in the normalisation: 2/(2+1), 1/(2+1)
    for rw in ({"generator": 2, "aggregator": 1}, {"generator": 2, "aggregator": 1, "evaluator": 5}):
        cfg = UpdateSettings(agg="seq-mean-token-mean", role_weights=rw)
        w = minibatch_weights(SHARE_BATCH, cfg)
        # generator: (1/40) * (2/3) / 0.75 = 1/45; aggregator: (1/8) * (1/3) / 0.25 = 1/6
        assert w == pytest.approx([1 / 45, 1 / 45, 1 / 45, 1 / 6], abs=1e-15)
        assert role_shares(SHARE_BATCH, w) == pytest.approx({"generator": 2 / 3, "aggregator": 1 / 3}, abs=1e-12)


def test_role_weights_single_role_batch_unchanged():
    # IP mini-batches hold one role: its share is already 1, so re-weighting is a no-op
    batch = [_s("generator", 4), _s("generator", 2)]
    cfg = UpdateSettings(agg="seq-mean-token-mean", role_weights={"generator": 2, "aggregator": 1})
    assert minibatch_weights(batch, cfg) == pytest.approx([1 / 8, 1 / 4], abs=1e-15)  # 1/(2*4), 1/(2*2)


# ---------------------------------------------------------------- micro-batch invariance (tiny model)

PROMPT_LENS = [3, 7, 5, 9, 2, 6, 4, 8]
COMPLETION_LENS = [1, 6, 3, 8, 2, 5, 7, 4]


@pytest.fixture
def lora_model(make_lora_model):
    """The tiny Llama with one adapter `shared` whose B is random (conftest.make_lora_model)."""
    return make_lora_model("tiny")


def _synthetic_samples(roles=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    roles = roles or ["generator"] * len(PROMPT_LENS)
    advs = torch.randn(len(PROMPT_LENS), generator=g).tolist()
    return [Row(torch.randint(0, 256, (lp,), generator=g).tolist(),
                   torch.randint(0, 256, (lc,), generator=g).tolist(),
                   a, r, "shared") for lp, lc, a, r in zip(PROMPT_LENS, COMPLETION_LENS, advs, roles)]


def _old_logps(model, samples, temperature, seed=0):
    """Old log-probs = current ones + noise (+-0.3 nats): some ratios leave [0.8, 1.28], so clipping is exercised."""
    old = policy_logprobs(model, "shared", [s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                          micro_batch=8, temperature=temperature)
    g = torch.Generator().manual_seed(seed + 100)
    return [o + 0.3 * torch.randn(o.shape, generator=g) for o in old]


def _accumulated_grads(model, samples, old, cfg, micro, monkeypatch):
    """The gradient update_policy accumulates over one mini-batch of `samples` in micro-batches of `micro` rows,
    with `old` as every row's old log-probs (SGD at lr 0 and no clipping: the step changes nothing), and the
    update's metrics."""
    import grpo
    monkeypatch.setattr(grpo, "store_old_logprobs",  # every row's, in the one mini-batch too
                        lambda model, adapter, steps, cfg: steps[0].old_logprobs.update(enumerate(old)))
    params = adapter_parameters(model, "shared")
    sgd = torch.optim.SGD(params, lr=0.0)
    captured = []
    sgd.register_step_pre_hook(lambda *_: captured.append([p.grad.detach().clone() for p in params]))
    opts = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
    settings = dataclasses.replace(cfg, mini_batch_size=len(samples), micro_batch_size=micro, max_grad_norm=1e9)
    m = update_policy(model, samples, opts, settings)
    (grads,) = captured
    return grads, m


def _reference_grads(model, samples, old, cfg):
    """Full batch through `aggregate` (the reference form of the weights), one backward."""
    params = adapter_parameters(model, "shared")
    for p in params:
        p.grad = None
    with use_adapter(model, "shared"):
        logp, mask, _ = completion_logprobs(model, [s.prompt_ids for s in samples],
                                            [s.completion_ids for s in samples], cfg.temperature)
        old_logp = torch.zeros_like(logp)
        for i, o in enumerate(old):
            old_logp[i, logp.shape[1] - len(o):] = o
        adv = torch.tensor([s.advantage for s in samples], dtype=logp.dtype)
        token_loss, clipped = clipped_token_loss(logp, old_logp, adv, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        aggregate(token_loss, mask, cfg.agg, cfg.norm_len).backward()
    n_clipped = int((clipped.float() * mask).sum())
    grads = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    return grads, n_clipped


def test_the_update_reads_from_the_device_per_mini_batch_not_per_micro_batch(lora_model, monkeypatch):
    """On a GPU each float() / .item() of a tensor waits for the device; per row and statistic that was thousands
    of waits per step. The per-role token sums stay on the device until the mini-batch ends (infra/tallies.py
    reads them back in one copy), so the update's own reads (grpo.py and its report,
    infra/update_report.py) are per mini-batch: one SP mini-batch of two roles
    reads its grad norm, the two roles' own gradient norms and their cosine (4), in 1 micro-batch or in 8."""
    cfg = UpdateSettings(temperature=0.7, kl_coef={"generator": 0.1})
    samples = _synthetic_samples(["generator", "aggregator"] * 4)
    old = _old_logps(lora_model, samples, cfg.temperature)
    reads = []
    for name in ("__float__", "__bool__", "item", "tolist", "cpu"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _original=original, _name=name, **kw):
            caller = os.path.basename(sys._getframe(1).f_code.co_filename)
            if caller in ("grpo.py", "update_report.py"):  # the update and its report, not this test
                reads.append(_name)
            return _original(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, spy)
    counts = {}
    for micro in (8, 1):
        reads.clear()
        _, m = _accumulated_grads(lora_model, samples, old, cfg, micro, monkeypatch)
        counts[micro] = list(reads)
    assert counts[8] == counts[1] == ["__float__"] * 4
    assert m["generator/kl_base"] > 0 and "aggregator/kl_base" not in m


def _max_diff(ga, gb):
    return max(float((a - b).abs().max()) for a, b in zip(ga, gb))


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_micro_batch_invariance(lora_model, agg, monkeypatch):
    cfg = UpdateSettings(agg=agg, norm_len=8, temperature=0.7)
    samples = _synthetic_samples()
    old = _old_logps(lora_model, samples, cfg.temperature)
    weights = minibatch_weights(samples, cfg)
    assert weights == pytest.approx(token_weights(COMPLETION_LENS, agg, 8), abs=1e-15)
    ref, n_clipped = _reference_grads(lora_model, samples, old, cfg)
    assert 0 < n_clipped < sum(COMPLETION_LENS)  # both branches of the clipped loss are in play
    assert max(float(g.abs().max()) for g in ref) > 1e-4  # a real, nonzero gradient
    grads = {}
    for micro in (8, 2, 1):
        grads[micro], m = _accumulated_grads(lora_model, samples, old, cfg, micro, monkeypatch)
        # per token over 1+6+3+8+2+5+7+4 = 36 tokens, as the reference counts them
        assert m["generator/clip_frac"] == pytest.approx(n_clipped / sum(COMPLETION_LENS), abs=1e-12)
        assert _max_diff(grads[micro], ref) < 1e-5, micro
    assert _max_diff(grads[8], grads[2]) < 1e-5
    assert _max_diff(grads[8], grads[1]) < 1e-5


def test_micro_batch_invariance_with_role_weights(lora_model, monkeypatch):
    roles = ["generator", "aggregator"] * 4
    cfg = UpdateSettings(agg="seq-mean-token-mean", temperature=0.7, role_weights={"generator": 2, "aggregator": 1})
    samples = _synthetic_samples(roles, seed=3)
    old = _old_logps(lora_model, samples, cfg.temperature, seed=3)
    weights = minibatch_weights(samples, cfg)
    assert role_shares(samples, weights) == pytest.approx({"generator": 2 / 3, "aggregator": 1 / 3}, abs=1e-12)
    g8, _ = _accumulated_grads(lora_model, samples, old, cfg, 8, monkeypatch)
    g1, _ = _accumulated_grads(lora_model, samples, old, cfg, 1, monkeypatch)
    assert max(float(g.abs().max()) for g in g8) > 1e-4
    assert _max_diff(g8, g1) < 1e-5
    # the role weights matter: the implicit weights give a different gradient
    implicit = UpdateSettings(agg=cfg.agg, temperature=0.7)
    assert minibatch_weights(samples, implicit) == pytest.approx(token_weights(COMPLETION_LENS, cfg.agg), abs=1e-15)
    g_plain, _ = _accumulated_grads(lora_model, samples, old, implicit, 8, monkeypatch)
    assert _max_diff(g8, g_plain) > 1e-4


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_update_policy_micro_batch_invariance(lora_model, agg):
    """Through update_policy itself: with plain SGD (lr 1) and no clipping, the step is exactly -gradient, so
    the parameter change must not depend on micro_batch_size and must equal -grad of the `aggregate` loss."""
    params = adapter_parameters(lora_model, "shared")
    start = [p.detach().clone() for p in params]
    samples = _synthetic_samples(seed=5)
    cfg = UpdateSettings(mini_batch_size=8, agg=agg, temperature=0.7, max_grad_norm=1e9)
    # old log-probs = current ones (update_policy computes them itself): ratio 1, nothing clipped
    old = policy_logprobs(lora_model, "shared", [s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                          micro_batch=8, temperature=0.7)
    ref, n_clipped = _reference_grads(lora_model, samples, old, cfg)
    assert n_clipped == 0
    deltas = {}
    for micro in (8, 2, 1):
        cfg.micro_batch_size = micro
        opt = torch.optim.SGD(params, lr=1.0)
        m = update_policy(lora_model, samples, {"shared": (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))},
                          cfg)
        assert m["generator/opt_steps"] == 1 and m["generator/clip_frac"] == 0.0
        deltas[micro] = [p.detach() - s for p, s in zip(params, start)]
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        assert _max_diff(deltas[micro], [-g for g in ref]) < 1e-5, micro
    assert max(float(d.abs().max()) for d in deltas[8]) > 1e-4
    assert _max_diff(deltas[8], deltas[2]) < 1e-5 and _max_diff(deltas[8], deltas[1]) < 1e-5


# ---------------------------------------------------------------- an entropy bonus (--entropy-coef)

def _direct_entropy_sum(model, samples, weights, temperature):
    """sum_i w_i sum_t H_it, each row's entropy taken from one plain forward of prompt + completion (no padding,
    no shared prompt pass, no checkpointed head): what the loss's entropy term should be, with its graph."""
    total = 0.0
    with use_adapter(model, "shared"):
        for s, w in zip(samples, weights):
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1] / temperature  # [T, V]
            logp = torch.log_softmax(logits, dim=-1)
            total = total + w * -(logp.exp() * logp).sum()
    return total


def test_an_entropy_bonus_moves_the_gradient_by_the_entropys_own(lora_model):
    """--entropy-coef c subtracts c x each token's entropy from the loss, weighted as the other terms. On rows of
    advantage 0 (no policy-gradient term) the gradient is 0 with c = 0 and, with c = 0.1, -0.1 x the gradient of
    sum_i w_i sum_t H_it, that sum computed here by a plain forward. With c = 0 the entropy is a diagnostic
    without a graph (no memory kept for it), as before. Tolerance: float32 sums over the vocabulary taken in
    another order (padding, the checkpointed head) differ by about 2e-6 of the largest gradient entry; 1e-5 of it
    is allowed."""
    import grpo
    samples = [dataclasses.replace(s, advantage=0.0) for s in _synthetic_samples()[:4]]
    params = adapter_parameters(lora_model, "shared")
    grads, terms = {}, {}
    for coef in (0.0, 0.1):
        cfg = UpdateSettings(mini_batch_size=4, micro_batch_size=4, entropy_coef=coef)
        (mb,) = grpo.mini_batches(samples, cfg)
        with use_adapter(lora_model, "shared"):
            loss, terms[coef] = grpo.micro_batch_loss(lora_model, mb, [0, 1, 2, 3], cfg)
            grads[coef] = torch.autograd.grad(loss, params, allow_unused=True)
    assert not terms[0.0].entropy.requires_grad and terms[0.1].entropy.requires_grad
    assert all(g is None or not g.any() for g in grads[0.0])  # advantage 0, no bonus: nothing to learn
    entropy = _direct_entropy_sum(lora_model, samples, mb.weights, cfg.temperature)
    torch.testing.assert_close((terms[0.1].entropy * torch.tensor(mb.weights)[:, None]).sum(), entropy.detach(),
                               rtol=1e-5, atol=0)
    expected = torch.autograd.grad(entropy, params)
    scale = max(float(e.abs().max()) for e in expected)
    assert scale > 1e-4  # the entropy has a gradient to follow
    for got, want in zip(grads[0.1], expected):
        torch.testing.assert_close(got, -0.1 * want, rtol=0, atol=1e-5 * 0.1 * scale)


def test_an_entropy_bonus_counts_a_row_without_advantage():
    """A row of advantage 0 has a gradient when the loss holds an entropy term: --skip-zero-advantage keeps it."""
    import grpo
    row = Row([1, 2], [3, 4], 0.0, "generator", "shared")
    assert not grpo.has_gradient(row, UpdateSettings())
    assert grpo.has_gradient(row, UpdateSettings(entropy_coef=0.01))


# ---------------------------------------------------------------- optimisation: skipped old-log-prob forwards

@pytest.mark.parametrize("mini_batch", [8, 3])  # one step (all rows on-policy) | three steps (3 + 3 + 2 rows)
def test_skipping_old_logprob_forward_is_exact(lora_model, monkeypatch, mini_batch):
    """`store_old_logprobs` scores only the mini-batches after the first (the first is on-policy: ratio exactly 1).
    Scoring every row, as an unoptimised trainer does, must give the same losses, clip fractions and
    final weights; with 3 steps the later mini-batches are off-policy and really use their old log-probs."""
    import grpo
    params = adapter_parameters(lora_model, "shared")
    start = [p.detach().clone() for p in params]
    samples = _synthetic_samples(seed=7)
    # one row per forward on both sides: the same rows padded alike give bit-identical log-probs, which matters
    # because Adam turns 1e-7 noise in a near-zero gradient into a full-size step
    cfg = UpdateSettings(mini_batch_size=mini_batch, micro_batch_size=1, temperature=0.7)
    scored = []

    def run():
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        opts = make_optimizers(lora_model, ["shared"], UpdateSettings(lr=0.05, warmup_steps=1), 500)
        m = update_policy(lora_model, samples, opts, cfg)
        return m, [p.detach().clone() for p in params]

    real_store = grpo.store_old_logprobs

    def store(model, adapter, steps, cfg):  # the rows each mini-batch holds old log-probs of
        real_store(model, adapter, steps, cfg)
        scored.append([len(mb.old_logprobs) for mb in steps])

    def store_all(model, adapter, steps, cfg):  # unoptimised: every row scored by a separate no-grad forward
        for mb in steps:
            mb.old_logprobs.update(enumerate(policy_logprobs(
                model, adapter, [s.prompt_ids for s in mb.rows], [s.completion_ids for s in mb.rows], 1,
                cfg.temperature)))
    monkeypatch.setattr(grpo, "store_old_logprobs", store)
    m_fast, w_fast = run()
    monkeypatch.setattr(grpo, "store_old_logprobs", store_all)
    m_full, w_full = run()
    assert scored[0] == {8: [0], 3: [0, 3, 2]}[mini_batch]  # 8 rows: the first mini-batch stores none
    assert m_fast["generator/opt_steps"] == m_full["generator/opt_steps"] == -(-len(samples) // mini_batch)
    for key in ("generator/pg_loss", "generator/clip_frac", "generator/approx_kl", "generator/grad_norm"):
        assert m_fast[key] == pytest.approx(m_full[key], abs=1e-6), key
    assert _max_diff(w_fast, start) > 1e-3  # the weights really moved
    assert _max_diff(w_fast, w_full) < 1e-6
    if mini_batch == 3:  # later mini-batches ran off-policy: ratios moved away from 1
        assert m_fast["generator/approx_kl"] > 1e-6


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_skip_zero_advantage_is_exact(lora_model, agg):
    """--skip-zero-advantage runs no forward/backward for rows with advantage 0 and must leave every step
    unchanged: the same grad norms and weights after (1) a step where 3 of 8 rows have advantage 0 and
    (2) a step where all do, which must still move the weights through Adam's momentum and weight decay."""
    params = adapter_parameters(lora_model, "shared")
    start = [p.detach().clone() for p in params]
    first = _synthetic_samples(seed=11)
    for i in (1, 4, 6):
        first[i].advantage = 0.0
    second = [Row(s.prompt_ids, s.completion_ids, 0.0, s.role, s.adapter) for s in _synthetic_samples(seed=12)]

    def run(skip: bool):
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        opts = make_optimizers(lora_model, ["shared"], UpdateSettings(lr=0.05, warmup_steps=1), 500)
        cfg = UpdateSettings(mini_batch_size=8, micro_batch_size=1, agg=agg, temperature=0.7, skip_zero_advantage=skip)
        m1 = update_policy(lora_model, first, opts, cfg)
        after_first = [p.detach().clone() for p in params]
        m2 = update_policy(lora_model, second, opts, cfg)
        return m1, m2, after_first, [p.detach().clone() for p in params]

    m1_full, m2_full, w1_full, w2_full = run(skip=False)
    m1_skip, m2_skip, w1_skip, w2_skip = run(skip=True)
    assert (m1_skip["skipped_rows"], m2_skip["skipped_rows"]) == (3, 8) and "skipped_rows" not in m1_full
    assert m1_skip["generator/grad_norm"] == pytest.approx(m1_full["generator/grad_norm"], abs=1e-7)
    assert m2_skip["generator/grad_norm"] == m2_full["generator/grad_norm"] == 0.0
    assert m2_skip["generator/opt_steps"] == m2_full["generator/opt_steps"] == 1
    assert _max_diff(w1_skip, w1_full) < 1e-7 and _max_diff(w2_skip, w2_full) < 1e-7
    assert _max_diff(w2_full, w1_full) > 1e-4  # the all-zero step still moved the weights (momentum)


# ---------------------------------------------------------------- optimisation: shared prompt passes

def test_shared_prompt_update_equals_full_passes(lora_model):
    """GRPO rows come in groups that share a prompt. With `share_prompts` each micro-batch runs a prompt once and
    its rows continue from its KV cache. Over two optimizer steps (mini-batches of 6 + 3 rows, so the second uses
    old log-probs from a shared no-grad pass) with a KL term (the base model's log-probs, shared too), the losses,
    clip fractions, KLs, entropies, grad norms and final weights equal one full pass per row up to float
    rounding, and the update runs the hand-counted number of token positions.

    Tolerances: the model runs in float64, but Llama's RMSNorm computes in float32 inside, and the shared pass
    sums the n rows' gradients before that norm's backward while the full pass sums after it, so gradients agree
    to float32 rounding (measured 4e-7 absolute on entries up to ~30). Plain SGD keeps that visible in the weights
    as lr x 4e-7: Adam would turn the rounding of a near-zero gradient into a full lr-sized step."""
    lora_model.double()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (23, 17, 30)]
    samples = [Row(prompts[k], torch.randint(0, 256, (n,), generator=g).tolist(), float(torch.randn(1, generator=g)),
                      "generator", "shared") for k in (0, 1, 2) for n in (3, 5, 2)]
    params = adapter_parameters(lora_model, "shared")
    start = [p.detach().clone() for p in params]
    positions = []
    handle = lora_model.get_input_embeddings().register_forward_hook(lambda _m, i, _o: positions.append(i[0].numel()))

    def run(share: bool):
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        sgd = torch.optim.SGD(params, lr=0.01)
        opts = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
        cfg = UpdateSettings(mini_batch_size=6, micro_batch_size=3, temperature=0.7, kl_coef={"generator": 0.1},
                             share_prompts=share)
        positions.clear()
        m = update_policy(lora_model, samples, opts, cfg)
        return m, [p.detach().clone() for p in params], sum(positions)

    try:
        m_full, w_full, n_full = run(share=False)
        m_shared, w_shared, n_shared = run(share=True)
    finally:
        handle.remove()
    assert m_shared["generator/opt_steps"] == m_full["generator/opt_steps"] == 2
    for key in ("pg_loss", "clip_frac", "approx_kl", "kl_base", "entropy", "grad_norm"):  # float32 rounding, 1e-6
        assert m_shared[f"generator/{key}"] == pytest.approx(m_full[f"generator/{key}"], rel=1e-6, abs=1e-9), key
    assert m_full["generator/approx_kl"] > 1e-6 and m_full["generator/kl_base"] > 1e-6  # both paths really ran
    assert _max_diff(w_full, start) > 1e-3
    # gradients within 1e-5 (25x the measured 4e-7), times lr 0.01 per step, two steps (clipping only shrinks)
    assert _max_diff(w_shared, w_full) < 2 * 0.01 * 1e-5
    # micro-batches = the three groups (prompt lengths 17, 23 | 30), completions 3, 5, 2 (width 5). Full: each
    # row pads to P + 5; shared: one prefix of P - 1, then 3 rows x (1 + 5). The groups of the first mini-batch
    # run twice (policy + base for the KL), the last group three times (old log-probs, policy, base).
    assert n_full == 3 * (2 * (17 + 5) + 2 * (23 + 5) + 3 * (30 + 5))
    assert n_shared == 2 * (16 + 18) + 2 * (22 + 18) + 3 * (29 + 18)


# ---------------------------------------------------------------- training changes only LoRA weights

def _peft_to_base_name(name):
    # base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight -> model.layers.0.self_attn.q_proj.weight
    return name.replace("base_model.model.", "", 1).replace(".base_layer", "")


def test_two_update_steps_change_only_lora():
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    model = add_adapters(model, ["shared"], rank=4, alpha=32)
    opts = make_optimizers(model, ["shared"], UpdateSettings(lr=1e-2, warmup_steps=1), 500)
    engine = HFEngine(model, tok, max_new_tokens=8, temperature=0.7)
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": q}]) for q in ("1+1?", "What is 12 * 3?")]
    gens = engine.generate(prompts * 2, ["shared"] * 4)
    assert all(1 <= len(g.completion_ids) <= 8 for g in gens)
    advs = [1.0, -1.0, 0.5, -0.5]
    samples = [Row(p, g.completion_ids, a, "generator", "shared") for p, g, a in zip(prompts * 2, gens, advs)]
    cfg = UpdateSettings(mini_batch_size=4, micro_batch_size=2, temperature=0.7)
    for _ in range(2):
        m = update_policy(model, samples, opts, cfg)
        assert m["generator/opt_steps"] == 1  # 4 samples, one mini-batch of 4
        assert m["lr"] == pytest.approx(1e-2)  # warmup 1 step: min(1, (s+1)/1) = 1
        assert m["nonfinite_steps"] == 0
    n_base = 0
    for n, p in model.named_parameters():
        if "lora_" in n:
            continue
        n_base += 1
        assert not p.requires_grad, n
        assert torch.equal(p, base[_peft_to_base_name(n)]), n
    assert n_base == len(base)  # every base tensor was compared (tied lm_head counted once)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert len(lora_b) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    assert any(float(p.detach().abs().max()) > 0 for p in lora_b)  # B starts at 0; training moved it


def test_train_main_two_steps(tmp_path):
    run_dir = tmp_path / "run"
    out = train.main(["--model", "tiny", "--steps", "2", "--max-new-tokens", "8", "--tasks-per-step", "2", "--n", "2",
                      "--n-val", "2", "--val-every", "0", "--run-dir", str(run_dir), "--lr", "1e-2",
                      "--warmup-steps", "1", "--difficulty", "1", "--n-train", "20", "--device", "cpu"])
    assert out == str(run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # --val-every 0: no step-0 validation line
    for step, line in enumerate(lines, start=1):
        m = json.loads(line)
        assert m["step"] == step
        for key in ("reward", "success", "generator/opt_steps"):
            assert key in m, key
        assert m["generator/opt_steps"] == 1  # 2 tasks x 2 episodes = 4 samples = one mini-batch (default size)
        assert 0.0 <= m["reward"] <= 1.0 and 0.0 <= m["success"] <= 1.0
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "adapters" / "shared" / "adapter_model.safetensors").is_file()
    assert (ckpt / "adapters" / "shared" / "adapter_config.json").is_file()
    assert (ckpt / "state.pt").is_file()  # optimizer, schedule, rng and I6 state
    assert json.loads((ckpt / "state.json").read_text()) == {"step": 2}
    assert not (run_dir / "checkpoints" / "step_000001").exists()  # --save-every 10: only the final step
    assert json.loads((run_dir / "args.json").read_text())["steps"] == 2


# ---------------------------------------------------------------- IP stepping

def test_ip_steps_per_role():
    model, _ = load_model("tiny")
    model = add_adapters(model, ["generator", "aggregator"], rank=4, alpha=32)
    opts = make_optimizers(model, ["generator", "aggregator"], UpdateSettings(lr=1e-3, warmup_steps=1), 500)
    g = torch.Generator().manual_seed(0)

    def sample(role, i):
        return Row(torch.randint(0, 256, (4,), generator=g).tolist(),
                      torch.randint(0, 256, (2 + i % 3,), generator=g).tolist(),
                      1.0 if i % 2 else -1.0, role, role)

    samples = [sample("generator", i) for i in range(6)] + [sample("aggregator", i) for i in range(2)]
    samples.append(Row([1, 2, 3], [], 1.0, "generator", "generator"))  # empty completion: skipped
    m = update_policy(model, samples, opts, UpdateSettings(mini_batch_size=2, micro_batch_size=2, temperature=0.7))
    # generator: 6 samples / 2 per mini-batch = 3 steps; aggregator: 2 / 2 = 1 step
    assert m["generator/opt_steps"] == 3
    assert m["aggregator/opt_steps"] == 1
    assert m["generator/loss_share"] == 1.0 and m["aggregator/loss_share"] == 1.0  # one role per adapter
    # each optimizer stepped exactly that many times on its own adapter's tensors
    for adapter, steps in (("generator", 3), ("aggregator", 1)):
        opt = opts[adapter][0]
        params = adapter_parameters(model, adapter)
        assert len(params) == 2 * 2 * 7  # lora_A + lora_B on 14 linear layers
        assert all(int(opt.state[p]["step"]) == steps for p in params)


@pytest.mark.parametrize("merge", [False, True])
def test_ip_update_leaves_other_adapter_untouched(merge):
    """An adapter without rows (the aggregator here) takes no step and keeps its weights, with one
    mini-batch per `mini_batch_size` rows or one per adapter (--merge-instance-steps)."""
    model, _ = load_model("tiny")
    model = add_adapters(model, ["generator", "aggregator"], rank=4, alpha=32)
    opts = make_optimizers(model, ["generator", "aggregator"], UpdateSettings(lr=1e-2, warmup_steps=1), 500)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    samples = [Row([5, 6, 7], [8, 9, 10], a, "generator", "generator") for a in (1.0, -1.0)]
    samples[1].completion_ids = [11, 12]
    cfg = UpdateSettings(mini_batch_size=2, temperature=0.7, merge_instance_steps=merge)
    m = update_policy(model, samples, opts, cfg)
    assert m["generator/opt_steps"] == 1 and "aggregator/opt_steps" not in m
    changed = {n for n, p in model.named_parameters() if "lora_" in n and not torch.equal(p, before[n])}
    assert changed and all(".generator." in n for n in changed)
    assert not opts["aggregator"][0].state  # the aggregator optimizer never stepped


# ---------------------------------------------------------------- learning-rate schedule

def _two_generator_samples():
    return [Row([1, 2, 3], [4, 5], 1.0, "generator", "generator"),
            Row([1, 2, 3], [6], -1.0, "generator", "generator")]


def test_warmup_lr_applied_on_first_step():
    """lr 1e-2, warmup 4: step 1 uses lr * (0+1)/4 = 2.5e-3; step 4 onward the full 1e-2."""
    model, _ = load_model("tiny")
    model = add_adapters(model, ["generator"], rank=4, alpha=32)
    opts = make_optimizers(model, ["generator"], UpdateSettings(lr=1e-2, warmup_steps=4), 500)
    assert opts["generator"][0].param_groups[0]["lr"] == pytest.approx(2.5e-3)
    update_policy(model, _two_generator_samples(), opts, UpdateSettings(mini_batch_size=2, temperature=0.7))
    # AdamW's first step moves each weight by lr * g / (|g| + 1e-8) ~= lr (B starts at 0, so decay adds nothing):
    # the largest |B| after one step is the lr that was applied
    max_b = max(float(p.detach().abs().max()) for n, p in model.named_parameters() if "lora_B" in n)
    assert max_b == pytest.approx(2.5e-3, rel=1e-3)
    lrs = []
    for _ in range(3):
        lrs.append(opts["generator"][0].param_groups[0]["lr"])
        update_policy(model, _two_generator_samples(), opts, UpdateSettings(mini_batch_size=2, temperature=0.7))
    assert lrs == pytest.approx([5e-3, 7.5e-3, 1e-2])  # (s+1)/4 for s = 1, 2, 3
    assert opts["generator"][0].param_groups[0]["lr"] == pytest.approx(1e-2)  # min(1, 5/4) = 1


def test_logged_lr_is_the_lr_used():
    model, _ = load_model("tiny")
    model = add_adapters(model, ["generator"], rank=4, alpha=32)
    opts = make_optimizers(model, ["generator"], UpdateSettings(lr=1e-2, warmup_steps=4), 500)
    m = update_policy(model, _two_generator_samples(), opts, UpdateSettings(mini_batch_size=2, temperature=0.7))
    assert m["lr"] == pytest.approx(2.5e-3)  # the step used 1e-2 * 1/4, not the next step's 2/4
    assert m["generator/lr"] == pytest.approx(2.5e-3)  # the same, per adapter
    assert opts["generator"][0].param_groups[0]["lr"] == pytest.approx(5e-3)  # next step: 2/4


def test_role_weights_without_the_batch_role_does_not_crash():
    model, _ = load_model("tiny")
    model = add_adapters(model, ["aggregator"], rank=4, alpha=32)
    opts = make_optimizers(model, ["aggregator"], UpdateSettings(lr=1e-2, warmup_steps=1), 500)
    samples = [Row([1, 2, 3], [4, 5], 1.0, "aggregator", "aggregator"),
               Row([1, 2, 3], [6], -1.0, "aggregator", "aggregator")]
    cfg = UpdateSettings(mini_batch_size=2, temperature=0.7, role_weights={"generator": 1})
    m = update_policy(model, samples, opts, cfg)
    assert m["aggregator/opt_steps"] == 0  # nothing to learn from: no optimizer step


def test_role_weights_zero_mini_batch_under_sp():
    # train.py allows this: --policy sp --role-weights generator=1 --mini-batch-size 2; the second mini-batch
    # holds only aggregator calls, whose target share is 0 -> all its weights are 0 (no division by zero)
    model, _ = load_model("tiny")
    model = add_adapters(model, ["shared"], rank=4, alpha=32)
    opts = make_optimizers(model, ["shared"], UpdateSettings(lr=1e-2, warmup_steps=1), 500)
    samples = [Row([1, 2, 3], [4, 5], 1.0, "generator", "shared"),
               Row([1, 2, 3], [6], -1.0, "generator", "shared"),
               Row([1, 2, 3], [7, 8], 1.0, "aggregator", "shared"),
               Row([1, 2, 3], [9], -1.0, "aggregator", "shared")]
    cfg = UpdateSettings(mini_batch_size=2, temperature=0.7, role_weights={"generator": 1})
    assert minibatch_weights(samples[2:], cfg) == [0.0, 0.0]
    assert minibatch_weights(samples[:2], cfg) == pytest.approx([1 / 4, 1 / 2])  # 1/(2*2), 1/(2*1): one role, unchanged
    m = update_policy(model, samples, opts, cfg)
    assert m["generator/loss_share"] == 1.0 and m["aggregator/loss_share"] == 0.0
    assert m["generator/opt_steps"] == 1 and m["aggregator/opt_steps"] == 0  # zero weights: step skipped
    assert m["aggregator/grad_norm"] == 0.0  # zero weight: zero gradient


# ---------------------------------------------------------------- faithful to the reference's update (verl)

def _step_grads(model, samples, **cfg):
    """The gradient each optimizer step of one update saw (SGD with lr 0: the weights never move, so later
    mini-batches' old log-probs equal their current ones; clipping off)."""
    params = adapter_parameters(model, "shared")
    sgd = torch.optim.SGD(params, lr=0.0)
    captured = []
    sgd.register_step_pre_hook(lambda *_: captured.append([p.grad.detach().clone() for p in params]))
    opts = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
    update_policy(model, samples, opts, UpdateSettings(max_grad_norm=1e9, temperature=0.7, **cfg))
    return captured


def test_a_partial_last_mini_batch_counts_its_rows_over_the_mini_batch_size(lora_model):
    """As verl: 10 samples in mini-batches of 4 -> 4, 4, 2. The last one's gradient is 2/4 of what the same two
    samples give as a mini-batch of their own; full mini-batches are not scaled; merged into one step, nothing is.
    Tolerance: old log-probs come from a separate no-grad pass, equal up to fp32 padding noise (~1e-7)."""
    samples = _synthetic_samples(seed=5) + _synthetic_samples(seed=6)[:2]
    steps = _step_grads(lora_model, samples, mini_batch_size=4)
    assert len(steps) == 3
    for got, rows in ((steps[0], samples[:4]), (steps[2], samples[8:])):
        (alone,) = _step_grads(lora_model, rows, mini_batch_size=len(rows))
        scale = len(rows) / 4
        largest = _max_diff(alone, [0 * a for a in alone])
        assert max(float((g - scale * a).abs().max()) for g, a in zip(got, alone)) < 1e-5 * largest
    (merged,) = _step_grads(lora_model, samples, mini_batch_size=4, merge_instance_steps=True)
    (alone,) = _step_grads(lora_model, samples, mini_batch_size=len(samples))
    assert _max_diff(merged, alone) < 1e-6


def test_a_mini_batch_without_gradient_has_no_gradient_shares(lora_model):
    """Two SP mini-batches, one whose advantages are all 0 (its gradient is exactly 0): its roles' gradient shares
    and cosine are undefined and left out, so the step's shares are the other mini-batch's and still sum to 1
    (they used to be averaged with zeros: 0.5 in all)."""
    live = _synthetic_samples(roles=["generator"] * 3 + ["aggregator"], seed=9)
    dead = [Row(s.prompt_ids, s.completion_ids, 0.0, s.role, s.adapter) for s in live]
    params = adapter_parameters(lora_model, "shared")
    sgd = torch.optim.SGD(params, lr=0.0)
    opts = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
    cfg = UpdateSettings(max_grad_norm=1e9, temperature=0.7, mini_batch_size=4)
    both = update_policy(lora_model, live + dead, opts, cfg)
    alone = update_policy(lora_model, live, opts, cfg)
    assert both["generator/grad_norm_share"] + both["aggregator/grad_norm_share"] == pytest.approx(1.0, abs=1e-12)
    for key in ("generator/grad_norm_share", "grad_cos/aggregator-generator"):
        assert both[key] == pytest.approx(alone[key], rel=1e-6)  # lr 0: the live mini-batch is the same both times
    only_dead = update_policy(lora_model, dead, opts, cfg)
    assert only_dead["generator/role_grad_norm"] == 0.0
    assert not [k for k in only_dead if "grad_norm_share" in k or k.startswith("grad_cos")]


def test_sp_logs_each_roles_share_of_the_loss_and_of_the_gradient(lora_model):
    """An SP mini-batch of 6 generator and 2 aggregator samples: loss_share is each role's share of the loss weight
    (seq-mean-token-mean: its share of the samples, 6/8 and 2/8); grad_norm_share is its own gradient's norm over
    the two norms' sum; and the numbers tie together: |g|^2 = |g_gen|^2 + |g_agg|^2 + 2 |g_gen| |g_agg| cos."""
    samples = _synthetic_samples(roles=["generator"] * 6 + ["aggregator"] * 2, seed=9)
    params = adapter_parameters(lora_model, "shared")
    sgd = torch.optim.SGD(params, lr=0.0)
    opts = {"shared": (sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))}
    m = update_policy(lora_model, samples, opts, UpdateSettings(max_grad_norm=1e9, temperature=0.7, mini_batch_size=8))
    assert (m["generator/loss_share"], m["aggregator/loss_share"]) == pytest.approx((0.75, 0.25), abs=1e-12)
    n_gen, n_agg = m["generator/role_grad_norm"], m["aggregator/role_grad_norm"]
    cos = m["grad_cos/aggregator-generator"]
    assert m["generator/grad_norm_share"] == pytest.approx(n_gen / (n_gen + n_agg), rel=1e-9)
    assert m["generator/grad_norm_share"] + m["aggregator/grad_norm_share"] == pytest.approx(1.0, abs=1e-12)
    total = m["generator/grad_norm"]  # the adapter's whole gradient, before clipping (fp32: 1e-5 relative)
    assert total ** 2 == pytest.approx(n_gen ** 2 + n_agg ** 2 + 2 * n_gen * n_agg * cos, rel=1e-5)


def test_the_functions_defaults_are_the_settings():
    """The functions of grpo.py that take a knob default to its UpdateSettings value (the class sits last in the
    file, below them, so they cannot name it): one default per knob."""
    import inspect
    cfg = UpdateSettings()
    clip = inspect.signature(clipped_token_loss).parameters
    assert (clip["clip_low"].default, clip["clip_high"].default, clip["dual_clip"].default) == \
        (cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    for function in (group_advantages, training_rows):
        assert inspect.signature(function).parameters["scale_by_std"].default == cfg.std_scale


def test_a_zero_rate_update_in_bf16_keeps_every_ratio_at_one_with_lora_active():
    """At a learning rate of 0 the weights never move, so every later mini-batch's ratio exp(new - old) must be 1:
    its old log-probs (the no-grad pass, grpo.store_old_logprobs) and its new ones (the update's pass) compute the
    same thing. In bf16, with LoRA active (B random), activation checkpointing and rows that share prompts and
    differ in length, they agree exactly: both run full rows in the update's own micro-batches. Before, the
    no-grad pass cut the later mini-batches' rows its own way and read an approximate KL of 2.2e-8 here (a shared
    prompt pass instead of full rows: tests/test_policies.py; bench/gpu_ratio.py measures both on a GPU's
    shapes). Exact: the same rows through the same kernels."""
    torch.manual_seed(0)
    model, _ = load_model("tiny-qwen3", torch.bfloat16)
    model = add_adapters(model, ["generator"], rank=8, alpha=16)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    enable_grad_checkpointing(model)
    prompts = [torch.randint(0, 200, (24,), generator=g).tolist() for _ in range(3)]
    # each mini-batch of 4 mixes the prompts (a prompt's copies in two mini-batches), lengths 5 to 19
    rows = [Row(prompts[k % 3], torch.randint(0, 200, (int(n),), generator=g).tolist(), (-1.0) ** k, "generator",
                "generator") for k, n in enumerate(torch.randint(5, 20, (12,), generator=g))]
    cfg = UpdateSettings(mini_batch_size=4, micro_batch_size=2, temperature=0.7)
    opts = make_optimizers(model, ["generator"], UpdateSettings(lr=0.0, weight_decay=0.0), 10)
    m = update_policy(model, rows, opts, cfg)
    assert m["generator/opt_steps"] == 3 and not m["nonfinite_steps"]
    assert m["generator/approx_kl"] == 0.0 and m["generator/clip_frac"] == 0.0

"""GRPO for every role of a workflow: group advantages, the clipped loss, the per-adapter update.

The method notes, docs/method.md ("GRPO as trained", "SP and IP"), describe what is trained. The one idea
to take away: every aggregation mode is a *per-token weight*. `token_weights` says how much each token of a
mini-batch counts in the loss, and the loss is sum(weight * token_loss). That makes three things exact and
visible: micro-batching is plain gradient accumulation; a role's share of the loss under SP is the sum of its
tokens' weights (finding 3); re-weighting roles is multiplying their tokens' weights. Under IP each adapter
is updated on its own role's calls, one optimizer step per mini-batch, so a role with three instances takes
three steps per training step (finding 4). Under torchrun the ranks split the rows and sum the gradients
(infra/distributed.py moves the values). Metrics are counted as numerator and denominator (infra/tallies.py)
and turned into rates once, at the end of the update.

    python -m pytest tests/test_grpo.py      # hand-computed checks of everything here
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Hashable

import torch
from tqdm import tqdm

from infra.distributed import all_reduce_sum, gather, world
from infra.tallies import Tallies, add_tallies, rates
from policies import adapter_parameters, completion_logprobs, micro_batches, policy_logprobs, use_adapter

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


# ---------------------------------------------------------------- advantages

def group_advantages(rewards: list[float], keys: list[Hashable], scale_by_std: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """Outcome advantage of each call against the other members of its group (key: task, call name, turn).

    Advantage = (r - mean) / (std + eps), unbiased std, or r - mean with `scale_by_std=False` (Dr. GRPO). A group
    whose rewards are all equal gets 0 for every member (nothing to learn); a group of one has no baseline: like
    verl (the reference), mean 0 and std 1, so its advantage is its raw reward.
    """
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(i)
    adv = [0.0] * len(rewards)
    for idx in members.values():
        r = torch.tensor([float(rewards[i]) for i in idx], dtype=torch.float64)
        mean, std = (r.mean(), r.std()) if len(idx) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        a = (r - mean) / (std + eps) if scale_by_std else r - mean
        for i, v in zip(idx, a.tolist()):
            adv[i] = v
    return adv


# ---------------------------------------------------------------- loss

def token_weights(lengths: list[int], agg: str, norm_len: int = 1) -> list[float]:
    """Weight of each token of sample i in the mini-batch loss (the same for all its tokens).

    N samples, lengths L_i, T = sum L_i:
      token-mean               1 / T            every token counts the same
      seq-mean-token-mean      1 / (N * L_i)    every sample counts the same (paper default)
      seq-mean-token-sum       1 / N            longer samples count more
      seq-mean-token-sum-norm  1 / (N * norm_len)  Dr. GRPO: a constant length (the generation budget)
    """
    n, total = len(lengths), sum(lengths)
    if agg == "token-mean":
        return [1.0 / total] * n
    if agg == "seq-mean-token-mean":
        return [1.0 / (n * max(L, 1)) for L in lengths]
    if agg == "seq-mean-token-sum":
        return [1.0 / n] * n
    if agg == "seq-mean-token-sum-norm":
        return [1.0 / (n * norm_len)] * n
    raise ValueError(f"unknown loss aggregation {agg!r}; expected one of {AGGREGATIONS}")


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float = 0.2,
                       clip_high: float = 0.28, dual_clip: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with clip-higher and dual clip (verl's form).

    logp, old_logp: [B, T]; adv: [B]. Returns (loss [B, T], clipped [B, T] bool). For A > 0 the ratio is capped at
    1 + clip_high; for A < 0 it is floored at 1 - clip_low, and the loss is also capped at -A * dual_clip so a huge
    ratio on a bad sample cannot blow up the step.
    """
    adv = adv[:, None]
    ratio = torch.exp(logp - old_logp)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_ppo, -adv * dual_clip)
    loss = torch.where(adv < 0, loss_dual, loss_ppo)
    clipped = (loss_clipped > loss_unclipped) | ((adv < 0) & (loss_ppo > -adv * dual_clip))
    return loss, clipped


# ---------------------------------------------------------------- update

@dataclass
class Sample:
    """One call, as the update sees it."""
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    role: str      # role type for metrics: generator0 -> generator
    adapter: str   # the adapter this call trains (route_adapter)
    rank: int = 0  # the rank that holds its tokens (torchrun); other ranks know only its length and advantage


@dataclass
class UpdateSettings:
    """The GRPO update's knobs. Each field with a `help` is one flag of train.py, made from it by
    infra/flags.py: the field's default (or its `flag_default`), its help, the paper's value
    (`paper`) and the values it takes (`within`, `choices`). A field without `help` is computed by
    train.py's `build_trainer`. A new knob is one field here, read as `cfg.<name>` where the update
    uses it."""
    mini_batch_size: int = field(default=512, metadata=dict(
        help="samples per optimizer step; 0 = a step's episodes", within="[0, inf)", flag_default=0,
        paper=512))
    micro_batch_size: int = field(default=8, metadata=dict(
        help="rows per forward/backward at most (memory only: the gradient is the same)",
        within="[1, inf)"))
    max_tokens_per_micro_batch: int = field(default=1 << 62, metadata=dict(  # verl: dynamic bsz
        help="padded tokens per forward/backward at most; 0 = rows only", within="[0, inf)",
        flag_default=0, paper=51200))
    agg: str = field(default="seq-mean-token-mean", metadata=dict(
        help="loss aggregation: how much each token counts (grpo.token_weights)",
        choices=AGGREGATIONS, paper="seq-mean-token-mean"))
    norm_len: int = 512  # seq-mean-token-sum-norm's constant length (train.py: --max-new-tokens)
    clip_low: float = field(default=0.2, metadata=dict(
        help="PPO clip below 1", within="(0, 1)", paper=0.2))
    clip_high: float = field(default=0.28, metadata=dict(
        help="PPO clip above 1 (clip-higher)", within="(0, inf)", paper=0.28))
    dual_clip: float = field(default=3.0, metadata=dict(
        help="dual-clip constant: a negative advantage's loss is capped at -A x this",
        within="(1, inf)", paper=3))
    max_grad_norm: float = field(default=1.0, metadata=dict(
        help="gradient clipping per adapter", within="(0, inf)", paper=1))
    temperature: float = 0.7  # log-probs at the sampling temperature: train.py gives --temperature
    role_weights: dict[str, float] = field(default_factory=dict, metadata=dict(
        help="SP: loss share per role, 'equal' or generator=2,aggregator=1; none: the "
             "aggregation's own shares (as the paper)", within="[0, inf)"))
    merge_instance_steps: bool = field(default=False, metadata=dict(
        help="finding 4: one optimizer step per adapter per training step, not one per mini-batch",
        paper=False))
    kl_coef: dict[str, float] = field(default_factory=dict, metadata=dict(
        help="I1: role=beta,... adds beta * KL(role || base) (k3)", within="(0, inf)"))
    coherence: dict[str, float] = field(default_factory=dict, metadata=dict(
        help="I6 (IP): role=lambda,... lambda in (0, 1]", within="(0, 1]", paper="<= 0.3"))
    coherence_window: int = field(default=128, metadata=dict(
        help="I6: EMA window, tau = 1 - 1/window", within="[1, inf)", paper=128))
    share_prompts: bool = field(default=True, metadata=dict(  # policies.shared_prompt_cache
        help="rows that share a prompt run it once (--no-share-prompts: each row its whole "
             "prompt)"))
    skip_zero_advantage: bool = field(default=False, metadata=dict(
        help="skip calls with advantage 0: the same step, less work (entropy and clip_frac then "
             "cover the trained calls)"))
    lr_schedule: str = field(default="constant", metadata=dict(  # verl-constant: see lr_multiplier
        help="after warm-up; cosine: to 0 at the last step (the paper's config); verl-constant: "
             "what its runs did, from lr 0, counting adapter updates (cells)",
        choices=["constant", "cosine", "verl-constant"]))


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str = "constant") -> float:
    """The learning rate of scheduler step `step` (from 0) as a fraction of --lr. constant and cosine count
    training steps: linear warm-up to 1 at step `warmup_steps` - 1, then constant, or a half cosine that reaches 0
    at training step `total_steps`. verl-constant is what the reference's runs executed (docs/method.md): verl's
    constant schedule with warm-up, which starts at 0 (the first update changes nothing) and counts adapter
    updates (`update_policy`), so under IP with K adapters its warm-up ends after ceil(warmup_steps / K) steps."""
    if schedule == "verl-constant":
        return min(step, warmup_steps) / warmup_steps if warmup_steps else 1.0
    t = step + 1
    if t <= warmup_steps:
        return t / warmup_steps
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(t - warmup_steps, total_steps - warmup_steps)
                                 / max(total_steps - warmup_steps, 1)))


def make_optimizers(model, adapters: list[str], lr: float = 2e-5, weight_decay: float = 0.01, warmup_steps: int = 15,
                    schedule: str = "constant", total_steps: int = 500
                    ) -> dict[str, tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]]:
    """One AdamW + schedule (`lr_multiplier`) per adapter: IP roles never share optimizer state."""
    out = {}
    for a in adapters:
        opt = torch.optim.AdamW(adapter_parameters(model, a), lr=lr, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, warmup_steps, total_steps, schedule))
        out[a] = (opt, sched)
    return out


def role_shares(samples: list[Sample], weights: list[float]) -> dict[str, float]:
    """Fraction of the total loss weight carried by each role's tokens (sums to 1)."""
    mass: dict[str, float] = defaultdict(float)
    for s, w in zip(samples, weights):
        mass[s.role] += w * len(s.completion_ids)
    total = sum(mass.values())
    return {r: m / total if total else 0.0 for r, m in mass.items()}


def minibatch_weights(samples: list[Sample], cfg: UpdateSettings) -> list[float]:
    """Per-token weight of each sample in one mini-batch, rescaled to the requested role shares if any."""
    w = token_weights([len(s.completion_ids) for s in samples], cfg.agg, cfg.norm_len)
    if cfg.role_weights:
        shares = role_shares(samples, w)
        present = {r: cfg.role_weights.get(r, 0.0) for r in shares}
        norm = sum(present.values()) or 1.0
        # scale each role's tokens so its share becomes target / sum(targets of roles present)
        w = [wi * (present[s.role] / norm) / shares[s.role] if shares[s.role] else 0.0 for s, wi in zip(samples, w)]
    return w


def old_logprobs(model, adapter: str, group: list[Sample], step_size: int, cfg: UpdateSettings,
                 rank: int = 0) -> list[torch.Tensor | None]:
    """Log-probs of this rank's samples under the adapter as it is before this step (None: the current ones,
    detached). The first mini-batch runs before the first optimizer step, so its ratio is exactly 1: only later
    mini-batches (IP parallel instances, a batch over `mini_batch_size`) need this extra no-grad forward."""
    later = [i for i in range(step_size, len(group)) if group[i].rank == rank]
    out: list[torch.Tensor | None] = [None] * len(group)
    scored = policy_logprobs(model, adapter, [group[i].prompt_ids for i in later],
                             [group[i].completion_ids for i in later], cfg.micro_batch_size, cfg.temperature,
                             cfg.share_prompts, cfg.max_tokens_per_micro_batch) if later else []
    for i, logp in zip(later, scored):
        out[i] = logp
    return out


def training_samples(episodes: list, scale_by_std: bool = True, rank: int = 0) -> list[Sample]:
    """Every call of every episode as one GRPO row: its reward compared within its group (`group_advantages`,
    the key from `Call.group_key`), its tokens, its role type and the adapter it trains (`Call.adapter`, set by
    the rollout from the policy).

    Example: one task, n = 2 Voting episodes, 3 generators and an aggregator in each:
      8 calls   generator0, generator1, generator2, aggregator, in episode 0 and again in episode 1
      4 groups  (task, generator0, 0), (task, generator1, 0), (task, generator2, 0), (task, aggregator, 0): each
                compares an instance's call in episode 0 with its call in episode 1
      SP        8 rows, all on adapter `shared`
      IP        6 rows on `generator`, 2 on `aggregator`
    (tests/test_workflows.py, test_worked_example_one_voting_task_becomes_rows, builds exactly this.)
    """
    calls = [(e.task.id, c) for e in episodes for c in e.calls]
    advantages = group_advantages([c.reward for _, c in calls], [c.group_key(i) for i, c in calls], scale_by_std)
    return [Sample(c.prompt_ids, c.completion_ids, a, c.role, c.adapter, rank) for (_, c), a in zip(calls, advantages)]


def global_batch(samples: list[Sample]) -> list[Sample]:
    """Under torchrun: every rank's samples in rank order, which is the order one process would have them in
    (ranks hold contiguous shares of the tasks). A rank keeps its own with their tokens; the others' come as what
    the loss weights need: length, advantage, role, adapter. One process: `samples` as they are."""
    rank, size = world()
    if size == 1:
        return samples
    metas = gather([(len(s.completion_ids), s.advantage, s.role, s.adapter) for s in samples])
    return [s for r, part in enumerate(metas) for s in (samples if r == rank else
            [Sample([], [0] * n, adv, role, adapter, r) for n, adv, role, adapter in part])]


def update_policy(model, samples: list[Sample], optimizers: dict, cfg: UpdateSettings,
                  grad_ema: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """One GRPO training step over all adapters (`update_adapter` each); returns per-role metrics (`role/name`)
    and totals. Every adapter's schedule advances once per training step (verl-constant: once per adapter update,
    as the reference's runs did). `grad_ema` carries the I6
    state from step to step. Under torchrun `samples` is the global batch, the same on every rank; each rank runs
    the rows it holds (`Sample.rank`), gradients are summed over ranks, and so are the metrics' counts."""
    by_adapter: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.completion_ids:
            by_adapter[s.adapter].append(s)
    unknown = set(by_adapter) - set(optimizers)
    assert not unknown, f"samples for adapters without an optimizer: {sorted(unknown)}"
    t: Tallies = defaultdict(lambda: [0.0, 0.0])
    t["nonfinite_steps"][1] = 1.0  # a count (see `_count`), 0 unless a step is skipped
    if cfg.skip_zero_advantage:
        t["skipped_rows"][1] = float(world()[0] == 0)
    grad_ema = {} if grad_ema is None else grad_ema
    for adapter, (opt, sched) in optimizers.items():
        if by_adapter[adapter]:
            update_adapter(model, adapter, by_adapter[adapter], opt, cfg, grad_ema, t)
        _mean(t, f"{adapter}/lr", opt.param_groups[0]["lr"])  # the lr this step used
        if cfg.lr_schedule != "verl-constant":
            stepping = [sched]  # this adapter's schedule, once per training step
        else:  # the reference's one scheduler, stepped by every adapter update that had rows: all advance together
            stepping = [s for _, s in optimizers.values()] if by_adapter[adapter] else []
        with warnings.catch_warnings():  # a step without an optimizer step (no rows, all skipped) is on purpose
            warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler.step\(\)` before", UserWarning)
            for schedule in stepping:
                schedule.step()
    m = rates(add_tallies(gather(dict(t))))  # every rank's counts added: the same metrics on every rank
    m["lr"] = m.get(f"{next(iter(optimizers), '')}/lr") or 0.0
    return m


def update_adapter(model, adapter: str, group: list[Sample], opt: torch.optim.Optimizer, cfg: UpdateSettings,
                   grad_ema: dict, t: Tallies) -> None:
    """One adapter's part of a training step, like any PPO update: per mini-batch, zero the gradient, accumulate
    it over micro-batches, clip, step. What is particular to GRPO for workflows: the loss weights
    (`minibatch_weights`), each role's own gradient under SP (`accumulate_gradients`), and I6's scaling."""
    rank, _ = world()
    params = adapter_parameters(model, adapter)
    # Why IP takes 3 generator steps per training step (finding 4): --mini-batch-size defaults to a training step's
    # episodes (tasks x n; the paper's 512 = 64 x 8), and under IP the `generator` adapter's group holds every
    # generator call, n_votes = 3 per episode, so it is cut into 3 mini-batches (3 optimizer steps) while the
    # aggregator's 1 call per episode makes 1. Under SP all 4 calls per episode share one adapter: 4 steps.
    # --merge-instance-steps makes one mini-batch of the whole group: one step per adapter per training step.
    step_size = len(group) if cfg.merge_instance_steps else cfg.mini_batch_size
    old = old_logprobs(model, adapter, group, step_size, cfg, rank)
    with use_adapter(model, adapter):
        model.train()
        for start in tqdm(range(0, len(group), step_size), desc=f"update {adapter}", leave=False, disable=None):
            mb, mb_old = group[start:start + step_size], old[start:start + step_size]
            # as verl: a mini-batch's loss counts its rows over the mini-batch size, so a partial last one (a
            # role with a variable number of calls) takes a proportionally smaller step
            weights = [w * len(mb) / step_size for w in minibatch_weights(mb, cfg)]
            opt.zero_grad(set_to_none=True)
            role_grads = accumulate_gradients(model, params, mb, mb_old, weights, cfg, t, rank)
            sum_gradients_over_ranks(params, role_grads)
            scale = coherence_scale(params, grad_ema, adapter, cfg.coherence[mb[0].role], cfg.coherence_window) \
                if mb[0].role in cfg.coherence else None  # I6 (IP: one role per adapter)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            # skip a non-finite step (counted), and an all-zero-weight one (a role weighted 0: weight
            # decay and Adam's momentum would still move the adapter)
            stepped = math.isfinite(grad_norm) and any(weights)
            if stepped:
                opt.step()
            opt.zero_grad(set_to_none=True)
            record_minibatch(t, mb, weights, role_grads, grad_norm, stepped, scale)
        model.eval()


def record_minibatch(t: Tallies, mb: list[Sample], weights: list[float], role_grads: dict[str, torch.Tensor],
                     grad_norm: float, stepped: bool, coherence: float | None) -> None:
    """A mini-batch's update metrics: each role's loss share, its own gradient's norm, share and cosines (SP),
    the I6 scale, the clipped-before norm, and the optimizer steps taken or skipped. The token statistics that
    `_micro_step` left on the device are read here, in one copy."""
    on_device = [k for k, v in t.items() if isinstance(v[0], torch.Tensor)]
    if on_device:
        for key, value in zip(on_device, torch.stack([t[k][0].float() for k in on_device]).tolist()):
            t[key][0] = value
    for role, share in role_shares(mb, weights).items():
        _mean(t, f"{role}/loss_share", share)
    for key, value in _role_gradient_stats(role_grads).items():  # empty for a one-role mini-batch
        _mean(t, key, value)
    if coherence is not None:
        _mean(t, f"{mb[0].role}/coherence_scale", coherence)
    _count(t, "nonfinite_steps", not math.isfinite(grad_norm))
    for role in {s.role for s in mb}:
        _count(t, f"{role}/opt_steps", stepped)
        _mean(t, f"{role}/grad_norm", grad_norm)


def _mean(t: Tallies, key: str, value: float) -> None:
    """A value to average (over mini-batches; every rank adds the same ones, so the average is unchanged)."""
    t[key][0] += value
    t[key][1] += 1


def _count(t: Tallies, key: str, value: float) -> None:
    """A number to report as a total: its denominator is 1 (and every rank adds the same total)."""
    t[key][0] += value
    t[key][1] = 1.0


def accumulate_gradients(model, params: list[torch.nn.Parameter], mb: list[Sample], old: list,
                         weights: list[float], cfg: UpdateSettings, t: Tallies,
                         rank: int = 0) -> dict[str, torch.Tensor]:
    """Backward over one mini-batch in micro-batches, formed role by role; when the mini-batch holds several roles
    (SP), the gradient is snapshotted after each role, so each role's own gradient comes free: the loss is a sum.
    (Measured cost of the role order and snapshots: +6% of a tiny-model update, none on SmolLM2.)"""
    def backward(idx: list[int]) -> None:
        idx = [i for i in idx if mb[i].rank == rank]  # the rows this rank holds
        if cfg.skip_zero_advantage:  # their loss is 0 * ratio: no gradient (a KL term would still have one)
            kept = [i for i in idx if mb[i].advantage != 0.0 or cfg.kl_coef.get(mb[i].role, 0.0) > 0]
            t["skipped_rows"][0] += len(idx) - len(kept)  # rows split over ranks: their total (rank 0 counts den 1)
            idx = kept
        # rows sorted by length, so each micro-batch pads to rows of about its own length (SP mixes short
        # generator rows with long aggregator rows), and a prompt's copies share one pass over it
        for cut in micro_batches([mb[i].prompt_ids for i in idx], [mb[i].completion_ids for i in idx],
                                 cfg.micro_batch_size, cfg.max_tokens_per_micro_batch):
            part = [idx[j] for j in cut]
            _micro_step(model, [mb[i] for i in part], [old[i] for i in part], [weights[i] for i in part], cfg, t)

    roles = sorted({s.role for s in mb})
    if len(roles) == 1:
        backward(list(range(len(mb))))
        _zero_missing_grads(params)
        return {}
    role_grads, before = {}, _flat_grad(params)
    for role in roles:
        backward([i for i, s in enumerate(mb) if s.role == role])
        after = _flat_grad(params)
        role_grads[role], before = after - before, after
    _zero_missing_grads(params)
    return role_grads


def sum_gradients_over_ranks(params: list[torch.nn.Parameter], role_grads: dict[str, torch.Tensor]) -> None:
    """Under torchrun: the adapter's gradient and each role's snapshot summed over ranks (the loss weights count
    the global mini-batch, so the sum is the gradient one process would have); nothing for one process."""
    if world()[1] > 1:
        grad = _flat_grad(params)
        all_reduce_sum([grad, *role_grads.values()])
        _set_flat_grad(params, grad)


def _zero_missing_grads(params: list[torch.nn.Parameter]) -> None:
    """A parameter no row reached (all skipped) gets a zero gradient, not None: AdamW skips None-grad
    parameters entirely, but must still apply momentum and weight decay as if the zero rows had run."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def _set_flat_grad(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def _flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]).float()


def _role_gradient_stats(role_grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each role's own gradient norm (before clipping), its share of the roles' summed norms (finding 3: under
    SP, how much of the update each role drives), and the cosine between every pair of roles with a gradient."""
    norms = {r: float(g.norm()) for r, g in role_grads.items()}
    out = {f"{r}/role_grad_norm": n for r, n in norms.items()}
    if sum(norms.values()) > 0:  # a zero gradient (every advantage 0) has no shares: left out, not counted as 0
        out.update({f"{r}/grad_norm_share": n / sum(norms.values()) for r, n in norms.items()})
    roles = sorted(r for r in role_grads if norms[r] > 0)  # a cosine needs two nonzero gradients
    for i, a in enumerate(roles):
        for b in roles[i + 1:]:
            out[f"grad_cos/{a}-{b}"] = float(torch.cosine_similarity(role_grads[a], role_grads[b], dim=0))
    return out


def coherence_scale(params: list[torch.nn.Parameter], grad_ema: dict[str, torch.Tensor], adapter: str,
                    lam: float, window: int) -> float:
    """I6, as the reference: shrink a gradient that keeps pointing where the recent ones pointed.

    scale = 1 - lam * clamp(cos(g, EMA g), 0, 1), applied before clipping, so it lies in [1 - lam, 1]. The EMA
    starts as the first gradient (so the first step is scaled by exactly 1 - lam), then moves toward the
    *scaled* gradient with tau = 1 - 1/window.
    """
    g = _flat_grad(params)
    ema = grad_ema.setdefault(adapter, g.clone())
    scale = 1.0 - lam * float(torch.nn.functional.cosine_similarity(g, ema, dim=0).clamp(0, 1))
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
    tau = 1.0 - 1.0 / window
    grad_ema[adapter] = tau * ema + (1 - tau) * g * scale
    return scale


def _micro_step(model, micro: list[Sample], old: list[torch.Tensor | None], weights: list[float], cfg: UpdateSettings,
                t: Tallies) -> None:
    """Forward + backward of one micro-batch; its weights already carry the mini-batch normalisation. Per-role
    token statistics are tallied as (sum over tokens, tokens), averaged per token at the end."""
    device = next(model.parameters()).device
    prompts, completions = [s.prompt_ids for s in micro], [s.completion_ids for s in micro]
    logp, mask, entropy = completion_logprobs(model, prompts, completions, cfg.temperature, with_entropy=True,
                                              share_prompts=cfg.share_prompts)  # [B, T] each
    old_logp = logp.detach().clone()  # `None` = on-policy: ratio 1, gradient of the ratio intact
    for i, o in enumerate(old):
        if o is not None:  # rows are right-aligned (see completion_logprobs)
            old_logp[i, logp.shape[1] - len(o):] = o.to(device)
    adv = torch.tensor([s.advantage for s in micro], dtype=logp.dtype, device=device)  # [B]
    pg_loss, clipped = clipped_token_loss(logp, old_logp, adv, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    token_loss = pg_loss  # [B, T]
    betas = [cfg.kl_coef.get(s.role, 0.0) for s in micro]
    kl = None
    if any(b > 0 for b in betas):  # I1: only the named roles pay beta * KL(role || base), k3 estimator
        with torch.no_grad(), use_adapter(model, None):
            ref_logp, _, _ = completion_logprobs(model, prompts, completions, cfg.temperature,
                                                 share_prompts=cfg.share_prompts)
        log_r = ref_logp - logp
        kl = (torch.exp(log_r) - log_r - 1) * mask  # [B, T]
        token_loss = token_loss + torch.tensor(betas, dtype=logp.dtype, device=device)[:, None] * kl
    w = torch.tensor(weights, dtype=logp.dtype, device=device)[:, None]  # [B, 1]
    (token_loss * mask * w).sum().backward()
    with torch.no_grad():  # per-role sums stay on the device: `record_minibatch` reads them once per mini-batch
        log_ratio = (logp - old_logp) * mask
        per_row = {"pg_loss": (pg_loss * mask).sum(1), "clip_frac": (clipped.float() * mask).sum(1),
                   "entropy": entropy.sum(1), "approx_kl": (0.5 * log_ratio ** 2).sum(1)}  # [B] each
        if kl is not None:
            per_row["kl_base"] = kl.sum(1)
        for role in dict.fromkeys(s.role for s in micro):  # the roles in row order
            rows = [i for i, s in enumerate(micro) if s.role == role]
            index, tokens = torch.tensor(rows, device=device), sum(len(completions[i]) for i in rows)
            for name, values in per_row.items():
                if name != "kl_base" or cfg.kl_coef.get(role, 0.0) > 0:
                    t[f"{role}/{name}"][0] += values[index].sum()
                    t[f"{role}/{name}"][1] += tokens
